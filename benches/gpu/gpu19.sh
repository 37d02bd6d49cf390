#!/usr/bin/env bash
# GPU run 19: the final code of the previous session (alloc.rs back to run 15's
# lifetimes, wgmma.cuh, launch.rs split) -- every test executable, each timed, with the
# time from its "test result" line to its exit (run 18 saw test-gemm take ~45 s to exit);
# a process still alive 8 s after its result gets its threads' stacks dumped (gdb) and is
# killed. test-gemm then runs 4 more times. Then every bench suite and the PyTorch
# baselines, and the streams suite once more with RTX_PROFILE=1.
set -uo pipefail
export RTX_KERNEL_CACHE=$PWD/.gpu/kcache PYTHONUNBUFFERED=1 RTX_REQUIRE_CUDA=1 RUST_BACKTRACE=1
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu /usr/local/nvidia/lib64; do
  [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH
L=/tmp/testlogs; mkdir -p $L
run_one() { # name, log
  local t=$1 log=$2 start=$(date +%s.%N) res="" pid rc
  timeout 150 .gpu/bin/$t > $log 2>&1 & pid=$!
  while kill -0 $pid 2>/dev/null; do
    if [ -z "$res" ] && grep -q "^test result:" $log; then res=$(date +%s.%N); fi
    if [ -n "$res" ] && awk "BEGIN{exit !($(date +%s.%N) - $res > 8)}"; then
      echo "== $t alive 8 s after its result: stacks"
      if command -v gdb >/dev/null; then
        timeout 60 gdb -q -batch -p $(ps -o pid= --ppid $pid | head -1 | tr -d " ") -ex "thread apply all bt 12" 2>&1 | grep -E "^Thread|^#" | head -150
      else
        for tid in /proc/$(ps -o pid= --ppid $pid | head -1 | tr -d " ")/task/*; do echo "$tid $(cat $tid/comm) $(cat $tid/wchan 2>/dev/null)"; done
      fi
      kill -9 $(ps -o pid= --ppid $pid) 2>/dev/null; break
    fi
    sleep 0.2
  done
  wait $pid; rc=$?
  local end=$(date +%s.%N)
  printf "%-24s rc=%-3s %6.1f s" $t $rc $(awk "BEGIN{print $end - $start}")
  [ -n "$res" ] && printf "  exit after result %5.1f s" $(awk "BEGIN{print $end - $res}")
  echo "  $(grep -E '^test result:' $log | tail -1 | cut -c1-60)"
  [ $rc = 0 ] || tail -30 $log
}
for t in $(ls .gpu/bin | grep -E '^(unit|test)-'); do run_one $t $L/$t.log; done
for i in 1 2 3 4; do run_one test-gemm $L/gemm$i.log; done
timeout 200 .gpu/bin/bench-harness --bench ew reduce chain gemm conv streams speedup attention raw > $OUT/rtx.jsonl 2> $OUT/rtx.err; echo "harness rc=$?"
timeout 200 python3 benches/torch_baseline.py ew reduce chain gemm conv streams attention > $OUT/torch.jsonl 2> $OUT/torch.err; echo "torch rc=$?"
python3 benches/compare.py $OUT/rtx.jsonl $OUT/torch.jsonl > $OUT/table.md
grep -E "conv|streams_8x200|gemm_.*_(1024|4096|8192)|bmm|attn|chain|cache" $OUT/table.md
RTX_PROFILE=1 timeout 60 .gpu/bin/bench-harness --bench streams > $OUT/profile.jsonl 2>&1; echo "profile rc=$?"
