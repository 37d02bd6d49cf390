#!/usr/bin/env bash
# GPU run 3a: the whole test suite, then every bench suite with the PyTorch baselines.
set -uo pipefail
export RTX_KERNEL_CACHE=$PWD/.gpu/kcache PYTHONUNBUFFERED=1
timeout 170 bash .gpu/run tests 2>&1 | grep -vE "^test result: ok" ; echo "tests rc=${PIPESTATUS[0]}"
timeout 170 .gpu/bin/bench-harness --bench ew reduce chain gemm conv streams speedup attention > $OUT/rtx.jsonl 2> $OUT/rtx.err; echo "harness rc=$?"
timeout 150 python3 benches/torch_baseline.py ew reduce chain gemm conv streams attention > $OUT/torch.jsonl 2> $OUT/torch.err; echo "torch rc=$?"
python3 benches/compare.py $OUT/rtx.jsonl $OUT/torch.jsonl | tee $OUT/table.md
