#!/usr/bin/env bash
# GPU run 45: every test executable after the final review mends (download finisher
# without its second event wait, one CUDA-presence check for tests, harness split).
set -uo pipefail
source benches/gpu/env.sh
export RTX_REQUIRE_CUDA=1
OUT=/tmp/testlogs timeout 140 bash .gpu/run tests 2>&1 | grep -vE "^test result: ok"; echo "tests rc=${PIPESTATUS[0]}"
