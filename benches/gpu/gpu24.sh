#!/usr/bin/env bash
# GPU run 24: why the streams suite takes ~2x as long in a process of its own (runs 16,
# 23: 19-24 ms for linear+relu on 4 streams) as after the other suites (runs 19, 22:
# 9.0-10.6 ms). The streams suite alone, twice in one process, and after each other
# suite; 4-stream rows printed.
set -uo pipefail
export RTX_KERNEL_CACHE=$PWD/.gpu/kcache
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu /usr/local/nvidia/lib64; do
  [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH
show() { python3 -c '
import json,sys
for l in open(sys.argv[1]):
    try: d=json.loads(l)
    except Exception: continue
    c=d.get("case","")
    if c.startswith("streams_8x200") and c[-2:] in ("_1","_4"):
        print("   %-32s %7.2f ms (min %.2f) submit %.2f" % (c, d["rtx_ms"], d["min_ms"], d["submit_ms"]))
' $1; }
for pre in "" "streams" "gemm" "ew" "conv" "chain" "reduce"; do
  timeout 150 .gpu/bin/bench-harness --bench $pre streams > $OUT/s-$pre.jsonl 2>/dev/null; echo "== [$pre] streams rc=$?"; show $OUT/s-$pre.jsonl
done
