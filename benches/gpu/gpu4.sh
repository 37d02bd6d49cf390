#!/usr/bin/env bash
# GPU run 4: why do tiny ops cost so much? Watcher and pool variants (temporary switches
# RTX_EXP_WATCH / RTX_EXP_POOL, since removed), and the raw driver floor.
set -uo pipefail
export RTX_KERNEL_CACHE=$PWD/.gpu/kcache
for w in query sync; do for p in keep default; do
  echo "watch=$w pool=$p: $(RTX_EXP_WATCH=$w RTX_EXP_POOL=$p timeout 60 .gpu/bin/bench-harness --bench chain 2>/dev/null)"
done; done
timeout 60 .gpu/bin/bench-harness --bench raw 2>/dev/null
RTX_EXP_POOL=default timeout 60 .gpu/bin/bench-harness --bench raw 2>/dev/null | sed 's/^/pool-default /'
for fn in ew_add_f32 ew_exp_f32 ew_add_f16 ewb_add_f32; do
  echo "$fn: $(cuobjdump -sass -fun $fn .gpu/cubin/elementwise.cubin | grep -oE '\b(LDL|STL|LDG|STG)[A-Z0-9.]*' | sort | uniq -c | tr '\n' ' ')"
done
