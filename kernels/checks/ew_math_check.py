#!/usr/bin/env python3
"""Element-wise exp and add: rtx's kernels as the runtime compiles them, against PyTorch,
on a GPU host.

    python3 kernels/checks/ew_math_check.py --cubins DIR [--variants elementwise,...] [--pairs 4]
        [--blocks 256,128] [--sizes 26,28] [--ops exp,add] [--dtypes f16,bf16,f32] [--once]

DIR holds builds of `kernels/cuda/elementwise.cu` made *here* by rtx's own NVRTC path (the
ptxas example, so with exactly the runtime's flags: `rtx_kernels::Options::default()`,
i.e. `--gpu-architecture=sm_90 -std=c++17 -default-device`, precise math, denormals
kept), one file per variant, NAME.cubin; `--variants` names them (default: elementwise,
the tree's own build):

    cargo build --release -p rtx-kernels --example ptxas
    ./target/release/examples/ptxas elementwise --out=DIR            # DIR/elementwise.cubin
    ./target/release/examples/ptxas elementwise --out=D2 --flag=-DX=1 && mv D2/elementwise.cubin DIR/x.cubin

They are loaded as built (`cupy.RawModule(path=...)`), not compiled by cupy: cupy's own
NVRTC compile adds `-ftz=true` to every program, which flushes denormal results that the
runtime's kernels keep (exp of x < -87.3 in f32 / bf16).

Each variant is launched on the launcher's grid (`rtx_kernels::launch::elementwise_grid`:
one 16-byte vector per thread, 256 threads). Inputs are uniform in [-1, 1) drawn in f32
and rounded (as the harness and `benches/torch_baseline.py`); timing is
`torch_baseline.py`'s `time_cuda` (batches of 10 back-to-back calls between CUDA events,
median per call), the harness's method. Every variant is timed alternately with PyTorch
(`torch.exp(a, out=y)`, `torch.add(a, b, out=y)`) `--pairs` times in one process; the ratio
is PyTorch / rtx per pair, median over pairs.

Each variant's output is checked first (output poisoned with NaN): relative error by the
norm against float64, the fraction of elements that differ from PyTorch's bit for bit,
exp over the dtype's whole range (`wide_exp`) and, for f16, on every one of the 65,536
inputs through each of the kernel's paths (`exhaustive_f16`). Prints one line per case; exits 1 on a
failed check.
"""
import argparse
import os
import statistics
import sys
import tempfile

_OUT = os.environ.get("OUT")
_TMP = os.path.join(_OUT, "tmp") if _OUT else tempfile.mkdtemp(prefix="ew_math_")
os.makedirs(_TMP, exist_ok=True)
os.environ["TMPDIR"] = _TMP
os.environ.setdefault("CUPY_CACHE_IN_MEMORY", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import cupy  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "benches"))
from torch_baseline import time_cuda, uniform  # noqa: E402

BLOCK = 256
DTYPES = {"f16": torch.float16, "f32": torch.float32, "bf16": torch.bfloat16}


def load(cubins, variant):
    return cupy.RawModule(path=os.path.join(cubins, variant + ".cubin"))


def wide_exp(mods, dt, dname, n, vec):
    """exp over the dtype's whole useful range (f16: [-18, 11], from below its smallest
    subnormal to just under its overflow; bf16: [-95, 88]; f32: [-104, 88]): each variant's
    result against PyTorch's bit for bit (both are positive, so the distance of their bit
    patterns is the distance in units in the last place) and which of the two is nearer
    float64's exp. Returns the number of failed variants (NaN left, or more than 1 ulp from
    PyTorch)."""
    lo, hi = {"f16": (-18.0, 11.0), "bf16": (-95.0, 88.0), "f32": (-104.0, 88.0)}[dname]
    x = (torch.rand(n, device="cuda") * (hi - lo) + lo).to(dt)
    y = torch.empty_like(x)
    ref = torch.exp(x)
    exact = torch.exp(x.double())
    ib = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}[dt]
    grid = (n + BLOCK * vec - 1) // (BLOCK * vec)
    fails = 0
    for v, m in mods.items():
        y.fill_(float("nan"))
        m.get_function("ew_exp_" + dname)((grid, 1, 1), (BLOCK, 1, 1),
                                          (np.uint64(x.data_ptr()), np.uint64(y.data_ptr()), np.uint64(n)))
        torch.cuda.synchronize()
        nan = int(torch.isnan(y).sum())
        ulps = (y.view(ib).long() - ref.view(ib).long()).abs()
        nd = int((ulps > 0).sum())
        e_r = (y.double() - exact).abs()
        e_t = (ref.double() - exact).abs()
        worse, better = int((e_r > e_t).sum()), int((e_r < e_t).sum())
        ok = nan == 0 and int(ulps.max()) <= 1
        if nd:  # the largest differences and the first two
            idx = torch.topk(ulps, min(4, nd)).indices.tolist() + torch.nonzero(ulps)[:2, 0].tolist()
            for i in idx:
                print("    x %.9g: rtx %.9g (0x%x)  torch %.9g (0x%x)  exact %.9g" % (
                    float(x[i]), float(y[i]), int(y.view(ib)[i]) & 0xffffffff, float(ref[i]),
                    int(ref.view(ib)[i]) & 0xffffffff, float(exact[i])))
        fails += not ok
        print("wide exp %-4s [%g, %g] %-8s NaN %d, differs from torch in %d of %d (max %d ulp): "
              "nearer exact %d, farther %d  %s" % (dname, lo, hi, v, nan, nd, n, int(ulps.max()),
                                                   better, worse, "PASS" if ok else "FAIL"), flush=True)
    return fails


def exhaustive_f16(mods):
    """exp on every one of the 65,536 f16 bit patterns, through each of the kernel's paths:
    the launcher's grid (one vector per thread), a grid of 3 blocks (the grid-stride
    loops) and pointers one element off 16-byte alignment (element by element). Each
    result must equal PyTorch's torch.exp bit for bit (NaN for NaN); mismatches against
    float64's exp rounded to f16 (correct rounding) are counted too. Returns the number of
    failed variant / path pairs."""
    n = 1 << 16
    x = torch.arange(n, dtype=torch.int32, device="cuda").to(torch.int16).view(torch.float16)
    ref = torch.exp(x)
    exact = torch.exp(x.double()).to(torch.float16)
    fails = 0

    def same(u, v):
        both_nan = torch.isnan(u) & torch.isnan(v)
        return (u.view(torch.int16) == v.view(torch.int16)) | both_nan

    print("torch.exp against float64 rounded: %d of %d differ" % (int((~same(ref, exact)).sum()), n))
    for v, m in mods.items():
        k = m.get_function("ew_exp_f16")
        for path, off, grid in (("launcher grid", 0, n // (BLOCK * 8)), ("3 blocks", 0, 3),
                                ("unaligned", 1, n // (BLOCK * 8))):
            y = torch.full((n,), float("nan"), dtype=torch.float16, device="cuda")
            cnt = n - off
            k((grid, 1, 1), (BLOCK, 1, 1), (np.uint64(x[off:].data_ptr()), np.uint64(y[off:].data_ptr()),
                                            np.uint64(cnt)))
            torch.cuda.synchronize()
            bad_t = ~same(y[off:], ref[off:])
            bad_e = ~same(y[off:], exact[off:])
            nt, ne = int(bad_t.sum()), int(bad_e.sum())
            ok = nt == 0
            fails += not ok
            shown = ", ".join("0x%04x -> 0x%04x (torch 0x%04x)" % (
                int(x[off + i].view(torch.int16)) & 0xffff, int(y[off + i].view(torch.int16)) & 0xffff,
                int(ref[off + i].view(torch.int16)) & 0xffff) for i in torch.nonzero(bad_t)[:4, 0].tolist())
            print("exhaustive exp f16 %-8s %-13s: %d of %d differ from torch, %d from float64 rounded  %s%s" % (
                v, path, nt, cnt, ne, "PASS" if ok else "FAIL", (": " + shown) if shown else ""), flush=True)
    return fails


def once(a, mods, blocks):
    """One launch of each variant and of PyTorch's kernel per case, in that order."""
    for dname in a.dtypes.split(","):
        dt = DTYPES[dname]
        vec = 16 // torch.tensor([], dtype=dt).element_size()
        for p in map(int, a.sizes.split(",")):
            n = 1 << p
            x, b = uniform(n, dtype=dt), uniform(n, dtype=dt)
            y = torch.empty_like(x)
            for op in a.ops.split(","):
                ptrs = (x, y) if op == "exp" else (x, b, y)
                args = tuple(np.uint64(t.data_ptr()) for t in ptrs) + (np.uint64(n),)
                for v, m in mods.items():
                    for block in blocks:
                        grid = (n + block * vec - 1) // (block * vec)
                        m.get_function("ew_%s_%s" % (op, dname))((grid, 1, 1), (block, 1, 1), args)
                        print("launched %s %s 2^%d %s block %d" % (op, dname, p, v, block), flush=True)
                if op == "exp":
                    torch.exp(x, out=y)
                else:
                    torch.add(x, b, out=y)
                print("launched %s %s 2^%d torch" % (op, dname, p), flush=True)
            torch.cuda.synchronize()
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--cubins", required=True)
    ap.add_argument("--variants", default="elementwise")
    ap.add_argument("--sizes", default="26,28")
    ap.add_argument("--blocks", default="256",
                    help="threads per block to launch with (the launcher's: 256; the grid keeps one "
                         "16-byte vector per thread)")
    ap.add_argument("--ops", default="exp,add")
    ap.add_argument("--once", action="store_true",
                    help="launch each kernel (and PyTorch's) once per case, nothing else: for Nsight "
                         "Compute (ncu -k regex:'ew_|elementwise')")
    ap.add_argument("--dtypes", default="f16,f32")
    a = ap.parse_args()
    print("device: %s" % torch.cuda.get_device_name(0), flush=True)
    mods = {}
    for v in a.variants.split(","):
        mods[v] = load(a.cubins, v)
        k = mods[v].get_function("ew_exp_f16")
        print("variant %-8s ew_exp_f16: %d regs" % (v, k.attributes["num_regs"]), flush=True)
    blocks = [int(b) for b in a.blocks.split(",")]
    if a.once:
        return once(a, mods, blocks)
    fails = 0
    for dname in a.dtypes.split(","):
        dt = DTYPES[dname]
        vec = 16 // torch.tensor([], dtype=dt).element_size()
        for p in map(int, a.sizes.split(",")):
            n = 1 << p
            x = uniform(n, dtype=dt)
            b = uniform(n, dtype=dt)
            y = torch.empty_like(x)
            for op in a.ops.split(","):
                name = "ew_%s_%s" % (op, dname)
                if op == "exp":
                    args = (np.uint64(x.data_ptr()), np.uint64(y.data_ptr()), np.uint64(n))
                    ref64 = torch.exp(x.double())
                    tfn = lambda: torch.exp(x, out=y)  # noqa: E731
                    nbytes = 2 * n * x.element_size()
                else:
                    args = (np.uint64(x.data_ptr()), np.uint64(b.data_ptr()), np.uint64(y.data_ptr()),
                            np.uint64(n))
                    ref64 = x.double() + b.double()
                    tfn = lambda: torch.add(x, b, out=y)  # noqa: E731
                    nbytes = 3 * n * x.element_size()
                tfn()
                tref = y.clone()
                if op == "exp" and p == min(map(int, a.sizes.split(","))):
                    fails += wide_exp(mods, dt, dname, n, vec)
                    if dname == "f16":
                        fails += exhaustive_f16(mods)
                for v, m, block in [(v, m, bl) for v, m in mods.items() for bl in blocks]:
                    k = m.get_function(name)
                    grid = (n + block * vec - 1) // (block * vec)
                    if block != BLOCK:
                        v = "%s/b%d" % (v, block)

                    def rfn(k=k, args=args, grid=grid, block=block):
                        k((grid, 1, 1), (block, 1, 1), args)

                    y.fill_(float("nan"))
                    rfn()
                    torch.cuda.synchronize()
                    err = ((y.double() - ref64).norm() / ref64.norm()).item()
                    diff = (y != tref).double().mean().item()
                    tol = 1e-6 if dt == torch.float32 else 2e-3
                    ok = bool(torch.isfinite(y).all()) and err < tol
                    fails += not ok
                    rt_ms, pt_ms = [], []
                    for _ in range(a.pairs):
                        rt_ms.append(time_cuda(rfn))
                        pt_ms.append(time_cuda(tfn))
                    ratio = statistics.median(t / r for t, r in zip(pt_ms, rt_ms))
                    r_med, t_med = statistics.median(rt_ms), statistics.median(pt_ms)
                    print("%-4s %-4s 2^%d %-12s rtx %.4f ms (%.2f TB/s)  torch %.4f ms  torch/rtx %.3f  "
                          "[%s]  rel err %.2e  differs from torch %.4f%%  %s" % (
                              op, dname, p, v, r_med, nbytes / r_med / 1e9, t_med, ratio,
                              " ".join("%.3f" % (t / r) for t, r in zip(pt_ms, rt_ms)), err, 100 * diff,
                              "PASS" if ok else "FAIL"), flush=True)
            del x, b, y
            torch.cuda.empty_cache()
    print("FAILED %d" % fails if fails else "all checks passed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
