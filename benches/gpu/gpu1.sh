#!/usr/bin/env bash
# GPU run 1: device facts, rtx info, attention kernel check (cupy), all test executables.
set -uo pipefail
export RTX_KERNEL_CACHE=$PWD/.gpu/kcache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
bash .gpu/run exec bin-rtx info
echo "=== attention_check.py"
timeout 200 python3 benches/attention_check.py > $OUT/attn.log 2>&1; echo "attention_check rc=$?"
tail -60 $OUT/attn.log
echo "=== tests"
timeout 300 bash .gpu/run tests; echo "tests rc=$?"
