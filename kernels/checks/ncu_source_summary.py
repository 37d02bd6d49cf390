#!/usr/bin/env python3
"""Summarizes Nsight Compute's source view (PC sampling per SASS instruction) of one or more
kernels: where each kernel's warps were sampled stalled, instruction by instruction.

Input: the CSV that `ncu --import REPORT --page source --csv --print-source sass` prints for a
report collected with `--section SourceCounters` (and `--section WarpStateStats`): for each
kernel a `"Kernel Name",NAME` line, a header line starting with `"Address"`, then one line per
SASS instruction with its stall-sample counts (`Warp Stall Sampling (All Samples)` and one
`stall_*` column per reason).

Prints, for each kernel: its samples and the share of each stall reason, then its `--top`
instructions by samples, each as its offset from the kernel's first instruction (the offsets
`cuobjdump -sass` prints for the same CUBIN), its share of the kernel's samples, how many times
it executed (per warp), the instruction, and its two largest stall reasons. `--range A:B`
(offsets, hex; repeatable) adds the share of the instructions from A to B inclusive, e.g. a
loop's or a phase's total.

    ncu --clock-control none -k regex:'flash_bwd_tma_d128|bprop' -c 2 --section WarpStateStats \\
        --section SourceCounters -o bwd python3 kernels/checks/prof_attention_bwd.py --reps 1
    ncu --import bwd.ncu-rep --page source --csv --print-source sass > sass.csv
    python3 kernels/checks/ncu_source_summary.py sass.csv --top 40 --range 0x5820:0x5ba0

(benches/gpu/run prof-attn-src runs the first three lines.) Standard library only.
"""
import argparse
import csv
import sys

ALL = "Warp Stall Sampling (All Samples)"


def number(text):
    """A CSV cell as a float: thousands separators dropped, empty or non-numeric cells 0."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def parse(lines):
    """[(kernel name, header, rows)] from the source page's CSV lines; rows shorter than their
    header (a truncated line) are dropped."""
    kernels = []
    for row in csv.reader(lines):
        if not row:
            continue
        if row[0] == "Kernel Name":
            kernels.append([row[1] if len(row) > 1 else "?", None, []])
        elif row[0] == "Address":
            if not kernels:
                kernels.append(["?", None, []])
            kernels[-1][1] = row
        elif kernels and kernels[-1][1] is not None:
            if len(row) >= len(kernels[-1][1]):
                kernels[-1][2].append(row)
    return [(name, header, rows) for name, header, rows in kernels if header is not None]


def summarize(name, header, rows, top, ranges, out):
    col = {h: i for i, h in enumerate(header)}
    if ALL not in col or "Address" not in col or "Source" not in col:
        out.write("== %s: no '%s' column (collected without --section SourceCounters?)\n" % (name, ALL))
        return
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    base = int(rows[0][col["Address"]], 16) if rows else 0
    total = sum(number(r[col[ALL]]) for r in rows)
    out.write("== %s: %d instructions, %.0f samples\n" % (name, len(rows), total))
    if total <= 0:
        return
    by_reason = sorted(((sum(number(r[col[h]]) for r in rows), h[len("stall_"):]) for h in reasons),
                       reverse=True)
    out.write("   " + "  ".join("%s %.1f%%" % (h, 100 * v / total) for v, h in by_reason if v > 0) + "\n")
    for spec in ranges:
        lo, hi = (int(x, 16) for x in spec.split(":"))
        part = sum(number(r[col[ALL]]) for r in rows if lo <= int(r[col["Address"]], 16) - base <= hi)
        out.write("   range %05x-%05x: %.1f%%\n" % (lo, hi, 100 * part / total))
    executed = col.get("Instructions Executed")
    for r in sorted(rows, key=lambda r: -number(r[col[ALL]]))[:top]:
        s = number(r[col[ALL]])
        if s <= 0:
            break
        worst = sorted(((number(r[col[h]]), h[len("stall_"):]) for h in reasons), reverse=True)[:2]
        out.write("   %05x %5.2f%% %10.0f  %-60s %s\n" % (
            int(r[col["Address"]], 16) - base, 100 * s / total,
            number(r[executed]) if executed is not None else 0, r[col["Source"]].strip()[:60],
            " ".join("%s:%.0f" % (h, v) for v, h in worst if v > 0)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="the output of ncu --import R --page source --csv --print-source sass")
    ap.add_argument("--top", type=int, default=30, help="instructions listed per kernel (default 30)")
    ap.add_argument("--range", action="append", default=[], metavar="A:B",
                    help="hex offsets: also print the share of the instructions A..B (repeatable)")
    ap.add_argument("--kernel", default="", help="only kernels whose name contains this")
    a = ap.parse_args(argv)
    with open(a.csv, errors="replace") as f:
        kernels = parse(f.read().splitlines())
    if not kernels:
        sys.exit("%s: no kernel found (expected a 'Kernel Name' and an 'Address' header line)" % a.csv)
    for name, header, rows in kernels:
        if a.kernel in name:
            summarize(name, header, rows, a.top, a.range, sys.stdout)


if __name__ == "__main__":
    main()
