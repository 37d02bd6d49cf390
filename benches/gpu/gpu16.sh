#!/usr/bin/env bash
# GPU run 16: the code of run 15 (tests passed there). The streams workload four times,
# alternating idle actors that poll 50 µs before sleeping (the default on this host) with
# actors that sleep at once (RTX_ACTOR_SPIN_US=0); then GEMM and conv again, with the
# PyTorch baselines of all three.
set -uo pipefail
export RTX_KERNEL_CACHE=$PWD/.gpu/kcache PYTHONUNBUFFERED=1
for i in 1 2; do
  RTX_ACTOR_SPIN_US=0 timeout 60 .gpu/bin/bench-harness --bench streams > $OUT/spin0_$i.jsonl 2>/dev/null; echo "spin0 rc=$?"
  timeout 60 .gpu/bin/bench-harness --bench streams > $OUT/spin50_$i.jsonl 2>/dev/null; echo "spin50 rc=$?"
done
timeout 120 .gpu/bin/bench-harness --bench gemm conv > $OUT/rtx.jsonl 2> $OUT/rtx.err; echo "harness rc=$?"
timeout 150 python3 benches/torch_baseline.py gemm conv streams > $OUT/torch.jsonl 2>/dev/null; echo "torch rc=$?"
python3 benches/compare.py $OUT/rtx.jsonl $OUT/torch.jsonl > $OUT/table.md
cat $OUT/table.md
python3 - <<'PY'
import json, os, glob
out = os.environ["OUT"]
rows = {}
for f in sorted(glob.glob(f"{out}/spin*.jsonl")):
    tag = os.path.basename(f)[:-6]
    for l in open(f):
        if l.startswith("{"):
            r = json.loads(l)
            rows.setdefault(r["case"], {})[tag] = "%.2f (%.2f-%.2f) sub %.1f" % (r["rtx_ms"], r.get("min_ms", 0), r.get("max_ms", 0), r.get("submit_ms", 0))
torch = {json.loads(l)["case"]: json.loads(l)["torch_ms"] for l in open(f"{out}/torch.jsonl") if l.startswith("{")}
for case, v in rows.items():
    print(case, "| torch %.1f |" % torch.get(case, float("nan")), " | ".join(f"{k}: {v[k]}" for k in sorted(v)))
PY
