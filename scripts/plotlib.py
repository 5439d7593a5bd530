"""What the plot scripts share: matplotlib, installed with pip if missing."""

import subprocess
import sys


def need_matplotlib():
    """`matplotlib.pyplot` with the Agg backend (files only, no display)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "matplotlib"]
        if subprocess.call(cmd) != 0:
            subprocess.check_call(cmd + ["--break-system-packages"])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def bars(ax, groups, series, value, width=0.8, rotation=20):
    """Grouped bars: one group per entry of `groups`, one bar per series; `value(group,
    series)` is a bar's height."""
    n = len(series)
    for i, s in enumerate(series):
        xs = [g + (i - (n - 1) / 2) * width / n for g in range(len(groups))]
        ax.bar(xs, [value(g, s) for g in groups], width / n, label=s)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=rotation, ha="right" if rotation else "center")
