#!/usr/bin/env python3
"""Plot `cairn bench spacejmp kv --json` results.

Usage: scripts/plot_kv_shared.py RESULTS.json OUTDIR

Writes OUTDIR/kv-shared.png (operations per second, log scale, of SET and GET for the
key-value store shared by 1 and 2 client processes, redis-server and `cairn kv serve`
under redis-benchmark) and prints the table used in docs/BENCHMARKS.md. Needs
matplotlib (installed with pip if missing).
"""

import json
import sys

from plotlib import bars, need_matplotlib


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    d = json.load(open(sys.argv[1]))
    rows = [r for r in d["results"] if r.get("experiment") == "kv"]

    def label(r):
        n = r["clients"]
        if r["system"] == "cairn shared":
            return f"shared, {n} process{'es' if n > 1 else ''}"
        return r["system"]

    systems = list(dict.fromkeys(label(r) for r in rows))
    ops = {(label(r), r["op"]): r for r in rows}
    print("| system | op | ops/s | p50 µs | p99 µs |")
    print("|---|---|---|---|---|")
    for s in systems:
        for op in ("set", "get"):
            r = ops.get((s, op))
            if r:
                print(f"| {s} | {op.upper()} | {r['ops_per_sec']:,.0f} | {r['p50_us']:.1f} | {r['p99_us']:.1f} |")
    for r in d["results"]:
        if r.get("experiment") == "kv ratio":
            print(r)

    plt = need_matplotlib()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    bars(ax, ["SET", "GET"], systems, lambda op, s: ops.get((s, op.lower()), {}).get("ops_per_sec", 0), rotation=0)
    ax.set_yscale("log")
    ax.set_ylabel("operations per second (median, log scale)")
    ax.set_title("key-value store shared by processes against servers (1 KiB values)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(f"{sys.argv[2]}/kv-shared.png", dpi=110)


if __name__ == "__main__":
    main()
