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
