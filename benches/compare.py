#!/usr/bin/env python3
"""Joins the rtx harness output and the PyTorch baseline into one markdown table.

    python3 benches/compare.py RTX.jsonl TORCH.jsonl

Each input has one JSON object per line with "case" and "rtx_ms" or "torch_ms" (plus
"bytes"/"flops" for rates). Ratio = torch_ms / rtx_ms: above 1 means rtx is faster.
Lines that are not JSON (logs) are skipped.
"""
import json
import sys


def load(path):
    out, order, info = {}, [], []
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "case" not in d:
            info.append(d)
            continue
        if d["case"] not in out:
            order.append(d["case"])
        out[d["case"]] = d
    return out, order, info


def rate(d, ms):
    if not ms:
        return ""
    if d.get("flops"):
        return f"{d['flops'] / ms / 1e9:.1f} TFLOP/s"
    if d.get("bytes"):
        return f"{d['bytes'] / ms / 1e9:.2f} TB/s"
    return ""


def main():
    rtx, order, rinfo = load(sys.argv[1])
    torch, torder, tinfo = load(sys.argv[2]) if len(sys.argv) > 2 else ({}, [], [])
    for i in rinfo + tinfo:
        print("<!--", json.dumps(i), "-->")
    print("| case | rtx ms | rtx rate | torch ms | torch rate | ratio (torch/rtx) | notes |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for c in order + [c for c in torder if c not in rtx]:
        r, t = rtx.get(c, {}), torch.get(c, {})
        rm, tm = r.get("rtx_ms"), t.get("torch_ms")
        ratio = f"{tm / rm:.2f}" if rm and tm else ""
        notes = "; ".join(f"{k}={v}" for k, v in {**t, **r}.items()
                          if k not in ("case", "rtx_ms", "torch_ms", "bytes", "flops"))
        fmt = lambda x: f"{x:.4f}" if isinstance(x, (int, float)) else ""
        print(f"| {c} | {fmt(rm)} | {rate(r or t, rm)} | {fmt(tm)} | {rate(t or r, tm)} | {ratio} | {notes} |")


if __name__ == "__main__":
    main()
