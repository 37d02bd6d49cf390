#!/usr/bin/env python3
"""Launches a few training kernels at the benchmark sizes, for a profiler (ncu) to read:
ln_fwd_bf16 and ln_bwd_pipe_bf16 at 8192 x 4096, emb_bwd_f32 at [50257, 768] with 8192
uniform ids (its preparation launches first). Each kernel runs `--reps` times (default 3).

    ncu --clock-control none -k regex:'ln_fwd_bf16|ln_bwd_pipe_bf16|emb_bwd_f32' -c 3 \\
        python3 kernels/checks/prof_train.py
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import train_kernels_check as t  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    t.SMS = torch.cuda.get_device_properties(0).multi_processor_count
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
