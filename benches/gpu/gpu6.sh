#!/usr/bin/env bash
# GPU run 6: the test suite after the review fixes, and the tiny-op chain and streams cases.
set -uo pipefail
export RTX_KERNEL_CACHE=$PWD/.gpu/kcache PYTHONUNBUFFERED=1
OUT=/tmp/testlogs timeout 200 bash .gpu/run tests 2>&1 | grep -vE "^test result: ok"; echo "tests rc=${PIPESTATUS[0]}"
timeout 100 .gpu/bin/bench-harness --bench chain streams raw > $OUT/rtx.jsonl 2> $OUT/rtx.err; echo "harness rc=$?"
cat $OUT/rtx.jsonl
