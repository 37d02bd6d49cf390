#!/usr/bin/env python3
"""PyTorch baselines for the rtx benchmark harness, on the same shapes.

Prints one JSON line per case: {"case": ..., "torch_ms": median, "bytes": ..., "flops": ...}
with the same case names as `benches/harness.rs`, so `benches/compare.py` can join them.
Times with CUDA events after warm-up; medians; inputs are random (never zeros).

    python3 benches/torch_baseline.py [SUITE ...]     suites: ew reduce chain gemm conv streams
"""
import json
import statistics
import sys
import time

import torch

DEV = "cuda"
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.backends.cudnn.benchmark = True


def emit(case, ms, bytes_=0.0, flops=0.0, **extra):
    d = {"case": case, "torch_ms": ms, "bytes": bytes_, "flops": flops}
    d.update(extra)
    print(json.dumps(d), flush=True)


def uniform(*shape, dtype):
    """Uniform in [-1, 1), drawn in f32 and rounded to `dtype`: the distribution the rtx
    harness uses (`random_f32`, then rounded). Drawing f16/bf16 directly (`torch.rand(...,
    dtype=bf16)`) leaves the low mantissa bits mostly zero; the tensor cores then draw
    less power and the GPU holds a higher clock, about 1 % on a bf16 4096³ GEMM
    (`benches/RESULTS.md`, run 39)."""
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
            a = torch.randn(n, device=DEV, dtype=dt)
            b = torch.randn(n, device=DEV, dtype=dt)
            es = a.element_size()
            emit(f"add_{name}_2^{p}", time_cuda(lambda: torch.add(a, b)), 3 * n * es)
            emit(f"exp_{name}_2^{p}", time_cuda(lambda: torch.exp(a)), 2 * n * es)
            del a, b
            torch.cuda.empty_cache()


def suite_reduce():
    for p in (24, 26, 28):
        n = 1 << p
        a = torch.randn(n, device=DEV)
        emit(f"sum_f32_2^{p}", time_cuda(lambda: torch.sum(a)), 4 * n)
        del a
    x = torch.randn(8192, 8192, device=DEV)
    nb = 4 * x.numel()
    emit("sum_dim0_f32_8192x8192", time_cuda(lambda: torch.sum(x, 0)), nb + 4 * 8192)
    emit("sum_dim1_f32_8192x8192", time_cuda(lambda: torch.sum(x, 1)), nb + 4 * 8192)
    emit("max_dim1_f32_8192x8192", time_cuda(lambda: torch.amax(x, 1)), nb + 4 * 8192)
    emit("argmax_dim1_f32_8192x8192", time_cuda(lambda: torch.argmax(x, 1)), nb + 8 * 8192)
    emit("softmax_f32_8192x8192", time_cuda(lambda: torch.softmax(x, -1)), 2 * nb)


def suite_chain():
    a = torch.randn(16, device=DEV)
    x = a.clone()
    for _ in range(200):
        x = x + a
    torch.cuda.synchronize()
    runs = []
    for _ in range(7):
        x = a.clone()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(1000):
            x = x + a
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        runs.append(((t2 - t0) * 1e3, (t1 - t0) * 1e6 / 1000))
    e2e = statistics.median(r[0] for r in runs)
    emit("chain_1000_tiny_adds", e2e, 0, 0, us_per_op=e2e, submit_us=statistics.median(r[1] for r in runs))


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


def suite_streams():
    # PyTorch eager has no fused linear + relu: the "linear_relu" case runs F.linear then
    # an in-place relu, which is what a PyTorch user writes for it.
    n = 256
    for form, k in [(f, k) for f in ("gemm256_relu", "linear_relu") for k in (1, 2, 4, 8)]:
        streams = [torch.cuda.Stream() for _ in range(k)]
        ws = [(torch.rand(n, n, device=DEV) * 2 - 1).mul((6.0 / n) ** 0.5).to(torch.bfloat16) for _ in range(8)]
        x0 = [(torch.rand(n, n, device=DEV) * 2 - 1).to(torch.bfloat16) for _ in range(8)]
        torch.cuda.synchronize()

        def run():
            t = time.perf_counter()
            xs = list(x0)
            for _ in range(200):
                for c in range(8):
                    with torch.cuda.stream(streams[c % k]):
                        if form == "linear_relu":
                            xs[c] = torch.nn.functional.linear(xs[c], ws[c]).relu_()
                        else:
                            xs[c] = torch.relu(xs[c] @ ws[c])
            torch.cuda.synchronize()
            return (time.perf_counter() - t) * 1e3

        run()
        ms = statistics.median(run() for _ in range(9))
        emit(f"streams_8x200_{form}_{k}", ms, 0, 8 * 200 * 2.0 * n ** 3)


def suite_attention():
    import torch.nn.functional as F
    for d in (64, 128):
        for l in (1024, 4096, 16384):
            for causal in (False, True):
                b, h = 16384 // l, 2048 // d
                q = torch.randn(b, h, l, d, device=DEV, dtype=torch.bfloat16)
                k = torch.randn(b, h, l, d, device=DEV, dtype=torch.bfloat16)
                v = torch.randn(b, h, l, d, device=DEV, dtype=torch.bfloat16)
                dout = torch.randn_like(q)
                fwd = 4.0 * b * h * l * l * d / (2 if causal else 1)
                name = f"attn_d{d}_l{l}_c{int(causal)}"
                reps = 3 if l >= 16384 else 8
                emit(f"{name}_fwd", time_cuda(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                              batch=reps, reps=7), 0, fwd)
                qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))

                def fb():
                    o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                    o.backward(dout)

                emit(f"{name}_fwdbwd", time_cuda(fb, batch=reps, reps=7), 0, 3.5 * fwd)
                del q, k, v, dout, qg, kg, vg
                torch.cuda.empty_cache()


SUITES = {"attention": suite_attention, "ew": suite_ew, "reduce": suite_reduce, "chain": suite_chain, "gemm": suite_gemm,
          "conv": suite_conv, "streams": suite_streams}

if __name__ == "__main__":
    names = sys.argv[1:] or list(SUITES)
    torch.manual_seed(0)
    print(json.dumps({"info": torch.cuda.get_device_name(), "torch": torch.__version__}), flush=True)
    for n in names:
        if n in SUITES:
            SUITES[n]()
