#!/usr/bin/env bash
# GPU run 17: the final code (review fixes, empty_cache test, wgmma backward for D=128):
# every test executable, every bench suite, the PyTorch baselines.
set -uo pipefail
export RTX_KERNEL_CACHE=$PWD/.gpu/kcache PYTHONUNBUFFERED=1
OUT=/tmp/testlogs timeout 240 bash .gpu/run tests 2>&1 | grep -vE "^test result: ok"; echo "tests rc=${PIPESTATUS[0]}"
timeout 200 .gpu/bin/bench-harness --bench ew reduce chain gemm conv streams speedup attention raw > $OUT/rtx.jsonl 2> $OUT/rtx.err; echo "harness rc=$?"
timeout 200 python3 benches/torch_baseline.py ew reduce chain gemm conv streams attention > $OUT/torch.jsonl 2> $OUT/torch.err; echo "torch rc=$?"
python3 benches/compare.py $OUT/rtx.jsonl $OUT/torch.jsonl > $OUT/table.md
grep -E "conv|streams_8x200_linear|gemm_.*_(4096|8192)|bmm|attn|chain|cache" $OUT/table.md
