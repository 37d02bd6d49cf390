#!/usr/bin/env bash
# GPU run 30 (next session's first): the streams suite's dependence on what ran before
# (runs 24-29). Bisects the conv suite (one tiny conv, i.e. cuDNN's first use, against
# the six layers) and profiles the slow and the fast case with the actors' release and
# idle phases (RTX_PROFILE=1; <phase>_ms = total per run over the actors).
set -uo pipefail
source benches/gpu/env.sh
keys="execute_ms record_ms publish_ms release_ms idle_ms inputs_ms watch_finish_ms watch_wait_ms"
for pre in "" convtiny conv; do
  timeout 120 .gpu/bin/bench-harness --bench $pre streams > $OUT/p-$pre.jsonl 2>/dev/null; echo "== [$pre] rc=$?"; show_streams $OUT/p-$pre.jsonl
done
for pre in "" conv; do
  RTX_PROFILE=1 timeout 120 .gpu/bin/bench-harness --bench $pre streams > $OUT/prof-$pre.jsonl 2>/dev/null; echo "== profiled [$pre] rc=$?"; show_streams $OUT/prof-$pre.jsonl $keys
done
