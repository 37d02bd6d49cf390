#!/usr/bin/env python3
"""PyTorch baselines for the rtx benchmark harness, on the same shapes, in PyTorch's best form.

Prints one JSON line per case: {"case": ..., "torch_ms": ms, "bytes": ..., "flops": ...}
with the same case names as `benches/harness.rs`, so `benches/compare.py` can join them.
Times with CUDA events after warm-up; medians; inputs are random (never zeros).

    python3 benches/torch_baseline.py [SUITE ...]
        suites: ew reduce chain gemm conv streams attention (default: all)

Where PyTorch has several ways to run a case, every way is timed and `torch_ms` is the
fastest; the line says which (`best_form`) and carries each form's time (`<form>_ms`):

- attention: `scaled_dot_product_attention` through each SDPA backend that is available
  (`torch.nn.attention.sdpa_kernel` with CUDNN_ATTENTION, FLASH_ATTENTION,
  EFFICIENT_ATTENTION; an unavailable one is skipped with a note on stderr) and without
  a backend restriction (`default`); forward + backward via `torch.autograd.grad`.
  Every backend's output is checked against the first one's before it is timed.
- streams (8 independent chains x 200 steps of relu(x W^T), bf16 256x256, the harness's
  `streams_8x200_*` workload): eager on the default stream; eager with the chains on k
  streams (k = 2, 4, 8; the stream context entered once per chain); the whole workload
  captured in one CUDA graph on one stream; one graph with 8 forked capture streams; the
  8 chains stacked into one `bmm` per step, eager and in one CUDA graph. Each form is
  also emitted on its own line (`streams_8x200@<form>`).
- chain (1000 dependent 16-element adds): eager, and the 1000 adds captured in one CUDA
  graph and replayed (`chain_1000_tiny_adds@<form>` lines too).
- gemm, conv: eager (`torch_ms`) with the calls' device time without PyTorch's host
  (`graph_ms`: the calls captured in a CUDA graph, its replays timed).
"""
import json
import statistics
import sys
import time
import traceback

import torch

DEV = "cuda"
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.backends.cudnn.benchmark = True


def emit(case, ms, bytes_=0.0, flops=0.0, **extra):
    d = {"case": case, "torch_ms": ms, "bytes": bytes_, "flops": flops}
    d.update(extra)
    print(json.dumps(d), flush=True)


def note(msg):
    print(msg, file=sys.stderr, flush=True)


def emit_best(cases, forms, bytes_, flops, lines_for_forms=None, **extra):
    """Emits each name of `cases` with `torch_ms` = the fastest of `forms` (a dict form ->
    ms, None where the form is unavailable), `best_form`, and every form's `<form>_ms`;
    and, if `lines_for_forms` is a prefix, one line per form named `<prefix>@<form>`."""
    timed = {k: v for k, v in forms.items() if v is not None}
    if not timed:
        note(f"{cases}: no form could be timed")
        return
    best = min(timed, key=timed.get)
    fields = {f"{k}_ms": v for k, v in timed.items()}
    for c in cases:
        emit(c, timed[best], bytes_, flops, best_form=best, **fields, **extra)
    if lines_for_forms:
        for k, v in timed.items():
            emit(f"{lines_for_forms}@{k}", v, bytes_, flops)


def median_ms(run, reps=9, warmup=2):
    """Median over `reps` of the CUDA-event time of one `run()` on the current stream,
    after `warmup` runs. The device is idle at each start (synchronized), so the span
    from the start event to the end event covers the whole workload, including any time
    the device waited for the host. `run` must leave every side stream joined to the
    current stream before it returns."""
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def capture(fn):
    """Captures `fn()` into a CUDA graph, after warm-up calls on a side stream (as
    PyTorch's docs prescribe); returns (graph, the graph's output)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph, out


def rel_err(x, ref):
    x, ref = x.double(), ref.double()
    return (torch.linalg.vector_norm(x - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-300)).item()


def check_close(what, x, ref, tol=2e-2):
    """Raises when `x` is not `ref` (relative error by the norm): a form that computes
    something else must not be timed as the baseline."""
    if isinstance(x, (list, tuple)):
        for i, (a, b) in enumerate(zip(x, ref)):
            check_close(f"{what}[{i}]", a, b, tol)
        return
    e = rel_err(x, ref)
    if not e <= tol:
        raise RuntimeError(f"{what}: relative error {e:.3e} > {tol}")


def uniform(*shape, dtype):
    """Uniform in [-1, 1), drawn in f32 and rounded to `dtype`: the distribution the rtx
    harness uses (`random_f32`, then rounded). Drawing f16/bf16 directly (`torch.rand(...,
    dtype=bf16)`) leaves the low mantissa bits mostly zero; the tensor cores then draw
    less power and the GPU holds a higher clock, about 1 % on a bf16 4096³ GEMM
    (`docs/performance-notes.md`, "Input distributions change clocks")."""
    return (torch.rand(*shape, device=DEV) * 2 - 1).to(dtype)


def time_cuda(fn, batch=10, reps=15):
    """Median over reps of the per-call milliseconds of `batch` back-to-back fn() calls
    between two CUDA events, after warm-up (the same method as the rtx harness's
    `time_with`): one batch runs ahead of the first event and the host stays up to two
    batches ahead, so each sample measures back-to-back device work, not the delay from
    an event to the first launch behind it."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()

    def event():
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    for _ in range(batch):
        fn()
    events = [event()]
    for i in range(reps):
        for _ in range(batch):
            fn()
        events.append(event())
        if len(events) > 2:
            events[-3].synchronize()
    events[-1].synchronize()
    times = [a.elapsed_time(b) / batch for a, b in zip(events, events[1:])]
    return statistics.median(times)


def time_graph(fn, batch=10, reps=9):
    """PyTorch's device time per call without its host: `batch` calls captured in a CUDA
    graph, whose replays are timed like `time_cuda` (one replay per sample). Emitted as
    `graph_ms` beside `torch_ms`, which is what a PyTorch program sees and is limited by
    PyTorch's per-call host cost when the op is short."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(batch):
            fn()
    return time_cuda(graph.replay, batch=1, reps=reps) / batch


def suite_ew():
    for dt, name in ((torch.float32, "f32"), (torch.float16, "f16")):
        for p in (24, 26, 28):
            n = 1 << p
            # drawn as the rtx harness draws them (its `random_f32`, rounded), so that both
            # sides move the same data (on an H100, PyTorch's exp and add took the same time on
            # randn: kernels/checks/ew_outputs_check.py --inputs)
            a = uniform(n, dtype=dt)
            b = uniform(n, dtype=dt)
            es = a.element_size()
            emit(f"add_{name}_2^{p}", time_cuda(lambda: torch.add(a, b)), 3 * n * es)
            emit(f"exp_{name}_2^{p}", time_cuda(lambda: torch.exp(a)), 2 * n * es)
            del a, b
            torch.cuda.empty_cache()


def suite_reduce():
    for p in (24, 26, 28):
        n = 1 << p
        a = uniform(n, dtype=torch.float32)
        emit(f"sum_f32_2^{p}", time_cuda(lambda: torch.sum(a)), 4 * n)
        del a
    x = uniform(8192, 8192, dtype=torch.float32)
    nb = 4 * x.numel()
    emit("sum_dim0_f32_8192x8192", time_cuda(lambda: torch.sum(x, 0)), nb + 4 * 8192)
    emit("sum_dim1_f32_8192x8192", time_cuda(lambda: torch.sum(x, 1)), nb + 4 * 8192)
    emit("max_dim1_f32_8192x8192", time_cuda(lambda: torch.amax(x, 1)), nb + 4 * 8192)
    emit("argmax_dim1_f32_8192x8192", time_cuda(lambda: torch.argmax(x, 1)), nb + 8 * 8192)
    emit("softmax_f32_8192x8192", time_cuda(lambda: torch.softmax(x, -1)), 2 * nb)


def suite_chain():
    """1000 dependent 16-element adds (`x = x + a`), the harness's `chain_1000_tiny_adds`:
    ms per 1000 ops (= µs per op). Eager: host clock from the first submit to the
    synchronize after the last (what the harness measures for rtx), and the submit loop
    alone (`submit_us` per op). Graph: the 1000 adds captured once, each replay timed
    with CUDA events."""
    a = torch.randn(16, device=DEV)
    x0 = torch.randn(16, device=DEV)
    x = x0.clone()
    for _ in range(200):
        x = x + a
    torch.cuda.synchronize()
    runs = []
    for _ in range(7):
        x = x0.clone()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(1000):
            x = x + a
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        runs.append(((t2 - t0) * 1e3, (t1 - t0) * 1e6 / 1000))
    eager = statistics.median(r[0] for r in runs)
    submit_us = statistics.median(r[1] for r in runs)

    def chain():
        y = x0
        for _ in range(1000):
            y = y + a
        return y

    graph = None
    try:
        graph, out = capture(chain)
        expect = chain()
        check_close("chain graph", out, expect)
        graph_ms = median_ms(lambda: graph.replay(), reps=9)
    except Exception as e:  # noqa: BLE001  (a missing graph feature must not end the run)
        note(f"chain: CUDA graph form failed: {e!r}")
        graph_ms = None
    del graph
    forms = {"eager": eager, "graph": graph_ms}
    emit_best(["chain_1000_tiny_adds", "chain_1000_tiny_adds_graph"], forms, 0.0, 0.0, lines_for_forms="chain_1000_tiny_adds",
              submit_us=submit_us,
              us_per_op=min(v for v in forms.values() if v is not None))


def suite_gemm():
    for label, dt, tf32 in (("f32", torch.float32, False), ("tf32", torch.float32, True),
                            ("f16", torch.float16, False), ("bf16", torch.bfloat16, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for n in (1024, 4096, 8192):
            a = uniform(n, n, dtype=dt)
            b = uniform(n, n, dtype=dt)
            reps = 5 if n >= 4096 else 20
            f = lambda: torch.matmul(a, b)
            emit(f"gemm_{label}_{n}", time_cuda(f, batch=reps, reps=9), 0, 2.0 * n ** 3,
                 graph_ms=time_graph(f, batch=reps))
        torch.backends.cuda.matmul.allow_tf32 = False
    a = uniform(64, 512, 512, dtype=torch.bfloat16)
    b = uniform(64, 512, 512, dtype=torch.bfloat16)
    f = lambda: torch.bmm(a, b)
    emit("bmm_bf16_64x512", time_cuda(f, reps=9), 0, 2.0 * 64 * 512 ** 3, graph_ms=time_graph(f))


CONV_LAYERS = [
    ("conv_56_64_64_3x3", 56, 64, 64, 3, 1),
    ("conv_56_64_256_1x1", 56, 64, 256, 1, 1),
    ("conv_28_128_128_3x3", 28, 128, 128, 3, 1),
    ("conv_14_256_1024_1x1", 14, 256, 1024, 1, 1),
    ("conv_7_512_512_3x3", 7, 512, 512, 3, 1),
    ("conv_56_256_128_1x1_s2", 56, 256, 128, 1, 2),
]


def suite_conv():
    n = 32
    for name, hw, cin, cout, k, stride in CONV_LAYERS:
        x = uniform(n, cin, hw, hw, dtype=torch.float16).to(memory_format=torch.channels_last)
        w = uniform(cout, cin, k, k, dtype=torch.float16).to(memory_format=torch.channels_last)
        ho = (hw + 2 * (k // 2) - k) // stride + 1
        f = lambda: torch.nn.functional.conv2d(x, w, stride=stride, padding=k // 2)
        emit(name, time_cuda(f, reps=9), 0, 2.0 * n * cout * ho * ho * cin * k * k, graph_ms=time_graph(f))


STREAMS_N, STREAMS_CHAINS, STREAMS_STEPS = 256, 8, 200


def suite_streams():
    """The harness's multi-stream workload: 8 independent chains x 200 steps of
    x <- relu(x W_c^T) (bf16, 256x256; `F.linear` then an in-place relu, which is how a
    PyTorch user writes it: PyTorch eager has no fused linear + relu), in every form
    PyTorch offers. Each form's time: the CUDA-event span of one whole workload (all
    chains, all steps) from an idle device, median of 9 after warm-up."""
    import torch.nn.functional as F
    n, chains, steps = STREAMS_N, STREAMS_CHAINS, STREAMS_STEPS
    # He-style scale (uniform, variance 2/n) keeps the chain's values O(1) through relu,
    # as in the harness (benches/streams.rs).
    ws = [uniform(n, n, dtype=torch.float32).mul_((6.0 / n) ** 0.5).to(torch.bfloat16)
          for _ in range(chains)]
    x0 = [uniform(n, n, dtype=torch.bfloat16) for _ in range(chains)]
    w_stack_t = torch.stack(ws).transpose(1, 2).contiguous()  # bmm(x, W^T) = linear(x, W)
    x0_stack = torch.stack(x0)
    torch.cuda.synchronize()
    flops = chains * steps * 2.0 * n ** 3

    def eager_default():
        xs = list(x0)
        for _ in range(steps):
            for c in range(chains):
                xs[c] = F.linear(xs[c], ws[c]).relu_()
        return xs

    def per_chain(k):
        side = [torch.cuda.Stream() for _ in range(k)]

        def run():
            cur = torch.cuda.current_stream()
            for s in side:
                s.wait_stream(cur)
            xs = list(x0)
            for c in range(chains):
                with torch.cuda.stream(side[c % k]):  # entered once per chain
                    x = xs[c]
                    for _ in range(steps):
                        x = F.linear(x, ws[c]).relu_()
                    xs[c] = x
            for s in side:
                cur.wait_stream(s)
            return xs
        return run

    def forked():
        # Inside a capture: fork 8 capture streams from the capture stream, join them back.
        cur = torch.cuda.current_stream()
        side = forked.streams
        for s in side:
            s.wait_stream(cur)
        xs = list(x0)
        for c in range(chains):
            with torch.cuda.stream(side[c]):
                x = xs[c]
                for _ in range(steps):
                    x = F.linear(x, ws[c]).relu_()
                xs[c] = x
        for s in side:
            cur.wait_stream(s)
        return xs
    forked.streams = [torch.cuda.Stream() for _ in range(chains)]

    def stacked():
        x = x0_stack
        for _ in range(steps):
            x = torch.bmm(x, w_stack_t).relu_()
        return x

    reference = eager_default()
    torch.cuda.synchronize()
    forms = {}

    def time_form(name, run, check):
        try:
            # bf16 chains of 200 steps through different GEMM kernels drift apart by
            # rounding (a few %); a form computing something else is off by ~100 %.
            check_close(f"streams {name}", check(), reference, tol=0.25)
            forms[name] = median_ms(run)
        except Exception as e:  # noqa: BLE001  (one form failing must not end the suite)
            note(f"streams: form {name} failed: {e!r}")
            forms[name] = None

    time_form("eager_default", eager_default, eager_default)
    for k in (2, 4, 8):
        run = per_chain(k)
        time_form(f"eager_{k}_streams", run, run)
    time_form("bmm_eager", stacked, lambda: list(stacked().unbind(0)))
    graphs = []
    for name, fn, unstack in (("graph_1_stream", eager_default, False),
                              ("graph_8_forked_streams", forked, False),
                              ("bmm_graph", stacked, True)):
        try:
            g, out = capture(fn)
            graphs.append(g)
            time_form(name, g.replay, (lambda o=out: list(o.unbind(0))) if unstack else (lambda o=out: o))
        except Exception as e:  # noqa: BLE001
            note(f"streams: capturing {name} failed: {e!r}")
            forms[name] = None
    eager = {k: v for k, v in forms.items() if v is not None and "graph" not in k}
    graph = {k: v for k, v in forms.items() if v is not None and "graph" in k}
    extra = {}
    if eager:
        extra["best_eager_form"] = min(eager, key=eager.get)
        extra["best_eager_ms"] = eager[extra["best_eager_form"]]
    if graph:
        extra["best_graph_form"] = min(graph, key=graph.get)
        extra["best_graph_ms"] = graph[extra["best_graph_form"]]
    # The harness's case names (two rtx forms x 1, 2, 4, 8 streams) all get PyTorch's best.
    # Their graph forms (`benches/graphs.rs`, `<case>_graph`) too.
    cases = [f"streams_8x200_{f}_{k}" for f in ("gemm256_relu", "linear_relu") for k in (1, 2, 4, 8)]
    cases += ["streams_8x200_stacked_linear_relu_1"]  # rtx's stacked linear (benches/streams.rs)
    cases += [f"{c}_graph" for c in cases]
    emit_best(cases, forms, 0.0, flops, lines_for_forms="streams_8x200", **extra)
    del graphs


def sdpa_backends():
    """(name, context factory) for every SDPA backend this PyTorch can select, fastest
    candidates first; `default` (no restriction) last."""
    out = []
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        for name, attr in (("cudnn", "CUDNN_ATTENTION"), ("flash", "FLASH_ATTENTION"),
                           ("efficient", "EFFICIENT_ATTENTION")):
            b = getattr(SDPBackend, attr, None)
            if b is None:
                note(f"attention: this PyTorch has no SDPBackend.{attr}")
                continue
            out.append((name, lambda b=b: sdpa_kernel(b)))
    except ImportError:
        # PyTorch < 2.3: the older switch (no cuDNN backend there).
        ctx = getattr(torch.backends.cuda, "sdp_kernel", None)
        if ctx is not None:
            out.append(("flash", lambda: ctx(enable_flash=True, enable_math=False, enable_mem_efficient=False)))
            out.append(("efficient", lambda: ctx(enable_flash=False, enable_math=False, enable_mem_efficient=True)))
        else:
            note("attention: no way to select an SDPA backend in this PyTorch")
    import contextlib
    out.append(("default", contextlib.nullcontext))
    return out


def suite_attention():
    """Attention, bf16, B*L = 16384, H*D = 2048 (the harness's `attn_*` cases), through
    every available SDPA backend; `torch_ms` is the fastest. Forward+backward computes
    the three input gradients with `torch.autograd.grad` (no accumulation into `.grad`)."""
    import torch.nn.functional as F
    backends = sdpa_backends()
    for d in (64, 128):
        for l in (1024, 4096, 16384):
            for causal in (False, True):
                b, h = 16384 // l, 2048 // d
                # drawn as the rtx harness draws its q, k, v and dO
                q, k, v, dout = (uniform(b, h, l, d, dtype=torch.bfloat16) for _ in range(4))
                qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                fwd_flops = 4.0 * b * h * l * l * d / (2 if causal else 1)
                name = f"attn_d{d}_l{l}_c{int(causal)}"
                reps = 3 if l >= 16384 else 8
                fwd, fb, ref = {}, {}, None
                for bname, ctx in backends:
                    def f():
                        with ctx():
                            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                    def g():
                        with ctx():
                            o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                        return torch.autograd.grad(o, (qg, kg, vg), dout)

                    try:
                        o = f()
                        torch.cuda.synchronize()
                        if ref is None:
                            ref = o
                        else:
                            check_close(f"{name} {bname}", o, ref)
                        del o
                        fwd[bname] = time_cuda(f, batch=reps, reps=7)
                    except Exception as e:  # noqa: BLE001  (unavailable for this case)
                        note(f"{name}: SDPA backend {bname} unavailable: {str(e).splitlines()[0][:160]}")
                        fwd[bname] = None
                        fb[bname] = None
                        torch.cuda.synchronize()
                        continue
                    try:
                        grads = g()
                        torch.cuda.synchronize()
                        del grads
                        fb[bname] = time_cuda(g, batch=reps, reps=7)
                    except Exception as e:  # noqa: BLE001
                        note(f"{name}: SDPA backend {bname} backward unavailable: {str(e).splitlines()[0][:160]}")
                        fb[bname] = None
                        torch.cuda.synchronize()
                emit_best([f"{name}_fwd"], fwd, 0.0, fwd_flops)
                # (the same row again under the name of rtx's run with the TMA backward off)
                emit_best([f"{name}_fwdbwd", f"{name}_fwdbwd_no_tma_bwd"], fb, 0.0, 3.5 * fwd_flops)
                del q, k, v, dout, qg, kg, vg, ref
                torch.cuda.empty_cache()


SUITES = {"attention": suite_attention, "ew": suite_ew, "reduce": suite_reduce, "chain": suite_chain, "gemm": suite_gemm,
          "conv": suite_conv, "streams": suite_streams}

def main():
    names = sys.argv[1:] or list(SUITES)
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        note(f"unknown suites {unknown}; suites: {' '.join(SUITES)}")
        return 2
    torch.manual_seed(0)
    print(json.dumps({"info": torch.cuda.get_device_name(), "torch": torch.__version__,
                      "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}), flush=True)
    failed = []
    for n in names:
        try:
            SUITES[n]()
        except Exception:  # noqa: BLE001  (report, go on with the next suite)
            traceback.print_exc()
            failed.append(n)
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    if failed:
        note(f"suites failed: {failed}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
