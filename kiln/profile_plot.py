"""The roofline plot of a kiln.profile report (needs matplotlib, the optional extra `plots`).

x: arithmetic intensity (FLOP per byte moved), y: achieved GFLOP/s, both log scale; the roofs are the
machine's measured copy bandwidth (the slope) and matmul peak (the ceiling). Each row is a point, coloured
by kind, its size by its share of the time; rows with no FLOPs (copies, fallbacks, graphs run with torch)
sit on the left edge at their achieved GB/s x the edge's intensity, drawn hollow.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any

COLOURS = {"kernel": "tab:blue", "extern": "tab:orange", "fallback": "tab:red", "torch graph": "tab:purple"}


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def roofline(report: Any, path: str) -> str:
    """Write the report's roofline PNG to `path`; raises ImportError (saying how to get it) without
    matplotlib."""
    if not available():
        raise ImportError("kiln.profile's roofline plot needs matplotlib: pip install matplotlib (or the "
                          "'plots' extra: pip install -e '.[plots]'); the table and JSON need nothing")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bw, peak = report.peaks["copy_gbps"], report.peaks["matmul_gflops"]
    rows = [r for r in report.rows if r.time_us > 0 and r.bytes]
    intensities = [r.flops / r.bytes for r in rows if r.flops]
    left = min([0.01] + [i / 2 for i in intensities])
    right = max([10 * peak / bw] + [2 * i for i in intensities])
    total = sum(r.time_us for r in rows) or 1.0

    fig, ax = plt.subplots(figsize=(8.0, 5.5))
    xs = [left * (right / left) ** (k / 200) for k in range(201)]
    ax.plot(xs, [min(peak, x * bw) for x in xs], color="black", linewidth=1.5)
    ax.text(right, peak, f" matmul peak {peak:.0f} GFLOP/s", va="bottom", ha="right", fontsize=8)
    ax.text(left * 1.1, left * bw * 1.15, f"copy {bw:.1f} GB/s", rotation=0, fontsize=8)
    for kind, colour in COLOURS.items():
        mine = [r for r in rows if r.kind == kind]
        if not mine:
            continue
        solid = [r for r in mine if r.flops]
        hollow = [r for r in mine if not r.flops]
        if solid:
            ax.scatter([r.flops / r.bytes for r in solid], [r.gflops for r in solid], color=colour,
                       s=[20 + 400 * r.time_us / total for r in solid], label=kind, alpha=0.8)
        if hollow:  # no FLOPs: placed by bandwidth on the left edge
            ax.scatter([left] * len(hollow), [max(1e-6, r.gbps * left) for r in hollow], facecolors="none",
                       edgecolors=colour, s=[20 + 400 * r.time_us / total for r in hollow],
                       label=None if solid else kind)
        for r in sorted(mine, key=lambda r: -r.time_us)[:4]:
            x = r.flops / r.bytes if r.flops else left
            y = r.gflops if r.flops else max(1e-6, r.gbps * left)
            ax.annotate(f"{r.name} {r.time_us:.0f}us", (x, y), fontsize=7, xytext=(4, 4),
                        textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_title(f"kiln.profile {report.function}: roofline (wall {report.wall_us:.0f} us/call, "
                 f"{100 * report.outside_kernels_share:.0f}% outside kernels)", fontsize=9)
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(fontsize=8, loc="lower right")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
