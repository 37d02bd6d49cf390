#!/usr/bin/env bash
# GPU run 2: re-run the tests that failed in run 1, then every bench suite with the
# PyTorch baselines, joined into one table.
set -uo pipefail
export RTX_KERNEL_CACHE=$PWD/.gpu/kcache PYTHONUNBUFFERED=1 RTX_REQUIRE_CUDA=1
for t in test-core test-gemm test-reduce unit-rtx_ops; do
  timeout 60 bash .gpu/run exec $t > /dev/null 2>&1; echo "$t rc=$?"; grep -E "^test result|panicked" $OUT/$t.log | head -5
done
timeout 60 .gpu/bin/bin-rtx demo 2>&1 | tail -25
timeout 330 .gpu/bin/bench-harness --bench ew reduce chain gemm conv streams speedup attention > $OUT/rtx.jsonl 2> $OUT/rtx.err; echo "harness rc=$?"; tail -3 $OUT/rtx.err
timeout 200 python3 benches/torch_baseline.py ew reduce chain gemm conv streams attention > $OUT/torch.jsonl 2> $OUT/torch.err; echo "torch rc=$?"; tail -3 $OUT/torch.err
python3 benches/compare.py $OUT/rtx.jsonl $OUT/torch.jsonl | tee $OUT/table.md
