"""Helpers shared by the standalone kernel checks in this folder (imported by name: a
script run as `python3 kernels/checks/X.py` has this folder on its path)."""

import torch


def time_ms(fn, reps=40, warm=5):
    """Median of CUDA-event times of fn. Before each start event the stream gets a spin
    of about 1 ms (torch.cuda._sleep), so that Python's launch overhead is hidden behind
    it and the events time the GPU's work, not the host's (as the harness's queued
    submissions do)."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
           for _ in range(reps)]
    for a, b in evs:
        torch.cuda._sleep(2_000_000)
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    ts = sorted(a.elapsed_time(b) for a, b in evs)
    return ts[len(ts) // 2]


def event_times(fn, reps):
    """The CUDA-event time (ms) of each of `reps` calls of fn, one at a time (synchronized after
    each): for the profiling scripts, whose first call is a warm-up and whose last is reported."""
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1))
    return times
