#!/usr/bin/env python3
"""Correctness and device-time check of kernels/cuda/small_gemm.cu against PyTorch, on a
GPU host.

    python3 kernels/checks/small_gemm_check.py [--no-check] [--no-bench]

The kernel (y = act(x · wᵀ + bias), f16/bf16, see the file's header) is compiled with
cupy's RawModule (NVRTC) with the runtime's flags (sm_90, -std=c++17, -default-device,
precise math, -I kernels/cuda; cupy adds -ftz=true; before 2026-12-06 this script also
passed --use_fast_math, which the runtime never used) and launched with the geometry of
ops/src/gemm/cuda/small.rs: grid (ceil(n/64), ceil(m/64), batch), 128 threads.

1. Correctness against float64 math on fresh torch.randn inputs (x, w scaled by
   1/sqrt(k) so that outputs are O(1)), the output poisoned with NaN before the launch:
   relative error by the norm, PASS below 1e-2 (one bf16/f16 rounding of the output is
   about 4e-3 / 5e-4). Shapes cover tails in m, n and k, single rows, the batch with
   shared and per-item weights, each activation, with and without bias. A repeated
   launch must be bitwise equal.
2. Device time with CUDA events (median of 30 after warm-up; a ~1 ms spin before each
   start event hides the host's launch cost), for one launch and for 64 launches queued
   back to back (per launch), against PyTorch's fastest form of the same product:
   torch._addmm_activation (cuBLASLt with the bias+relu/gelu epilogue) or F.linear, and
   64 of them captured in a CUDA graph.

A JSON summary goes to $OUT/small_gemm.json when OUT is set.
"""
import argparse
import warnings
import json
import math
import os
import tempfile

_OUT = os.environ.get("OUT")
_TMP = os.path.join(_OUT, "tmp") if _OUT else tempfile.mkdtemp(prefix="small_gemm_")
os.makedirs(_TMP, exist_ok=True)
os.environ["TMPDIR"] = _TMP
tempfile.tempdir = _TMP
os.environ.setdefault("CUPY_CACHE_IN_MEMORY", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import cupy  # noqa: E402

import check_util  # noqa: E402

warnings.filterwarnings("ignore", category=DeprecationWarning)  # cupy.cuda.ExternalStream
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KDIR = os.path.join(ROOT, "kernels", "cuda")
DEV = "cuda"
FAILS = []
SUMMARY = {"checks": [], "bench": []}
ACTS = ("none", "relu", "gelu")


# (BM, BN, BK, STAGES, KSPLIT): the first is the file's default (the launcher's); the
# others are compile-time variants (-DSG_BM=...), checked and timed beside it. KSPLIT > 1
# (warp groups splitting each stage's k steps; runs i2-i3, not adopted) no longer builds:
# small_gemm_batch, in the same file since 659ab1b, requires KSPLIT == 1.
DEFAULT = (64, 64, 64, 2, 1)
VARIANTS = [DEFAULT, (64, 64, 32, 3, 1), (64, 64, 64, 3, 1), (32, 64, 64, 2, 1)]


class Module:
    def __init__(self, v):
        bm, bn, bk, st, ks = v
        src = open(os.path.join(KDIR, "small_gemm.cu")).read()
        opts = ("-std=c++17", "-default-device", "-I" + KDIR, "--gpu-architecture=sm_90",
                "-DSG_BM=%d" % bm, "-DSG_BN=%d" % bn, "-DSG_BK=%d" % bk, "-DSG_STAGES=%d" % st,
                "-DSG_KSPLIT=%d" % ks)
        self.mod = cupy.RawModule(code=src, options=opts)
        self.v, self.bm, self.bn = v, bm, bn
        self.threads = (bm // 32) * (bn // 32) * 32 * ks
        self.fns = {}
        self.name = "%dx%dx%d/%d/k%d" % v

    def fn(self, act, dt):
        key = (act, dt)
        if key not in self.fns:
            self.fns[key] = self.mod.get_function("small_gemm_%s_%s" % key)
        return self.fns[key]

    def launch(self, act, x, w, bias, y, m, n, k, batch, sx, sw, stream=None):
        dt = {torch.float16: "f16", torch.bfloat16: "bf16"}[x.dtype]
        grid = ((n + self.bn - 1) // self.bn, (m + self.bm - 1) // self.bm, batch)
        p = lambda t: np.uint64(0 if t is None else t.data_ptr())  # noqa: E731
        args = (p(x), p(w), p(bias), p(y), np.int32(m), np.int32(n), np.int32(k),
                np.int64(sx), np.int64(sw), np.int64(0), np.int64(m * n))
        self.fn(act, dt)(grid, (self.threads, 1, 1), args, stream=stream)


def torch_stream():
    return cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)


def ref(act, x, w, bias):
    y = x.double() @ w.double().transpose(-1, -2)
    if bias is not None:
        y = y + bias.double()
    if act == "relu":
        y = torch.relu(y)
    elif act == "gelu":
        y = F.gelu(y, approximate="tanh")
    return y


def rel(out, r):
    out = out.double()
    if not torch.isfinite(out).all():
        return float("nan")
    return (out - r).norm().item() / max(r.norm().item(), 1e-30)


def inputs(batch, m, n, k, dt, shared_w, has_bias):
    s = 1.0 / math.sqrt(k)
    x = (torch.randn(batch, m, k, device=DEV) * s).to(dt)
    w = (torch.randn(1 if shared_w else batch, n, k, device=DEV) * s).to(dt)
    b = torch.randn(n, device=DEV).to(dt) if has_bias else None
    return x, w, b


def check(mod, full):
    shapes = [  # (batch, m, n, k, shared w)
        (1, 1, 8, 8, True), (1, 7, 24, 40, True), (1, 64, 64, 64, True),
        (1, 65, 72, 136, True), (1, 255, 264, 248, True), (1, 256, 256, 256, True),
        (1, 512, 512, 512, True), (1, 100, 1000, 8, True), (1, 33, 8, 2048, True),
        (3, 130, 64, 96, False), (8, 64, 256, 256, False), (5, 17, 40, 24, True),
    ]
    if not full:
        shapes = shapes[1:2] + shapes[4:5] + shapes[8:10]
    for dt in (torch.bfloat16, torch.float16):
        for (batch, m, n, k, shared) in shapes:
            for act in (ACTS if full else ACTS[1:2]):
                for has_bias in (False, True):
                    x, w, b = inputs(batch, m, n, k, dt, shared, has_bias)
                    y = torch.full((batch, m, n), float("nan"), device=DEV, dtype=dt)
                    mod.launch(act, x, w, b, y, m, n, k, batch, m * k, 0 if shared else n * k,
                               torch_stream())
                    torch.cuda.synchronize()
                    e = rel(y, ref(act, x, w, b))
                    y2 = torch.full_like(y, float("nan"))
                    mod.launch(act, x, w, b, y2, m, n, k, batch, m * k, 0 if shared else n * k,
                               torch_stream())
                    torch.cuda.synchronize()
                    same = torch.equal(y.view(torch.int16), y2.view(torch.int16))
                    ok = e == e and e < 1e-2 and same
                    name = "[%s] %s %s b%d %dx%dx%d%s%s" % (
                        mod.name, str(dt).split(".")[-1], act, batch, m, n, k,
                        "" if shared else " w/item", " +bias" if has_bias else "")
                    SUMMARY["checks"].append({"case": name, "rel": e, "bitwise": same, "ok": ok})
                    if not ok or full and act == "none" and has_bias:
                        print("%s %-44s rel %.2e bitwise-repeat %s" % (
                            "PASS" if ok else "FAIL", name, e, same), flush=True)
                    if not ok:
                        FAILS.append(name)


def time_ms(fn):
    return check_util.time_ms(fn, reps=30)


def graph_of(fn, q):
    """fn() q times captured in one CUDA graph (after a warm-up on a side stream)."""
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        for _ in range(q):
            fn()
    torch.cuda.synchronize()
    return g


def bench(mods):
    """Per product, µs: one launch alone (the event pair around it), and q = 64 queued
    back to back: eagerly and captured in one CUDA graph (the device's time per product
    with no host in it). The ratio is PyTorch's best per-product time over ours."""
    q = 64
    shapes = [(1, 256, 256, 256, "relu"), (1, 256, 256, 256, "none"),
              (1, 64, 256, 256, "relu"), (1, 512, 512, 512, "relu"),
              (1, 128, 1024, 256, "gelu"), (1, 32, 512, 512, "relu"),
              (1, 1024, 256, 256, "relu"), (1, 16, 768, 768, "gelu"),
              (8, 256, 256, 256, "relu")]
    print("\n%-22s %-14s %9s %9s %9s %8s" % (
        "case (bf16, +bias)", "kernel", "alone", "eager/64", "graph/64", "ratio"))
    for (batch, m, n, k, act) in shapes:
        dt = torch.bfloat16
        x, w, b = inputs(batch, m, n, k, dt, batch == 1, True)
        x2, w2 = x[0], w[0]
        y = torch.empty(batch, m, n, device=DEV, dtype=dt)
        case = "%s%dx%dx%d %s" % ("%dx" % batch if batch > 1 else "", m, n, k, act)

        def theirs():
            if batch > 1:  # the stacked form: one batched product, then the activation
                return torch.relu(torch.baddbmm(b, x, w.transpose(1, 2)))
            if act == "none":
                return F.linear(x2, w2, b)
            return torch._addmm_activation(b, x2, w2.t(), use_gelu=(act == "gelu"))

        rows = []

        def many(f):
            return lambda: [f() for _ in range(q)]

        t1, tq = time_ms(theirs), time_ms(many(theirs)) / q
        tg = time_ms(graph_of(theirs, q).replay) / q
        rows.append(("torch", t1, tq, tg))
        for mod in mods:
            def ours(mod=mod):
                mod.launch(act, x, w, b, y, m, n, k, batch, m * k, 0 if batch == 1 else n * k,
                           torch_stream())
            o1, oq = time_ms(ours), time_ms(many(ours)) / q
            og = time_ms(graph_of(ours, q).replay) / q
            rows.append((mod.name, o1, oq, og))
        best = min(tq, tg)
        for (name, a1, aq, ag) in rows:
            ratio = best / ag if name != "torch" else float("nan")
            print("%-22s %-14s %7.2fus %7.2fus %7.2fus %7.2fx" % (
                case, name, a1 * 1e3, aq * 1e3, ag * 1e3, ratio), flush=True)
            SUMMARY["bench"].append({"case": case, "kernel": name, "alone_us": a1 * 1e3,
                                     "eager_q_us": aq * 1e3, "graph_q_us": ag * 1e3,
                                     "ratio_graph": ratio})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--no-bench", action="store_true")
    a = ap.parse_args()
    torch.manual_seed(0)
    mods = [Module(v) for v in VARIANTS]
    for mod in mods:
        f = mod.fn("relu", "bf16")
        print("[%s] small_gemm_relu_bf16: %d threads, %d regs, %d B smem, %d B local" % (
            mod.name, mod.threads, f.attributes["num_regs"], f.attributes["shared_size_bytes"],
            f.attributes["local_size_bytes"]))
    if not a.no_check:
        for mod in mods:
            check(mod, mod.v == DEFAULT)
        n = len(SUMMARY["checks"])
        print("%d of %d checks passed" % (n - len(FAILS), n))
    if not a.no_bench:
        bench(mods)
    if _OUT:
        with open(os.path.join(_OUT, "small_gemm.json"), "w") as fh:
            json.dump(SUMMARY, fh, indent=1)
    raise SystemExit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
