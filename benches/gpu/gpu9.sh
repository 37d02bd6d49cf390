#!/usr/bin/env bash
# GPU run 8: keep-alives released on the actor thread, completed producers marked done.
# The whole test suite, a profiled chain, then every bench suite with the PyTorch baselines.
set -uo pipefail
export RTX_KERNEL_CACHE=$PWD/.gpu/kcache PYTHONUNBUFFERED=1
OUT=/tmp/testlogs timeout 150 bash .gpu/run tests 2>&1 | grep -vE "^test result: ok"; echo "tests rc=${PIPESTATUS[0]}"
RTX_PROFILE=1 timeout 60 .gpu/bin/bench-harness --bench chain 2>/dev/null
timeout 150 .gpu/bin/bench-harness --bench ew reduce chain gemm conv streams speedup attention raw > $OUT/rtx.jsonl 2> $OUT/rtx.err; echo "harness rc=$?"
timeout 120 python3 benches/torch_baseline.py ew reduce chain gemm conv streams attention > $OUT/torch.jsonl 2> $OUT/torch.err; echo "torch rc=$?"
python3 benches/compare.py $OUT/rtx.jsonl $OUT/torch.jsonl > $OUT/table.md
grep -E "chain|streams|gemm_.*_1024|raw" $OUT/table.md
