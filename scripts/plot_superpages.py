#!/usr/bin/env python3
"""Plot `cairn bench superpages --json` results.

Usage: scripts/plot_superpages.py RESULTS.json OUTDIR

Writes OUTDIR/superpages.png (ns per operation of each workload and size, for Cairn with
2 MiB extents, Cairn with 4 KiB blocks and tmpfs) and prints the table used in
docs/BENCHMARKS.md. Needs matplotlib (installed with pip if missing).
"""

import json
import sys

from plotlib import need_matplotlib


SYSTEMS = [("cairn", "2M"), ("cairn", "4K"), ("tmpfs", "4K")]
WORKLOADS = ["chase8B", "copy4KB", "copy256B", "read4KB", "map+touch"]


def mib(n):
    return f"{n >> 20} MiB" if n < 1 << 30 else f"{n >> 30} GiB"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    d = json.load(open(sys.argv[1]))
    rows = d["rows"]
    sizes = sorted({r["size"] for r in rows})
    cell = {(r["system"], r["pages"], r["workload"], r["size"]): r for r in rows}

    print("| size | workload | cairn 2M | cairn 4K | tmpfs 4K | 2M vs 4K | faults 2M / 4K |")
    print("|---|---|---|---|---|---|---|")
    for size in sizes:
        for w in WORKLOADS:
            c = [cell.get((s, p, w, size)) for s, p in SYSTEMS]
            if not all(c):
                continue
            ns = [x["ns_per_op"] for x in c]
            print(
                f"| {mib(size)} | {w} | {ns[0]:.1f} | {ns[1]:.1f} | {ns[2]:.1f} | "
                f"{(ns[0] / ns[1] - 1) * 100:+.0f}% | {c[0]['page_faults']} / {c[1]['page_faults']} |"
            )
    for size in sizes:
        w = cell.get(("tmpfs", "4K", "map+write", size))
        if w:
            print(f"tmpfs map+write {mib(size)}: {w['ns_per_op']:.1f} ns/page, {w['page_faults']} faults")
    for size, kib in d.get("pmd_mapped_kib", []):
        print(f"PMD-mapped: {kib} KiB of {mib(size)}")
    p = d.get("promotion")
    if p:
        print(
            f"promotion of {mib(p['size'])} at {p['rate_mib']} MiB/s: {p['seconds']:.2f} s; "
            f"overwrites during p50/p99/max {p['during_p50_ns']}/{p['during_p99_ns']}/{p['during_max_ns']} ns, "
            f"after {p['after_p50_ns']}/{p['after_p99_ns']}/{p['after_max_ns']} ns"
        )

    plt = need_matplotlib()
    fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        ws = [w for w in WORKLOADS if w != "map+touch"]
        width = 0.27
        for k, (s, p) in enumerate(SYSTEMS):
            ys = [cell[(s, p, w, size)]["ns_per_op"] for w in ws]
            xs = [i + (k - 1) * width for i in range(len(ws))]
            ax.bar(xs, ys, width, label=f"{s} {p}")
        ax.set_xticks(range(len(ws)))
        ax.set_xticklabels(ws)
        ax.set_ylabel("ns per operation")
        ax.set_title(f"random access over a {mib(size)} file")
        ax.legend()
    fig.tight_layout()
    out = f"{sys.argv[2]}/superpages.png"
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
