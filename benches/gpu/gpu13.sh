#!/usr/bin/env bash
# GPU run 13: run 12's cases after the fixes (block caches, batched watcher
# hand-off), with the conv engine search logged (RTX_LOG) to see what the graph API offers.
set -uo pipefail
export RTX_KERNEL_CACHE=$PWD/.gpu/kcache PYTHONUNBUFFERED=1
OUT=/tmp/testlogs timeout 200 bash .gpu/run tests 2>&1 | grep -vE "^test result: ok"; echo "tests rc=${PIPESTATUS[0]}"
RTX_LOG=rtx_ops=debug timeout 60 .gpu/bin/bench-harness --bench conv > /dev/null 2> $OUT/conv_log.txt; echo "conv log rc=$?"
sed -E "s/^[^ ]+ //" $OUT/conv_log.txt | sort | uniq -c | sort -rn | head -30
RTX_PROFILE=1 timeout 90 .gpu/bin/bench-harness --bench chain streams 2>/dev/null > $OUT/profile.jsonl; echo "profile rc=$?"
timeout 150 .gpu/bin/bench-harness --bench conv streams chain > $OUT/rtx.jsonl 2> $OUT/rtx.err; echo "harness rc=$?"
timeout 120 python3 benches/torch_baseline.py conv streams chain > $OUT/torch.jsonl 2> $OUT/torch.err; echo "torch rc=$?"
python3 benches/compare.py $OUT/rtx.jsonl $OUT/torch.jsonl > $OUT/table.md
cat $OUT/table.md; cat $OUT/profile.jsonl
