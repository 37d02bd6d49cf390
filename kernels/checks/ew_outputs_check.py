#!/usr/bin/env python3
"""Does where an element-wise op writes change its time? PyTorch's exp at 2^26 and 2^28
elements (f16 and f32) timed as benches/torch_baseline.py times it (`time_cuda`: batches of
10 back-to-back calls between CUDA events, median per call) with the output

  alloc   a new tensor per call (torch.exp(a): the caching allocator hands the block freed by
          the previous call straight back, so every call writes the same memory),
  same    one preallocated tensor (torch.exp(a, out=y)),
  rotate  the next of R preallocated tensors per call (out=ys[i % R], R = 24 by default):
          as rtx's harness writes, whose ops keep their outputs until their completion is
          observed, so that each call writes memory last written about R calls before.

Prints one line per case and the ratio rotate / same. Needs a GPU and PyTorch.

With --inputs it asks instead whether the *data* changes the time: exp and add at the same
sizes on `randn` drawn in the dtype (what benches/torch_baseline.py drew before 2026-12-05)
against uniform [-1, 1) drawn in f32 and rounded (what the rtx harness draws), timed in
turn twice each in one process; prints the ratio uniform / randn per case.

    python3 kernels/checks/ew_outputs_check.py [--rotate 24] [--inputs]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benches"))
from torch_baseline import time_cuda  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rotate", type=int, default=24)
    ap.add_argument("--inputs", action="store_true")
    a = ap.parse_args()
    print("device: %s" % torch.cuda.get_device_name(0))
    if a.inputs:
        return inputs()
    for dt in (torch.float16, torch.float32):
        for p in (26, 28):
            n = 1 << p
            x = torch.randn(n, device="cuda").to(dt)
            r = a.rotate if p == 26 or dt == torch.float16 else max(2, a.rotate // 2)
            ys = [torch.empty_like(x) for _ in range(r)]
            i = [0]

            def rot():
                torch.exp(x, out=ys[i[0] % r])
                i[0] += 1

            nbytes = 2 * n * x.element_size()
            res = {}
            for name, fn in (("alloc", lambda: torch.exp(x)), ("same", lambda: torch.exp(x, out=ys[0])),
                             ("rotate", rot), ("same2", lambda: torch.exp(x, out=ys[0]))):
                ms = time_cuda(fn)
                res[name] = ms
                print("exp %s 2^%d %-6s %8.4f ms  %5.2f TB/s%s" % (
                    str(dt).replace("torch.", ""), p, name, ms, nbytes / ms / 1e9,
                    "  (%d outputs)" % r if name == "rotate" else ""), flush=True)
            same = min(res["same"], res["same2"])
            print("  rotate / same = %.3f, alloc / same = %.3f" % (res["rotate"] / same, res["alloc"] / same))
            del x, ys
            torch.cuda.empty_cache()


def inputs():
    for dt in (torch.float16, torch.float32):
        for p in (26, 28):
            n = 1 << p
            data = {"randn": (torch.randn(n, device="cuda", dtype=dt), torch.randn(n, device="cuda", dtype=dt)),
                    "uniform": tuple((torch.rand(n, device="cuda") * 2 - 1).to(dt) for _ in range(2))}
            for op, fn, nb in (("exp", lambda a, b: torch.exp(a), 2), ("add", lambda a, b: torch.add(a, b), 3)):
                res = {"randn": [], "uniform": []}
                for _ in range(2):
                    for name, (a, b) in data.items():
                        res[name].append(time_cuda(lambda a=a, b=b: fn(a, b)))
                r, u = min(res["randn"]), min(res["uniform"])
                nbytes = nb * n * data["randn"][0].element_size()
                print("%s %s 2^%d  randn %.4f ms (%.2f TB/s, %s)  uniform %.4f ms (%.2f TB/s, %s)  uniform / randn %.3f" % (
                    op, str(dt).replace("torch.", ""), p, r, nbytes / r / 1e9, " ".join("%.4f" % x for x in res["randn"]),
                    u, nbytes / u / 1e9, " ".join("%.4f" % x for x in res["uniform"]), u / r), flush=True)
            del data
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    main()
