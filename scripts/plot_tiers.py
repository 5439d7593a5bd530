#!/usr/bin/env python3
"""Plot `cairn bench tiers --json` results.

Usage: scripts/plot_tiers.py RESULTS.json OUTDIR

Writes OUTDIR/tiers-multilayer.png (throughput over time of the multi-layer run, with
Cairn's tier usage underneath) and OUTDIR/tiers-amplification.png (bytes written per
tier per byte the application wrote), and prints the tables used in
docs/BENCHMARKS.md. Needs matplotlib (installed with pip if missing).
"""

import json
import sys

from plotlib import need_matplotlib


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    r = json.load(open(sys.argv[1]))
    out = sys.argv[2]
    plt = need_matplotlib()

    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True,
                                  gridspec_kw={"height_ratios": [3, 2]})
    for m in r["multilayer"]:
        t = [s["t"] for s in m["samples"]]
        ax.plot(t, [s["mbps"] for s in m["samples"]], label=m["system"], lw=1.5)
    ax.set_ylabel("throughput (MB/s, 250 ms windows)")
    ax.set_title("1 MiB appends round-robin over many files: Cairn (NVM + SSD + HDD) "
                 "vs %s + fdatasync" % r["host_fs"], fontsize=10)
    ax.legend()
    ax.grid(alpha=0.3)
    cairn = next(m for m in r["multilayer"] if m["system"] == "cairn")
    t = [s["t"] for s in cairn["samples"]]
    for i, name in enumerate(["NVM", "SSD", "HDD"]):
        ax2.plot(t, [s["tier_used"][i] / 2**20 if len(s["tier_used"]) > i else 0
                     for s in cairn["samples"]], label=name)
    ax2.set_xlabel("seconds")
    ax2.set_ylabel("Cairn tier used (MiB)")
    ax2.legend()
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out + "/tiers-multilayer.png", dpi=110)

    fig, ax = plt.subplots(figsize=(8, 3.5))
    rows = r["write_amplification"]
    labels = ["%s\n%s" % (a["experiment"], a["system"]) for a in rows]
    keys = [("nvm_log_bytes", "NVM log"), ("nvm_shared_bytes", "NVM shared area"),
            ("ssd_bytes", "SSD"), ("hdd_bytes", "HDD")]
    bottom = [0.0] * len(rows)
    for k, name in keys:
        v = [a[k] / max(a["app_bytes"], 1) for a in rows]
        ax.bar(labels, v, bottom=bottom, label=name)
        bottom = [b + x for b, x in zip(bottom, v)]
    dev = [(a["device_bytes"] or 0) / max(a["app_bytes"], 1) for a in rows]
    ax.plot(labels, dev, "k_", markersize=30, mew=2, label="block device (host)")
    ax.set_ylabel("bytes written / app byte")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out + "/tiers-amplification.png", dpi=110)

    print("| system | bytes | seconds | mean MB/s | min MB/s (250 ms) | median MB/s |")
    print("|---|---|---|---|---|---|")
    for m in r["multilayer"]:
        v = sorted(s["mbps"] for s in m["samples"])
        print("| %s | %.2f GiB | %.2f | %.0f | %.0f | %.0f |" % (
            m["system"], m["bytes"] / 2**30, m["seconds"], m["mbps"], v[0], v[len(v) // 2]))
    print()
    print("| system | ops/s | MB/s | read p50 | read p99 | write p50 | write p99 | cache hits |")
    print("|---|---|---|---|---|---|---|---|")
    for z in r["zipf"]:
        tot = z["cache_hits"] + z["cache_misses"]
        hit = "%.1f%%" % (100.0 * z["cache_hits"] / tot) if tot else "-"
        print("| %s | %.0f | %.1f | %.2f µs | %.2f µs | %.2f µs | %.2f µs | %s |" % (
            z["system"], z["ops_per_sec"], z["mbps"], z["read_p50_ns"] / 1e3,
            z["read_p99_ns"] / 1e3, z["write_p50_ns"] / 1e3, z["write_p99_ns"] / 1e3, hit))
    print()
    print("| experiment | system | app bytes | NVM log | NVM area | SSD | HDD | device |")
    print("|---|---|---|---|---|---|---|---|")
    for a in rows:
        f = lambda b: "%.2f" % (b / max(a["app_bytes"], 1))
        print("| %s | %s | %.0f MiB | %s | %s | %s | %s | %s |" % (
            a["experiment"], a["system"], a["app_bytes"] / 2**20, f(a["nvm_log_bytes"]),
            f(a["nvm_shared_bytes"]), f(a["ssd_bytes"]), f(a["hdd_bytes"]),
            f(a["device_bytes"]) if a["device_bytes"] is not None else "-"))


if __name__ == "__main__":
    main()
