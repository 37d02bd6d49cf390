#!/usr/bin/env bash
# GPU run 34: after run 33: test-transfer's premise fixed; review mends of the pinned cache
# (raw event wait, eviction of the largest free blocks, teardown lock, record-failure path,
# poisoned check) and its unit test with a held-back stream (unit-rtx_runtime):
# every test executable; test-transfer 5 more times, unit-rtx_runtime 3, test-gemm 3, test-memory and
# test-oom 2 each; the streams suite alone twice and after conv; then the issue-4 suites
# again (streams first) with PyTorch in the same run, for a second table.
set -uo pipefail
source benches/gpu/env.sh
export PYTHONUNBUFFERED=1
keys="minflt cpu_sys_ms pinned_cache_hits pinned_cache_misses submit_ms"
( export RTX_REQUIRE_CUDA=1
  OUT=/tmp/testlogs timeout 170 bash .gpu/run tests 2>&1 | grep -vE "^test result: ok"; echo "tests rc=${PIPESTATUS[0]}"
  for t in test-transfer:5 unit-rtx_runtime:3 test-gemm:3 test-memory:2 test-oom:2; do
    for i in $(seq 1 ${t#*:}); do timeout 60 .gpu/bin/${t%:*} > /tmp/t.log 2>&1; echo "${t%:*} $i rc=$? $(grep '^test result' /tmp/t.log | cut -c1-40)"; done
  done )
for pre in "streams" "streams" "conv streams"; do
  f=/tmp/s.jsonl
  timeout 100 .gpu/bin/bench-harness --bench $pre > $f 2>/dev/null; echo "== [$pre] rc=$?"; show_streams $f $keys
done
timeout 200 .gpu/bin/bench-harness --bench streams gemm conv speedup rawstreams > $OUT/rtx.jsonl 2> $OUT/rtx.err; echo "harness rc=$?"
timeout 150 python3 benches/torch_baseline.py gemm conv streams > $OUT/torch.jsonl 2> /tmp/torch.err; echo "torch rc=$?"; tail -3 /tmp/torch.err
python3 benches/compare.py $OUT/rtx.jsonl $OUT/torch.jsonl > $OUT/table.md
grep -E "conv|streams_8x200|gemm_.*_(1024|4096|8192)|bmm|cache|speedup" $OUT/table.md | cut -c1-120
