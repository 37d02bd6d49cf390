#!/usr/bin/env bash
# GPU run 31: the review mends (attention launches through the shared dptr helpers, the
# actor's single input list, spare-pool liveness check, shared integration-test helpers):
# every test executable once, test-gemm three more times.
set -uo pipefail
source benches/gpu/env.sh
export RTX_REQUIRE_CUDA=1
OUT=/tmp/testlogs timeout 150 bash .gpu/run tests 2>&1 | grep -vE "^test result: ok"; echo "tests rc=${PIPESTATUS[0]}"
for i in 1 2 3; do timeout 30 .gpu/bin/test-gemm > /tmp/g$i.log 2>&1; echo "test-gemm $i rc=$? $(grep '^test result' /tmp/g$i.log | cut -c1-40)"; done
