#!/usr/bin/env bash
# GPU run 27: run 26 showed the slow streams case device-serialized (4 streams, 46 us per
# op per stream against ~25 us of actor time) at full clocks. Do our streams share the
# device's hardware work queues (CUDA_DEVICE_MAX_CONNECTIONS, default 8)? The suite
# alone with 8 (default) and 32 queues, and after conv with 32.
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
    if c.startswith("streams_8x200"):
        print("   %-32s %7.2f ms (min %.2f)" % (c, d["rtx_ms"], d["min_ms"]))
' $1; }
timeout 100 .gpu/bin/bench-harness --bench streams > $OUT/a8.jsonl 2>/dev/null; echo "== alone, 8 queues rc=$?"; show $OUT/a8.jsonl
CUDA_DEVICE_MAX_CONNECTIONS=32 timeout 100 .gpu/bin/bench-harness --bench streams > $OUT/a32.jsonl 2>/dev/null; echo "== alone, 32 queues rc=$?"; show $OUT/a32.jsonl
CUDA_DEVICE_MAX_CONNECTIONS=32 timeout 100 .gpu/bin/bench-harness --bench conv streams > $OUT/c32.jsonl 2>/dev/null; echo "== after conv, 32 queues rc=$?"; show $OUT/c32.jsonl
