#!/usr/bin/env python3
"""The PyTorch agreement check of rtx's training layers.

Loads what `examples/torch_agreement.rs` exported (an MLP and a pre-norm causal
transformer block: initial weights, a batch, rtx's logits, cross-entropy loss, every
gradient of the first step and the losses of 10 AdamW steps), rebuilds the same models
in PyTorch with the same math, recomputes everything, prints the relative error of each
tensor (||rtx - torch|| / ||torch||) and the 10 losses side by side, and exits non-zero
when any of them disagrees beyond the tolerance.

How to run (on the GPU host: rtx on CUDA, torch on CUDA; or anywhere on the CPU):

    cargo run --release --example torch_agreement -- target/agreement   # [--cpu]
    python3 train/checks/torch_agreement.py target/agreement            # [--device cpu]

Needs `torch` (any recent version; the CPU build is enough) and nothing else.

The same math on both sides:
- Linear: y = x W^T + b (W as nn.Linear's [out, in]); GELU in its tanh form
  (F.gelu(approximate="tanh")), as rtx's Activation::Gelu;
- LayerNorm over the last dim, biased variance, eps from the index (1e-5);
- attention: F.scaled_dot_product_attention(is_causal=True), scale 1/sqrt(head dim),
  heads split as [B, L, H, D/H] -> [B, H, L, D/H]; where rtx ran the attention op in
  f16 (f32 parameters on CUDA: its flash kernels take f16/bf16), q, k, v and the
  attention output are rounded through f16 here too;
- block: h = x + attn(LN1(x)); y = h + fc2(gelu(fc1(LN2(h)))); the loss is the
  cross-entropy of each position's D outputs as logits (labels in the batch);
- F.cross_entropy (mean) and torch.optim.AdamW with the index's lr, betas, eps and
  weight decay; the losses are recorded before each step's update.

The reference computes in float64. Tolerances (relative by the norm): 1e-4 for the
tensors and 1e-3 for the 10 losses when rtx computed in f32; 3e-2 and 5e-2 where its
attention ran in f16. A gradient that vanishes by symmetry (the key projection's bias:
softmax ignores a shift shared by a row) is measured against 1e-2 of the largest
gradient norm of the model instead of its own (then it is f32 rounding noise).
"""

import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

STEPS = 10


def load(root, entry):
    dtype = {"f32": torch.float32, "i32": torch.int32}[entry["dtype"]]
    with open(os.path.join(root, entry["file"]), "rb") as f:
        data = bytearray(f.read())
    t = torch.frombuffer(data, dtype=dtype).clone()
    return t.reshape(entry["shape"])


def rel(a, b, floor=0.0):
    a = a.detach().double().cpu().flatten()
    b = b.detach().double().cpu().flatten()
    den = max(b.norm().item(), floor, 1e-300)
    return (a - b).norm().item() / den


def gelu(x):
    return F.gelu(x, approximate="tanh")


class Mlp(torch.nn.Module):
    def __init__(self, sizes):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:])
        )

    def forward(self, x):
        for i, l in enumerate(self.layers):
            x = l(x)
            if i + 1 < len(self.layers):
                x = gelu(x)
        return x

    def ordered(self):
        """Parameters in rtx's order: each layer's weight, then bias."""
        return [p for l in self.layers for p in (l.weight, l.bias)]


class Block(torch.nn.Module):
    def __init__(self, d, heads, hidden, eps, attn_round):
        super().__init__()
        self.heads = heads
        self.attn_round = attn_round
        self.ln1 = torch.nn.LayerNorm(d, eps=eps)
        self.q, self.k, self.v, self.out = (torch.nn.Linear(d, d) for _ in range(4))
        self.ln2 = torch.nn.LayerNorm(d, eps=eps)
        self.fc1 = torch.nn.Linear(d, hidden)
        self.fc2 = torch.nn.Linear(hidden, d)

    def rnd(self, t):
        return t.to(self.attn_round).to(t.dtype) if self.attn_round is not None else t

    def attn(self, x):
        b, l, d = x.shape
        h = self.heads

        def split(t):
            return self.rnd(t.reshape(b, l, h, d // h).permute(0, 2, 1, 3))

        o = F.scaled_dot_product_attention(
            split(self.q(x)), split(self.k(x)), split(self.v(x)), is_causal=True
        )
        return self.out(self.rnd(o).permute(0, 2, 1, 3).reshape(b, l, d))

    def forward(self, x):
        h = x + self.attn(self.ln1(x))
        return h + self.fc2(gelu(self.fc1(self.ln2(h))))

    def ordered(self):
        """Parameters in rtx's order (TransformerBlock::parameters)."""
        mods = [self.ln1, self.q, self.k, self.v, self.out, self.ln2, self.fc1, self.fc2]
        return [p for m in mods for p in (m.weight, m.bias)]


def check(name, root, spec, device, failures):
    cfg = spec["config"]
    t = {k: load(root, e) for k, e in spec["tensors"].items()}
    names = [k[len("init."):] for k in spec["tensors"] if k.startswith("init.")]
    f16_attn = cfg.get("attn_dtype", "f32") != "f32"
    tol, loss_tol = (3e-2, 5e-2) if f16_attn else (1e-4, 1e-3)
    dt = torch.float64
    if name == "mlp":
        model = Mlp(cfg["sizes"])
    else:
        rnd = {"f16": torch.float16, "bf16": torch.bfloat16}.get(cfg.get("attn_dtype"))
        model = Block(cfg["d"], cfg["heads"], cfg["hidden"], cfg["eps"], rnd)
    model = model.to(device=device, dtype=dt)
    params = model.ordered()
    if len(params) != len(names):
        print(f"{name}: {len(names)} exported parameters, the torch model has {len(params)}")
        failures.append(name)
        return
    with torch.no_grad():
        for p, n in zip(params, names):
            src = t["init." + n]
            if tuple(src.shape) != tuple(p.shape):
                print(f"{name}: {n} is {tuple(src.shape)}, torch has {tuple(p.shape)}")
                failures.append(name)
                return
            p.copy_(src.to(device=device, dtype=dt))
    x = t["batch.x"].to(device=device, dtype=dt)
    labels = t["batch.labels"].to(device=device, dtype=torch.long)

    def loss_of():
        y = model(x)
        logits = y.reshape(-1, y.shape[-1])
        return logits, F.cross_entropy(logits, labels)

    a = cfg["adamw"]
    opt = torch.optim.AdamW(
        params,
        lr=a["lr"],
        betas=(a["beta1"], a["beta2"]),
        eps=a["eps"],
        weight_decay=a["weight_decay"],
    )
    print(f"== {name} (rtx on {cfg.get('backend')}, attention in {cfg.get('attn_dtype', 'f32')};"
          f" torch {torch.__version__} on {device}, float64; tolerance {tol:g})")
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        logits, loss = loss_of()
        loss.backward()
        losses.append(loss.item())
        if step == 0:
            rows = [("logits", rel(t["logits"], logits)), ("loss", rel(t["loss"].reshape(()), loss))]
            grads = [p.grad for p in params]
            scale = max(g.norm().item() for g in grads)
            for n, g in zip(names, grads):
                rows.append(("grad." + n, rel(t["grad." + n], g, floor=1e-2 * scale)))
            for n, e in rows:
                bad = not (e <= tol)
                print(f"  {n:24s} {e:10.3e}{'   <-- beyond tolerance' if bad else ''}")
                if bad:
                    failures.append(f"{name}/{n}")
        opt.step()
    print(f"  {'step':>4s} {'rtx loss':>14s} {'torch loss':>14s} {'rel':>10s}")
    for i, (r, p) in enumerate(zip(spec["losses"], losses)):
        e = abs(r - p) / max(abs(p), 1e-30)
        bad = not (e <= loss_tol)
        print(f"  {i:4d} {r:14.7g} {p:14.7g} {e:10.3e}{'   <-- beyond tolerance' if bad else ''}")
        if bad:
            failures.append(f"{name}/loss[{i}]")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", nargs="?", default="target/agreement")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    with open(os.path.join(args.dir, "index.json")) as f:
        index = json.load(f)
    failures = []
    for name in ("mlp", "block"):
        if name not in index:
            print(f"{name}: missing from the export")
            failures.append(name)
            continue
        check(name, args.dir, index[name], args.device, failures)
    if failures:
        print(f"DISAGREE: {len(failures)} beyond tolerance: {', '.join(failures)}")
        sys.exit(1)
    print("AGREE: every tensor and the 10 losses of both models within tolerance")


if __name__ == "__main__":
    main()
