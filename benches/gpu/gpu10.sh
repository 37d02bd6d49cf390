#!/usr/bin/env bash
# GPU run 10: the test suite after the last refactors (one allocator, attention split).
set -uo pipefail
export RTX_KERNEL_CACHE=$PWD/.gpu/kcache
OUT=/tmp/testlogs timeout 200 bash .gpu/run tests 2>&1 | grep -vE "^test result: ok"; echo "tests rc=${PIPESTATUS[0]}"
RTX_PROFILE=1 timeout 40 .gpu/bin/bench-harness --bench chain 2>/dev/null
