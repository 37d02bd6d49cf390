#!/usr/bin/env bash
# GPU run 18: test-gemm crashed (SIGSEGV) once in run 17: rerun it serially and in
# parallel, and under gdb where the host has it, to find the crashing test.
set -uo pipefail
export RTX_KERNEL_CACHE=$PWD/.gpu/kcache
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu /usr/local/nvidia/lib64; do
  [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH RTX_REQUIRE_CUDA=1
for i in 1 2 3 4; do .gpu/bin/test-gemm --test-threads=1 > /tmp/s$i.log 2>&1; echo "serial $i rc=$?"; grep -E "^test " /tmp/s$i.log | tail -2; done
for i in 1 2 3 4 5 6; do .gpu/bin/test-gemm > /tmp/p$i.log 2>&1; echo "parallel $i rc=$?"; done
for t in test-dag test-conv test-memory test-attention; do .gpu/bin/$t > /tmp/$t.log 2>&1; echo "$t rc=$?"; done
if command -v gdb >/dev/null; then
  for i in 1 2 3; do gdb -q -batch -ex run -ex "thread apply all bt 8" --args .gpu/bin/test-gemm > /tmp/gdb$i.log 2>&1; if grep -q SIGSEGV /tmp/gdb$i.log; then grep -B2 -A40 SIGSEGV /tmp/gdb$i.log | head -80; break; fi; echo "gdb $i: no crash"; done
else echo "no gdb"; fi
