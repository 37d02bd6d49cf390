#!/usr/bin/env bash
# GPU run 36: GEMM algorithm tuning (ops/src/gemm/tune.rs: cuBLASLt's candidates timed
# once per large problem and device). Every test executable (test-gemm has the new
# large-GEMM test) and test-gemm 3 more times; the candidates' times (RTX_LOG); then
# three passes alternating rtx (tuned), rtx with RTX_GEMM_TUNE=0, and PyTorch over the
# gemm and conv suites; then the streams suite (256³ is below the tuning threshold).
set -uo pipefail
source benches/gpu/env.sh
export PYTHONUNBUFFERED=1
( export RTX_REQUIRE_CUDA=1
  OUT=/tmp/testlogs timeout 170 bash .gpu/run tests 2>&1 | grep -vE "^test result: ok"; echo "tests rc=${PIPESTATUS[0]}"
  for i in 1 2 3; do timeout 60 .gpu/bin/test-gemm > /tmp/t.log 2>&1; echo "test-gemm $i rc=$? $(grep '^test result' /tmp/t.log | cut -c1-40) $(grep 'GEMM plans timed' /tmp/t.log)"; done )
RTX_LOG=rtx_ops=debug timeout 120 .gpu/bin/bench-harness --bench gemm > /tmp/dbg.jsonl 2> $OUT/dbg.log; echo "debug gemm rc=$?"
grep "candidates timed" $OUT/dbg.log | sed -E 's/^.*DEBUG //' | cut -c1-400
mkdir -p /tmp/p
for i in 1 2 3; do
  timeout 150 .gpu/bin/bench-harness --bench gemm conv > /tmp/p/tuned$i.jsonl 2>/dev/null; echo "tuned $i rc=$?"
  RTX_GEMM_TUNE=0 timeout 150 .gpu/bin/bench-harness --bench gemm conv > /tmp/p/heur$i.jsonl 2>/dev/null; echo "heuristic $i rc=$?"
  timeout 150 python3 benches/torch_baseline.py gemm conv > /tmp/p/torch$i.jsonl 2>/tmp/torch.err; echo "torch $i rc=$?"
done
tar czf $OUT/passes.tgz -C /tmp/p .
python3 - <<'PY'
import json, glob, statistics
def load(f):
    d = {}
    for l in open(f):
        try: j = json.loads(l)
        except ValueError: continue
        if "case" in j: d[j["case"]] = j
    return d
runs = {k: [load(f"/tmp/p/{k}{i}.jsonl") for i in (1, 2, 3)] for k in ("tuned", "heur", "torch")}
ms = lambda j: j.get("rtx_ms", j.get("torch_ms", j.get("ms")))
print("%-24s %-26s %-26s %-26s %s" % ("case", "tuned ms", "heuristic ms", "torch ms", "median ratios tuned / heuristic"))
for c in runs["tuned"][0]:
    if not (c.startswith("gemm_") or c.startswith("conv_") or c.startswith("bmm")) or "cache" in c: continue
    v = {k: [ms(r[c]) for r in runs[k] if c in r] for k in runs}
    if not all(v.values()): continue
    t, h, p = (statistics.median(v[k]) for k in ("tuned", "heur", "torch"))
    f = lambda xs: "/".join("%.4f" % x for x in xs)
    print("%-24s %-26s %-26s %-26s %.3f / %.3f" % (c, f(v["tuned"]), f(v["heur"]), f(v["torch"]), p / t, p / h))
print("plan cache (tuned pass 1):", {k: v for k, v in runs["tuned"][0].get("gemm_plan_cache", {}).items() if k not in ("case",)})
PY
timeout 100 .gpu/bin/bench-harness --bench streams > /tmp/s.jsonl 2>/dev/null; echo "== streams rc=$?"; show_streams /tmp/s.jsonl submit_ms
