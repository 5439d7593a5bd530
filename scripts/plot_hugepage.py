#!/usr/bin/env python3
"""Plot `cairn bench hugepage --json` results.

Usage: scripts/plot_hugepage.py RESULTS.json OUTDIR

Writes OUTDIR/hugepage-speed.png (dependent loads, GUPS and redis-benchmark GET under
base pages, greedy huge pages and cairn hugepaged, relative to base pages),
OUTDIR/hugepage-redis.png (redis-server's resident memory after the fill, the 70%
deletion and the refill, per policy) and OUTDIR/hugepage-fairness.png (huge pages held
by two identical processes over time under one promotion budget), and prints the
tables used in docs/BENCHMARKS.md. Needs matplotlib (installed with pip if missing).
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


def tables(r):
    """The Markdown tables of docs/BENCHMARKS.md."""
    if r["tlb"]:
        t = {x["mode"]: x for x in r["tlb"]}
        b = t["base"]
        print(f"| policy ({b['mib']} MiB) | huge MiB | promoted in | dependent load | speed-up | GUPS (M/s) | speed-up |")
        print("|---|---|---|---|---|---|---|")
        for m, x in t.items():
            prom = f"{x['promote_secs']:.1f} s" if x["promote_secs"] is not None else "–"
            print(f"| {m} | {x['huge_bytes'] // MIB} | {prom} | {x['chase_ns']:.0f} ns | {b['chase_ns'] / x['chase_ns']:.2f}× "
                  f"| {x['gups_per_sec'] / 1e6:.1f} | {x['gups_per_sec'] / b['gups_per_sec']:.2f}× |")
        g, h = t.get("greedy"), t.get("hugepaged")
        if g and h:
            share = (h["gups_per_sec"] / b["gups_per_sec"] - 1) / (g["gups_per_sec"] / b["gups_per_sec"] - 1)
            print(f"\nhugepaged's share of greedy's GUPS speed-up: {share * 100:.0f}%\n")
    if r["redis"]:
        x0 = r["redis"][0]
        print(f"| policy ({x0['keys']} × {x0['value_bytes']} B) | filled MiB | 70% deleted MiB | bloat | refilled MiB | bloat | huge MiB | SET/s fill | SET/s refill | GET/s | p99 ms |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for x in r["redis"]:
            print(f"| {x['mode']} | {x['rss_filled'] // MIB} | {x['rss_deleted'] // MIB} | {x['bloat_deleted'] * 100:+.2f}% "
                  f"| {x['rss_refilled'] // MIB} | {x['bloat_refilled'] * 100:+.2f}% | {x['huge_refilled'] // MIB} "
                  f"| {x['fill_sets_per_sec']:.0f} | {x['refill_sets_per_sec']:.0f} | {x['get']['requests_per_sec']:.0f} | {x['get']['p99_ms']:.2f} |")
        print()
    if r["get"]:
        b = r["get"][0]
        print(f"| policy ({b['keys']} keys) | RSS MiB | huge MiB | GET/s | speed-up | p50 ms | p99 ms |")
        print("|---|---|---|---|---|---|---|")
        for x in r["get"]:
            print(f"| {x['mode']} | {x['rss'] // MIB} | {x['huge_bytes'] // MIB} | {x['get']['requests_per_sec']:.0f} "
                  f"| {x['get']['requests_per_sec'] / b['get']['requests_per_sec']:.2f}× | {x['get']['p50_ms']:.2f} | {x['get']['p99_ms']:.2f} |")
        print()
    f = r.get("fairness")
    if f:
        print(f"fairness: largest gap {f['max_gap'] * 100:.1f}%, at the end {f['final_gap'] * 100:.1f}%, "
              f"held at the end {f['samples'][-1][1] // MIB} and {f['samples'][-1][2] // MIB} MiB\n")
    if r["daemon"]:
        print("| workload | GiB watched | promoted GiB | CPU s to promote | CPU once promoted | per GiB |")
        print("|---|---|---|---|---|---|")
        for d in r["daemon"]:
            print(f"| {d['workload']} | {d['watched_gib']:.2f} | {d['promoted_gib']:.2f} | {d['promote_cpu_secs']:.2f} "
                  f"| {d['steady_cpu_fraction'] * 100:.2f}% | {d['steady_per_gib'] * 100:.2f}% |")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    r = json.load(open(sys.argv[1]))
    plt = need_matplotlib()
    speed(plt, r, sys.argv[2])
    redis(plt, r, sys.argv[2])
    fairness(plt, r, sys.argv[2])
    tables(r)


if __name__ == "__main__":
    main()
