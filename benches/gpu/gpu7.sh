#!/usr/bin/env bash
# GPU run 7: where a tiny op's host time goes (RTX_PROFILE=1 phase timers), twice, and
# once without the timers.
set -uo pipefail
export RTX_KERNEL_CACHE=$PWD/.gpu/kcache
for i in 1 2; do RTX_PROFILE=1 timeout 60 .gpu/bin/bench-harness --bench chain 2>/dev/null; done
timeout 60 .gpu/bin/bench-harness --bench chain raw 2>/dev/null
