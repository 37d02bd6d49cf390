#!/usr/bin/env bash
# GPU run 33: the pinned host staging cache (runtime/src/cuda/pinned.rs). Run 32 found
# the slow streams case paying 4096 minor page faults per run (8 downloads, each pinning
# a fresh 2 MiB region) and none after cuDNN's first use. Now: every test executable
# (incl. the new test-transfer), the streams suite alone twice and after convtiny, then
# the issue-4 suites with `streams` first in the process, and PyTorch on the same shapes.
set -uo pipefail
source benches/gpu/env.sh
export PYTHONUNBUFFERED=1
keys="minflt cpu_sys_ms pinned_cache_hits pinned_cache_misses submit_ms"
( export RTX_REQUIRE_CUDA=1; OUT=/tmp/testlogs timeout 170 bash .gpu/run tests 2>&1 | grep -vE "^test result: ok"; echo "tests rc=${PIPESTATUS[0]}" )
for pre in "streams" "streams" "convtiny streams"; do
  f=$OUT/s-${pre// /-}.jsonl; [ -e $f ] && f=$OUT/s-${pre// /-}-2.jsonl
  timeout 100 .gpu/bin/bench-harness --bench $pre > $f 2>/dev/null; echo "== [$pre] rc=$?"; show_streams $f $keys
done
timeout 200 .gpu/bin/bench-harness --bench streams gemm conv speedup rawstreams > $OUT/rtx.jsonl 2> $OUT/rtx.err; echo "harness rc=$?"
timeout 150 python3 benches/torch_baseline.py gemm conv streams > $OUT/torch.jsonl 2> /tmp/torch.err; echo "torch rc=$?"; tail -3 /tmp/torch.err
python3 benches/compare.py $OUT/rtx.jsonl $OUT/torch.jsonl > $OUT/table.md
grep -E "conv|streams_8x200|gemm_.*_(1024|4096|8192)|bmm|cache|speedup" $OUT/table.md
