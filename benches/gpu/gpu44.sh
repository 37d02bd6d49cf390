#!/usr/bin/env bash
# GPU run 44, on the final code: every test executable; then whether rtx's short convs
# cost more host time after the gemm suite in the same process (runs 42-43: 1×1 stride-2
# conv 0.0175-0.0186 ms after gemm, 0.0104-0.0118 alone; PyTorch's device time 0.0094).
set -uo pipefail
source benches/gpu/env.sh
( export RTX_REQUIRE_CUDA=1
  OUT=/tmp/testlogs timeout 200 bash .gpu/run tests 2>&1 | grep -vE "^test result: ok"; echo "tests rc=${PIPESTATUS[0]}" )
for pre in "conv" "gemm conv" "conv" "gemm conv"; do
  timeout 100 .gpu/bin/bench-harness --bench $pre > /tmp/c.jsonl 2>/dev/null; echo "== [$pre] rc=$?"
  python3 -c '
import json,sys
for l in open(sys.argv[1]):
    try: d=json.loads(l)
    except ValueError: continue
    if d.get("case","").startswith("conv_") and "cache" not in d["case"]: print("   %-24s %.4f" % (d["case"], d["rtx_ms"]))' /tmp/c.jsonl
done
