#!/usr/bin/env bash
# GPU run 20: the test-gemm hang (run 19: 1 of 5 runs stuck with 4 tests running for
# over 60 s; run 18: the 4th of 4 runs; run 17: SIGSEGV). Runs test-gemm (an unstripped
# copy, .gpu/bin/dbg-test-gemm, so stacks have Rust names) up to 40 times with a 25 s
# watchdog; a stuck process gets every thread's stack dumped (gdb, else /proc) into
# $OUT/hangN.txt and is killed; stops after two hangs. Then every test executable once.
set -uo pipefail
export RTX_KERNEL_CACHE=$PWD/.gpu/kcache RTX_REQUIRE_CUDA=1 RUST_BACKTRACE=1
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu /usr/local/nvidia/lib64; do
  [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH
echo "gdb: $(command -v gdb || echo none); nproc $(nproc); driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader)"
dump() { # pid file
  local p=$1 f=$2
  for t in /proc/$p/task/*; do echo "task $(basename $t) $(cat $t/comm) wchan=$(cat $t/wchan 2>/dev/null) syscall=$(cut -d' ' -f1 $t/syscall 2>/dev/null)"; done > $f
  if command -v gdb >/dev/null; then timeout 90 gdb -q -batch -p $p -ex "set pagination off" -ex "thread apply all bt 30" >> $f 2>&1; fi
}
hangs=0; crashes=0
for i in $(seq 1 40); do
  s=$(date +%s.%N)
  .gpu/bin/dbg-test-gemm > /tmp/g$i.log 2>&1 & pid=$!
  n=0
  while kill -0 $pid 2>/dev/null && [ $n -lt 125 ]; do sleep 0.2; n=$((n+1)); done
  if kill -0 $pid 2>/dev/null; then
    hangs=$((hangs+1)); echo "run $i: STUCK after 25 s; running tests:"; grep -E "^test .* \.\.\. *$|has been running" /tmp/g$i.log | head; 
    dump $pid $OUT/hang$hangs.txt; kill -9 $pid; wait $pid 2>/dev/null
    cp /tmp/g$i.log $OUT/hang$hangs.log
    [ $hangs -ge 2 ] && break
  else
    wait $pid; rc=$?
    printf "run %2d rc=%s %.1f s %s\n" $i $rc $(awk "BEGIN{print $(date +%s.%N) - $s}") "$(grep -E '^test result' /tmp/g$i.log | cut -c1-40)"
    if [ $rc -ne 0 ]; then crashes=$((crashes+1)); tail -25 /tmp/g$i.log; cp /tmp/g$i.log $OUT/fail$crashes.log; fi
  fi
done
echo "hangs=$hangs failures=$crashes"
OUT=/tmp/testlogs timeout 200 bash .gpu/run tests 2>&1 | grep -vE "^test result: ok"; echo "tests rc=${PIPESTATUS[0]}"
