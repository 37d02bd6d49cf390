#!/usr/bin/env python3
"""The sweep of `rtx` (the main job; `train/src/pipeline/sweep.rs`) in PyTorch, in every
form a strong PyTorch user would write it, for `benches/sweep.rs` to be compared with.

8 MLP classifiers (the `MODELS` list below = `SweepConfig::models` of sweep.rs: widths
128-2048, depths 2-4, GELU (tanh) between layers, SGD with momentum and AdamW at
several learning rates, no weight decay) on 256-d inputs, 10 classes, batch 512, 200 steps
each, bf16 autocast, fused optimizers, data already on the GPU (32 batches per model,
cycled). The loss is kept every 10 steps on the device and read once at the end.

    python3 benches/torch_sweep.py [FORM ...]      default: every form

Forms (one JSON line each: {"case": "sweep_torch_<form>", "samples_per_s": ..., "wall_s": ...}):
  sequential        one model after another, eager
  interleaved       step by step, all models, one stream, eager
  streams           the same, one CUDA stream per model (stream context entered per step)
  graph1            a CUDA graph of each model's whole step (forward, loss, backward,
                    optimizer with capturable=True), replayed in turn on one stream
  graphN            the same graphs, each replayed on its own stream
  stacked           8 models of one shape (512 wide, 3 deep, AdamW) stacked into bmm
                    (weights [8, out, in]), eager; AdamW on the stacked tensors is the
                    same update as on each model's
  stacked_graph     the same in one CUDA graph
  vmap              the 8 same-shape models via torch.func.stack_module_state + vmap of
                    functional_call (grad by torch.func.grad), eager
  processes         8 processes at once, one model each (sequential eager in each)
  each              each model's step alone on the default stream, eager and its graph
                    replayed: {"case": "sweep_torch_each_{eager,graph}_mlp-WxD",
                    "us_per_step": ...} (not in the default list)
samples/s is of the whole sweep: 8 x steps x batch / wall time (the stacked forms train 8
models of one shape, the same number of samples).
"""
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

DEV = "cuda"
DIM, CLASSES, BATCH, STEPS, LOSS_EVERY, NBATCH = 256, 10, 512, 200, 10, 32
# (width, depth, optimizer, lr, momentum): the list of sweep.rs.
MODELS = [
    (128, 2, "adamw", 3e-3, 0.0),
    (256, 3, "sgd", 0.05, 0.9),
    (512, 3, "adamw", 1e-3, 0.0),
    (512, 4, "sgd", 0.1, 0.9),
    (1024, 2, "adamw", 1e-3, 0.0),
    (1024, 3, "sgd", 0.05, 0.9),
    (2048, 2, "adamw", 5e-4, 0.0),
    (2048, 4, "adamw", 3e-4, 0.0),
]


def mlp(width, depth):
    sizes = [DIM] + [width] * (depth - 1) + [CLASSES]
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes):
            layers.append(nn.GELU(approximate="tanh"))
    return nn.Sequential(*layers).to(DEV)


def optimizer(params, kind, lr, momentum, capturable=False):
    if kind == "adamw":
        if capturable:
            return torch.optim.AdamW(params, lr=lr, weight_decay=0.0, fused=True, capturable=True)
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0, fused=True)
    try:
        return torch.optim.SGD(params, lr=lr, momentum=momentum, fused=True)
    except (TypeError, RuntimeError):
        return torch.optim.SGD(params, lr=lr, momentum=momentum, foreach=True)


def data(seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    teacher = torch.randn(DIM, CLASSES, device=DEV, generator=g)
    xs = torch.rand(NBATCH, BATCH, DIM, device=DEV, generator=g) * 2 - 1
    ys = (xs @ teacher).argmax(-1)
    return xs, ys


class Job:
    """One model, its optimizer and its data."""

    def __init__(self, i, capturable=False):
        w, d, kind, lr, mom = MODELS[i]
        torch.manual_seed(100 + i)
        self.model = mlp(w, d)
        self.opt = optimizer(self.model.parameters(), kind, lr, mom, capturable)
        self.xs, self.ys = data(i)
        self.losses = []
        self.k = 0

    def step(self):
        x, y = self.xs[self.k % NBATCH], self.ys[self.k % NBATCH]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.k += 1
        if self.k % LOSS_EVERY == 0:
            self.losses.append(loss.detach())

    def capture(self, stream):
        """A graph of the whole step on `stream`, reading static_x / static_y."""
        self.static_x = self.xs[0].clone()
        self.static_y = self.ys[0].clone()
        with torch.cuda.stream(stream):
            for _ in range(3):  # warm-up: optimizer states, cuBLAS workspaces
                self.step()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        self.opt.zero_grad(set_to_none=True)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=stream):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                self.static_loss = F.cross_entropy(self.model(self.static_x), self.static_y)
            self.static_loss.backward()
            self.opt.step()
        self.k = 0
        self.losses = []

    def replay(self):
        self.static_x.copy_(self.xs[self.k % NBATCH], non_blocking=True)
        self.static_y.copy_(self.ys[self.k % NBATCH], non_blocking=True)
        self.graph.replay()
        self.k += 1
        if self.k % LOSS_EVERY == 0:
            self.losses.append(self.static_loss.detach().clone())


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def emit(form, wall, models=8, steps=STEPS, extra=None):
    rec = {"case": f"sweep_torch_{form}", "samples_per_s": round(models * steps * BATCH / wall, 1),
           "wall_s": round(wall, 4), "steps": steps, "batch": BATCH}
    rec.update(extra or {})
    print(json.dumps(rec), flush=True)


def warm(jobs, n=3):
    for j in jobs:
        for _ in range(n):
            j.step()
    for j in jobs:
        j.k, j.losses = 0, []


def form_sequential():
    jobs = [Job(i) for i in range(8)]
    warm(jobs)
    emit("sequential", timed(lambda: [j.step() for j in jobs for _ in range(STEPS)]))


def form_interleaved():
    jobs = [Job(i) for i in range(8)]
    warm(jobs)
    emit("interleaved", timed(lambda: [j.step() for _ in range(STEPS) for j in jobs]))


def form_streams():
    jobs = [Job(i) for i in range(8)]
    streams = [torch.cuda.Stream() for _ in jobs]
    warm(jobs)

    def run():
        for _ in range(STEPS):
            for j, s in zip(jobs, streams):
                with torch.cuda.stream(s):
                    j.step()
        for s in streams:
            torch.cuda.current_stream().wait_stream(s)

    emit("streams", timed(run))


def form_graphs(own_streams):
    jobs = [Job(i, capturable=True) for i in range(8)]
    streams = [torch.cuda.Stream() for _ in jobs]
    for j, s in zip(jobs, streams):
        j.capture(s)
    torch.cuda.synchronize()

    def run():
        if own_streams:
            for _ in range(STEPS):
                for j, s in zip(jobs, streams):
                    with torch.cuda.stream(s):
                        j.replay()
            for s in streams:
                torch.cuda.current_stream().wait_stream(s)
        else:
            for _ in range(STEPS):
                for j in jobs:
                    j.replay()

    emit("graphN" if own_streams else "graph1", timed(run))


class Stacked(nn.Module):
    """8 MLPs of one shape (512 wide, 3 deep) as batched weights."""

    def __init__(self, n=8, width=512, depth=3):
        super().__init__()
        sizes = [DIM] + [width] * (depth - 1) + [CLASSES]
        self.w = nn.ParameterList()
        self.b = nn.ParameterList()
        for i in range(len(sizes) - 1):
            bound = 1 / sizes[i] ** 0.5
            self.w.append(nn.Parameter(torch.empty(n, sizes[i], sizes[i + 1], device=DEV).uniform_(-bound, bound)))
            self.b.append(nn.Parameter(torch.empty(n, 1, sizes[i + 1], device=DEV).uniform_(-bound, bound)))

    def forward(self, x):  # x [n, batch, DIM]
        for i, (w, b) in enumerate(zip(self.w, self.b)):
            x = torch.baddbmm(b, x, w)
            if i + 1 < len(self.w):
                x = F.gelu(x, approximate="tanh")
        return x


def stacked_setup(capturable):
    model = Stacked()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, fused=True, capturable=capturable)
    xs, ys = data(7)
    xs = xs[:, None].expand(NBATCH, 8, BATCH, DIM).contiguous()
    ys = ys[:, None].expand(NBATCH, 8, BATCH).contiguous()
    return model, opt, xs, ys


def stacked_step(model, opt, x, y):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, CLASSES), y.reshape(-1)) * 8  # sum of means
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def form_stacked():
    model, opt, xs, ys = stacked_setup(False)
    for k in range(3):
        stacked_step(model, opt, xs[k], ys[k])
    losses = []

    def run():
        for k in range(STEPS):
            loss = stacked_step(model, opt, xs[k % NBATCH], ys[k % NBATCH])
            if (k + 1) % LOSS_EVERY == 0:
                losses.append(loss.detach())

    emit("stacked", timed(run))


def form_stacked_graph():
    model, opt, xs, ys = stacked_setup(True)
    sx, sy = xs[0].clone(), ys[0].clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            stacked_step(model, opt, sx, sy)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    opt.zero_grad(set_to_none=True)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            sl = F.cross_entropy(model(sx).reshape(-1, CLASSES), sy.reshape(-1)) * 8
        sl.backward()
        opt.step()
    losses = []

    def run():
        for k in range(STEPS):
            sx.copy_(xs[k % NBATCH], non_blocking=True)
            sy.copy_(ys[k % NBATCH], non_blocking=True)
            g.replay()
            if (k + 1) % LOSS_EVERY == 0:
                losses.append(sl.detach().clone())

    emit("stacked_graph", timed(run))


def form_vmap():
    from torch.func import functional_call, grad, stack_module_state, vmap

    models = [mlp(512, 3) for _ in range(8)]
    params, buffers = stack_module_state(models)
    base = mlp(512, 3).to("meta")
    opt = torch.optim.AdamW(list(params.values()), lr=1e-3, weight_decay=0.0, fused=True)
    xs, ys = data(7)

    def loss_fn(p, b, x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return F.cross_entropy(functional_call(base, (p, b), (x,)), y)

    gfn = vmap(grad(loss_fn), in_dims=(0, 0, None, None))

    def step(k):
        gs = gfn(params, buffers, xs[k % NBATCH], ys[k % NBATCH])
        for name, p in params.items():
            p.grad = gs[name]
        opt.step()

    for k in range(3):
        step(k)
    emit("vmap", timed(lambda: [step(k) for k in range(STEPS)]))


def _worker(i, barrier, q):
    torch.cuda.init()
    job = Job(i)
    warm([job])
    torch.cuda.synchronize()
    barrier.wait()
    t = time.perf_counter()
    for _ in range(STEPS):
        job.step()
    torch.cuda.synchronize()
    q.put((t, time.perf_counter()))


def form_processes():
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier, q = ctx.Barrier(8), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(i, barrier, q)) for i in range(8)]
    for p in procs:
        p.start()
    spans = [q.get() for _ in procs]
    for p in procs:
        p.join()
    wall = max(e for _, e in spans) - min(s for s, _ in spans)
    emit("processes", wall)


def form_each():
    """Each model's step alone, eager and as its graph replayed, on the default stream:
    µs per step over 400 steps after warm-up (and capture), for `sweep.rs --each`."""
    only = os.environ.get("SWEEP_EACH")  # model i only (for a profiler run)
    for i, (w, d, kind, _, _) in enumerate(MODELS):
        if only is not None and int(only) != i:
            continue
        job = Job(i)
        warm([job])
        t = timed(lambda: [job.step() for _ in range(400)])
        print(json.dumps({"case": f"sweep_torch_each_eager_mlp-{w}x{d}", "us_per_step": round(t / 400 * 1e6, 2),
                          "model": f"mlp-{w}x{d}", "opt": kind}), flush=True)
        job = Job(i, capturable=True)
        job.capture(torch.cuda.Stream())
        torch.cuda.synchronize()
        t = timed(lambda: [job.replay() for _ in range(400)])
        print(json.dumps({"case": f"sweep_torch_each_graph_mlp-{w}x{d}", "us_per_step": round(t / 400 * 1e6, 2),
                          "model": f"mlp-{w}x{d}", "opt": kind}), flush=True)


FORMS = {
    "sequential": form_sequential,
    "interleaved": form_interleaved,
    "streams": form_streams,
    "graph1": lambda: form_graphs(False),
    "graphN": lambda: form_graphs(True),
    "stacked": form_stacked,
    "stacked_graph": form_stacked_graph,
    "vmap": form_vmap,
    "processes": form_processes,
    "each": form_each,
}


def main():
    want = sys.argv[1:] or [f for f in FORMS if f != "each"]
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", file=sys.stderr, flush=True)
    for name in want:
        if name not in FORMS:
            print(f"unknown form {name}; forms: {' '.join(FORMS)}", file=sys.stderr)
            sys.exit(2)
        try:
            FORMS[name]()
        except Exception as e:  # one failing form does not hide the others
            print(f"{name}: failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    os.sys.stdout.flush()


if __name__ == "__main__":
    main()
