#!/usr/bin/env python3
"""Plot `cairn bench spacejmp sam --json` results.

Usage: scripts/plot_sam.py RESULTS.json OUTDIR

Writes OUTDIR/sam.png (milliseconds per operation, log scale, for samtools, Cairn's
tools on decoded BAM and the same tools on the data set in a segment) and prints the
table used in docs/BENCHMARKS.md. Needs matplotlib (installed with pip if missing).
"""

import json
import sys

from plotlib import bars, need_matplotlib

OPS = ["flagstat", "sort-name", "sort-coord", "index", "query", "pipeline"]
SYSTEMS = ["samtools", "bam", "segment"]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    d = json.load(open(sys.argv[1]))
    rows = d["results"]
    ms = {(r["system"], r["op"]): r["ms"] for r in rows if r.get("experiment") == "sam"}
    print("| operation | samtools | bam | segment | bam / segment | samtools / segment |")
    print("|---|---|---|---|---|---|")
    for op in OPS:
        t, b, s = (ms.get((x, op), float("nan")) for x in SYSTEMS)
        print(f"| {op} | {t:,.1f} | {b:,.1f} | {s:,.1f} | {b / s:.1f}x | {t / s:.1f}x |")
        if op.startswith("sort"):
            print(f"| {op} core | | {ms[('bam', op + ' core')]:,.1f} | {ms[('segment', op + ' core')]:,.1f} | | |")
    for r in rows:
        if r.get("experiment") in ("sam-ratio", "sam-attach", "sam-load", "sam-data"):
            print(r)

    plt = need_matplotlib()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    bars(ax, OPS, SYSTEMS, lambda op, s: ms.get((s, op), 0))
    ax.set_yscale("log")
    ax.set_ylabel("ms (median, log scale)")
    ax.set_title(f"genomics tools, {d.get('reads', 0):,} reads: files against a segment")
    ax.legend()
    fig.tight_layout()
    fig.savefig(f"{sys.argv[2]}/sam.png", dpi=110)


if __name__ == "__main__":
    main()
