#!/usr/bin/env python3
"""Plot `cairn bench kv --json` results.

Usage: scripts/plot_kv.py RESULTS.json OUTDIR

Writes OUTDIR/kv-ycsb.png (embedded ops/s per mix, append and in-place, 1 and 2
threads), OUTDIR/kv-server.png (redis-benchmark requests/s against cairn kv serve and
redis-server) and OUTDIR/kv-churn.png (resident memory over live data under churn), and
prints the tables used in docs/BENCHMARKS.md. Needs matplotlib (installed with pip if
missing).
"""

import json
import sys

from plotlib import bars, need_matplotlib


def ycsb(plt, r, out):
    rows = r["embedded"]
    if not rows:
        return
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, dist in zip(axes, ["uniform", "zipfian"]):
        groups = [f"{g}% GET" for g in [100, 95, 50, 0]]
        series = [f"{p} {t} thr" for p in ["append", "inplace"] for t in [1, 2]]

        def value(g, s):
            p, t, _ = s.split()
            for e in rows:
                if (
                    e["distribution"] == dist
                    and f"{e['get_percent']}% GET" == g
                    and e["policy"] == p
                    and str(e["threads"]) == t
                ):
                    return e["ops_per_sec"] / 1e6
            return 0

        bars(ax, groups, series, value)
        ax.set_title(f"{dist} keys")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("million ops/s")
    axes[0].legend()
    fig.suptitle(f"cairn-kv embedded, {r['keys']} keys of {r['value_bytes']} B")
    fig.tight_layout()
    fig.savefig(f"{out}/kv-ycsb.png", dpi=110)


def server(plt, r, out):
    rows = r["server"]
    if not rows:
        return
    names = []
    for s in rows:
        if s["server"] not in names:
            names.append(s["server"])
    groups = [f"{t} -P {p}" for p in [1, 16] for t in ["SET", "GET"]]

    def value(g, name):
        t, _, p = g.split()
        for s in rows:
            if s["server"] == name and s["test"] == t and str(s["pipeline"]) == p:
                return s["requests_per_sec"] / 1e3
        return 0

    fig, ax = plt.subplots(figsize=(10, 4.5))
    bars(ax, groups, names, value)
    ax.set_ylabel("thousand requests/s")
    ax.set_title("redis-benchmark, 50 clients")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(f"{out}/kv-server.png", dpi=110)
    print("| server | SET -P 1 | GET -P 1 | SET -P 16 | GET -P 16 |")
    print("|---|---|---|---|---|")
    for n in names:
        cells = [f"{value(g, n):.0f}k" for g in groups]
        print(f"| {n} | " + " | ".join(cells) + " |")


def churn(plt, r, out):
    rows = r["churn"]
    if not rows:
        return
    groups, systems = [], []
    for c in rows:
        if c["workload"] not in groups:
            groups.append(c["workload"])
        if c["system"] not in systems:
            systems.append(c["system"])
    order = ["cairn-kv append", "cairn-kv in-place", "redis-server", "hashmap"]
    systems.sort(key=lambda s: order.index(s) if s in order else len(order))

    def find(g, s):
        for c in rows:
            if c["workload"] == g and c["system"] == s:
                return c
        return None

    def value(g, s):
        c = find(g, s)
        return c["ratio"] if c else 0

    fig, ax = plt.subplots(figsize=(12, 4.5))
    bars(ax, groups, systems, value)
    ax.axhline(1.1, color="gray", linestyle="--", linewidth=1)
    ax.set_ylabel("resident memory / live data")
    ax.set_title("Memory under churn (dashed: the 10% target)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(f"{out}/kv-churn.png", dpi=110)
    print()
    print("| workload | " + " | ".join(systems) + " |")
    print("|---|" + "---|" * len(systems))
    for g in groups:
        cells = []
        for s in systems:
            c = find(g, s)
            if c is None:
                cells.append("")
                continue
            extra = f", {c['refused']} refused" if c["refused"] else ""
            cells.append(f"{c['ratio']:.2f}× ({c['secs']:.1f} s{extra})")
        print(f"| {g} | " + " | ".join(cells) + " |")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        r = json.load(f)
    plt = need_matplotlib()
    ycsb(plt, r, sys.argv[2])
    server(plt, r, sys.argv[2])
    churn(plt, r, sys.argv[2])


if __name__ == "__main__":
    main()
