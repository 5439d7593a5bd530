#!/usr/bin/env python3
"""Plot `cairn bench hugepage --json` results.

Usage: scripts/plot_hugepage.py RESULTS.json OUTDIR

Writes OUTDIR/hugepage-speed.png (dependent loads, GUPS and redis-benchmark GET under
base pages, greedy huge pages and cairn hugepaged, relative to base pages),
OUTDIR/hugepage-redis.png (redis-server's resident memory after the fill, the 70%
deletion and the refill, per policy) and OUTDIR/hugepage-fairness.png (huge pages held
by two identical processes over time under one promotion budget). Needs matplotlib
(installed with pip if missing).
"""

import json
import sys

from plotlib import bars, need_matplotlib

MIB = 1 << 20


def speed(plt, r, out):
    if not r["tlb"] and not r["get"]:
        return
    modes = ["base", "greedy", "hugepaged"]
    tests = []
    if r["tlb"]:
        t = {x["mode"]: x for x in r["tlb"]}
        mib = r["tlb"][0]["mib"]
        tests.append((f"dependent loads\n{mib} MiB", {m: t["base"]["chase_ns"] / t[m]["chase_ns"] for m in modes}))
        tests.append((f"GUPS\n{mib} MiB", {m: t[m]["gups_per_sec"] / t["base"]["gups_per_sec"] for m in modes}))
    if r["get"]:
        g = {x["mode"]: x for x in r["get"]}
        keys = r["get"][0]["keys"]
        tests.append((f"redis GET\n{keys // 1000000}M keys", {m: g[m]["get"]["requests_per_sec"] / g["base"]["get"]["requests_per_sec"] for m in modes}))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    speedup = dict(tests)
    bars(ax, list(speedup), modes, lambda t, m: speedup[t][m], rotation=0)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel("speed relative to base pages")
    ax.set_title("TLB-bound speed: base pages, greedy huge pages, cairn hugepaged")
    ax.legend()
    fig.tight_layout()
    fig.savefig(f"{out}/hugepage-speed.png", dpi=110)


def redis(plt, r, out):
    rows = r["redis"]
    if not rows:
        return
    points = [("filled", "rss_filled"), ("70% deleted", "rss_deleted"), ("refilled", "rss_refilled")]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    field = dict(points)
    row = {x["mode"]: x for x in rows}
    bars(ax, list(field), list(row), lambda p, m: row[m][field[p]] / MIB, rotation=0)
    ax.set_ylabel("redis-server RssAnon (MiB)")
    ax.set_title(f"Redis: {rows[0]['keys']} keys of {rows[0]['value_bytes']} B, 70% deleted, refilled")
    ax.legend()
    fig.tight_layout()
    fig.savefig(f"{out}/hugepage-redis.png", dpi=110)


def fairness(plt, r, out):
    f = r.get("fairness")
    if not f:
        return
    t = [s[0] for s in f["samples"]]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(t, [s[1] / MIB for s in f["samples"]], label="process 1")
    ax.plot(t, [s[2] / MIB for s in f["samples"]], "--", label="process 2")
    ax.set_xlabel("seconds")
    ax.set_ylabel("huge pages held (MiB)")
    ax.set_title(f"Two processes of {f['mib_each']} MiB, {f['rate_mib']:g} MiB/s of promotions")
    ax.legend()
    fig.tight_layout()
    fig.savefig(f"{out}/hugepage-fairness.png", dpi=110)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    r = json.load(open(sys.argv[1]))
    plt = need_matplotlib()
    speed(plt, r, sys.argv[2])
    redis(plt, r, sys.argv[2])
    fairness(plt, r, sys.argv[2])


if __name__ == "__main__":
    main()
