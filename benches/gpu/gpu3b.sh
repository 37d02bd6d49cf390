#!/usr/bin/env bash
# GPU run 3b: attention kernel variants (cupy), and the SASS of our kernels
# (CUBINs written by `.gpu/bin/example-ptxas attention elementwise reduce softmax --out=.gpu/cubin`).
set -uo pipefail
export PYTHONUNBUFFERED=1
for c in .gpu/cubin/*.cubin; do
  echo "== $c: $(cuobjdump -sass $c | grep -oE '\b(HGMMA|HMMA|LDSM|LDGSTS|REDG|LDG\.E\.128|STG\.E\.128|LDL|STL)[A-Z0-9.]*' | sed 's/\..*//' | sort | uniq -c | tr '\n' ' ')"
done
timeout 250 python3 benches/attention_check.py > $OUT/attn.log 2>&1; echo "attention_check rc=$?"
grep -A200 "== " $OUT/attn.log | tail -90
