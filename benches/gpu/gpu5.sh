#!/usr/bin/env bash
# GPU run 5 (final): whole test suite, every bench suite with the PyTorch baselines in the
# same run, and the attention kernel check (base build: D=64 forward now preset 1).
set -uo pipefail
export RTX_KERNEL_CACHE=$PWD/.gpu/kcache PYTHONUNBUFFERED=1
OUT=/tmp/testlogs timeout 150 bash .gpu/run tests 2>&1 | grep -vE "^test result: ok"; echo "tests rc=${PIPESTATUS[0]}"
timeout 150 .gpu/bin/bench-harness --bench ew reduce chain gemm conv streams speedup attention raw > $OUT/rtx.jsonl 2> $OUT/rtx.err; echo "harness rc=$?"
timeout 120 python3 benches/torch_baseline.py ew reduce chain gemm conv streams attention > $OUT/torch.jsonl 2> $OUT/torch.err; echo "torch rc=$?"
python3 benches/compare.py $OUT/rtx.jsonl $OUT/torch.jsonl > $OUT/table.md
timeout 110 python3 benches/attention_check.py --no-variant > $OUT/attn.log 2>&1; echo "attention_check rc=$?"
grep -E "summary|FAIL" $OUT/attn.log | head; grep -B2 -A16 "^-- forward --" $OUT/attn.log | head -40
cat $OUT/table.md
