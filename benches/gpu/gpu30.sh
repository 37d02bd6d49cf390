#!/usr/bin/env bash
# GPU run 30 (next session's first): the streams suite's dependence on what ran before
# (runs 24-29). Bisects the conv suite (one tiny conv, i.e. cuDNN's first use, against
# the six layers) and profiles the slow and the fast case with the actors' release and
# idle phases (RTX_PROFILE=1; <phase>_ms = total per run over the actors).
set -uo pipefail
export RTX_KERNEL_CACHE=$PWD/.gpu/kcache
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu /usr/local/nvidia/lib64; do
  [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH
show() { python3 -c '
import json,sys
keys=("execute_ms","record_ms","publish_ms","release_ms","idle_ms","inputs_ms","watch_finish_ms","watch_wait_ms")
for l in open(sys.argv[1]):
    try: d=json.loads(l)
    except Exception: continue
    c=d.get("case","")
    if c.startswith("streams_8x200") and c[-2:] in ("_1","_4"):
        print("   %-30s %6.2f ms  " % (c, d["rtx_ms"]) + " ".join("%s=%.2f" % (k[:-3], d[k]) for k in keys if k in d))
' $1; }
for pre in "" convtiny conv; do
  timeout 120 .gpu/bin/bench-harness --bench $pre streams > $OUT/p-$pre.jsonl 2>/dev/null; echo "== [$pre] rc=$?"; show $OUT/p-$pre.jsonl
done
for pre in "" conv; do
  RTX_PROFILE=1 timeout 120 .gpu/bin/bench-harness --bench $pre streams > $OUT/prof-$pre.jsonl 2>/dev/null; echo "== profiled [$pre] rc=$?"; show $OUT/prof-$pre.jsonl
done
