#!/usr/bin/env python3
"""Correctness and speed check of the training kernels against PyTorch, on a GPU host.

    python3 kernels/checks/train_kernels_check.py [--no-check] [--no-bench] [--old DIR]
        [--only ln,ce,adamw,ew,emb]

Kernels: kernels/cuda/norm.cu (layer norm fwd / bwd: the backward on the cp.async ring,
the fused one and the three-kernel one; the forward and backward on bulk-copy rings,
norm_bulk.cuh, as the setting layer_norm_bulk takes them and in other shapes), loss.cu
(cross entropy fwd / bwd), optim.cu (AdamW, one launch per tensor and the multi-tensor
launch), embedding.cu (lookup and the deterministic scatter-add in five launches and, as
the setting embedding_one_launch takes it, in one: uniform, Zipf, all-equal and invalid
ids; the backward run twice and compared bit for bit), elementwise.cu (add, exp: only
timed, at several grid sizes). Each .cu is compiled with cupy's RawModule (NVRTC)
with the runtime's flags (rtx_kernels::Options::default(): sm_90, -std=c++17,
-default-device, precise math; plus -I kernels/cuda), to which cupy adds -ftz=true
(denormal results flushed, which the runtime's kernels keep). Before 2026-12-06 this
script compiled with --use_fast_math, which the runtime never used: figures it gave
until then (benches/RESULTS.md says which) timed fast-math builds.
kernels/checks/ew_math_check.py times the element-wise kernels from CUBINs built by
rtx's own NVRTC path instead.

1. Correctness against float64 PyTorch math on fresh torch.randn inputs, every output
   poisoned with NaN before the launch: relative error ||out - ref|| / ||ref|| (each
   output), PASS below 2e-2 for bf16 / f16 outputs and 1e-4 for f32 (AdamW: 1e-5). Shapes
   cover the vector paths (warp per row, block per row), the scalar fallbacks (odd sizes)
   and ignored rows (cross entropy).
2. Timing with CUDA events (medians of 20-40 runs after warm-up) against PyTorch's eager
   forms (F.layer_norm, F.cross_entropy, torch.optim.AdamW(fused=True), torch.add/exp)
   and the device copy peak (torch copy_ of 2 GiB); TB/s counts the fewest bytes each
   case must move (as benches/torch_train.py). The grids are the launchers'
   (ops/src/*/cuda.rs): min(work, SMs x 8) for the row kernels, a block per tile for the
   multi-tensor AdamW; element-wise add/exp are timed at several grids ("1vec", a
   16-byte vector per thread, is rtx_kernels::launch::elementwise_grid's). Rows tagged
   grid=occ (SMs x blocks per SM at the kernel's occupancy), LN_*= / CE_U= (compile-time
   variants of norm.cu / loss.cu; RTX_MT_* of optim.cu, EMB_* of embedding.cu) are
   experiments (each LN_*= variant is also run through the correctness check, its rows
   tagged [LN_*=...]). "copy ref" rows: a torch copy_ moving the same bytes as the case before
   it, in the same run (what a transfer of that size reaches). Timings put a ~1 ms GPU
   spin before each start event, so that the host's launch overhead is not timed. The per-tensor AdamW forms are bound
   here by Python's launch overhead (148 cupy launches).
   --old DIR also times an older tree's kernels, so that before and after come from one
   run: DIR holds its norm.cu, loss.cu, optim.cu and common.cuh, e.g.
       mkdir -p /tmp/old && for f in norm.cu loss.cu optim.cu common.cuh; do
           git show REV:kernels/cuda/$f > /tmp/old/$f; done

A table is printed last; a JSON summary goes to $OUT/train_kernels.json when OUT is set.
cupy's temporary files go under $OUT (or a private temp dir).
"""
import argparse
import json
import math
import os
import shutil
import sys
import tempfile

_OUT = os.environ.get("OUT")
_TMP = os.path.join(_OUT, "tmp") if _OUT else tempfile.mkdtemp(prefix="train_check_")
os.makedirs(_TMP, exist_ok=True)
os.environ["TMPDIR"] = _TMP
tempfile.tempdir = _TMP
os.environ.setdefault("CUPY_CACHE_IN_MEMORY", "1")
os.environ.setdefault("CUPY_CACHE_DIR", os.path.join(_TMP, "cupy_cache"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import cupy  # noqa: E402

from check_util import time_ms  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KDIR = os.path.join(ROOT, "kernels", "cuda")
DEV = "cuda"
BLOCK = 256
FINAL_BLOCK = 1024  # ln_bwd_final's block (LN_FINAL_BLOCK in norm.cu)
RESULTS = []   # (case, ours ms, ours TB/s, torch ms, torch TB/s, ratio, note)
FAILS = []
SUMMARY = {"checks": [], "bench": []}


def ptr(t):
    return np.uint64(0 if t is None else t.data_ptr())


# ---------------------------------------------------------------------------------------
# Compilation
# ---------------------------------------------------------------------------------------
class Module:
    def __init__(self, name, kdir=KDIR, defines=None):
        src = open(os.path.join(kdir, name + ".cu")).read()
        opts = ["-std=c++17", "-default-device", "-I" + kdir]
        opts += ["-D%s=%s" % kv for kv in (defines or {}).items()]
        self.mod = cupy.RawModule(code=src, options=tuple(opts + ["--gpu-architecture=sm_90"]))
        self.fns = {}
        self.tag = "%s%s" % (name, "" if not defines else str(defines))

    def fn(self, name):
        if name not in self.fns:
            self.fns[name] = self.mod.get_function(name)
        return self.fns[name]

    def resident(self, name, mode="rust"):
        """The grid cap. mode "rust": SMs x 8, as ops/src/kernels.rs's grid(); "occ": SMs x
        blocks per SM at the kernel's occupancy (registers and shared memory at 256
        threads; at most 8); "all": no cap."""
        if mode == "rust":
            return SMS * 8
        if mode == "all":
            return 1 << 30
        k = self.fn(name)
        regs = max(1, k.attributes["num_regs"])
        smem = k.attributes["shared_size_bytes"]
        per_warp = ((regs * 32 + 255) // 256) * 256
        by_regs = 65536 // (per_warp * (BLOCK // 32))
        by_smem = (228 * 1024) // (smem + 1024) if smem else 8
        return SMS * max(1, min(8, by_regs, by_smem))

    def final_block(self, t):
        """ln_bwd_final's block: FINAL_BLOCK, or fewer threads where the module's kernel is
        bound lower (an older tree's, given with --old, was launched with 256)."""
        return min(FINAL_BLOCK, self.fn("ln_bwd_final_" + t).attributes["max_threads_per_block"])

    def regs(self, name):
        a = self.fn(name).attributes
        return "%d regs, %d B smem, %d B local" % (a["num_regs"], a["shared_size_bytes"],
                                                    a["local_size_bytes"])

    def launch(self, name, grid, args, block=BLOCK, smem=0):
        if isinstance(grid, int):
            grid = (grid, 1, 1)
        k = self.fn(name)
        if smem and k.max_dynamic_shared_size_bytes < smem:
            k.max_dynamic_shared_size_bytes = smem
        k(grid, (block, 1, 1), args, shared_mem=smem)


def tname(dt):
    return {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}[dt]


def rel(out, ref):
    out = out.double()
    ref = ref.double()
    if not torch.isfinite(out).all():
        return float("nan")
    n = ref.norm().item()
    return (out - ref).norm().item() / (n if n > 0 else 1.0)


def check(name, errs, tol):
    """tol: a number, or a dict of one per output."""
    worst = max(errs.values())
    tols = tol if isinstance(tol, dict) else {k: tol for k in errs}
    ok = all(e == e and e < tols[k] for k, e in errs.items())
    SUMMARY["checks"].append({"case": name, "errs": errs, "ok": ok})
    line = "  ".join("%s %.2e" % kv for kv in errs.items())
    print("%s %-44s %s" % ("PASS" if ok else "FAIL", name, line), flush=True)
    if not ok:
        FAILS.append(name)
    return worst


def poison(shape, dt):
    return torch.full(shape, float("nan"), device=DEV, dtype=dt)


# ---------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------
# time_ms: check_util.py (shared with the other checks).


def report(case, ours, theirs, nbytes, note=""):
    tb = lambda ms: nbytes / (ms * 1e-3) / 1e12  # noqa: E731
    r = (case, ours, tb(ours), theirs, tb(theirs) if theirs else float("nan"),
         (theirs / ours) if theirs else float("nan"), note)
    RESULTS.append(r)
    SUMMARY["bench"].append(dict(zip(("case", "ms", "tbs", "torch_ms", "torch_tbs", "ratio", "note"), r)))
    print("  %-40s %8.4f ms %5.2f TB/s | torch %8.4f ms %5.2f TB/s | ratio %.2f %s" % r, flush=True)


# ---------------------------------------------------------------------------------------
# Layer norm
# ---------------------------------------------------------------------------------------
def ln_chunking(rows, d):
    tiles = (d + BLOCK - 1) // BLOCK
    want = min(max(4 * SMS // tiles, 1), 65535, rows)
    rpc = max((rows + want - 1) // want, (rows + 65534) // 65535)
    return rpc, (rows + rpc - 1) // rpc


class LN:
    """fused: the backward as ln_bwd_fused (dx + per-block partials, grid SMs x
    fused_blocks) + ln_bwd_final, as ops/src/norm/cuda.rs does on the register path;
    otherwise the three-kernel path (dx, part, final). fused_nv: the module's LN_FUSED_NV
    (vectors per thread of ln_bwd_fused; its register path needs d / V <= 256 x fused_nv,
    else the three-kernel path is taken, as the launcher's gate would have to)."""
    def __init__(self, mod, mode="rust", fused=True, fused_blocks=2, fused_nv=4):
        self.m = mod
        self.mode = mode
        self.fused = fused
        self.fused_blocks = fused_blocks
        self.fused_nv = fused_nv

    def fwd(self, x, g, b, y, mean, rstd, eps=1e-5):
        rows, d = x.shape
        name = "ln_fwd_" + tname(x.dtype)
        grid = max(1, min(rows, self.m.resident(name, self.mode)))
        self.m.launch(name, grid, (ptr(x), ptr(g), ptr(b), ptr(y), ptr(mean), ptr(rstd),
                                   np.uint64(rows), np.uint64(d), np.float32(eps)))

    def fused_ok(self, x):
        v = 16 // x.element_size()
        d = x.shape[1]
        return d % v == 0 and d // v <= BLOCK * self.fused_nv and d <= 8192

    def bwd(self, dy, x, mean, rstd, g, dx, dg, db, scratch):
        rows, d = x.shape
        t = tname(x.dtype)
        if self.fused and self.fused_ok(x):
            grid = max(1, min(rows, SMS * self.fused_blocks))
            pg, pb = scratch[0][: grid * d], scratch[1][: grid * d]
            self.m.launch("ln_bwd_fused_" + t, grid,
                          (ptr(dy), ptr(x), ptr(mean), ptr(rstd), ptr(g), ptr(dx), ptr(pg), ptr(pb),
                           np.uint64(rows), np.uint64(d)))
            self.m.launch("ln_bwd_final_" + t, (d + 31) // 32,
                          (ptr(pg), ptr(pb), ptr(dg), ptr(db), np.uint64(grid), np.uint64(d)), block=self.m.final_block(t))
            return
        n_dx = "ln_bwd_dx_" + t
        self.m.launch(n_dx, max(1, min(rows, self.m.resident(n_dx, self.mode))),
                      (ptr(dy), ptr(x), ptr(mean), ptr(rstd), ptr(g), ptr(dx), np.uint64(rows), np.uint64(d)))
        rpc, chunks = ln_chunking(rows, d)
        pg, pb = scratch[0][: chunks * d], scratch[1][: chunks * d]
        self.m.launch("ln_bwd_part_" + t, ((d + BLOCK - 1) // BLOCK, chunks, 1),
                      (ptr(dy), ptr(x), ptr(mean), ptr(rstd), ptr(pg), ptr(pb),
                       np.uint64(rows), np.uint64(d), np.uint64(rpc)))
        n_f = "ln_bwd_final_" + t
        grid = (d + 31) // 32
        self.m.launch(n_f, grid, (ptr(pg), ptr(pb), ptr(dg), ptr(db), np.uint64(chunks), np.uint64(d)),
                      block=self.m.final_block(t))


class LNPipe(LN):
    """The launcher's choice on sm_80+ (ops/src/norm/cuda.rs): the forward as LN, the
    backward on the register path as ln_bwd_pipe (the cp.async ring; grid SMs x blocks)
    + ln_bwd_final. nv / s / blocks: the module's LN_BPIPE_NV / LN_BPIPE_S /
    LN_BPIPE_BLOCKS (its dynamic shared memory follows them). The rows of fewer than 8
    KiB take the 3-kernel path, as the launcher does, when launcher=True."""
    def __init__(self, mod, bnv=4, bs=3, bblocks=1, launcher=False):
        super().__init__(mod)
        self.bnv, self.bs, self.bblocks, self.launcher = bnv, bs, bblocks, launcher
        self.bsmem = bs * (2 * bnv * BLOCK * 16 + 8 * BLOCK) + bnv * BLOCK * 16

    def bwd(self, dy, x, mean, rstd, g, dx, dg, db, scratch):
        rows, d = x.shape
        t = tname(x.dtype)
        v = 16 // x.element_size()
        if not (d % v == 0 and d // v <= BLOCK * self.bnv and d <= 8192) or (
                self.launcher and d * x.element_size() < 8192):
            return LN.bwd(LN(self.m, fused=False), dy, x, mean, rstd, g, dx, dg, db, scratch)
        grid = max(1, min(rows, SMS * self.bblocks))
        pg, pb = scratch[0][: grid * d], scratch[1][: grid * d]
        self.m.launch("ln_bwd_pipe_" + t, grid,
                      (ptr(dy), ptr(x), ptr(mean), ptr(rstd), ptr(g), ptr(dx), ptr(pg), ptr(pb),
                       np.uint64(rows), np.uint64(d)), smem=self.bsmem)
        self.m.launch("ln_bwd_final_" + t, (d + 31) // 32,
                      (ptr(pg), ptr(pb), ptr(dg), ptr(db), np.uint64(grid), np.uint64(d)), block=self.m.final_block(t))


class LNBulk(LNPipe):
    """The forward as ln_fwd_bulk (norm_bulk.cuh: rows copied whole into
    a ring in shared memory by bulk copies; one block of `threads` per SM), the backward
    as LNPipe's (the launcher's). threads / nv / s: the module's LN_FWD_BULK_THREADS /
    LN_FWD_BULK_NV / LN_FWD_BULK_S. Rows its ring path does not take go to LN.fwd."""
    SMEM = 232448 - 2048  # the most dynamic shared memory of a block (227 KiB) less its static part

    def __init__(self, mod, threads=256, nv=16, s=3):
        super().__init__(mod, launcher=True)
        self.threads, self.nv, self.s = threads, nv, s

    def plan(self, x, g, b, y):
        """(groups per block, dynamic shared memory) of ln_fwd_bulk for these rows (its
        groups as norm.cu's ln_group, stages as many as fit up to s), or None."""
        v = 16 // x.element_size()
        d = x.shape[1]
        nv = d // v
        if d % v or nv == 0 or nv > self.threads * self.nv or any(t.data_ptr() % 16 for t in (x, g, b, y)):
            return None
        gn = 32
        while gn < self.threads and gn * self.nv < nv:
            gn *= 2
        stage = self.threads // gn * nv * 16
        s = min(self.s, self.SMEM // stage)
        return (self.threads // gn, s * stage) if s else None

    def fwd(self, x, g, b, y, mean, rstd, eps=1e-5):
        rows, d = x.shape
        p = self.plan(x, g, b, y)
        if p is None:
            return LN.fwd(self, x, g, b, y, mean, rstd, eps)
        grid = max(1, min(SMS, (rows + p[0] - 1) // p[0]))
        self.m.launch("ln_fwd_bulk_" + tname(x.dtype), grid,
                      (ptr(x), ptr(g), ptr(b), ptr(y), ptr(mean), ptr(rstd), np.uint64(rows), np.uint64(d),
                       np.float32(eps)), block=self.threads, smem=p[1])


class LNBulkBwd(LNPipe):
    """The backward as ln_bwd_bulk (norm_bulk.cuh: dy and x rows copied
    whole into a ring in shared memory by bulk copies; one block of `threads` per SM, grid
    SMs, so SMs partial rows) + ln_bwd_final; the forward as `fwd_k` (an LNBulk on the same
    module) or ln_fwd. threads / nv / s: the module's LN_BWD_BULK_THREADS / LN_BWD_BULK_NV /
    LN_BWD_BULK_S. Rows off its path, and with short=False rows under 8 KiB (the
    launcher's gate for ln_bwd_pipe): LNPipe's (the launcher's) backward."""
    SMEM = LNBulk.SMEM

    def __init__(self, mod, threads=256, nv=4, s=6, fwd_k=None, short=False):
        super().__init__(mod, launcher=True)
        self.threads, self.nv, self.s, self.fwd_k, self.short = threads, nv, s, fwd_k, short

    def fwd(self, x, g, b, y, mean, rstd, eps=1e-5):
        if self.fwd_k is not None:
            return self.fwd_k.fwd(x, g, b, y, mean, rstd, eps)
        return LN.fwd(self, x, g, b, y, mean, rstd, eps)

    def bwd(self, dy, x, mean, rstd, g, dx, dg, db, scratch):
        rows, d = x.shape
        t = tname(x.dtype)
        v = 16 // x.element_size()
        nv = d // v
        if (d % v or nv == 0 or nv > self.threads * self.nv or (not self.short and d * x.element_size() < 8192)
                or any(u.data_ptr() % 16 for u in (dy, x, dx, g))):
            return LNPipe.bwd(self, dy, x, mean, rstd, g, dx, dg, db, scratch)
        gn = 32
        while gn < self.threads and gn * self.nv < nv:
            gn *= 2
        stage = self.threads // gn * 2 * nv * 16
        s = min(self.s, self.SMEM // stage)
        if s == 0:
            return LNPipe.bwd(self, dy, x, mean, rstd, g, dx, dg, db, scratch)
        grid = max(1, min(rows, SMS))
        pg, pb = scratch[0][: grid * d], scratch[1][: grid * d]
        self.m.launch("ln_bwd_bulk_" + t, grid,
                      (ptr(dy), ptr(x), ptr(mean), ptr(rstd), ptr(g), ptr(dx), ptr(pg), ptr(pb),
                       np.uint64(rows), np.uint64(d)), block=self.threads, smem=s * stage)
        self.m.launch("ln_bwd_final_" + t, (d + 31) // 32,
                      (ptr(pg), ptr(pb), ptr(dg), ptr(db), np.uint64(grid), np.uint64(d)), block=self.m.final_block(t))


def ln_scratch(rows, d):
    _, chunks = ln_chunking(rows, d)
    chunks = max(chunks, SMS * 4)
    return (torch.empty(chunks * d, device=DEV), torch.empty(chunks * d, device=DEV))


def ln_inputs(rows, d, dt):
    x = (torch.randn(rows, d, device=DEV) * 2 + 0.5).to(dt)
    g = (1 + 0.1 * torch.randn(d, device=DEV)).to(dt)
    b = (0.1 * torch.randn(d, device=DEV)).to(dt)
    dy = torch.randn(rows, d, device=DEV).to(dt)
    return x, g, b, dy


def check_ln(ln_fused, tag=""):
  for ln in (ln_fused, LN(ln_fused.m, fused=False)):
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        for rows, d in ((67, 768), (33, 4096), (19, 1000), (21, 771), (9, 2048), (5, 8192), (40, 96), (7, 1)):
            if dt == torch.float32 and d == 8192:
                d = 4100  # f32 past the register path: the scalar fallback
            x, g, b, dy = ln_inputs(rows, d, dt)
            y, mean, rstd = poison((rows, d), dt), poison((rows,), torch.float32), poison((rows,), torch.float32)
            ln.fwd(x, g, b, y, mean, rstd)
            dx, dg, db = poison((rows, d), dt), poison((d,), dt), poison((d,), dt)
            ln.bwd(dy, x, mean, rstd, g, dx, dg, db, ln_scratch(rows, d))
            torch.cuda.synchronize()
            xd, gd, bd = (t.double().requires_grad_() for t in (x, g, b))
            yr = F.layer_norm(xd, (d,), gd, bd, 1e-5)
            dxr, dgr, dbr = torch.autograd.grad(yr, (xd, gd, bd), dy.double())
            mr = xd.detach().mean(-1)
            rr = (xd.detach().var(-1, unbiased=False) + 1e-5).rsqrt()
            tol = 1e-4 if dt == torch.float32 else 2e-2
            check("%sln %s %dx%d%s" % (tag, tname(dt), rows, d, "" if ln.fused else " 3-kernel bwd"),
                  {"y": rel(y, yr), "mean": rel(mean, mr), "rstd": rel(rstd, rr),
                   "dx": rel(dx, dxr), "dg": rel(dg, dgr), "db": rel(db, dbr)}, tol)


def bench_ln(ln, old, variants=()):
    for rows, d in ((8192, 768), (8192, 4096)):
        dt = torch.bfloat16
        x, g, b, dy = ln_inputs(rows, d, dt)
        y, mean, rstd = (torch.empty(rows, d, device=DEV, dtype=dt), torch.empty(rows, device=DEV),
                         torch.empty(rows, device=DEV))
        dx, dg, db = torch.empty_like(x), torch.empty_like(g), torch.empty_like(b)
        sc = ln_scratch(rows, d)
        xb = rows * d * 2
        xr, gr, br = (t.detach().clone().requires_grad_() for t in (x, g, b))
        t_f = time_ms(lambda: F.layer_norm(xr, (d,), gr, br, 1e-5))
        t_fb = time_ms(lambda: torch.autograd.grad(F.layer_norm(xr, (d,), gr, br, 1e-5), (xr, gr, br), dy))
        copy_ref(2 * xb, "ln fwd ")
        copy_ref(5 * xb, "ln fwd+bwd ")
        ks = [("", ln), ("3-kernel bwd ", LN(ln.m, fused=False))] + [("%s " % t, k) for t, k in variants]
        for tag, k in ks + ([("old ", old)] if old else []):
            f = lambda: k.fwd(x, g, b, y, mean, rstd)  # noqa: E731
            fb = lambda: (k.fwd(x, g, b, y, mean, rstd), k.bwd(dy, x, mean, rstd, g, dx, dg, db, sc))  # noqa: E731
            report("%sln fwd bf16 %dx%d" % (tag, rows, d), time_ms(f), t_f, 2 * xb)
            report("%sln fwd+bwd bf16 %dx%d" % (tag, rows, d), time_ms(fb), t_fb, 5 * xb)
            bw = time_ms(lambda: k.bwd(dy, x, mean, rstd, g, dx, dg, db, sc))
            report("%sln bwd only %dx%d" % (tag, rows, d), bw, t_fb - t_f, 3 * xb, "(torch: fb - f)")
            if isinstance(k, LNPipe):
                t = tname(dt)
                grid = max(1, min(rows, SMS * k.bblocks))
                a_f = (ptr(sc[0]), ptr(sc[1]), ptr(dg), ptr(db), np.uint64(grid), np.uint64(d))
                report("  of which ln_bwd_final (%d partial rows)" % grid,
                       time_ms(lambda: k.m.launch("ln_bwd_final_" + t, (d + 31) // 32, a_f, block=k.m.final_block(t))), float("nan"),
                       2 * grid * d * 4)
            if tag == "3-kernel bwd ":
                t = tname(dt)
                n_dx = "ln_bwd_dx_" + t
                gdx = max(1, min(rows, k.m.resident(n_dx, k.mode)))
                a_dx = (ptr(dy), ptr(x), ptr(mean), ptr(rstd), ptr(g), ptr(dx), np.uint64(rows), np.uint64(d))
                report("  of which dx %dx%d" % (rows, d), time_ms(lambda: k.m.launch(n_dx, gdx, a_dx)),
                       float("nan"), 3 * xb)
                rpc, chunks = ln_chunking(rows, d)
                a_p = (ptr(dy), ptr(x), ptr(mean), ptr(rstd), ptr(sc[0]), ptr(sc[1]), np.uint64(rows),
                       np.uint64(d), np.uint64(rpc))
                grid_p = ((d + BLOCK - 1) // BLOCK, chunks, 1)
                report("  of which part %dx%d" % (rows, d),
                       time_ms(lambda: k.m.launch("ln_bwd_part_" + t, grid_p, a_p)), float("nan"), 2 * xb)


# ---------------------------------------------------------------------------------------
# Cross entropy
# ---------------------------------------------------------------------------------------
class CE:
    def __init__(self, mod, mode="rust"):
        self.m = mod
        self.mode = mode
        self.part_loss = torch.zeros(1024, device=DEV, dtype=torch.float64)
        self.part_count = torch.zeros(1024, device=DEV, dtype=torch.int32)
        self.part_bad = torch.zeros(1024, device=DEV, dtype=torch.int32)
        self.counter = torch.zeros(1, device=DEV, dtype=torch.int32)

    def fwd(self, x, lab, lse, loss, bad, ignore=None):
        rows, cols = x.shape
        name = "ce_fwd_%s_i32" % tname(x.dtype)
        grid = max(1, min(rows, self.m.resident(name, self.mode), 1024))
        self.m.launch(name, grid, (ptr(x), ptr(lab), ptr(lse), ptr(loss), ptr(bad), np.uint64(rows),
                                   np.uint64(cols), np.int64(-100 if ignore is None else ignore),
                                   np.int32(ignore is not None), ptr(self.part_loss), ptr(self.part_count),
                                   ptr(self.part_bad), ptr(self.counter)))

    def bwd(self, x, lab, lse, dx, ignore=None, scale=1.0):
        rows, cols = x.shape
        name = "ce_bwd_%s_i32" % tname(x.dtype)
        grid = max(1, min(rows, self.m.resident(name, self.mode)))
        self.m.launch(name, grid, (ptr(x), ptr(lab), ptr(lse), ptr(dx), np.uint64(rows), np.uint64(cols),
                                   np.int64(-100 if ignore is None else ignore), np.int32(ignore is not None),
                                   np.float32(scale)))


def check_ce(ce):
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        for rows, cols, ign in ((64, 50304, False), (33, 1000, True), (17, 1001, False), (9, 7, True),
                                (5, 32768, True)):
            x = (torch.randn(rows, cols, device=DEV) * 2).to(dt)
            lab = torch.randint(0, cols, (rows,), device=DEV, dtype=torch.int32)
            if ign:
                lab[::3] = -100
            lse, loss = poison((rows,), torch.float32), poison((1,), torch.float32)
            bad = torch.full((1,), 7, device=DEV, dtype=torch.int32)
            dx = poison((rows, cols), dt)
            ce.fwd(x, lab, lse, loss, bad, -100 if ign else None)
            ce.bwd(x, lab, lse, dx, -100 if ign else None, 1.0)
            torch.cuda.synchronize()
            xd = x.double().requires_grad_()
            lr = F.cross_entropy(xd, lab.long(), ignore_index=-100)
            (dxr,) = torch.autograd.grad(lr, xd)
            lser = torch.logsumexp(xd.detach(), -1)
            tol = 1e-4 if dt == torch.float32 else 2e-2
            errs = {"lse": rel(lse, lser), "loss": rel(loss, lr.detach().reshape(1)), "dx": rel(dx, dxr),
                    "bad": float(bad.item() != 0)}
            check("ce %s %dx%d%s" % (tname(dt), rows, cols, " ignore" if ign else ""), errs, tol)


def bench_ce(ce, old, variants):
    n, c = 8192, 50304
    x = (torch.randn(n, c, device=DEV) * 2).to(torch.bfloat16)
    lab = torch.randint(0, c, (n,), device=DEV, dtype=torch.int32)
    lab64 = lab.long()
    lse, loss = torch.empty(n, device=DEV), torch.empty(1, device=DEV)
    bad = torch.empty(1, device=DEV, dtype=torch.int32)
    dx = torch.empty_like(x)
    lbytes = n * c * 2 + n * 8
    xr = x.detach().clone().requires_grad_()
    t_f = time_ms(lambda: F.cross_entropy(xr, lab64))
    t_fb = time_ms(lambda: torch.autograd.grad(F.cross_entropy(xr, lab64), xr))
    ks = [("", ce), ("grid=occ ", CE(ce.m, "occ")), ("grid=rows ", CE(ce.m, "all"))]
    ks += ([("old ", old)] if old else []) + [("%s " % tag, k) for tag, k in variants]
    for tag, k in ks:
        report("%sce fwd bf16 8192x50304" % tag, time_ms(lambda: k.fwd(x, lab, lse, loss, bad)), t_f, lbytes)
        report("%sce fwd+bwd" % tag, time_ms(lambda: (k.fwd(x, lab, lse, loss, bad), k.bwd(x, lab, lse, dx))),
               t_fb, 2 * lbytes + n * c * 2, "(torch eager)")
        report("%sce bwd only" % tag, time_ms(lambda: k.bwd(x, lab, lse, dx)), t_fb - t_f, 2 * n * c * 2,
               "(torch: fb - f)")


# ---------------------------------------------------------------------------------------
# AdamW
# ---------------------------------------------------------------------------------------
HYPER = np.dtype({"names": ["lr", "beta1", "beta2", "eps", "wd", "momentum", "t", "max_norm",
                            "nesterov", "copy_kind"],
                  "formats": ["f4"] * 8 + ["i4", "i4"], "offsets": [4 * i for i in range(10)],
                  "itemsize": 40})
MT_TENSOR = [("p_in", "u8"), ("p_out", "u8"), ("g", "u8"), ("m_in", "u8"), ("m_out", "u8"),
             ("v_in", "u8"), ("v_out", "u8"), ("copy", "u8"), ("n", "u8")]


def mt_table(mt_max):
    return np.dtype([("t", np.dtype(MT_TENSOR), (mt_max,)), ("tile_end", "u8", (mt_max,)),
                     ("count", "i4"), ("pad_", "i4")])


assert mt_table(24).itemsize == 1928 and mt_table(48).itemsize == 3848


def hyper(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, wd=0.1, t=1.0, copy_kind=0):
    h = np.zeros(1, dtype=HYPER)
    h["lr"], h["beta1"], h["beta2"], h["eps"], h["wd"], h["t"] = lr, b1, b2, eps, wd, t
    h["copy_kind"] = copy_kind
    return h


class Adam:
    def __init__(self, mod, mt_max=48, tile=4096):
        self.m = mod
        self.mt_max = mt_max
        self.tile = tile

    def per_tensor(self, ts, h, copies=None):
        """ts: list of (p, g, m, v) updated in place."""
        for i, (p, g, m, v) in enumerate(ts):
            name = "adamw_%s_%s" % (tname(p.dtype), tname(g.dtype))
            n = p.numel()
            c = copies[i] if copies else None
            grid = max(1, min((n + BLOCK - 1) // BLOCK, self.m.resident(name)))
            self.m.launch(name, grid, (ptr(p), ptr(p), ptr(g), ptr(m), ptr(m), ptr(v), ptr(v), ptr(c),
                                       np.uint64(n), h, np.uint64(0), np.uint64(0), np.uint64(0)))

    def tables(self, ts, copies=None):
        out = []
        MT_MAX, MT_TILE = self.mt_max, self.tile
        for s in range(0, len(ts), MT_MAX):
            grp = ts[s:s + MT_MAX]
            tab = np.zeros(1, dtype=mt_table(MT_MAX))
            end = 0
            for k, (p, g, m, v) in enumerate(grp):
                c = copies[s + k] if copies else None
                e = tab["t"][0][k]
                e["p_in"] = e["p_out"] = p.data_ptr()
                e["g"] = g.data_ptr()
                e["m_in"] = e["m_out"] = m.data_ptr()
                e["v_in"] = e["v_out"] = v.data_ptr()
                e["copy"] = 0 if c is None else c.data_ptr()
                e["n"] = p.numel()
                end += (p.numel() + MT_TILE - 1) // MT_TILE
                tab["tile_end"][0][k] = end
            tab["count"] = len(grp)
            out.append((tab, end, tname(grp[0][0].dtype), tname(grp[0][1].dtype)))
        return out

    def multi(self, tabs, h, mode="all"):
        for tab, tiles, pn, gn in tabs:
            name = "adamw_mt_%s_%s" % (pn, gn)
            grid = max(1, min(tiles, self.m.resident(name, mode)))  # "all": a block per tile, as the launcher
            # norm, scaler, tstep: none (h.t is the step)
            self.m.launch(name, grid, (tab, h, np.uint64(0), np.uint64(0), np.uint64(0)))


def adam_ref(p, g, m, v, lr, b1, b2, eps, wd, t):
    p, g, m, v = (x.double() for x in (p, g, m, v))
    p = p * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    p = p - lr / (1 - b1 ** t) * m / (v.sqrt() / math.sqrt(1 - b2 ** t) + eps)
    return p, m, v


def check_adam(ad, tag=""):
    sizes = [1, 3, 4, 4095, 4096, 4097, 12345, 768, 100003]
    for pdt, gdt in ((torch.float32, torch.float32), (torch.float32, torch.bfloat16),
                     (torch.bfloat16, torch.bfloat16)):
        for mode in ("per_tensor", "multi"):
            ts, refs = [], []
            for n in sizes:
                p = (torch.randn(n, device=DEV) * 0.02).to(pdt)
                g = (torch.randn(n, device=DEV) * 1e-3).to(gdt)
                m = (torch.randn(n, device=DEV) * 1e-4).to(pdt)
                v = (torch.rand(n, device=DEV) * 1e-6).to(pdt)
                refs.append(adam_ref(p, g, m, v, 1e-3, 0.9, 0.999, 1e-8, 0.1, 3.0))
                ts.append((p, g, m, v))
            copies = [poison((n,), torch.bfloat16) for n in sizes]
            h = hyper(t=3.0, copy_kind=2)
            if mode == "multi":
                ad.multi(ad.tables(ts, copies), h)
            else:
                ad.per_tensor(ts, h, copies)
            torch.cuda.synchronize()
            cat = lambda xs: torch.cat([x.double().flatten() for x in xs])  # noqa: E731
            tol = 1e-5 if pdt == torch.float32 else 2e-2
            errs = {"p": rel(cat([t[0] for t in ts]), cat([r[0] for r in refs])),
                    "m": rel(cat([t[2] for t in ts]), cat([r[1] for r in refs])),
                    "v": rel(cat([t[3] for t in ts]), cat([r[2] for r in refs])),
                    "copy": rel(cat(copies), cat([r[0] for r in refs]))}
            check("%sadamw %s %s %s" % (tag, tname(pdt), tname(gdt), mode), errs,
                  {"p": tol, "m": tol, "v": tol, "copy": 1e-2})


def gpt2_sizes():
    v, d, l, ctx = 50257, 768, 12, 1024
    sizes = [v * d, ctx * d]
    for _ in range(l):
        sizes += [d, d, 3 * d * d, 3 * d, d * d, d, d, d, 4 * d * d, 4 * d, 4 * d * d, d]
    return sizes + [d, d]


def bench_adam(ad, old, variants=()):
    """The per-tensor forms are bound by Python's launch overhead here (148 launches from
    cupy): only the multi-tensor form and the one large tensor measure the kernels."""
    sizes = gpt2_sizes()
    total = sum(sizes)
    params = [(torch.randn(s, device=DEV) * 0.02).requires_grad_() for s in sizes]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, fused=True)
    t_torch = time_ms(opt.step, reps=20)
    ts = [(p.data, p.grad, torch.zeros_like(p), torch.zeros_like(p)) for p in params]
    h = hyper(lr=1e-4, wd=0.1, t=1.0)
    nbytes = 7 * 4 * total
    tabs = ad.tables(ts)
    report("adamw 124M f32 multi-tensor (%d launches)" % len(tabs), time_ms(lambda: ad.multi(tabs, h), reps=20),
           t_torch, nbytes, "(torch fused)")
    report("adamw 124M f32 multi-tensor, grid capped at SMs x 8", time_ms(lambda: ad.multi(tabs, h, "rust"), reps=20),
           t_torch, nbytes, "(torch fused)")
    for tag, k in variants:
        tb = k.tables(ts)
        report("%s adamw multi-tensor (%d launches)" % (tag, len(tb)), time_ms(lambda: k.multi(tb, h), reps=20),
               t_torch, nbytes, "(torch fused)")
    # PyTorch's foreach form, and the per-size copy reference
    opt2 = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, foreach=True)
    report("torch foreach adamw (as rtx column)", time_ms(opt2.step, reps=20), t_torch, nbytes, "(torch fused)")
    copy_ref(nbytes)
    if old:
        report("old adamw per tensor", time_ms(lambda: old.per_tensor(ts, h), reps=20), t_torch, nbytes)
    # one big tensor: the kernel's own bandwidth, no launch gaps
    big = ts[0]
    report("adamw one tensor 38.6M f32 per-tensor kernel", time_ms(lambda: ad.per_tensor([big], h)), float("nan"),
           7 * 4 * big[0].numel())


# ---------------------------------------------------------------------------------------
# Element-wise: grid sizes
# ---------------------------------------------------------------------------------------
def bench_ew(ew):
    for log2n in (26, 28):
        n = 1 << log2n
        for dt in (torch.float32, torch.float16):
            a = torch.randn(n, device=DEV).to(dt)
            b = torch.randn(n, device=DEV).to(dt)
            y = torch.empty_like(a)
            esz = a.element_size()
            vec = 16 // esz
            t_add = time_ms(lambda: torch.add(a, b, out=y))
            t_exp = time_ms(lambda: torch.exp(a, out=y))
            for op, t_t, nb in (("add", t_add, 3 * n * esz), ("exp", t_exp, 2 * n * esz)):
                name = "ew_%s_%s" % (op, tname(dt))
                res = ew.resident(name)  # SMs x 8, as the launcher
                full = (n + BLOCK * vec * 4 - 1) // (BLOCK * vec * 4)
                args = (ptr(a), ptr(b), ptr(y), np.uint64(n)) if op == "add" else (ptr(a), ptr(y), np.uint64(n))
                for gname, grid in (("resident", min(full, res)), ("2x", min(full, 2 * res)),
                                    ("4x", min(full, 4 * res)), ("full", full),
                                    ("1vec", (n + BLOCK * vec - 1) // (BLOCK * vec))):
                    ms = time_ms(lambda: ew.launch(name, grid, args))
                    report("%s %s 2^%d grid %s=%d" % (op, tname(dt), log2n, gname, grid), ms, t_t, nb)


def copy_ref(nbytes, tag=""):
    """A device-to-device copy moving nbytes (nbytes / 2 read, nbytes / 2 written)."""
    n = int(nbytes // 8)
    x = torch.randn(n, device=DEV)
    y = torch.empty_like(x)
    ms = time_ms(lambda: y.copy_(x))
    report("copy ref %s%.1f MB moved" % (tag, nbytes / 1e6), ms, float("nan"), 8 * n)
    del x, y


# ---------------------------------------------------------------------------------------
# Embedding
# ---------------------------------------------------------------------------------------
def nt_of(v):
    return (v + 1023) // 1024


class Emb:
    """scan: the backward as the launcher takes it with the setting embedding_one_launch
    on (emb_bwd_scan, one launch, for at most 16384 ids); False (the launcher's default):
    the five launches (count, scan, scatter, order, emb_bwd)."""
    def __init__(self, mod, scan=False):
        self.m = mod
        self.scan = scan

    def fwd(self, table, ids, y, bad):
        v, d = table.shape
        n = ids.numel()
        name = "emb_fwd_%s_i32" % tname(table.dtype)
        grid = max(1, min((n + 7) // 8, SMS * 8))
        self.m.launch(name, grid, (ptr(table), ptr(ids), ptr(y), np.uint64(n), np.uint64(v), np.uint64(d), ptr(bad)))

    def scratch(self, n, v):
        nt = (v + 1023) // 1024
        return {"cnt": torch.empty(v + nt + 1, device=DEV, dtype=torch.int32),
                "off": torch.empty(v + 1, device=DEV, dtype=torch.int32),
                "next": torch.empty(v + 4, device=DEV, dtype=torch.int32),
                "slots": torch.empty(max(n, 1), device=DEV, dtype=torch.int32),
                "pos": torch.empty(max(n, 1), device=DEV, dtype=torch.int32)}

    def args(self, dy, ids, v, dt, sc):
        """(name, grid, args) of each launch after the memset, as ops/src/embedding/cuda.rs."""
        n, d = dy.shape
        nt = (v + 1023) // 1024
        cnt = sc["cnt"]
        tiles, bad = cnt[v:v + nt], cnt[v + nt:]
        g = max(1, min((n + BLOCK - 1) // BLOCK, SMS * 8))
        return [("emb_count_i32", g, (ptr(ids), np.uint64(n), np.uint64(v), ptr(cnt), ptr(tiles), ptr(bad))),
                ("emb_scan", max(1, min(nt, SMS * 8)), (ptr(cnt), ptr(tiles), np.uint64(v), ptr(sc["off"]),
                                                        ptr(sc["next"]))),
                ("emb_scatter_i32", g, (ptr(ids), np.uint64(n), np.uint64(v), ptr(sc["next"]), ptr(sc["slots"]),
                                        ptr(bad))),
                ("emb_order_i32", g, (ptr(ids), np.uint64(n), np.uint64(v), ptr(sc["off"]), ptr(sc["slots"]),
                                      ptr(sc["pos"]))),
                ("emb_bwd_%s" % tname(dy.dtype), max(1, min((v + 63) // 64, SMS * 8)),
                 (ptr(dy), ptr(sc["off"]), ptr(sc["pos"]), ptr(dt), np.uint64(v), np.uint64(d)))], bad

    def scan_args(self, dy, ids, v, dt, sc):
        """(name, grid, args, smem) of the one-launch backward emb_bwd_scan, or None where
        the launcher (ops/src/embedding/cuda.rs) takes the five launches."""
        n, d = dy.shape
        r = (v + SMS - 1) // SMS
        if not self.scan or n > 16384 or r > 4096 or v * SMS >= 1 << 32:
            return None
        smem = 4 * n + 2 * (n + n % 2) + 4 * (r + 1) + 4 * r + 4 * 32 * 32 * (16 // dy.element_size())
        bad = sc["cnt"][v + nt_of(v):]
        return ("emb_bwd_scan_%s_i32" % tname(dy.dtype), SMS,
                (ptr(dy), ptr(ids), np.uint64(n), ptr(dt), np.uint64(v), np.uint64(d), ptr(bad)), smem), bad

    def bwd(self, dy, ids, v, dt, sc):
        one = self.scan_args(dy, ids, v, dt, sc)
        if one is not None:
            (name, grid, a, smem), bad = one
            self.m.launch(name, grid, a, block=1024, smem=smem)
            return bad
        sc["cnt"][:v + nt_of(v)].zero_()  # counts and tile counts (one memset; bad: emb_count)
        launches, bad = self.args(dy, ids, v, dt, sc)
        for name, grid, a in launches:
            self.m.launch(name, grid, a)
        return bad


def check_emb(em):
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        for v, d, n, mode in ((1000, 768, 4096, "rand"), (50257, 768, 8192, "zipf"), (37, 13, 100, "rand"),
                              (5, 64, 3000, "rand"), (300, 96, 2049, "same"), (64, 100, 513, "rand"),
                              (2000, 64, 17000, "zipf"), (3000, 96, 16384, "zipf"), (600000, 4, 50, "rand")):
            table = torch.randn(v, d, device=DEV).to(dt)
            if mode == "same":
                ids = torch.full((n,), 7, device=DEV, dtype=torch.int32)
            elif mode == "zipf":
                w = 1.0 / torch.arange(1, v + 1, device=DEV, dtype=torch.float64)
                ids = torch.multinomial(w, n, replacement=True).to(torch.int32)
            else:
                ids = torch.randint(0, v, (n,), device=DEV, dtype=torch.int32)
            y, bad = poison((n, d), dt), torch.full((1,), 7, device=DEV, dtype=torch.int32)
            bad.zero_()
            em.fwd(table, ids, y, bad)
            dy = torch.randn(n, d, device=DEV).to(dt)
            sc = em.scratch(n, v)
            dtab = poison((v, d), dt)
            b2 = em.bwd(dy, ids, v, dtab, sc)
            dtab2 = poison((v, d), dt)
            em.bwd(dy, ids, v, dtab2, sc)
            torch.cuda.synchronize()
            ref = torch.zeros(v, d, device=DEV, dtype=torch.float64).index_add_(0, ids.long(), dy.double())
            same = bool(torch.equal(dtab.view(torch.int16 if dt != torch.float32 else torch.int32),
                                    dtab2.view(torch.int16 if dt != torch.float32 else torch.int32)))
            tol = 1e-5 if dt == torch.float32 else 2e-2
            check("emb %s V=%d D=%d n=%d %s" % (tname(dt), v, d, n, mode),
                  {"y": rel(y, table[ids.long()]), "dtable": rel(dtab, ref), "bad": float(bad.item() + b2.item()),
                   "nondet": 0.0 if same else 1.0}, tol)
    # invalid ids: zeros in y, counted; skipped by the backward
    v, d, n = 50, 64, 100
    table = torch.randn(v, d, device=DEV)
    ids = torch.randint(0, v, (n,), device=DEV, dtype=torch.int32)
    ids[3], ids[50] = -1, v
    y, bad = poison((n, d), torch.float32), torch.zeros(1, device=DEV, dtype=torch.int32)
    em.fwd(table, ids, y, bad)
    dy = torch.randn(n, d, device=DEV)
    dtab = poison((v, d), torch.float32)
    b2 = em.bwd(dy, ids, v, dtab, em.scratch(n, v))
    torch.cuda.synchronize()
    ok = ids.clamp(0, v - 1).long()
    yr = table[ok] * ((ids >= 0) & (ids < v)).unsqueeze(1)
    keep = (ids >= 0) & (ids < v)
    ref = torch.zeros(v, d, device=DEV, dtype=torch.float64).index_add_(0, ids[keep].long(), dy[keep].double())
    check("emb invalid ids", {"y": rel(y, yr), "dtable": rel(dtab, ref), "bad": abs(bad.item() - 2) + abs(b2.item() - 2)},
          1e-5)


def bench_emb(em, old=None, variants=()):
    v, d, n = 50257, 768, 8192
    table = (torch.randn(v, d, device=DEV) * 0.02)
    tr = table.clone().requires_grad_()
    ids = torch.randint(0, v, (n,), device=DEV, dtype=torch.int32)
    ids64 = ids.long()
    dy = torch.randn(n, d, device=DEV)
    y = torch.empty(n, d, device=DEV)
    bad = torch.zeros(1, device=DEV, dtype=torch.int32)
    fb = 2 * n * d * 4 + n * 4
    t_f = time_ms(lambda: F.embedding(ids64, tr))
    report("emb fwd f32 [50257,768] n=8192", time_ms(lambda: em.fwd(table, ids, y, bad)), t_f, fb)
    copy_ref(fb, "emb fwd ")
    sc = em.scratch(n, v)
    dt = torch.empty(v, d, device=DEV)
    bb = v * d * 4 + n * d * 4 + n * 4
    t_b = time_ms(lambda: torch.autograd.grad(F.embedding(ids64, tr), tr, dy))
    report("emb bwd f32 (scatter-add, whole table)", time_ms(lambda: em.bwd(dy, ids, v, dt, sc)), t_b, bb,
           "(torch: autograd.grad of F.embedding)")
    copy_ref(bb, "emb bwd ")
    # the pieces (each launch alone, on consistent scratch; the scatter after a scan,
    # which resets its cursors)
    five = Emb(em.m, scan=False)
    five.bwd(dy, ids, v, dt, sc)
    launches, _ = em.args(dy, ids, v, dt, sc)
    L = em.m.launch
    (n_c, g_c, a_c), (n_s, g_s, a_s), (n_x, g_x, a_x), (n_o, g_o, a_o), (n_b, g_b, a_b) = launches
    report("  of which emb_bwd kernel", time_ms(lambda: L(n_b, g_b, a_b)), float("nan"), bb)
    report("  of which emb_scan", time_ms(lambda: L(n_s, g_s, a_s)), float("nan"), 1)
    report("  of which emb_scan + emb_scatter", time_ms(lambda: (L(n_s, g_s, a_s), L(n_x, g_x, a_x))),
           float("nan"), 1)
    report("  of which emb_order", time_ms(lambda: L(n_o, g_o, a_o)), float("nan"), 1)
    report("  of which emb_count", time_ms(lambda: L(n_c, g_c, a_c)), float("nan"), 1)
    report("  of which the memset of counts", time_ms(lambda: sc["cnt"][:v + nt_of(v)].zero_()), float("nan"), 1)
    report("  zero-fill of the table (torch zero_)", time_ms(lambda: dt.zero_()), float("nan"), v * d * 4)
    five.bwd(dy, ids, v, dt, sc)  # leave the scratch consistent
    w = 1.0 / torch.arange(1, v + 1, device=DEV, dtype=torch.float64)
    zid = torch.multinomial(w, n, replacement=True).to(torch.int32)
    t_z = time_ms(lambda: torch.autograd.grad(F.embedding(zid.long(), tr), tr, dy))
    report("emb bwd f32, Zipf ids", time_ms(lambda: em.bwd(dy, zid, v, dt, sc)), t_z, bb)
    for tag, k in variants:
        report("%s emb bwd f32" % tag, time_ms(lambda: k.bwd(dy, ids, v, dt, sc)), t_b, bb)
        report("%s emb bwd f32, Zipf ids" % tag, time_ms(lambda: k.bwd(dy, zid, v, dt, sc)), t_z, bb)
    em.bwd(dy, ids, v, dt, sc)


def copy_peak():
    n = 1 << 29
    x = torch.randn(n, device=DEV)
    y = torch.empty_like(x)
    ms = time_ms(lambda: y.copy_(x), reps=20)
    tb = 2 * n * 4 / (ms * 1e-3) / 1e12
    print("copy peak: %.4f ms, %.2f TB/s" % (ms, tb), flush=True)
    SUMMARY["copy_peak_tbs"] = tb
    del x, y
    return tb


# ---------------------------------------------------------------------------------------
def main():
    global SMS
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--old", default=None, help="folder with an older tree's norm/loss/optim.cu + common.cuh")
    ap.add_argument("--only", default="ln,ce,adamw,ew,emb")
    args = ap.parse_args()
    only = set(args.only.split(","))
    SMS = torch.cuda.get_device_properties(0).multi_processor_count
    print("device: %s, %d SMs, torch %s, cupy %s" % (torch.cuda.get_device_name(0), SMS, torch.__version__,
                                                      cupy.__version__), flush=True)
    mods = {}
    for name in ("norm", "loss", "optim", "elementwise", "embedding"):
        try:
            mods[name] = Module(name)
        except Exception as e:  # noqa: BLE001
            print("COMPILE FAIL %s: %s" % (name, str(e)[:3000]), flush=True)
            FAILS.append("compile " + name)
    old = {}
    if args.old:
        for name in ("norm", "loss", "optim"):
            try:
                old[name] = Module(name, kdir=args.old)
            except Exception as e:  # noqa: BLE001
                print("old %s: %s" % (name, str(e)[:300]))
    ln_vars = []
    if "ln" in only and not args.no_bench:
        # (norm.cu defines, ln_bwd_fused's grid in blocks per SM: its LN_FUSED_BLOCKS).
        # LN_FUSED_NV=2: a row of bf16 d = 4096 per block (2 vectors per thread, 80 regs
        # fit 3 blocks per SM); LN_BWD_PREFETCH: the next row's dy / x loads in flight
        # during this row's reductions; LN_PAIR_SUM (1 by default since 2026-12-02; 0
        # here is the earlier default): one barrier pair per row's two sums.
        # Earlier variants (LN_PREFETCH, LN_MIN_BLOCKS, LN_FUSED_BLOCKS, LN_BWD_PREFETCH,
        # LN_PAIR_SUM=0, LN_NV=2) were no faster on the H200 (runs h1-h2, 2026-12-02);
        # the one kept here is the fastest of them at D = 4096.
        for dfn, fb in (({"LN_FUSED_NV": 2, "LN_FUSED_BLOCKS": 3}, 3),):
            try:
                mod = Module("norm", defines=dfn)
                for kn in ("ln_fwd_bf16", "ln_bwd_dx_bf16", "ln_bwd_fused_bf16"):
                    print("  variant %s %s: %s" % (dfn, kn, mod.regs(kn)))
                fnv = dfn.get("LN_FUSED_NV", dfn.get("LN_NV", 4))
                ln_vars.append((",".join("%s=%s" % kv for kv in dfn.items()) + " fgrid=%dxSM" % fb,
                                LN(mod, fused_blocks=fb, fused_nv=fnv)))
            except Exception as e:  # noqa: BLE001
                print("variant %s: %s" % (dfn, str(e)[:300]))
    if "ln" in only:
        # The backward on the cp.async ring (ln_bwd_pipe): (norm.cu defines, LNPipe
        # arguments). The first is the launcher's (sm_80+); the others were timed in
        # 2026-12-03's runs (all slower at bf16 8192 x 4096: 1 block per SM with 4 or 5
        # stages, 2 vectors per thread with 2 blocks per SM, 8 vectors per thread).
        # LN_STREAM: the forward's streaming loads and stores (norm.cu; 2, the default:
        # for rows of at least 8 KiB; 0: never, 1: always).
        for dfn, kw in (({}, {"launcher": True}),
                        ({"LN_STREAM": 0}, {"launcher": True}),
                        ({"LN_STREAM": 1}, {"launcher": True})):
            try:
                mod = Module("norm", defines=dfn)
                print("  pipe variant %s ln_bwd_pipe_bf16: %s, %d B dynamic" % (
                    dfn, mod.regs("ln_bwd_pipe_bf16"), LNPipe(mod, **kw).bsmem))
                ln_vars.append(("pipe " + (",".join("%s=%s" % kv for kv in dfn.items()) or "(launcher)"),
                                LNPipe(mod, **kw)))
            except Exception as e:  # noqa: BLE001
                print("pipe variant %s: %s" % (dfn, str(e)[:600]))
        # The bulk-copy rings (norm_bulk.cuh). First as the launcher takes them with the
        # setting layer_norm_bulk (the module's defaults: ln_fwd_bulk 256 threads, 16 vectors
        # per thread, up to 12 stages; ln_bwd_bulk 256, 4, up to 12; every row they take),
        # then other shapes of each: (block threads, most vectors per thread, most stages;
        # a stage count past what the shared memory holds is cut to it).
        if "norm" in mods:
            m = mods["norm"]
            ln_vars.append(("bulk (layer_norm_bulk)", LNBulkBwd(m, 256, 4, 12, LNBulk(m, 256, 16, 12), short=True)))
        # The forward's (the backward LNPipe's), and the backward's (the forward ln_fwd; rows
        # of at least 8 KiB only, the others LNPipe's).
        for kind, th, nv, s in (("FWD", 256, 16, 3), ("FWD", 512, 8, 3), ("FWD", 512, 16, 1),
                                ("BWD", 256, 4, 6), ("BWD", 256, 4, 4), ("BWD", 512, 2, 6)):
            dfn = {"LN_%s_BULK_THREADS" % kind: th, "LN_%s_BULK_NV" % kind: nv, "LN_%s_BULK_S" % kind: s}
            kn = "ln_%s_bulk_bf16" % kind.lower()
            try:
                mod = Module("norm", defines=dfn)
                print("  bulk variant %s %s: %s" % (dfn, kn, mod.regs(kn)))
                k = LNBulk(mod, th, nv, s) if kind == "FWD" else LNBulkBwd(mod, th, nv, s)
                ln_vars.append(("bulk %s T=%d,NV=%d,S=%d" % (kind.lower(), th, nv, s), k))
            except Exception as e:  # noqa: BLE001
                print("bulk variant %s: %s" % (dfn, str(e)[:600]))
    ce_vars = []
    if "ce" in only and not args.no_bench:
        for u in (2, 8):
            try:
                ce_vars.append(("CE_U=%d" % u, CE(Module("loss", defines={"CE_U": u}))))
            except Exception as e:  # noqa: BLE001
                print("variant CE_U=%d: %s" % (u, str(e)[:300]))
    emb_vars = []
    if "emb" in only and not args.no_bench:
        # The one-launch backward (emb_bwd_scan; the setting embedding_one_launch), checked
        # on every case (past 16384 ids it falls back to the five launches, as the launcher).
        if "embedding" in mods:
            emb_vars.append(("one-launch", Emb(mods["embedding"], scan=True)))
    ad_vars = []
    if "adamw" in only and not args.no_bench:
        for dfn in ({"RTX_MT_MAX": 24}, {"RTX_MT_MAX": 160}, {"RTX_MT_U": 2}):
            try:
                mod = Module("optim", defines=dfn)
                print("  variant %s adamw_mt_f32_f32: %s" % (dfn, mod.regs("adamw_mt_f32_f32")))
                ad_vars.append((",".join("%s=%s" % kv for kv in dfn.items()),
                                Adam(mod, dfn.get("RTX_MT_MAX", 48), dfn.get("RTX_MT_TILE", 4096))))
            except Exception as e:  # noqa: BLE001
                print("variant %s: %s" % (dfn, str(e)[:300]))
    for key, names in (("norm", ["ln_fwd_bf16", "ln_bwd_dx_bf16", "ln_bwd_part_bf16", "ln_fwd_f32",
                                 "ln_bwd_fused_bf16", "ln_bwd_fused_f32", "ln_bwd_final_bf16"]),
                       ("embedding", ["emb_fwd_f32_i32", "emb_bwd_f32", "emb_bwd_bf16", "emb_scan", "emb_order_i32",
                                      "emb_bwd_scan_f32_i32", "emb_bwd_scan_bf16_i32"]),
                       ("loss", ["ce_fwd_bf16_i32", "ce_bwd_bf16_i32"]),
                       ("optim", ["adamw_f32_f32", "adamw_mt_f32_f32", "adamw_mt_f32_bf16"]),
                       ("elementwise", ["ew_add_f32", "ew_exp_f16"])):
        if key in mods:
            for n in names:
                print("  %-22s %s" % (n, mods[key].regs(n)))
    ln = LN(mods["norm"]) if "norm" in mods else None
    ce = CE(mods["loss"]) if "loss" in mods else None
    ad = Adam(mods["optim"]) if "optim" in mods else None
    em = Emb(mods["embedding"]) if "embedding" in mods else None
    if not args.no_check:
        for flag, fn, obj in (("ln", check_ln, ln), ("ce", check_ce, ce), ("adamw", check_adam, ad),
                              ("emb", check_emb, em)):
            if flag in only and obj is not None:
                try:
                    fn(obj)
                except Exception as e:  # noqa: BLE001
                    print("CHECK ERROR %s: %r" % (flag, e), flush=True)
                    FAILS.append("check " + flag)
    if not args.no_check:
        for tag, k in ln_vars:
            try:
                check_ln(k, "[%s] " % tag)
            except Exception as e:  # noqa: BLE001
                print("CHECK ERROR ln %s: %r" % (tag, e), flush=True)
                FAILS.append("check ln " + tag)
        for tag, k in emb_vars:
            try:
                check_emb(k)
            except Exception as e:  # noqa: BLE001
                print("CHECK ERROR emb %s: %r" % (tag, e), flush=True)
                FAILS.append("check emb " + tag)
        for tag, k in ad_vars:
            try:
                check_adam(k, tag + " ")
            except Exception as e:  # noqa: BLE001
                print("CHECK ERROR adamw %s: %r" % (tag, e), flush=True)
                FAILS.append("check adamw " + tag)
    if not args.no_bench:
        copy_peak()
        steps = (("ln", lambda k, o: bench_ln(k, o, ln_vars), ln,
                  LN(old["norm"], fused=False) if "norm" in old else None),
                 ("ce", lambda k, o: bench_ce(k, o, ce_vars), ce, CE(old["loss"]) if "loss" in old else None),
                 ("adamw", lambda k, o: bench_adam(k, o, ad_vars), ad, Adam(old["optim"]) if "optim" in old else None),
                 ("emb", lambda k, o: bench_emb(k, o, emb_vars), em, None),
                 ("ew", lambda k, o: bench_ew(k), mods.get("elementwise"), None))
        for flag, fn, obj, o in steps:
            if flag in only and obj is not None:
                try:
                    fn(obj, o)
                except Exception as e:  # noqa: BLE001
                    print("BENCH ERROR %s: %r" % (flag, e), flush=True)
                torch.cuda.empty_cache()
    print("\n| case | rtx ms | rtx TB/s | torch ms | torch TB/s | ratio |")
    for r in RESULTS:
        print("| %s | %.4f | %.2f | %.4f | %.2f | %.2f | %s" % r)
    print("FAILS: %s" % (FAILS or "none"))
    if _OUT:
        with open(os.path.join(_OUT, "train_kernels.json"), "w") as f:
            json.dump(SUMMARY, f, indent=1, default=str)
    else:
        shutil.rmtree(_TMP, ignore_errors=True)
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
