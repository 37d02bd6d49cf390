#!/usr/bin/env bash
# GPU run 43: the conv layers over more passes (run 42: 7²·512→512 3×3 read 0.93 against
# PyTorch eager in two of three passes, whose own time moved 0.018-0.025 ms). Five
# alternating rtx / PyTorch passes over the conv suite, per-pass ratios against PyTorch
# eager (torch_ms) and against its CUDA-graph device time (graph_ms).
set -uo pipefail
source benches/gpu/env.sh
export PYTHONUNBUFFERED=1
mkdir -p /tmp/p
for i in 1 2 3 4 5; do
  timeout 100 .gpu/bin/bench-harness --bench conv > /tmp/p/rtx$i.jsonl 2>/dev/null; echo -n "rtx $i rc=$? "
  timeout 120 python3 benches/torch_baseline.py conv > /tmp/p/torch$i.jsonl 2>/tmp/torch.err; echo "torch $i rc=$?"
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
R = [load(f"/tmp/p/rtx{i}.jsonl") for i in range(1, 6)]
T = [load(f"/tmp/p/torch{i}.jsonl") for i in range(1, 6)]
m = statistics.median
for c in R[0]:
    if not c.startswith("conv_") or "cache" in c or "tiny" in c: continue
    r = [d[c]["rtx_ms"] for d in R]; t = [d[c]["torch_ms"] for d in T]; g = [d[c]["graph_ms"] for d in T]
    per = " ".join("%.2f" % (b / a) for a, b in zip(r, t))
    print("%-24s rtx %s | eager %s | graph %s | eager/rtx median %.3f (passes %s) | graph/rtx %.3f" % (
        c, "/".join("%.4f" % x for x in r), "/".join("%.4f" % x for x in t), "/".join("%.4f" % x for x in g),
        m(t) / m(r), per, m(g) / m(r)))
PY
