#!/usr/bin/env python3
"""Launches the D = 128 TMA attention forward for calls without a mask
(flash_fwd_tma_nm_d128_bf16 of attention_tma.cu, from the CUBIN `tmanm` of
`attention_wgmma_check.py --build`) at a benchmark size, for a profiler (ncu) to read next to
PyTorch's SDPA forward on its cuDNN backend. bf16, B = 4, H = 16, L = 4096, D = 128, not causal
(--causal: causal; --L: another length, B = 16384 / L). The grid is the launcher's: one block
per SM taking work tiles from the counter up to 4096 keys, a block per tile beyond
(--tiles: a block per tile at any length). Each kernel runs `--reps` times (default 2); the
first is a warm-up for the timing printed at the end (CUDA events, no profiler: run it without
ncu for the times). --only a,b,a,b times the kernel of each named CUBIN in that order, in one
process (an A/B comparison of compile-time variants with the default tiles, e.g. `tmanm,tmawa`;
each one's output checked against SDPA's), --no-sdpa leaves out SDPA's timing.

    ncu --clock-control none -k regex:'flash_fwd_tma|cudnn|sdpa|fmha|fprop' -c 2 \\
        --section SpeedOfLight --section WarpStateStats --section SourceCounters \\
        -o fwd python3 kernels/checks/prof_attention_fwd.py --reps 1
    ncu --import fwd.ncu-rep --page source --csv --print-source sass > sass.csv
    python3 kernels/checks/ncu_source_summary.py sass.csv --top 40

(benches/gpu/run prof-attn-fwd runs these.)
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import attention_check as ac  # noqa: E402  (sets TMPDIR under $OUT, imports torch, cupy)
import attention_wgmma_check as wc  # noqa: E402
import cupy  # noqa: E402
from check_util import event_times  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--L", type=int, default=4096)
    ap.add_argument("--tiles", action="store_true")
    ap.add_argument("--cubins", default=wc.DEFAULT_CUBINS)
    ap.add_argument("--only", default="tmanm", help="CUBINs (mask-less builds, default tiles), timed in this order")
    ap.add_argument("--no-sdpa", action="store_true")
    a = ap.parse_args()
    L, D, dt = a.L, 128, "bf16"
    B, H = 16384 // L, 2048 // D
    causal = int(a.causal)
    kerns = {}
    threads, smem, br = wc.tma_cfg({"ATTN_TMA_NOMASK": 1}, D)
    for name in a.only.split(","):
        path = os.path.join(a.cubins, name + ".cubin")
        if not os.path.exists(path):
            print("no %s (python3 kernels/checks/attention_wgmma_check.py --build)" % path)
            return 1
        if name not in kerns:
            kerns[name] = cupy.RawModule(path=path).get_function("flash_fwd_tma_nm_d128_bf16")
            kerns[name].max_dynamic_shared_size_bytes = smem

    torch.manual_seed(0)
    q, k, v = ((torch.rand(B, H, L, D, device="cuda") * 2 - 1).to(torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    lse = torch.empty(B, H, L, device="cuda", dtype=torch.float32)
    p = ac.make_params(q, k, v, o, lse, None, (0, 0, 0), causal)
    tp = wc.tma_fwd_params(ac.PARAMS_DTYPE, wc.TensorMaps(), p, B, H, L, D, True, br)
    blocks = (L + br - 1) // br * H * B
    persist = L <= 4096 and not a.tiles
    sched = torch.zeros(2, dtype=torch.int32, device="cuda")
    if persist:
        blocks = min(blocks, torch.cuda.get_device_properties(0).multi_processor_count)
        tp["sched"] = sched.data_ptr()

    def rtx(kern):
        kern((blocks, 1, 1), (threads, 1, 1), (tp,), shared_mem=smem)

    def sdpa():
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with torch.no_grad(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))

    fl = 4.0 * B * H * L * L * D * (0.5 if causal else 1.0)
    grid = "persistent" if persist else "block per tile"
    runs = [("%s %s (%s)" % (n, "flash_fwd_tma_nm_d128", grid), lambda n=n: rtx(kerns[n])) for n in a.only.split(",")]
    ok = True
    ref = None  # SDPA's output, computed after the first rtx timing (so that ncu -c 2 sees rtx's kernel and SDPA's first)
    for name, fn in runs + ([] if a.no_sdpa else [("sdpa cudnn fwd", sdpa)]):
        o.fill_(float("nan"))  # (poisoned: an unwritten element fails the check below)
        ms = event_times(fn, a.reps)[-1]
        line = "%-46s %8.3f ms  %6.1f TFLOP/s  (L=%d causal=%d)" % (name, ms, fl / (ms * 1e-3) / 1e12, L, causal)
        if fn is not sdpa:
            if ref is None:
                ref = sdpa()
            err = ac.relerr(o, ref)
            left = sched.tolist()
            ok = ok and err < 2e-2 and left == [0, 0]
            line += "  rel err %.2e, counters %s" % (err, left)
        print(line, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
