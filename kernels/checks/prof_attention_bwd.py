#!/usr/bin/env python3
"""Launches the D = 128 attention backward main kernels at a benchmark size, for a profiler
(ncu) to read next to cuDNN's: flash_bwd_wgmma_d128_bf16 (attention_wgmma_bwd.cu, the default)
and flash_bwd_tma_d128_bf16 (attention_tma_bwd.cu, the setting attn_bwd_tma) from the CUBINs of
`attention_wgmma_check.py --build` (.wgmma_cubin/: bwg.cubin, btma.cubin, wg.cubin,
attention.cubin), then PyTorch's SDPA backward on its cuDNN backend. bf16, B = 4, H = 16,
L = 4096 (--L: another length, B = 16384 / L), D = 128, not causal (--causal: causal); --only names
the main kernels and their order (default bwg,btma; any btma* variant of attention_wgmma_check.py
whose CUBIN was built), --no-sdpa leaves out SDPA. Each main kernel and the SDPA backward run
`--reps` times (default 2); the first of each is a warm-up for the timing printed at the end
(CUDA events, no profiler: run it without ncu for the times).

    ncu --clock-control none -k regex:'flash_bwd_(wgmma|tma)_d128|cudnn|flash|fmha|dgrad' -c 8 \\
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats \\
        --section MemoryWorkloadAnalysis python3 kernels/checks/prof_attention_bwd.py

(benches/gpu/run prof-attn runs that and keeps the report.)
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import attention_check as ac  # noqa: E402  (sets TMPDIR under $OUT, imports torch, cupy)
import attention_wgmma_check as wc  # noqa: E402
from check_util import event_times  # noqa: E402
import cupy  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--cubins", default=wc.DEFAULT_CUBINS)
    ap.add_argument("--only", default="bwg,btma",
                    help="main kernels, in order: bwg, btma or another of attention_wgmma_check.py's btma* "
                         "variants (its CUBIN from --cubins)")
    ap.add_argument("--no-sdpa", action="store_true", help="leave out SDPA's backward")
    ap.add_argument("--L", type=int, default=4096, help="sequence length (B = 16384 / L)")
    a = ap.parse_args()
    B, H, L, D, dt = max(1, 16384 // a.L), 16, a.L, 128, "bf16"
    causal = int(a.causal)
    mods = {}

    def launch(cubin, name, grid, block, smem, params):
        m = mods.get(cubin)
        if m is None:
            m = mods[cubin] = cupy.RawModule(path=os.path.join(a.cubins, cubin + ".cubin"))
        k = m.get_function(name)
        if smem > 48 * 1024:
            k.max_dynamic_shared_size_bytes = smem
        k(grid, block, (params,), shared_mem=smem)

    torch.manual_seed(0)
    q, k, v, do = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    o = torch.empty_like(q)
    lse = torch.empty(B, H, L, device="cuda", dtype=torch.float32)
    dsum = torch.empty(B, H, L, device="cuda", dtype=torch.float32)
    dqa = torch.empty(B, H, L, D, device="cuda", dtype=torch.float32)
    dq, dk, dv = (torch.empty_like(q) for _ in range(3))
    p = ac.make_params(q, k, v, o, lse, None, (0, 0, 0), causal, None, do, dsum, dqa, dq, dk, dv)
    threads, smem, br = wc.wg_cfg({}, D)
    launch("wg", "flash_fwd_wgmma_d%d_%s" % (D, dt), ((L + br - 1) // br, H, B), (threads, 1, 1), smem, p)
    rows = B * H * L
    rpb = ac.pre_rows_per_block(D)
    launch("attention", "flash_bwd_preprocess_d%d_%s" % (D, dt), ((rows + rpb - 1) // rpb, 1, 1), (256, 1, 1), 0, p)

    maps = wc.TensorMaps()

    mains = []
    variants = {n: d for (n, d, _) in wc.BWD_VARIANTS}
    for name in a.only.split(","):
        defs = variants.get(name, {})
        if not os.path.exists(os.path.join(a.cubins, name + ".cubin")):
            print("no %s.cubin in %s: skipped" % (name, a.cubins))
            continue
        threads, smem, bc = wc.bwg_cfg(defs, name)
        tma = name.startswith("btma")
        kern = "flash_bwd_%s_d%d_%s" % ("tma" if tma else "wgmma", D, dt)
        grid = ((L + bc - 1) // bc, H, B)
        arg = (wc.tma_bwd_params(ac.PARAMS_DTYPE, maps, p, B, H, H, L, L, D, True, wc.tbw_rows(defs, D))
               if tma else p)
        mains.append((name, lambda kern=kern, name=name, threads=threads, smem=smem, grid=grid, arg=arg: launch(
            name, kern, grid, (threads, 1, 1), smem, arg)))

    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))

    def sdpa_bwd():
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=bool(causal))
        torch.autograd.grad(out, (qg, kg, vg), do)

    fl = 2.5 * 4.0 * B * H * L * L * D * (0.5 if causal else 1.0)
    for name, fn in mains + ([] if a.no_sdpa else [("sdpa cudnn fwd+bwd", sdpa_bwd)]):
        ms = event_times(fn, a.reps)[-1]
        print("%-28s %8.3f ms  %6.1f TFLOP/s (backward FLOPs; the SDPA row includes its forward)" % (
            name, ms, fl / (ms * 1e-3) / 1e12), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
