#!/usr/bin/env python3
"""PyTorch baselines for the training kernels (`bench-harness --bench train`), same shapes.

Prints one JSON line per case, in the format of `benches/torch_baseline.py`:
{"case": ..., "torch_ms": ms, "bytes": ..., "best_form": ..., "<form>_ms": ...}. `bytes` is
the fewest bytes the case must move through device memory (each input read once, each
output written once), the same count the rtx harness uses, so both sides report TB/s
against the device copy peak, which this script measures too (`copy_peak`).

    python3 benches/torch_train.py [--no-compile] [CASE-PREFIX ...]

Forms timed (the fastest is `torch_ms`):
- cross entropy, bf16 logits [8192, 50304], int64 labels: `F.cross_entropy` eager, and
  `torch.compile`d (Inductor fuses the log-softmax and the loss), forward alone and
  forward + backward (`torch.autograd.grad` of the loss w.r.t. the logits);
- layer norm, bf16 [8192, 768] and [8192, 4096], affine: `F.layer_norm` eager and compiled,
  forward and forward + backward (dx, dgamma, dbeta);
- AdamW over 124M f32 parameters in GPT-2 small's tensor sizes: `torch.optim.AdamW(fused=True)`
  and `foreach=True`, one `step()` (gradients already there);
- embedding, GPT-2 sizes (table [50257, 768] f32, 8192 ids): `F.embedding` forward, and
  its backward (`torch.autograd.grad` w.r.t. the table: a scatter-add into a zeroed table).
Times are medians of CUDA-event times after warm-up; inputs are random, never zeros.
"""
import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F

DEV = "cuda"


def emit(case, forms, bytes_):
    timed = {k: v for k, v in forms.items() if v is not None}
    if not timed:
        print(f"{case}: no form could be timed", file=sys.stderr, flush=True)
        return
    best = min(timed, key=timed.get)
    d = {"case": case, "torch_ms": timed[best], "bytes": float(bytes_), "best_form": best}
    d.update({f"{k}_ms": v for k, v in timed.items()})
    d["torch_tbps"] = bytes_ / (timed[best] * 1e-3) / 1e12
    print(json.dumps(d), flush=True)


def median_ms(run, reps=25, warmup=5):
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def guarded(name, f):
    try:
        return f()
    except Exception as e:  # a form that cannot run here is skipped, and said so
        print(f"{name}: skipped ({type(e).__name__}: {e})", file=sys.stderr, flush=True)
        return None


def copy_peak():
    n = 1 << 29  # 2 GiB of f32 each way
    x = torch.randn(n, device=DEV)
    y = torch.empty_like(x)
    ms = median_ms(lambda: y.copy_(x), reps=15)
    emit("copy_peak", {"copy": ms}, 2 * n * 4)


# The small cases' byte counts: a copy moving as many bytes is timed beside each
# (`copy_<case>`), since a kernel that moves tens of MB cannot reach the big copy's peak.
SMALL_CASES = {
    "ln_fwd_8192x768_bf16": 2 * 8192 * 768 * 2,
    "ln_fwdbwd_8192x768_bf16": 5 * 8192 * 768 * 2,
    "ln_fwd_8192x4096_bf16": 2 * 8192 * 4096 * 2,
    "ln_fwdbwd_8192x4096_bf16": 5 * 8192 * 4096 * 2,
    "emb_fwd_50257x768_n8192_f32": 2 * 8192 * 768 * 4 + 8192 * 4,
    "emb_bwd_50257x768_n8192_f32": 50257 * 768 * 4 + 8192 * 768 * 4 + 8192 * 4,
}


def copy_small():
    """`copy_<case>`: `copy_` of bytes / 2 into another buffer (bytes / 2 read, as many
    written) for each small case."""
    for case, bytes_ in SMALL_CASES.items():
        n = bytes_ // 8
        x = torch.randn(n, device=DEV)
        y = torch.empty_like(x)
        emit(f"copy_{case}", {"copy": median_ms(lambda: y.copy_(x))}, 8 * n)


def cross_entropy(compile_):
    n, c = 8192, 50304
    logits = (torch.randn(n, c, device=DEV) * 2).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, c, (n,), device=DEV)
    fwd = lambda f: (lambda: f(logits, labels))
    def fwdbwd(f):
        return lambda: torch.autograd.grad(f(logits, labels), logits)
    ce = F.cross_entropy
    cc = torch.compile(F.cross_entropy) if compile_ else None
    lbytes = n * c * 2 + n * 8
    emit("ce_fwd_8192x50304_bf16",
         {"eager": median_ms(fwd(ce)),
          "compiled": guarded("ce compiled", lambda: median_ms(fwd(cc))) if cc else None},
         lbytes)
    emit("ce_fwdbwd_8192x50304_bf16",
         {"eager": median_ms(fwdbwd(ce)),
          "compiled": guarded("ce compiled bwd", lambda: median_ms(fwdbwd(cc))) if cc else None},
         2 * lbytes + n * c * 2)  # read logits twice (fwd, bwd), write dlogits


def layer_norm(compile_):
    for rows, d in [(8192, 768), (8192, 4096)]:
        x = torch.randn(rows, d, device=DEV).to(torch.bfloat16).requires_grad_()
        w = (1 + 0.1 * torch.randn(d, device=DEV)).to(torch.bfloat16).requires_grad_()
        b = (0.1 * torch.randn(d, device=DEV)).to(torch.bfloat16).requires_grad_()
        dy = torch.randn(rows, d, device=DEV).to(torch.bfloat16)
        ln = lambda x, w, b: F.layer_norm(x, (d,), w, b, 1e-5)
        lc = torch.compile(ln) if compile_ else None
        def fwd(f):
            return lambda: f(x, w, b)
        def fwdbwd(f):
            return lambda: torch.autograd.grad(f(x, w, b), (x, w, b), dy)
        xb = rows * d * 2
        f = {"eager": median_ms(fwd(ln)),
             "compiled": guarded("ln compiled", lambda: median_ms(fwd(lc))) if lc else None}
        fb = {"eager": median_ms(fwdbwd(ln)),
              "compiled": guarded("ln compiled bwd", lambda: median_ms(fwdbwd(lc))) if lc else None}
        # the same PyTorch forms against rtx's experimental bulk-copy kernels too
        # (benches/train.rs, cases ending in _bulk)
        for suffix in ("", "_bulk"):
            emit(f"ln_fwd_{rows}x{d}_bf16{suffix}", f, 2 * xb)  # read x, write y
            emit(f"ln_fwdbwd_{rows}x{d}_bf16{suffix}", fb, 2 * xb + 3 * xb)  # fwd: x, y; bwd: x, dy read, dx written


def gpt2_small_sizes():
    v, d, l, ctx = 50257, 768, 12, 1024
    sizes = [v * d, ctx * d]
    for _ in range(l):
        sizes += [d, d, 3 * d * d, 3 * d, d * d, d, d, d, 4 * d * d, 4 * d, 4 * d * d, d]
    sizes += [d, d]
    return sizes


def adamw():
    sizes = gpt2_small_sizes()
    total = sum(sizes)
    params = [torch.randn(s, device=DEV) * 0.02 for s in sizes]
    for p in params:
        p.requires_grad_()
        p.grad = torch.randn_like(p) * 1e-3
    forms = {}
    for form in ("fused", "foreach"):
        opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, **{form: True})
        forms[form] = guarded(f"adamw {form}", lambda: median_ms(opt.step, reps=15))
    # read p, g, m, v; write p, m, v
    emit(f"adamw_{total // 1_000_000}m_f32", forms, 7 * 4 * total)


def embedding():
    v, d, n = 50257, 768, 8192
    table = (torch.randn(v, d, device=DEV) * 0.02).requires_grad_()
    ids = torch.randint(0, v, (n,), device=DEV)
    dy = torch.randn(n, d, device=DEV)
    emit("emb_fwd_50257x768_n8192_f32",
         {"eager": median_ms(lambda: F.embedding(ids, table))}, 2 * n * d * 4 + n * 8)
    bwd = {"eager": median_ms(lambda: torch.autograd.grad(F.embedding(ids, table), table, dy))}
    # zero + write the table, read dy and ids; the same PyTorch form again against rtx's
    # five-launch backward (the setting embedding_one_launch off; benches/train.rs)
    for case in ("emb_bwd_50257x768_n8192_f32", "emb_bwd_50257x768_n8192_f32_five_launch"):
        emit(case, bwd, v * d * 4 + n * d * 4 + n * 8)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile forms")
    ap.add_argument("cases", nargs="*", help="case prefixes: copy ce ln adamw emb (default all; copy "
                    "includes the copy_<case> references of the small cases)")
    a = ap.parse_args()
    torch.manual_seed(0)
    want = a.cases or ["copy", "ce", "ln", "adamw", "emb"]
    runs = {"copy": lambda: (copy_peak(), copy_small()), "ce": lambda: cross_entropy(not a.no_compile),
            "ln": lambda: layer_norm(not a.no_compile), "adamw": adamw, "emb": embedding}
    for k in want:
        guarded(k, runs[k])


if __name__ == "__main__":
    main()
