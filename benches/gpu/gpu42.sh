#!/usr/bin/env bash
# GPU run 42: the conv search re-times only the contenders after its first round (a
# review's cost finding), and the PyTorch baseline also reports its device time without
# its host (`graph_ms`: CUDA-graph replays), since back-to-back samples of short ops
# measure PyTorch's enqueue rate (run 40). test-conv twice; three alternating rtx /
# PyTorch passes over gemm and conv.
set -uo pipefail
source benches/gpu/env.sh
export PYTHONUNBUFFERED=1
for i in 1 2; do RTX_REQUIRE_CUDA=1 timeout 60 .gpu/bin/test-conv > /tmp/t.log 2>&1; echo "test-conv $i rc=$? $(grep '^test result' /tmp/t.log | cut -c1-40)"; done
mkdir -p /tmp/p
for i in 1 2 3; do
  timeout 150 .gpu/bin/bench-harness --bench gemm conv > /tmp/p/rtx$i.jsonl 2>/dev/null; echo "rtx $i rc=$?"
  timeout 200 python3 benches/torch_baseline.py gemm conv > /tmp/p/torch$i.jsonl 2>/tmp/torch.err; echo "torch $i rc=$?"; tail -2 /tmp/torch.err
done
tar czf $OUT/passes.tgz -C /tmp/p .
python3 - <<'PY'
import json, statistics
def load(f):
    d = {}
    for l in open(f):
        try: j = json.loads(l)
        except ValueError: continue
        if "case" in j: d[j["case"]] = j
    return d
runs = {k: [load(f"/tmp/p/{k}{i}.jsonl") for i in (1, 2, 3)] for k in ("rtx", "torch")}
print("%-24s %-22s %-22s %-22s %s" % ("case", "rtx ms", "torch ms", "torch graph ms", "ratios of medians: torch / graph"))
f = lambda xs: "/".join("%.4f" % x for x in xs)
for c in runs["rtx"][0]:
    if not (c.startswith("gemm_") or c.startswith("conv_") or c.startswith("bmm")) or "cache" in c: continue
    r = [d[c]["rtx_ms"] for d in runs["rtx"] if c in d]
    t = [d[c]["torch_ms"] for d in runs["torch"] if c in d]
    g = [d[c]["graph_ms"] for d in runs["torch"] if c in d and "graph_ms" in d[c]]
    if not (r and t and g): continue
    m = statistics.median
    print("%-24s %-22s %-22s %-22s %.3f / %.3f" % (c, f(r), f(t), f(g), m(t) / m(r), m(g) / m(r)))
for c in ("gemm_plan_cache", "conv_algo_cache"):
    print(c, {k: v for k, v in runs["rtx"][0].get(c, {}).items() if k not in ("case", "rtx_ms", "bytes", "flops")})
PY
