"""The growth benchmark's chart: each measure against the number of Jobs, one line per layout."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any, Final

from bench.growth_stack import CONTROLLERS
from bench.running import ROOT

PNG: Final = ROOT / "docs" / "benchmarks-growth.png"


def path() -> Path:
    """docs/benchmarks-growth.png, or a temporary file under ``--no-write`` (which leaves docs/ alone; the
    bench's ``run`` is not told the flag, so it reads the command line as bench/__main__.py parsed it)."""
    if "--no-write" in sys.argv or "--no-auth" in sys.argv:
        return Path(tempfile.gettempdir()) / "benchmarks-growth.png"
    return PNG


def write(data: dict[str, dict[int, dict[str, Any]]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("list, limit=500 walk (µs per object)", lambda r: r["walk_us_per_object"]),
        ("list without limit, p99 (µs per object)", lambda r: r["whole_us_per_object"]),
        ("watch fan-out to 100 clients, p99 (ms)", lambda r: r["watch_p99_ms"]),
        ("reconcile lag p99 (ms): scheduler -, billing --", None),
        ("RSS per Job (KiB)", None),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    for ax, (title, value) in zip(axes, panels, strict=True):
        for layout, rows in data.items():
            sizes = sorted(rows)
            if value is not None:
                ax.plot(sizes, [value(rows[s]) for s in sizes], marker="o", label=layout)
            elif title.startswith("reconcile"):
                for who, style in (("scheduler", "-"), ("billing", "--")):
                    ys = [rows[s][f"lag_{who}_p99_ms"] for s in sizes]
                    ax.plot(sizes, ys, style, marker="o", label=f"{layout}, {who}")
            else:
                for name in CONTROLLERS:
                    ys = [rows[s]["rss_per_object"][name] / 1024 for s in sizes]
                    ax.plot(sizes, ys, marker="o", label=f"{layout}, {name}")
        ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax.set_xlabel("Jobs")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=6)
        ax.grid(alpha=0.3)
    fig.suptitle("Cost per object as the number of Jobs grows (flat is the goal)", fontsize=10)
    fig.tight_layout()
    out = path()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    print(f"growth: chart in {out}")
    return out
