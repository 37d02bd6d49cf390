#!/usr/bin/env python3
"""Correctness and speed check of kernels/cuda/attention.cu (FlashAttention-2 fwd/bwd).

Runs on the GPU host:  python3 kernels/checks/attention_check.py [--quick] [--no-bench] [--no-check]

1. ABI check: a tiny kernel echoes every FlashParams field it receives by value.
2. Correctness against float64 PyTorch math (not SDPA), gradients from float64 autograd,
   fresh torch.randn inputs, every output and workspace poisoned with NaN before launch:
   dtype {f16, bf16} x D {64, 128} x causal {0, 1} x mask {none, [Lq,Lk], [B,H,Lq,Lk]}
   x (Lq, Lk) x GQA {H=2*Hkv, H=Hkv}; relative errors ||x - ref|| / ||ref|| of o, lse,
   dq, dk, dv; PASS when all < 2e-2. Masks hold -inf entries and (Lq > 3) one fully
   masked row, which must give o = 0, lse = -inf and zero gradients.
3. Timing (CUDA events, medians, 2 rotating input sets) against
   torch.nn.functional.scaled_dot_product_attention, bf16, B*L = 16384, H*D = 2048.
4. Compile-time VARIANTS (see VARIANTS below; -D macros of attention.cu): each is compiled
   separately (a failing one is reported and skipped), checked on a reduced correctness set
   (both dtypes, both D, causal 0/1, masks, odd lengths, GQA), and timed on the parts it
   changes (forward and/or backward-only). A table of TFLOP/s per variant and the best
   passing variant per (D, causal, fwd/bwd) is printed at the end.
   --variants a,b,c selects variants by name ("base" is always built); --no-variant: none.

Writes nothing outside $OUT (if set; a JSON summary goes there). cupy's kernel cache is
kept in memory and its temporary files go under $OUT (or a private temp dir, removed).
"""
import argparse
import contextlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
import traceback

_OUT = os.environ.get("OUT")
if _OUT:
    _TMP = os.path.join(_OUT, "tmp")
    os.makedirs(_TMP, exist_ok=True)
    _OWN_TMP = False
else:
    _TMP = tempfile.mkdtemp(prefix="attn_check_")
    _OWN_TMP = True
os.environ["TMPDIR"] = _TMP
tempfile.tempdir = _TMP
os.environ.setdefault("CUPY_CACHE_IN_MEMORY", "1")
os.environ.setdefault("CUPY_CACHE_DIR", os.path.join(_TMP, "cupy_cache"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import cupy  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # kernels/checks/ -> root
KDIR = os.path.join(ROOT, "kernels", "cuda")
TOL = 2e-2

# ---------------------------------------------------------------------------------------
# ABI (mirrors struct FlashParams in kernels/cuda/attention_common.cuh)
# ---------------------------------------------------------------------------------------
_FIELDS = [
    ("q", "u8", 0), ("k", "u8", 8), ("v", "u8", 16), ("mask", "u8", 24), ("o", "u8", 32),
    ("lse", "u8", 40), ("dout", "u8", 48), ("dsum", "u8", 56), ("dq_accum", "u8", 64),
    ("dq", "u8", 72), ("dk", "u8", 80), ("dv", "u8", 88),
    ("mask_stride_b", "i8", 96), ("mask_stride_h", "i8", 104), ("mask_stride_q", "i8", 112),
    ("B", "i4", 120), ("H", "i4", 124), ("Hkv", "i4", 128), ("Lq", "i4", 132), ("Lk", "i4", 136),
    ("scale", "f4", 140), ("causal", "i4", 144), ("pad_", "i4", 148),
]
PARAMS_DTYPE = np.dtype({"names": [f[0] for f in _FIELDS], "formats": [f[1] for f in _FIELDS],
                         "offsets": [f[2] for f in _FIELDS], "itemsize": 152})

FWD_BR = 128          # query rows per forward block (both presets)
BWD_SMEM = {64: 58368, 128: 70144}   # defaults (documented ABI)

# Compile-time variants: (name, -D defines, parts it changes, head dims it changes, note).
# Ordered by expected payoff; "base" (all defaults) must stay first.
VARIANTS = [
    ("base", {}, ("fwd", "bwd"), (64, 128), "defaults (ABI-documented launch)"),
    ("p1", {"ATTN_FWD_D64_PRESET": 1, "ATTN_FWD_D128_PRESET": 1}, ("fwd",), (64, 128),
     "fwd preset 1: 4 warps x 2 m-tiles, 128 thr, 2 CTA/SM"),
    ("bw8v4", {"ATTN_BWD_D64_NWARPS": 8, "ATTN_BWD_D128_NWARPS": 8, "ATTN_BWD_RED_V4": 1}, ("bwd",),
     (64, 128), "bwd 8 warps, BC=128 keys, 256 thr, 1 CTA/SM, dQ red.v4"),
    ("p2", {"ATTN_FWD_D64_PRESET": 2, "ATTN_FWD_D128_PRESET": 2, "ATTN_FWD_D128_STAGES": 2}, ("fwd",),
     (64, 128), "fwd preset 2: 8 warps x 1 m-tile, 128-key tiles (D128: Q from smem, 2 stages)"),
    ("bw8v4s3", {"ATTN_BWD_D64_NWARPS": 8, "ATTN_BWD_D128_NWARPS": 8, "ATTN_BWD_RED_V4": 1,
                 "ATTN_BWD_STAGES": 3}, ("bwd",), (64, 128), "bw8v4 with a 3-stage Q/dO ring"),
    ("bw8", {"ATTN_BWD_D64_NWARPS": 8, "ATTN_BWD_D128_NWARPS": 8}, ("bwd",), (64, 128),
     "bwd 8 warps, BC=128 keys, dQ red.v2"),
    ("bv4", {"ATTN_BWD_RED_V4": 1}, ("bwd",), (64, 128), "bwd default tiles, dQ red.v4"),
    ("bw8r64", {"ATTN_BWD_D128_NWARPS": 8, "ATTN_BWD_D128_BR": 64, "ATTN_BWD_RED_V4": 1}, ("bwd",),
     (128,), "bwd D128 8 warps, BC=128, BR=64 (24 B spill), red.v4"),
]


def fwd_launch_cfg(d, preset, stages=3):
    """(threads per block, dynamic smem bytes) of flash_fwd_d{d}_* for a warp-layout preset
    (ATTN_FWD_D{d}_PRESET in attention.cu; 0 is the default)."""
    if preset == 0:
        threads, bc = 256, 64
    elif preset == 2:
        threads, bc = 256, 128
    else:
        threads, bc = 128, (64 if d == 64 else 32)
    return threads, FWD_BR * d * 2 + stages * 2 * bc * d * 2


def bwd_launch_cfg(d, nwarps=4, br=None, stages=2):
    """(threads, keys per block BC, dynamic smem bytes) of flash_bwd_dq_dk_dv_d{d}_* for
    ATTN_BWD_D{d}_NWARPS / ATTN_BWD_D{d}_BR (BwdCfg in attention_bwd.cuh)."""
    if br is None:
        br = 64 if d == 64 else 32
    bc = 16 * nwarps
    smem = 2 * bc * d * 2 + bc * br * 2 + stages * (2 * br * d * 2 + 8 * br)
    return 32 * nwarps, bc, smem


assert bwd_launch_cfg(64) == (128, 64, BWD_SMEM[64]) and bwd_launch_cfg(128) == (128, 64, BWD_SMEM[128])


def pre_rows_per_block(d):
    return 256 // (d // 8)


ECHO_SRC = r'''
#include "attention_common.cuh"
extern "C" __global__ void flash_params_echo(const FlashParams p, unsigned long long* out) {
    if (threadIdx.x != 0) return;
    out[0] = (unsigned long long)p.q;  out[1] = (unsigned long long)p.k;
    out[2] = (unsigned long long)p.v;  out[3] = (unsigned long long)p.mask;
    out[4] = (unsigned long long)p.o;  out[5] = (unsigned long long)p.lse;
    out[6] = (unsigned long long)p.dout; out[7] = (unsigned long long)p.dsum;
    out[8] = (unsigned long long)p.dq_accum; out[9] = (unsigned long long)p.dq;
    out[10] = (unsigned long long)p.dk; out[11] = (unsigned long long)p.dv;
    out[12] = (unsigned long long)p.mask_stride_b; out[13] = (unsigned long long)p.mask_stride_h;
    out[14] = (unsigned long long)p.mask_stride_q;
    out[15] = p.B; out[16] = p.H; out[17] = p.Hkv; out[18] = p.Lq; out[19] = p.Lk;
    out[20] = __float_as_uint(p.scale); out[21] = p.causal; out[22] = sizeof(FlashParams);
}
'''


def compile_module(src, probe, extra=()):
    """RawModule of src; `probe` is a kernel name fetched to force compilation."""
    base = ("-std=c++17", "-I" + KDIR) + tuple(extra)
    try:
        mod = cupy.RawModule(code=src, options=base + ("--gpu-architecture=sm_90",))
        mod.get_function(probe)
        return mod
    except Exception as e:  # noqa: BLE001  cupy may add its own -arch; retry without ours
        if "arch" not in str(e).lower():
            raise
        print("note: compiling without --gpu-architecture (cupy sets the arch): %s" % str(e)[:200])
        mod = cupy.RawModule(code=src, options=base)
        mod.get_function(probe)
        return mod


class Kernels:
    def __init__(self, defines=None, name="base"):
        """attention.cu compiled with -D<k>=<v> for each item of `defines` (a VARIANTS entry)."""
        defines = dict(defines or {})
        src = open(os.path.join(KDIR, "attention.cu")).read()
        extra = tuple("-D%s=%s" % (k, v) for k, v in sorted(defines.items()))
        self.name = name
        self.defines = defines
        dv = lambda k, dflt: int(defines.get(k, dflt))  # noqa: E731
        # Default presets as in attention.cu: D=64 preset 1, D=128 preset 0.
        self.fwd_cfg = {d: fwd_launch_cfg(d, dv("ATTN_FWD_D%d_PRESET" % d, 1 if d == 64 else 0),
                                          dv("ATTN_FWD_D%d_STAGES" % d, 3))
                        for d in (64, 128)}
        self.bwd_cfg = {d: bwd_launch_cfg(d, dv("ATTN_BWD_D%d_NWARPS" % d, 4),
                                          dv("ATTN_BWD_D%d_BR" % d, 64 if d == 64 else 32),
                                          dv("ATTN_BWD_STAGES", 2))
                        for d in (64, 128)}
        t0 = time.time()
        self.mod = compile_module(src, "flash_fwd_d64_f16", extra)
        self.cache = {}
        self.attrs = {}
        for d in (64, 128):
            for t in ("f16", "bf16"):
                for kn, smem in ((f"flash_fwd_d{d}_{t}", self.fwd_cfg[d][1]),
                                 (f"flash_bwd_dq_dk_dv_d{d}_{t}", self.bwd_cfg[d][2])):
                    k = self.get(kn, smem)
                    try:
                        self.attrs[kn] = (k.num_regs, k.local_size_bytes, smem)
                    except Exception:  # noqa: BLE001
                        pass
        self.compile_s = time.time() - t0

    def get(self, name, smem=0):
        k = self.cache.get(name)
        if k is None:
            k = self.mod.get_function(name)
            if smem > 48 * 1024:
                k.max_dynamic_shared_size_bytes = smem
            self.cache[name] = k
        return k

    def launch(self, name, grid, block, smem, params):
        self.get(name, smem)(grid, block, (params,), shared_mem=smem)


def tname(dtype):
    return "bf16" if dtype == torch.bfloat16 else "f16"


def make_params(q, k, v, o, lse, mask=None, mstrides=(0, 0, 0), causal=0, scale=None,
                dout=None, dsum=None, dq_accum=None, dq=None, dk=None, dv=None):
    B, H, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    p = np.zeros(1, dtype=PARAMS_DTYPE)
    ptr = lambda t: 0 if t is None else t.data_ptr()  # noqa: E731
    for name, t in (("q", q), ("k", k), ("v", v), ("mask", mask), ("o", o), ("lse", lse),
                    ("dout", dout), ("dsum", dsum), ("dq_accum", dq_accum), ("dq", dq),
                    ("dk", dk), ("dv", dv)):
        p[name] = ptr(t)
    p["mask_stride_b"], p["mask_stride_h"], p["mask_stride_q"] = mstrides
    p["B"], p["H"], p["Hkv"], p["Lq"], p["Lk"] = B, H, Hkv, Lq, Lk
    p["scale"] = scale if scale is not None else 1.0 / math.sqrt(D)
    p["causal"] = int(causal)
    return p


def run_fwd(K, p, B, H, Lq, D, dt):
    threads, smem = K.fwd_cfg[D]
    K.launch(f"flash_fwd_d{D}_{dt}", ((Lq + FWD_BR - 1) // FWD_BR, H, B), (threads, 1, 1), smem, p)


def run_bwd(K, p, B, H, Hkv, Lq, Lk, D, dt):
    rows = B * H * Lq
    rpb = pre_rows_per_block(D)
    K.launch(f"flash_bwd_preprocess_d{D}_{dt}", ((rows + rpb - 1) // rpb, 1, 1), (256, 1, 1), 0, p)
    threads, bc, smem = K.bwd_cfg[D]
    K.launch(f"flash_bwd_dq_dk_dv_d{D}_{dt}", ((Lk + bc - 1) // bc, Hkv, B), (threads, 1, 1), smem, p)
    n4 = rows * D // 4
    K.launch(f"flash_bwd_convert_dq_d{D}_{dt}", (max(1, min((n4 + 255) // 256, 65535)), 1, 1),
             (256, 1, 1), 0, p)


# ---------------------------------------------------------------------------------------
# ABI echo
# ---------------------------------------------------------------------------------------
def check_abi():
    mod = compile_module(ECHO_SRC, "flash_params_echo")
    fn = mod.get_function("flash_params_echo")
    out = cupy.zeros(23, dtype=cupy.uint64)
    p = np.zeros(1, dtype=PARAMS_DTYPE)
    vals = {}
    for i, (name, fmt, _) in enumerate(_FIELDS[:12]):
        vals[name] = 0x1000_0000_0000 + 0x10 * (i + 1)
    vals.update(mask_stride_b=-3, mask_stride_h=123456789012, mask_stride_q=77, B=2, H=8, Hkv=4,
                Lq=1001, Lk=4097, scale=0.125, causal=1)
    for kname, val in vals.items():
        p[kname] = val
    fn((1,), (32,), (p, out))
    got = cupy.asnumpy(out).astype(np.uint64)
    exp = [vals[f[0]] for f in _FIELDS[:12]] + [(-3) % 2**64, 123456789012, 77, 2, 8, 4, 1001, 4097,
                                                 int(np.float32(0.125).view(np.uint32)), 1, 152]
    bad = [(i, int(g), int(e)) for i, (g, e) in enumerate(zip(got, exp)) if int(g) != int(e) % 2**64]
    return bad


# ---------------------------------------------------------------------------------------
# Reference (float64 math + autograd)
# ---------------------------------------------------------------------------------------
def reference(q, k, v, mask, causal, scale, dout):
    G = q.shape[1] // k.shape[1]
    qd = q.double().requires_grad_()
    kd = k.double().requires_grad_()
    vd = v.double().requires_grad_()
    kk = kd.repeat_interleave(G, dim=1)
    vv = vd.repeat_interleave(G, dim=1)
    s = torch.matmul(qd, kk.transpose(-1, -2)) * scale
    if mask is not None:
        s = s + mask.double()
    Lq, Lk = q.shape[2], k.shape[2]
    if causal:
        tri = torch.ones(Lq, Lk, dtype=torch.bool, device=q.device).triu(1)
        s = s.masked_fill(tri, float("-inf"))
    m = s.amax(dim=-1, keepdim=True).detach()
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(s - m)
    l = e.sum(dim=-1, keepdim=True)
    pm = e / torch.where(l == 0, torch.ones_like(l), l)
    o = torch.matmul(pm, vv)
    lse = torch.where(l == 0, torch.full_like(l, float("-inf")), torch.log(l) + m).squeeze(-1)
    o.backward(dout.double())
    return o.detach(), lse.detach(), qd.grad, kd.grad, vd.grad


def relerr(x, ref):
    x = x.double()
    fin = torch.isfinite(ref)
    if not bool(torch.equal(torch.isfinite(x) | ~fin, torch.ones_like(fin))):
        return float("nan")  # NaN / inf where the reference is finite (e.g. unwritten)
    if not bool(fin.all()):
        # non-finite reference entries (lse = -inf) must match exactly
        if not bool(torch.equal(x[~fin], ref[~fin])):
            return float("nan")
        x, ref = x[fin], ref[fin]
    den = ref.norm().item()
    num = (x - ref).norm().item()
    return num / den if den > 0 else num


def make_inputs(dtype, D, mask_mode, Lq, Lk, B, H, Hkv, gen):
    """Random q, k, v, dout on the GPU, and the mask (None; 2-D for mask_mode 1, 4-D for
    2; about 6 % -inf, row 3 fully masked) with its (batch, head, row) strides."""
    dev = "cuda"
    q = torch.randn(B, H, Lq, D, device=dev, generator=gen).to(dtype)
    k = torch.randn(B, Hkv, Lk, D, device=dev, generator=gen).to(dtype)
    v = torch.randn(B, Hkv, Lk, D, device=dev, generator=gen).to(dtype)
    dout = torch.randn(B, H, Lq, D, device=dev, generator=gen).to(dtype)
    mask, mstr = None, (0, 0, 0)
    if mask_mode:
        shape = (Lq, Lk) if mask_mode == 1 else (B, H, Lq, Lk)
        mask = torch.randn(*shape, device=dev, generator=gen)
        drop = torch.rand(*shape, device=dev, generator=gen) < 0.06
        mask = mask.masked_fill(drop, float("-inf"))
        if Lq > 3:
            mask[..., 3, :] = float("-inf")  # one fully masked row: zero gradients
        mask = mask.to(dtype).contiguous()
        mstr = (0, 0, Lk) if mask_mode == 1 else (H * Lq * Lk, Lq * Lk, Lk)
    return q, k, v, dout, mask, mstr


def check_case(K, dtype, D, causal, mask_mode, Lq, Lk, B, H, Hkv, gen):
    dev = "cuda"
    dt = tname(dtype)
    scale = 1.0 / math.sqrt(D)
    q, k, v, dout, mask, mstr = make_inputs(dtype, D, mask_mode, Lq, Lk, B, H, Hkv, gen)
    nan = float("nan")
    o = torch.full((B, H, Lq, D), nan, device=dev, dtype=dtype)
    lse = torch.full((B, H, Lq), nan, device=dev, dtype=torch.float32)
    dsum = torch.full((B, H, Lq), nan, device=dev, dtype=torch.float32)
    dqa = torch.full((B, H, Lq, D), nan, device=dev, dtype=torch.float32)
    dq = torch.full((B, H, Lq, D), nan, device=dev, dtype=dtype)
    dk = torch.full((B, Hkv, Lk, D), nan, device=dev, dtype=dtype)
    dv = torch.full((B, Hkv, Lk, D), nan, device=dev, dtype=dtype)
    p = make_params(q, k, v, o, lse, mask, mstr, causal, scale, dout, dsum, dqa, dq, dk, dv)
    run_fwd(K, p, B, H, Lq, D, dt)
    run_bwd(K, p, B, H, Hkv, Lq, Lk, D, dt)
    torch.cuda.synchronize()
    ro, rl, rdq, rdk, rdv = reference(q, k, v, mask, causal, scale, dout)
    errs = {"o": relerr(o, ro), "lse": relerr(lse, rl), "dq": relerr(dq, rdq),
            "dk": relerr(dk, rdk), "dv": relerr(dv, rdv)}
    ok = all(e == e and e < TOL for e in errs.values())
    return ok, errs


# Reduced set for the variants: (Lq, Lk, mask mode, gqa) per dtype x D x causal (40 cases):
# odd lengths, a 1025 tail past a 128-key block, both masks, GQA and not.
VARIANT_CASES = [(17, 17, 0, True), (1000, 1000, 1, True), (1000, 17, 0, False), (17, 1000, 2, True),
                 (1025, 1025, 0, True)]


def variant_case_list():
    for dtype in (torch.float16, torch.bfloat16):
        for D in (64, 128):
            for causal in (0, 1):
                for (Lq, Lk, mask_mode, gqa) in VARIANT_CASES:
                    yield dtype, D, causal, mask_mode, Lq, Lk, gqa


def full_case_list(quick):
    lengths = [(1, 1), (17, 17), (1000, 1000), (4097, 4097), (1, 1000), (17, 1000), (1000, 17)]
    if quick:
        lengths = [(1, 1), (17, 17), (300, 300), (1, 300), (17, 300), (300, 17)]
    for dtype in (torch.float16, torch.bfloat16):
        for D in (64, 128):
            for causal in (0, 1):
                for mask_mode in (0, 1, 2):
                    for (Lq, Lk) in lengths:
                        for gqa in (True, False):
                            yield dtype, D, causal, mask_mode, Lq, Lk, gqa


def correctness(K, quick, title="", cases=None, verbose=True):
    """Runs `cases` (default: the full set) on kernels K; prints every case (or, with
    verbose=False, only failures). Stops early (remaining cases 'skipped') if the CUDA
    context is lost; CONTEXT_LOST is then set for the caller."""
    global CONTEXT_LOST
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    results = []
    print("\n== correctness%s vs float64 reference (rel. L2 error; PASS < %.0e) ==" % (title, TOL))
    print("%-4s %-4s %3s %3s %4s %5s %5s %5s | %8s %8s %8s %8s %8s | %s" % (
        "res", "dt", "D", "cau", "mask", "H/Hkv", "Lq", "Lk", "o", "lse", "dq", "dk", "dv", "note"))
    mask_names = {0: "none", 1: "LqLk", 2: "full"}
    if cases is None:
        cases = full_case_list(quick)
    fmt = lambda x: "%8.1e" % x if x == x else "     NaN"  # noqa: E731
    for (dtype, D, causal, mask_mode, Lq, Lk, gqa) in cases:
        big = Lq >= 1000 and Lk >= 1000
        B = 1 if big else 2
        H = 2 if big else 4
        Hkv = H // 2 if gqa else H
        case = dict(dt=tname(dtype), D=D, causal=causal, mask=mask_names[mask_mode],
                    Lq=Lq, Lk=Lk, B=B, H=H, Hkv=Hkv)
        if CONTEXT_LOST:
            results.append(dict(case, ok=False, errs={}, note="skipped: " + CONTEXT_LOST))
            continue
        note = ""
        try:
            ok, errs = check_case(K, dtype, D, causal, mask_mode, Lq, Lk, B, H, Hkv, gen)
        except Exception as e:  # noqa: BLE001
            ok, errs, note = False, {}, "%s: %s" % (type(e).__name__, str(e)[:120])
            try:
                torch.cuda.synchronize()
            except Exception as e2:  # noqa: BLE001
                CONTEXT_LOST = "CUDA context lost (%s)" % str(e2)[:80]
        results.append(dict(case, ok=ok, errs=errs, note=note))
        if verbose or not ok:
            print("%-4s %-4s %3d %3d %4s %2d/%-2d %5d %5d | %s %s %s %s %s | %s" % (
                "PASS" if ok else "FAIL", case["dt"], D, causal, case["mask"], H, Hkv, Lq, Lk,
                *[fmt(errs.get(n, float("nan"))) for n in ("o", "lse", "dq", "dk", "dv")], note),
                flush=True)
    n_ok = sum(r["ok"] for r in results)
    print("correctness%s: %d / %d PASS" % (title, n_ok, len(results)), flush=True)
    return results


CONTEXT_LOST = None


# ---------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------
def time_fn(fns, reps):
    """fns: list of callables (rotated). Returns median milliseconds."""
    for i in range(3):
        fns[i % len(fns)]()
    torch.cuda.synchronize()
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for i, (a, b) in enumerate(evs):
        a.record()
        fns[i % len(fns)]()
        b.record()
    torch.cuda.synchronize()
    ts = sorted(a.elapsed_time(b) for a, b in evs)
    return ts[len(ts) // 2]


def sdpa_best_ms(fns, reps):
    """time_fn of SDPA callables under its default dispatch and under its cuDNN and flash
    backends (torch.nn.attention.sdpa_kernel, where this PyTorch has them): the fastest, as
    benches/torch_baseline.py compares. The default dispatch picks the flash backend on some
    hosts, 1.5-2x slower than cuDNN's there (run 27a, H100)."""
    ctxs = [contextlib.nullcontext]
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        for attr in ("CUDNN_ATTENTION", "FLASH_ATTENTION"):
            b = getattr(SDPBackend, attr, None)
            if b is not None:
                ctxs.append(lambda b=b: sdpa_kernel(b))
    except ImportError:
        pass
    best = float("inf")
    for ctx in ctxs:
        try:
            with ctx():
                best = min(best, time_fn(fns, reps))
        except Exception:  # noqa: BLE001 (a backend that does not take these inputs)
            pass
    if best == float("inf"):
        raise RuntimeError("no SDPA backend ran")
    return best


def bench(Ks, quick, fa2=False):
    """Ks: list of (variant name, Kernels, parts, dims); Ks[0] is the base build. Per config:
    base forward, backward-only and forward+backward; each other variant only on the parts
    ("fwd" / "bwd") and head dims it changes; SDPA (default backend) forward and f+b.
    Returns rows with r["ms"][(variant, part)] = median ms, part in fwd / bwd / fb."""
    global CONTEXT_LOST
    rows = []
    dtype = torch.bfloat16
    dt = "bf16"
    Ls = (1024, 4096) if quick else (1024, 4096, 16384)
    try:
        from torch.nn.attention import sdpa_kernel, SDPBackend
    except Exception:  # noqa: BLE001
        fa2 = False
    for D in (64, 128):
        H = 2048 // D
        for L in Ls:
            B = 16384 // L
            for causal in (0, 1):
                if CONTEXT_LOST:
                    break
                fl = 4.0 * B * H * L * L * D * (0.5 if causal else 1.0)
                sets = []
                for _ in range(2):
                    q = torch.randn(B, H, L, D, device="cuda", dtype=dtype)
                    k = torch.randn(B, H, L, D, device="cuda", dtype=dtype)
                    v = torch.randn(B, H, L, D, device="cuda", dtype=dtype)
                    do = torch.randn(B, H, L, D, device="cuda", dtype=dtype)
                    o = torch.empty_like(q)
                    lse = torch.empty(B, H, L, device="cuda", dtype=torch.float32)
                    dsum = torch.empty(B, H, L, device="cuda", dtype=torch.float32)
                    dqa = torch.empty(B, H, L, D, device="cuda", dtype=torch.float32)
                    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                    p = make_params(q, k, v, o, lse, None, (0, 0, 0), causal, None, do, dsum, dqa, dq, dk, dv)
                    sets.append((q, k, v, do, p))
                reps = 20 if L >= 16384 else 30
                res = dict(D=D, L=L, B=B, H=H, causal=causal, fwd_flops=fl, ms={}, err="")
                base = Ks[0][1]
                for (name, K, parts, dims) in Ks:
                    if D not in dims or CONTEXT_LOST:
                        continue
                    try:
                        if "fwd" in parts:
                            res["ms"][(name, "fwd")] = time_fn(
                                [lambda s=s: run_fwd(K, s[4], B, H, L, D, dt) for s in sets], reps)
                        if "bwd" in parts:
                            for s_ in sets:  # o, lse for the backward
                                run_fwd(base, s_[4], B, H, L, D, dt)
                            res["ms"][(name, "bwd")] = time_fn(
                                [lambda s=s: run_bwd(K, s[4], B, H, H, L, L, D, dt) for s in sets], reps)
                        if K is base:
                            res["ms"][(name, "fb")] = time_fn(
                                [lambda s=s: (run_fwd(K, s[4], B, H, L, D, dt),
                                              run_bwd(K, s[4], B, H, H, L, L, D, dt)) for s in sets], reps)
                    except Exception as e:  # noqa: BLE001
                        res["err"] += " %s: %s" % (name, str(e)[:100])
                        try:
                            torch.cuda.synchronize()
                        except Exception as e2:  # noqa: BLE001
                            CONTEXT_LOST = "CUDA context lost in timing of %s (%s)" % (name, str(e2)[:80])
                if CONTEXT_LOST:
                    rows.append(res)
                    break

                def t_fwd(s):
                    with torch.no_grad():
                        F.scaled_dot_product_attention(s[0], s[1], s[2], is_causal=bool(causal))

                tsets = [(s[0].clone().requires_grad_(), s[1].clone().requires_grad_(),
                          s[2].clone().requires_grad_(), s[3]) for s in sets]

                def t_fb(s):
                    out = F.scaled_dot_product_attention(s[0], s[1], s[2], is_causal=bool(causal))
                    torch.autograd.grad(out, (s[0], s[1], s[2]), s[3])  # no .grad accumulation

                try:
                    res["ms"][("sdpa", "fwd")] = time_fn([lambda s=s: t_fwd(s) for s in sets], reps)
                    res["ms"][("sdpa", "fb")] = time_fn([lambda s=s: t_fb(s) for s in tsets], reps)
                except Exception as e:  # noqa: BLE001
                    res["err"] += " sdpa: " + str(e)[:100]
                if fa2:
                    try:
                        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                            res["ms"][("fa2", "fwd")] = time_fn([lambda s=s: t_fwd(s) for s in sets], reps)
                            res["ms"][("fa2", "fb")] = time_fn([lambda s=s: t_fb(s) for s in tsets], reps)
                    except Exception as e:  # noqa: BLE001
                        res["err"] += " fa2: " + str(e)[:100]
                rows.append(res)
                print("timed D=%d L=%d causal=%d" % (D, L, causal), flush=True)
                del sets, tsets
                torch.cuda.empty_cache()
    return rows


def tflops(r, name, part):
    """TFLOP/s of (variant, part) on row r; fwd = 4BHL^2D (/2 causal), bwd = 2.5 fwd, fb = 3.5 fwd."""
    ms = r["ms"].get((name, part))
    if not ms:
        return None
    return {"fwd": 1.0, "bwd": 2.5, "fb": 3.5}[part] * r["fwd_flops"] / (ms * 1e-3) / 1e12


def print_bench(rows, names, ok_names):
    """names: variant names in build order; ok_names: those whose correctness passed."""
    g = lambda x: "%7.1f" % x if x else "      -"  # noqa: E731
    fwd_names = [n for n in names if any((n, "fwd") in r["ms"] for r in rows)]
    bwd_names = [n for n in names if any((n, "bwd") in r["ms"] for r in rows)]
    print("\n== timing, bf16, B*L = 16384, H*D = 2048: TFLOP/s (fwd = 4BHL^2D (/2 causal), bwd-only = 2.5x, "
          "f+b = 3.5x) ==")
    print("variants: " + "; ".join("%s = %s" % (n, note) for (n, _, _, _, note) in VARIANTS if n in names))
    print("'-' = not timed (variant does not change that part / head dim, or failed); "
          "'!' after a name = variant FAILED correctness (not recommended)")
    lab = lambda n: n + ("" if n in ok_names else "!")  # noqa: E731
    print("\n-- forward --")
    print("%4s %6s %3s %4s | %8s | %s | %7s %7s" % ("D", "L", "B", "caus", "base ms",
                                                  " ".join("%7s" % lab(n)[:7] for n in fwd_names), "sdpa", "fa2"))
    for r in rows:
        ms = r["ms"].get(("base", "fwd"))
        print("%4d %6d %3d %4d | %8s | %s | %s %s" % (
            r["D"], r["L"], r["B"], r["causal"], "%.3f" % ms if ms else "n/a",
            " ".join(g(tflops(r, n, "fwd")) for n in fwd_names),
            g(tflops(r, "sdpa", "fwd")), g(tflops(r, "fa2", "fwd"))))
    print("\n-- backward only (preprocess + dq_dk_dv + convert) --")
    print("%4s %6s %3s %4s | %8s | %s" % ("D", "L", "B", "caus", "base ms",
                                          " ".join("%7s" % lab(n)[:7] for n in bwd_names)))
    for r in rows:
        ms = r["ms"].get(("base", "bwd"))
        print("%4d %6d %3d %4d | %8s | %s" % (
            r["D"], r["L"], r["B"], r["causal"], "%.3f" % ms if ms else "n/a",
            " ".join(g(tflops(r, n, "bwd")) for n in bwd_names)))
    # forward + backward: measured for base; best passing fwd + best passing bwd (sum of
    # the separately measured medians) as the estimate for the best combination
    print("\n-- forward + backward --  base = measured; best = best passing fwd + best passing bwd "
          "(sum of medians); ratio = sdpa time / ours")
    print("%4s %6s %3s %4s | %8s %7s %6s | %8s %7s %6s %-18s | %7s %7s" % (
        "D", "L", "B", "caus", "base ms", "base", "ratio", "best ms", "best", "ratio", "(fwd+bwd)", "sdpa", "fa2"))
    for r in rows:
        bm = r["ms"].get(("base", "fb"))
        sm = r["ms"].get(("sdpa", "fb"))
        fbest = min(((r["ms"][(n, "fwd")], n) for n in fwd_names if n in ok_names and (n, "fwd") in r["ms"]),
                    default=None)
        bbest = min(((r["ms"][(n, "bwd")], n) for n in bwd_names if n in ok_names and (n, "bwd") in r["ms"]),
                    default=None)
        est = fbest[0] + bbest[0] if fbest and bbest else None
        tf = lambda ms: 3.5 * r["fwd_flops"] / (ms * 1e-3) / 1e12 if ms else None  # noqa: E731
        print("%4d %6d %3d %4d | %8s %s %6s | %8s %s %6s %-18s | %s %s  %s" % (
            r["D"], r["L"], r["B"], r["causal"], "%.3f" % bm if bm else "n/a", g(tf(bm)),
            "%.2f" % (sm / bm) if bm and sm else "n/a",
            "%.3f" % est if est else "n/a", g(tf(est)), "%.2f" % (sm / est) if est and sm else "n/a",
            "(%s+%s)" % (fbest[1], bbest[1]) if est else "", g(tf(sm)), g(tflops(r, "fa2", "fb")), r.get("err", "")))
    # best variant per (D, causal, part): geometric mean TFLOP/s over the rows with L >= 4096
    print("\n== best variant per (D, causal, part): geometric mean TFLOP/s over L >= 4096 "
          "(passing variants only; x = vs base) ==")
    best = {}
    for D in (64, 128):
        for causal in (0, 1):
            rs = [r for r in rows if r["D"] == D and r["causal"] == causal and r["L"] >= 4096]
            if not rs:
                rs = [r for r in rows if r["D"] == D and r["causal"] == causal]
            for part, cand in (("fwd", fwd_names), ("bwd", bwd_names)):
                scores = []
                for n in cand:
                    vals = [tflops(r, n, part) for r in rs]
                    if not rs or any(v is None for v in vals):
                        continue
                    gm = math.exp(sum(math.log(v) for v in vals) / len(vals))
                    scores.append((gm, n))
                scores.sort(reverse=True)
                base_gm = next((x for x, n in scores if n == "base"), None)
                passing = [(x, n) for x, n in scores if n in ok_names]
                win = passing[0][1] if passing else None
                best[(D, causal, part)] = win
                print("D=%-3d causal=%d %-3s: best %-8s | %s" % (
                    D, causal, part, win or "n/a", "  ".join(
                        "%s%s %.1f (x%.2f)" % (n, "" if n in ok_names else "!", x, x / base_gm if base_gm else 0)
                        for x, n in scores)))
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller lengths, fewer timing configs")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--no-variant", action="store_true", help="build and time only the defaults")
    ap.add_argument("--variants", default="", help="comma-separated variant names (default: all)")
    ap.add_argument("--base-check", choices=("full", "reduced"), default="full",
                    help="correctness set of the default build (reduced = the variants' set)")
    ap.add_argument("--no-fa2", action="store_true", help="skip timing SDPA forced to FLASH_ATTENTION")
    args = ap.parse_args()
    t0 = time.time()
    dev = torch.cuda.get_device_properties(0)
    print("device: %s, torch %s, cupy %s" % (dev.name, torch.__version__, cupy.__version__))
    summary = {}
    bad = check_abi()
    print("ABI echo: %s" % ("OK" if not bad else "MISMATCH (index, got, expected) %s" % bad))
    summary["abi_ok"] = not bad
    if bad:
        print("FlashParams is not passed as laid out; stopping.")
        return 1
    wanted = [v for v in VARIANTS if v[0] == "base"]
    if not args.no_variant:
        sel = [x for x in args.variants.split(",") if x]
        wanted += [v for v in VARIANTS if v[0] != "base" and (not sel or v[0] in sel)]
    builds = []  # (name, Kernels, parts, dims)
    for (name, defs, parts, dims, note) in wanted:
        try:
            K = Kernels(defs, name)
            builds.append((name, K, parts, dims))
            print("built %-7s in %4.1f s  %s  [%s]" % (name, K.compile_s, " ".join(
                "-D%s=%s" % kv for kv in sorted(defs.items())) or "(defaults)", note))
            for kn in sorted(K.attrs):
                if (("fwd" in kn and "fwd" in parts) or ("dq_dk_dv" in kn and "bwd" in parts)) and "bf16" in kn:
                    regs, local, smem = K.attrs[kn]
                    print("    %-28s regs %3d  local %3d B  smem %6d" % (kn, regs, local, smem))
        except Exception as e:  # noqa: BLE001
            print("variant %s: BUILD FAILED: %s" % (name, str(e)[:600]))
            summary.setdefault("build_failed", {})[name] = str(e)[:2000]
            if name == "base":
                return 1
    n_fail = 0
    ok_names = set(n for n, *_ in builds)
    summary["correctness"] = {}
    if not args.no_check:
        for (name, K, parts, dims) in builds:
            if name == "base" and args.base_check == "full":
                res = correctness(K, args.quick, " of base (full set)", verbose=False)
            else:
                res = correctness(K, args.quick, " of %s (reduced set)" % name, list(variant_case_list()),
                                  verbose=False)
            summary["correctness"][name] = res
            fails = [r for r in res if not r["ok"]]
            if fails:
                ok_names.discard(name)
            if name == "base":
                n_fail = len(fails)
            print("(%.0f s so far)" % (time.time() - t0), flush=True)
            if CONTEXT_LOST:
                print("CUDA context lost: stopping the checks (%s)" % CONTEXT_LOST)
                break
    rows = []
    best = {}
    try:
        if not args.no_bench and not CONTEXT_LOST:
            # time base + every variant that passed (or all, with --no-check)
            rows = bench([b for b in builds if b[0] in ok_names or b[0] == "base"], args.quick, not args.no_fa2)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
    finally:
        if not args.no_check:
            print("\n== correctness summary ==")
            for name, res in summary["correctness"].items():
                fails = [r for r in res if not r["ok"]]
                print("%-7s %3d cases, %3d FAIL%s" % (name, len(res), len(fails),
                                                     "" if not fails else "  <-- do not use"))
                for r in fails[:12]:
                    print("    FAIL %s" % {k: v for k, v in r.items() if k not in ("ok",)})
        if rows:
            best = print_bench(rows, [b[0] for b in builds], ok_names)
            summary["bench"] = [dict(r, ms={"%s/%s" % k: v for k, v in r["ms"].items()}) for r in rows]
            summary["best"] = {"D%d_causal%d_%s" % k: v for k, v in best.items()}
        print("\ntotal %.0f s" % (time.time() - t0))
        if _OUT:
            with open(os.path.join(_OUT, "attention_check.json"), "w") as f:
                json.dump(summary, f, indent=1, default=str)
    return 1 if n_fail else 0


if __name__ == "__main__":
    try:
        rc = main()
    finally:
        if _OWN_TMP:
            shutil.rmtree(_TMP, ignore_errors=True)
    sys.exit(rc)
