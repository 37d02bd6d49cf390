#!/usr/bin/env bash
# GPU run 14: one ready event per burst of ops; conv graph search over up to 64
# configurations; the streams workload with 9 samples per case.
set -uo pipefail
export RTX_KERNEL_CACHE=$PWD/.gpu/kcache PYTHONUNBUFFERED=1
OUT=/tmp/testlogs timeout 240 bash .gpu/run tests 2>&1 | grep -vE "^test result: ok"; echo "tests rc=${PIPESTATUS[0]}"
RTX_PROFILE=1 timeout 90 .gpu/bin/bench-harness --bench chain streams 2>/dev/null > $OUT/profile.jsonl; echo "profile rc=$?"
timeout 200 .gpu/bin/bench-harness --bench conv streams chain gemm attention > $OUT/rtx.jsonl 2> $OUT/rtx.err; echo "harness rc=$?"
timeout 200 python3 benches/torch_baseline.py conv streams chain gemm attention > $OUT/torch.jsonl 2> $OUT/torch.err; echo "torch rc=$?"
python3 benches/compare.py $OUT/rtx.jsonl $OUT/torch.jsonl > $OUT/table.md
cat $OUT/table.md; cat $OUT/profile.jsonl
