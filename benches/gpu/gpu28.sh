#!/usr/bin/env bash
# GPU run 28: which cuBLASLt algorithm the streams suite's plans get, alone and after
# conv (RTX_LOG=rtx_ops=debug prints each new plan's configuration).
set -uo pipefail
export RTX_KERNEL_CACHE=$PWD/.gpu/kcache RTX_LOG=rtx_ops=debug
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu /usr/local/nvidia/lib64; do
  [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH
for pre in "" conv; do
  timeout 100 .gpu/bin/bench-harness --bench $pre streams > $OUT/o-$pre.jsonl 2> $OUT/e-$pre.log; echo "== [$pre] rc=$?"
  sed -E 's/\x1b\[[0-9;]*m//g' $OUT/e-$pre.log | grep "cuBLASLt plan" | grep "m=256 n=256 k=256" | sed -E 's/^.*cuBLASLt plan //; s/^[^ ]* //' | sed -E 's/.*(dtype=)/\1/' | sort | uniq -c | head -12
  python3 -c '
import json,sys
for l in open(sys.argv[1]):
    try: d=json.loads(l)
    except Exception: continue
    c=d.get("case","")
    if c.startswith("streams_8x200") and c[-2:] in ("_1","_4"): print("   %-32s %7.2f ms" % (c, d["rtx_ms"]))
' $OUT/o-$pre.jsonl
done
grep -c "cuBLASLt plan" $OUT/e-.log $OUT/e-conv.log
grep "cuBLASLt plan" $OUT/e-conv.log | grep -v "m=256 n=256 k=256" | head -5
