#!/usr/bin/env bash
# GPU run 21: the test-gemm hang and crash, continued. Run 20 (no gdb on the host) saw
# 2 hangs and 1 SIGSEGV in 10 runs; every thread was in a futex wait, and the stuck
# 4-stream runtime's watchers had exited (actors in teardown). Here:
#  A. pools on: up to 15 runs, the first stuck one's threads dumped with cuda-gdb;
#  B. RTX_STREAM_POOLS=0 (default pool, no block cache): 20 runs, hangs and crashes counted;
#  C. pools on, under cuda-gdb: up to 5 runs, stacks at a SIGSEGV.
set -uo pipefail
export RTX_KERNEL_CACHE=$PWD/.gpu/kcache RTX_REQUIRE_CUDA=1 RUST_BACKTRACE=1
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu /usr/local/nvidia/lib64; do
  [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH
G=$(command -v cuda-gdb || echo /usr/local/cuda/bin/cuda-gdb); echo "cuda-gdb: $G"
loop() { # tag runs dump?
  local tag=$1 runs=$2 want=$3 hangs=0 fails=0 ok=0
  for i in $(seq 1 $runs); do
    .gpu/bin/dbg-test-gemm > /tmp/$tag$i.log 2>&1 & pid=$!
    n=0; while kill -0 $pid 2>/dev/null && [ $n -lt 100 ]; do sleep 0.2; n=$((n+1)); done
    if kill -0 $pid 2>/dev/null; then
      hangs=$((hangs+1)); echo "$tag run $i: STUCK"
      if [ "$want" = dump ] && [ $hangs = 1 ]; then
        for t in /proc/$pid/task/*; do echo "task $(basename $t) $(cat $t/comm)"; done > $OUT/$tag-hang.txt
        timeout 150 $G -q -batch -p $pid -ex "set pagination off" -ex "info threads" -ex "thread apply all bt 30" >> $OUT/$tag-hang.txt 2>&1
        echo "dump: $(wc -l < $OUT/$tag-hang.txt) lines"; cp /tmp/$tag$i.log $OUT/$tag-hang.log
      fi
      kill -9 $pid; wait $pid 2>/dev/null
      [ "$want" = dump ] && break
    else
      wait $pid; rc=$?
      if [ $rc = 0 ]; then ok=$((ok+1)); else fails=$((fails+1)); echo "$tag run $i rc=$rc"; grep -E "panicked|^test .*(FAILED|\.\.\. *$)" /tmp/$tag$i.log | head -5; fi
    fi
  done
  echo "== $tag: ok=$ok failed=$fails stuck=$hangs"
}
loop A 15 dump
export RTX_STREAM_POOLS=0; loop B 20 count; unset RTX_STREAM_POOLS
for i in 1 2 3 4 5; do
  timeout 100 $G -q -batch -ex "set pagination off" -ex run -ex "info threads" -ex "thread apply all bt 30" --args .gpu/bin/dbg-test-gemm > /tmp/C$i.log 2>&1
  echo "C run $i rc=$? $(grep -cE 'SIGSEGV|SIGABRT' /tmp/C$i.log) signals"
  if grep -qE "SIGSEGV|SIGABRT" /tmp/C$i.log; then cp /tmp/C$i.log $OUT/C-crash.txt; break; fi
done
