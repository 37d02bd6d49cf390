#!/usr/bin/env bash
# GPU run 25: run 24 found the streams suite ~2.5x faster after the conv suite (4 streams,
# linear+relu: 8.8 ms) than alone or after any other suite (22-26 ms). Is it something
# conv leaves busy (CPU time of the process), or idle cores sleeping deeply (the same
# suite alone with four busy-loop processes beside it)?
set -uo pipefail
export RTX_KERNEL_CACHE=$PWD/.gpu/kcache
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu /usr/local/nvidia/lib64; do
  [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH
run() { # label, suites...
  local label=$1; shift
  python3 - "$label" "$OUT/$label.jsonl" "$@" <<'PY'
import json, resource, subprocess, sys, time
label, out, suites = sys.argv[1], sys.argv[2], sys.argv[3:]
t = time.time()
with open(out, "w") as f:
    subprocess.run([".gpu/bin/bench-harness", "--bench", *suites], stdout=f, stderr=subprocess.DEVNULL, timeout=150)
wall = time.time() - t
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"== [{label}] wall {wall:.1f} s, cpu user {ru.ru_utime:.1f} s sys {ru.ru_stime:.1f} s, vol/invol ctx switches {ru.ru_nvcsw}/{ru.ru_nivcsw}")
for l in open(out):
    try: d = json.loads(l)
    except Exception: continue
    c = d.get("case", "")
    if c.startswith("streams_8x200") and c[-2:] in ("_1", "_4"):
        print("   %-32s %7.2f ms (min %.2f)" % (c, d["rtx_ms"], d["min_ms"]))
PY
}
run conv-streams conv streams
run gemm-streams gemm streams
for i in 1 2 3 4; do python3 -c 'while True: pass' & done
run busy4-streams streams
kill $(jobs -p) 2>/dev/null; wait 2>/dev/null
run streams-alone streams
