#!/usr/bin/env bash
# GPU run 38: which kernels the 4096³/8192³ f16 and bf16 GEMMs run, in PyTorch (kernel
# names from torch.profiler) and in rtx (the plan's cuBLASLt configuration, RTX_LOG),
# after run 37 measured rtx 1.5-2.7 % behind at 4096 with back-to-back timing.
set -uo pipefail
source benches/gpu/env.sh
python3 - <<'PY'
import torch
from torch.profiler import profile, ProfilerActivity
for dt in (torch.float16, torch.bfloat16):
    for n in (4096, 8192):
        a = torch.rand(n, n, device="cuda", dtype=dt) * 2 - 1
        b = torch.rand(n, n, device="cuda", dtype=dt) * 2 - 1
        for _ in range(3): torch.matmul(a, b)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(20): torch.matmul(a, b)
            torch.cuda.synchronize()
        for e in p.key_averages():
            if e.device_type.name == "CUDA" or "gemm" in e.key.lower() or "sm90" in e.key:
                print(f"torch {dt} {n}: {e.key[:200]}  n={e.count} avg_us={e.device_time:.1f}" if hasattr(e, "device_time") else f"torch {dt} {n}: {e.key[:200]} n={e.count}")
PY
RTX_LOG=rtx_ops=debug timeout 120 .gpu/bin/bench-harness --bench gemm 2>&1 >/dev/null | grep "cuBLASLt plan" | grep -E "dtype=(F16|BF16) m=(4096|8192)" | sed -E 's/^.*DEBUG //'
which ncu nsys 2>/dev/null
