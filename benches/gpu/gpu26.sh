#!/usr/bin/env bash
# GPU run 26: the streams suite alone vs after conv, with RTX_PROFILE=1 (host time per op
# phase) and the SM clock sampled every 100 ms (nvidia-smi, read only): is the slow
# case host-bound or device-bound, and does the clock differ?
set -uo pipefail
export RTX_KERNEL_CACHE=$PWD/.gpu/kcache RTX_PROFILE=1
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu /usr/local/nvidia/lib64; do
  [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu --format=csv,noheader -lms 100 > $OUT/clocks.csv 2>&1 &
SMI=$!
sleep 1
phase() { # label suites...
  local label=$1; shift
  echo "$label start $(date +%s.%N)" >> $OUT/marks.txt
  timeout 120 .gpu/bin/bench-harness --bench "$@" > $OUT/$label.jsonl 2>/dev/null
  echo "$label end $(date +%s.%N)" >> $OUT/marks.txt
  sleep 1
}
phase alone streams
phase afterconv conv streams
phase alone2 streams
kill $SMI
python3 - $OUT <<'PY'
import json, sys, datetime, statistics
out = sys.argv[1]
clk = []
for l in open(out + "/clocks.csv"):
    p = [x.strip() for x in l.split(",")]
    try:
        t = datetime.datetime.strptime(p[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        clk.append((t, float(p[1].split()[0]), float(p[3].split()[0]), p[4]))
    except Exception:
        pass
marks = {}
for l in open(out + "/marks.txt"):
    lab, what, t = l.split()
    marks.setdefault(lab, {})[what] = float(t)
for lab, m in marks.items():
    rows = []
    for l in open(f"{out}/{lab}.jsonl"):
        try: d = json.loads(l)
        except Exception: continue
        if d.get("case", "").startswith("streams_8x200") and d["case"][-2:] in ("_1", "_4"):
            rows.append(d)
    # the streams cases are the last ~4 s of the phase
    sm = [c[1] for c in clk if m["start"] <= c[0] <= m["end"]]
    tail = [c for c in clk if m["end"] - 5 <= c[0] <= m["end"]]
    print(f"== {lab}: SM clock median {statistics.median(sm) if sm else 'n/a'} MHz over the phase; last 5 s: SM {[int(c[1]) for c in tail][::5]} power {[int(c[2]) for c in tail][::5]}")
    for d in rows:
        print("   %-30s %6.2f ms  execute %.1f  record %.1f  watch_wait %.1f  watch_finish %.1f  inputs %.2f publish %.2f" % (
            d["case"], d["rtx_ms"], d.get("execute", 0), d.get("record", 0), d.get("watch_wait", 0), d.get("watch_finish", 0), d.get("inputs", 0), d.get("publish", 0)))
PY
