#!/usr/bin/env bash
# GPU run 32: the streams suite's dependence on what ran before (runs 24-29), bisected
# further, then every test executable on the code after the review mends (run 31's plan).
# - rawstreams: the same workload through cuBLASLt on k threads with no runtime, alone and
#   after conv: is the slow state the process's (driver, cuBLASLt), or the runtime's?
# - convtiny: is cuDNN's first use enough to make the suite fast?
# - every streams row carries the process's CPU user/system ms, minor faults and context
#   switches per run; the profiled runs the actors' phases incl. release and idle.
set -uo pipefail
source benches/gpu/env.sh
echo "== host"; nproc; lscpu | grep -E "Model name|Socket|NUMA node|MHz" | head; cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>/dev/null
keys="cpu_user_ms cpu_sys_ms minflt vcsw ivcsw submit_ms"
pkeys="$keys execute_ms record_ms publish_ms release_ms idle_ms inputs_ms watch_finish_ms watch_wait_ms"
for pre in "rawstreams" "conv rawstreams" "streams" "convtiny streams" "conv streams"; do
  f=$OUT/s-${pre// /-}.jsonl
  timeout 150 .gpu/bin/bench-harness --bench $pre > $f 2>/dev/null; echo "== [$pre] rc=$?"; show_streams $f $keys
done
for pre in "streams" "conv streams"; do
  f=$OUT/p-${pre// /-}.jsonl
  RTX_PROFILE=1 timeout 150 .gpu/bin/bench-harness --bench $pre > $f 2>/dev/null; echo "== profiled [$pre] rc=$?"; show_streams $f $pkeys
done
export RTX_REQUIRE_CUDA=1
OUT=/tmp/testlogs timeout 170 bash .gpu/run tests 2>&1 | grep -vE "^test result: ok"; echo "tests rc=${PIPESTATUS[0]}"
for i in 1 2 3; do timeout 30 .gpu/bin/test-gemm > /tmp/g$i.log 2>&1; echo "test-gemm $i rc=$? $(grep '^test result' /tmp/g$i.log | cut -c1-40)"; done
