#!/usr/bin/env bash
# GPU run 41: the streams workload's spread across processes on the final code (runs
# 33-40 read 6.8-10.4 ms for linear + relu on 4 streams): the suite alone in 6 processes,
# then PyTorch's streams suite twice.
set -uo pipefail
source benches/gpu/env.sh
for i in 1 2 3 4 5 6; do
  timeout 60 .gpu/bin/bench-harness --bench streams > /tmp/s$i.jsonl 2>/dev/null; echo "== rtx process $i rc=$?"; show_streams /tmp/s$i.jsonl submit_ms
done
for i in 1 2; do
  timeout 100 python3 benches/torch_baseline.py streams > /tmp/t$i.jsonl 2>/dev/null; echo "== torch $i rc=$?"
  python3 -c '
import json,sys
for l in open(sys.argv[1]):
    d=json.loads(l)
    if d["case"][-2:] in ("_1","_4"): print("   %-32s %7.2f ms" % (d["case"], d["torch_ms"]))' /tmp/t$i.jsonl
done
