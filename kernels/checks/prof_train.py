#!/usr/bin/env python3
"""Launches a few training kernels at the benchmark sizes, for a profiler (ncu) to read:
ln_fwd_bf16 and ln_bwd_pipe_bf16 at 8192 x 4096, emb_bwd_f32 at [50257, 768] with 8192
uniform ids (its preparation launches first). Each kernel runs `--reps` times (default 3).

    ncu --clock-control none -k regex:'ln_fwd_bf16|ln_bwd_pipe_bf16|emb_bwd_f32' -c 3 \\
        python3 kernels/checks/prof_train.py

--ew: instead, rtx's exp f16 and add f32 kernels at 2^28 elements (the launcher's grid) and then
PyTorch's, for a side-by-side reading (benches/gpu/run prof-ew):

    ncu --clock-control none -k regex:'ew_exp_f16|ew_add_f32|elementwise' -c 8 \\
        python3 kernels/checks/prof_train.py --ew --reps 2
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import train_kernels_check as t  # noqa: E402


def ew(reps):
    """exp f16 and add f32 at 2^28: rtx's kernels at the launcher's grid, then PyTorch's."""
    mod = t.Module("elementwise")
    n = 1 << 28
    for dt, op in ((torch.float16, "exp"), (torch.float32, "add")):
        a = torch.randn(n, device="cuda").to(dt)
        b = torch.randn(n, device="cuda").to(dt)
        y = torch.empty_like(a)
        vec = 16 // a.element_size()
        name = "ew_%s_%s" % (op, t.tname(dt))
        # the launcher's grid (rtx_kernels::launch::elementwise_grid): a 16-byte vector per thread
        grid = (n + t.BLOCK * vec - 1) // (t.BLOCK * vec)
        args = ((t.ptr(a), t.ptr(b), t.ptr(y), t.np.uint64(n)) if op == "add"
                else (t.ptr(a), t.ptr(y), t.np.uint64(n)))
        for _ in range(reps):
            mod.launch(name, grid, args)
        for _ in range(reps):
            if op == "add":
                torch.add(a, b, out=y)
            else:
                torch.exp(a, out=y)
        torch.cuda.synchronize()
        del a, b, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ew", action="store_true",
                    help="only the element-wise kernels: exp f16 and add f32 at 2^28, rtx's then PyTorch's "
                         "(ncu -k regex:'ew_exp_f16|ew_add_f32|vectorized_elementwise')")
    a = ap.parse_args()
    t.SMS = torch.cuda.get_device_properties(0).multi_processor_count
    if a.ew:
        ew(a.reps)
        print("done")
        return
    norm, emb = t.Module("norm"), t.Module("embedding")
    rows, d = 8192, 4096
    x, g, b, dy = t.ln_inputs(rows, d, torch.bfloat16)
    y = torch.empty_like(x)
    mean, rstd = torch.empty(rows, device="cuda"), torch.empty(rows, device="cuda")
    dx, dg, db = torch.empty_like(x), torch.empty_like(g), torch.empty_like(b)
    sc = t.ln_scratch(rows, d)
    ln, pipe = t.LN(norm), t.LNPipe(norm, launcher=True)
    em = t.Emb(emb)
    v, e, n = 50257, 768, 8192
    ids = torch.randint(0, v, (n,), device="cuda", dtype=torch.int32)
    edy = torch.randn(n, e, device="cuda")
    dt = torch.empty(v, e, device="cuda")
    esc = em.scratch(n, v)
    for _ in range(a.reps):
        ln.fwd(x, g, b, y, mean, rstd)
        pipe.bwd(dy, x, mean, rstd, g, dx, dg, db, sc)
        em.bwd(edy, ids, v, dt, esc)
    torch.cuda.synchronize()
    print("done")


if __name__ == "__main__":
    main()
