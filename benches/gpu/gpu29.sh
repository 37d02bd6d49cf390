#!/usr/bin/env bash
# GPU run 29: run 26 showed the slow streams case neither device-bound (GPU 20-30 % busy,
# 1980 MHz) nor explained by the actors' timed phases (about half the wall time
# unaccounted). Is it glibc malloc giving memory back to the OS (trim / mmap thresholds,
# which freeing a mid-size mmapped block raises for the rest of the process)? The suite
# alone with fixed thresholds, against the suite alone as is.
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
    if c.startswith("streams_8x200") and c[-2:] in ("_1","_4"): print("   %-32s %7.2f ms (min %.2f)" % (c, d["rtx_ms"], d["min_ms"]))
' $1; }
one() { # label env...
  local label=$1; shift
  env "$@" timeout 100 .gpu/bin/bench-harness --bench streams > $OUT/$label.jsonl 2>/dev/null; echo "== $label rc=$?"; show $OUT/$label.jsonl
}
one control X=1
one mmap32M-trim256M GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=268435456
one trim256M GLIBC_TUNABLES=glibc.malloc.trim_threshold=268435456
one mmap32M GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432
