#!/usr/bin/env python3
"""Joins the rtx harness output and the PyTorch baseline into one markdown table.

    python3 benches/compare.py RTX.jsonl TORCH.jsonl

Each input has one JSON object per line with "case" and "rtx_ms" or "torch_ms" (plus
"bytes"/"flops" for rates). Ratio = torch_ms / rtx_ms: above 1 means rtx is faster.
`torch_ms` is PyTorch's best form of the case (`benches/torch_baseline.py`); the form is
in the "torch form" column, and every form's time (`<form>_ms`) in the notes, with the
ratio to the best eager form (`best_eager_ms`, where the case has one) as `eager/rtx`.
Cases only one side has are listed too (PyTorch's forms as `case@form`). Lines that are
not JSON (logs) are skipped.
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


def num(x):
    """4 decimals for floats, as-is for the rest (counts, names)."""
    if isinstance(x, float):
        return f"{x:.4f}"
    return "" if x is None else str(x)


def note(x):
    """A note's value: counts as integers, times with 4 decimals."""
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return num(x)


def main():
    rtx, order, rinfo = load(sys.argv[1])
    torch, torder, tinfo = load(sys.argv[2]) if len(sys.argv) > 2 else ({}, [], [])
    for i in rinfo + tinfo:
        print("<!--", json.dumps(i), "-->")
    print("| case | rtx ms | rtx rate | torch ms | torch rate | torch form | ratio (torch/rtx) | notes |")
    print("|---|---:|---:|---:|---:|---|---:|---|")
    for c in order + [c for c in torder if c not in rtx]:
        r, t = rtx.get(c, {}), torch.get(c, {})
        rm, tm = r.get("rtx_ms"), t.get("torch_ms")
        ratio = f"{tm / rm:.2f}" if rm and tm else ""
        notes = [f"{k}={note(v)}" for k, v in {**t, **r}.items()
                 if k not in ("case", "rtx_ms", "torch_ms", "bytes", "flops", "best_form")]
        eager = t.get("best_eager_ms")
        if rm and eager:
            notes.append(f"eager/rtx={eager / rm:.2f}")
        print(f"| {c} | {num(rm)} | {rate(r or t, rm)} | {num(tm)} | {rate(t or r, tm)} "
              f"| {t.get('best_form', '')} | {ratio} | {'; '.join(notes)} |")


if __name__ == "__main__":
    main()
