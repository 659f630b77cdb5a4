"""PNG plots of a `kiln bench` run (needs matplotlib, the optional extra `plots`).

speedup.png: speedup over eager per model, one bar per compiler, a line at 1x, the interquartile range of
the per-pair ratio as an error bar, "?" after a speedup within noise (report.unreliable); rows that fail
accuracy or error are drawn hatched at 0 (and the legend says so only when one did). compile_time.png: cold
and warm compile seconds per model and compiler, log scale. A busy run (report.busy_note) is marked in red
on every plot.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any

from . import report


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def failed(row: dict[str, Any]) -> bool:
    """A row drawn hatched: it ran and did not pass (an unavailable compiler is no bar at all)."""
    return row.get("status") not in (None, "pass", "unavailable") or \
        (row.get("status") == "pass" and not row.get("speedup"))


def _mark_busy(fig: Any, meta: dict[str, Any] | None) -> None:
    note = report.busy_note(meta or {})
    if note:
        fig.text(0.5, 0.995, note, ha="center", va="top", color="red", fontsize=8, wrap=True)


def write(rows: list[dict[str, Any]], out_dir: str, meta: dict[str, Any] | None = None) -> list[str]:
    """Write speedup.png and compile_time.png into out_dir; [] when matplotlib is not installed. `meta`:
    the run's (a busy run is marked on each plot)."""
    if not available():
        return []
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.patches
    import matplotlib.ticker

    os.makedirs(out_dir, exist_ok=True)
    models = list(dict.fromkeys(row["model"] for row in rows))
    compilers = [c for c in dict.fromkeys(row["compiler"] for row in rows) if c != "eager"]
    by_key = {(row["model"], row["compiler"]): row for row in rows}
    paths = []
    if not models or not compilers:
        return paths
    width = 0.8 / len(compilers)
    positions = range(len(models))

    fig, ax = plt.subplots(figsize=(max(6.0, 1.0 + 0.9 * len(models)), 4.0))
    for i, compiler in enumerate(compilers):
        heights, hatches, low, high, marks = [], [], [], [], []
        for model in models:
            row = by_key.get((model, compiler), {})
            ok = row.get("status") == "pass" and bool(row.get("speedup"))
            height = row["speedup"] if ok else 0.0
            heights.append(height)
            hatches.append(failed(row))
            paired = ok and report.spread(row) is not None
            low.append(max(0.0, height - row["speedup_q1"]) if paired else 0.0)
            high.append(max(0.0, row["speedup_q3"] - height) if paired else 0.0)
            marks.append(f" {report.UNRELIABLE}" if ok and report.unreliable(row) else "")
        xs = [p + (i - (len(compilers) - 1) / 2) * width for p in positions]
        bars = ax.bar(xs, heights, width, label=compiler, color=f"C{i}",
                      yerr=[low, high] if any(low) or any(high) else None, capsize=2,
                      error_kw={"elinewidth": 0.8})
        for bar, hatched, height, mark, top in zip(bars, hatches, heights, marks, high):
            if hatched:
                bar.set_height(0.05)
                bar.set_hatch("xx")
            elif height:
                ax.annotate(f"{height:.2f}{mark}", (bar.get_x() + bar.get_width() / 2, height + top),
                            ha="center", va="bottom", fontsize=8)
    handles = [matplotlib.patches.Patch(color=f"C{i}", label=c) for i, c in enumerate(compilers)]
    if any(failed(row) for row in rows if row["compiler"] in compilers):
        handles.append(matplotlib.patches.Patch(facecolor="white", edgecolor="black", hatch="xx",
                                                label="failed (error / accuracy)"))
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(list(positions), models, rotation=30, ha="right")
    ax.set_ylabel("speedup over eager (x)")
    ax.set_title("speedup per model (median eager / median compiled; bars: IQR over pairs, ? = noise)",
                 fontsize=9)
    ax.legend(handles=handles, fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.95) if report.busy_note(meta or {}) else None)
    _mark_busy(fig, meta)
    paths.append(os.path.join(out_dir, "speedup.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(max(6.0, 1.0 + 0.9 * len(models)), 4.0))
    series = [(i, c, kind) for i, c in enumerate(compilers) for kind in ("cold", "warm")]
    width = 0.8 / len(series)
    smallest, largest = [], []
    for j, (i, compiler, kind) in enumerate(series):
        values = [by_key.get((m, compiler), {}).get(f"compile_{kind}_s") for m in models]
        xs = [p + (j - (len(series) - 1) / 2) * width for p in positions]
        heights = [v if v and v > 0 else 0.0 for v in values]
        if any(heights):
            smallest.append(min(h for h in heights if h))
            largest.append(max(heights))
            ax.bar(xs, heights, width, label=f"{compiler} ({kind})", color=f"C{i}",
                   alpha=1.0 if kind == "cold" else 0.5)
    if smallest:
        ax.set_yscale("log")
        ax.set_ylim(min(smallest) / 2, max(largest) * 3)   # room for the legend
        ax.yaxis.set_minor_locator(matplotlib.ticker.LogLocator(subs=(2.0, 5.0)))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.legend(fontsize=8)
    ax.set_xticks(list(positions), models, rotation=30, ha="right")
    ax.set_ylabel("compile time (s, log scale)")
    ax.set_title("compile time: cold (empty caches) and warm (cache hit)")
    fig.tight_layout(rect=(0, 0, 1, 0.95) if report.busy_note(meta or {}) else None)
    _mark_busy(fig, meta)
    paths.append(os.path.join(out_dir, "compile_time.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
