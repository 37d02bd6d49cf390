#!/usr/bin/env bash
# GPU run 35: run 34 read conv 56²·64→64 3×3 at 0.91 and GEMM bf16 4096 at 0.97 (run 33:
# 0.96 and 0.99). The conv search now takes each candidate's best of 3 interleaved rounds
# of 10 launches (was one round of 5). Here: the search's candidate times (RTX_LOG), then
# three alternating rtx / PyTorch passes over the gemm and conv suites, for the spread.
set -uo pipefail
source benches/gpu/env.sh
export PYTHONUNBUFFERED=1
RTX_REQUIRE_CUDA=1 timeout 60 .gpu/bin/test-conv 2>&1 | grep "^test result"; echo "test-conv rc=${PIPESTATUS[0]}"
RTX_LOG=rtx_ops=debug timeout 120 .gpu/bin/bench-harness --bench conv > $OUT/dbg.jsonl 2> $OUT/dbg.log; echo "debug conv rc=$?"
grep -E "candidate timed|engine chosen" $OUT/dbg.log | sed -E 's/^.*(DEBUG|INFO) //' | head -40
for i in 1 2 3; do
  timeout 150 .gpu/bin/bench-harness --bench gemm conv > $OUT/rtx$i.jsonl 2>/dev/null; echo "rtx $i rc=$?"
  timeout 150 python3 benches/torch_baseline.py gemm conv > $OUT/torch$i.jsonl 2>/tmp/torch.err; echo "torch $i rc=$?"
  python3 benches/compare.py $OUT/rtx$i.jsonl $OUT/torch$i.jsonl | grep -E "conv_|gemm_.*_(4096|8192)|bmm" | awk -F'|' '{printf "%s %s %s %s\n", $2, $3, $5, $7}'
done
