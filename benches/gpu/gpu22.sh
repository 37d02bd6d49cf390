#!/usr/bin/env bash
# GPU run 22: the teardown changes (pools kept for reuse instead of destroyed, actors
# tear down one at a time, cuBLAS handle only for the fallback) against the driver
# deadlock of runs 20-21: test-gemm (unstripped copy) 30 times with a 20 s watchdog and
# test-conv 5 times; then every test executable, every bench suite and PyTorch.
set -uo pipefail
export RTX_KERNEL_CACHE=$PWD/.gpu/kcache RTX_REQUIRE_CUDA=1 RUST_BACKTRACE=1 PYTHONUNBUFFERED=1
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu /usr/local/nvidia/lib64; do
  [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH
G=/usr/local/cuda/bin/cuda-gdb
loop() { # exe runs
  local exe=$1 runs=$2 hangs=0 fails=0 ok=0 t0=$(date +%s)
  for i in $(seq 1 $runs); do
    $exe > /tmp/r$i.log 2>&1 & pid=$!
    n=0; while kill -0 $pid 2>/dev/null && [ $n -lt 100 ]; do sleep 0.1; n=$((n+1)); done
    if kill -0 $pid 2>/dev/null; then
      hangs=$((hangs+1)); echo "$exe run $i: STUCK"
      if [ $hangs = 1 ]; then
        timeout 150 $G -q -batch -p $pid -ex "set pagination off" -ex "thread apply all bt 30" > $OUT/hang.txt 2>&1
      fi
      kill -9 $pid; wait $pid 2>/dev/null
    else
      wait $pid; rc=$?
      if [ $rc = 0 ]; then ok=$((ok+1)); else fails=$((fails+1)); echo "$exe run $i rc=$rc"; grep -E "panicked|FAILED" -A1 /tmp/r$i.log | head -6; fi
    fi
  done
  echo "== $exe: ok=$ok failed=$fails stuck=$hangs in $(( $(date +%s) - t0 )) s"
}
loop .gpu/bin/dbg-test-gemm 30
loop .gpu/bin/test-conv 5
OUT=/tmp/testlogs timeout 200 bash .gpu/run tests 2>&1 | grep -vE "^test result: ok"; echo "tests rc=${PIPESTATUS[0]}"
timeout 200 .gpu/bin/bench-harness --bench ew reduce chain gemm conv streams speedup attention raw > $OUT/rtx.jsonl 2> $OUT/rtx.err; echo "harness rc=$?"
timeout 200 python3 benches/torch_baseline.py ew reduce chain gemm conv streams attention > $OUT/torch.jsonl 2> $OUT/torch.err; echo "torch rc=$?"
python3 benches/compare.py $OUT/rtx.jsonl $OUT/torch.jsonl > $OUT/table.md
grep -E "conv|streams_8x200_linear|gemm_.*_(1024|4096|8192)|bmm|chain|cache" $OUT/table.md
