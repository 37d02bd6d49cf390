#!/usr/bin/env bash
# GPU run 39: run 38 found rtx and PyTorch running the same cuBLAS kernel for bf16 4096³
# (nvjet 256x128, cluster 1x2) yet rtx 2.7 % slower back to back (run 37). Is the kernel
# itself slower in rtx (ncu: its duration at locked clocks, and with the boost clock), or
# is the difference between kernels? ncu on both processes, the same kernel name.
set -uo pipefail
source benches/gpu/env.sh
N=/usr/local/cuda/bin/ncu
K='regex:nvjet_sm90_tst_256x128'
M=gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,dram__throughput.avg.pct_of_peak_sustained_elapsed
for cc in base none; do
  echo "== clock-control $cc: rtx"
  timeout 70 $N --clock-control $cc -k "$K" --launch-skip 5 --launch-count 3 --metrics $M --csv .gpu/bin/bench-harness --bench gemm 2>/dev/null | grep -E "nvjet" | awk -F'","' '{print $5, $(NF-2), $(NF-1), $NF}' | cut -c1-200
  echo "== clock-control $cc: torch"
  timeout 70 $N --clock-control $cc -k "$K" --launch-skip 5 --launch-count 3 --metrics $M --csv python3 benches/torch_baseline.py gemm 2>/dev/null | grep -E "nvjet" | awk -F'","' '{print $5, $(NF-2), $(NF-1), $NF}' | cut -c1-200
done
