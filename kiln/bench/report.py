"""The report of a `kiln bench` run: terminal table, results.json, results.md, and the summary lines.

A run is `{"meta": {...}, "rows": [row, ...]}`; a row is one (model, compiler) pair:
  model, compiler, mode, batch, status (pass | fail_accuracy | error | timeout | unavailable),
  time_ms (median per call), eager_ms (median eager per call, interleaved in the same process),
  speedup (eager_ms / time_ms), compile_cold_s, compile_warm_s, peak_mem_mb, graph_count,
  graph_break_count, accuracy (the Verdict as a dict), error; for a compiler, the spread of the speedup
  over the interleaved (eager, compiled) pairs: speedup_min, speedup_q1, speedup_pair_median, speedup_q3,
  speedup_max (a speedup whose interquartile range is wider than its distance from 1 is printed with "?"),
  and load_before/load_after, the load average around its timing.
The meta has machine_before/machine_after (load average and copy bandwidth, best and median GB/s),
machine_idle (the idle copy bandwidth kiln.profile cached, if any) and busy (why the run's times are not
to be trusted; a busy run is marked above the table and on every plot).
The summary gives, per compiler, the pass rate and the geometric-mean speedup over the models that pass
accuracy (as PyTorch reports its compiler), and the median compile times.
With `kiln bench --memory` a row also has rss_base_mb, rss_first_peak_mb, rss_peak_mb, rss_steady_mb (the
worker's `memory` phase) or memory_error, and a memory table compares each compiler with eager per model.
In training mode a row also has saved_mb, saved_tensors, saved_storages (what autograd holds for the
backward over one step, worker.saved_activations) and, for kiln, planned_saved_mb and planned_recomputed_mb
(its partitioner's plan); a training table then sets each compiler against eager and torch.compile.
"""
from __future__ import annotations

import json
import math
import os
import statistics
from typing import Any

STATUSES = ("pass", "fail_accuracy", "error", "timeout", "unavailable")


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per compiler: models, passed, pass rate, geomean speedup (passing models), median compile times."""
    summary: dict[str, dict[str, Any]] = {}
    for compiler in dict.fromkeys(row["compiler"] for row in rows):
        mine = [row for row in rows if row["compiler"] == compiler]
        ran = [row for row in mine if row["status"] != "unavailable"]
        passed = [row for row in ran if row["status"] == "pass"]
        cold = [row["compile_cold_s"] for row in passed if row.get("compile_cold_s") is not None]
        warm = [row["compile_warm_s"] for row in passed if row.get("compile_warm_s") is not None]
        summary[compiler] = {
            "models": len(mine),
            "ran": len(ran),
            "passed": len(passed),
            "unavailable": len(mine) - len(ran),
            "pass_rate": len(passed) / len(ran) if ran else None,
            "geomean_speedup": geomean([row.get("speedup") for row in passed]),
            "unreliable": sum(unreliable(row) for row in passed),
            "median_compile_cold_s": statistics.median(cold) if cold else None,
            "median_compile_warm_s": statistics.median(warm) if warm else None,
        }
    return summary


# ---- formatting ------------------------------------------------------------------------------------------
def _num(value: Any, fmt: str, suffix: str = "") -> str:
    if value is None:
        return "-"
    return format(value, fmt) + suffix


def _graphs(row: dict[str, Any]) -> str:
    if row.get("graph_count") is None:
        return "-"
    return f"{row['graph_count']}/{row.get('graph_break_count', '?')}"


def _status(row: dict[str, Any]) -> str:
    return {"pass": "pass", "fail_accuracy": "FAIL acc", "error": "ERROR", "timeout": "TIMEOUT",
            "unavailable": "n/a"}.get(row["status"], row["status"])


COLUMNS = ("model", "compiler", "status", "eager ms", "ms/iter", "speedup", "pairs IQR", "cold s", "warm s",
           "mem MB", "graphs/brk")
UNRELIABLE = "?"   # after a speedup whose spread is wider than its distance from 1


def spread(row: dict[str, Any]) -> float | None:
    """The width of the speedup's interquartile range over the interleaved pairs (None without pairs)."""
    if row.get("speedup_q1") is None or row.get("speedup_q3") is None:
        return None
    return row["speedup_q3"] - row["speedup_q1"]


def unreliable(row: dict[str, Any]) -> bool:
    """Whether the row's speedup cannot be told from noise: its pairs' interquartile range is wider than
    the speedup's distance from 1 (a 1.07x whose pairs range over 1.00-1.15 may be no speedup at all)."""
    width = spread(row)
    return row.get("speedup") is not None and width is not None and width > abs(row["speedup"] - 1.0)


def speedup_cell(row: dict[str, Any]) -> str:
    cell = _num(row.get("speedup"), ".2f", "x")
    return f"{cell} {UNRELIABLE}" if unreliable(row) else cell


def _iqr(row: dict[str, Any]) -> str:
    if spread(row) is None:
        return "-"
    return f"{row['speedup_q1']:.2f}-{row['speedup_q3']:.2f}"


def row_cells(row: dict[str, Any], with_fallbacks: bool = False) -> list[str]:
    cells = [row["model"], row["compiler"], _status(row), _num(row.get("eager_ms"), ".3f"),
             _num(row.get("time_ms"), ".3f"), speedup_cell(row), _iqr(row),
             _num(row.get("compile_cold_s"), ".1f"),
             _num(row.get("compile_warm_s"), ".1f"), _num(row.get("peak_mem_mb"), ".0f"), _graphs(row)]
    if with_fallbacks:
        cells.append("-" if row.get("fallbacks") is None else str(row["fallbacks"]))
    return cells


def columns(rows: list[dict[str, Any]]) -> tuple[str, ...]:
    """The table's columns: COLUMNS, and kiln's fallback count per row in a run at another precision than
    fp32 (`kiln bench --precision`), where a fallback is the first thing to look for."""
    return COLUMNS + ("fallbacks",) if _with_fallbacks(rows) else COLUMNS


def _with_fallbacks(rows: list[dict[str, Any]]) -> bool:
    return any(row.get("precision", "fp32") != "fp32" for row in rows)


def summary_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The lines under the table: per compiler, pass rate, geomean speedup, median compile times."""
    summary = summarize(rows)
    lines = []
    for compiler, s in summary.items():
        if s["ran"] == 0:
            reasons = {row.get("error") for row in rows if row["compiler"] == compiler and row.get("error")}
            why = f": {'; '.join(sorted(reasons))}" if reasons else ""
            lines.append(f"{compiler}: unavailable ({s['models']} models){why}")
            continue
        line = f"{compiler}: pass rate {s['passed']}/{s['ran']} ({100 * s['pass_rate']:.0f}%)"
        if compiler != "eager":
            line += f", geomean speedup {_num(s['geomean_speedup'], '.2f', 'x')} (passing models"
            line += f"; {s['unreliable']} of them within noise {UNRELIABLE})" if s["unreliable"] else ")"
            line += f", median compile cold {_num(s['median_compile_cold_s'], '.1f', ' s')}"
            line += f" / warm {_num(s['median_compile_warm_s'], '.1f', ' s')}"
        if s["unavailable"]:
            line += f"; unavailable for {s['unavailable']}"
        lines.append(line)
    return lines


def busy_note(meta: dict[str, Any]) -> str | None:
    """The mark of a busy run (runner.run_busy_reasons: load above the CPUs, or a copy bandwidth well below
    the idle one) for the table's header and every plot; None for a quiet run. Runs written before the
    reasons were recorded are judged by their load averages."""
    reasons = meta.get("busy")
    if reasons is None:
        loads = [meta.get(key) for key in ("load_average_start", "load_average")]
        loads = [load for load in loads if load is not None]
        cpus = meta.get("cpus")
        reasons = [f"load {max(loads):g} on {cpus} CPUs"] if loads and cpus and max(loads) > cpus else []
    if not reasons:
        return None
    note = f"BUSY MACHINE ({'; '.join(reasons)}): times and speedups are not to be trusted"
    return note if meta.get("threads") == 1 else note + "; --threads 1 steadies them"


def machine_line(meta: dict[str, Any]) -> str | None:
    """Load and copy bandwidth before and after the run (and the idle bandwidth they are judged against)."""
    before, after = meta.get("machine_before"), meta.get("machine_after")
    if not before:
        return None

    def one(snap: dict[str, Any] | None) -> str:
        if not snap:
            return "-"
        return f"load {_num(snap.get('load'), 'g')}, copy {_num(snap.get('copy_gbps_median'), 'g')} GB/s"
    idle = meta.get("machine_idle")
    reference = (f"; idle copy {_num(idle.get('copy_gbps_median') or idle.get('copy_gbps'), 'g')} GB/s"
                 if idle else "; no idle copy bandwidth cached (kiln.profile measures it)")
    return (f"machine: {meta.get('cpus')} CPUs, {meta.get('threads')} thread(s); before: {one(before)}; "
            f"after: {one(after)}{reference}")


def problems(rows: list[dict[str, Any]]) -> list[str]:
    """One line per row that did not pass, saying why."""
    lines = []
    for row in rows:
        if row["status"] == "pass":
            continue
        reason = row.get("error") or (row.get("accuracy") or {}).get("reason") or ""
        reason = " ".join(reason.split())
        if len(reason) > 300:
            reason = reason[:297] + "..."
        lines.append(f"{row['model']} / {row['compiler']}: {row['status']}: {reason}")
    return lines


MEMORY_COLUMNS = ("model", "compiler", "base MB", "peak MB", "steady MB", "peak/eager", "steady/eager",
                  "1st call MB")
MEMORY_SLACK = 1.10  # the goal: a compiled peak RSS within 10% of eager's


def _eager_rows(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["model"]: row for row in rows if row["compiler"] == "eager" and row.get("rss_peak_mb")}


def _ratio(row: dict[str, Any], eager: dict[str, Any] | None, key: str) -> float | None:
    if eager is None or row.get(key) is None or not eager.get(key):
        return None
    return row[key] / eager[key]


def memory_cells(rows: list[dict[str, Any]]) -> list[list[str]]:
    """One line per row with memory figures (or a memory error): RSS in MiB, ratios to eager's."""
    eager = _eager_rows(rows)
    cells = []
    for row in rows:
        if row.get("memory_error"):
            error = " ".join(str(row["memory_error"]).split())[:60]
            cells.append([row["model"], row["compiler"], f"error: {error}", "", "", "", "", ""])
            continue
        if row.get("rss_peak_mb") is None:
            continue
        base = eager.get(row["model"])
        cells.append([row["model"], row["compiler"], _num(row.get("rss_base_mb"), ".0f"),
                      _num(row.get("rss_peak_mb"), ".0f"), _num(row.get("rss_steady_mb"), ".0f"),
                      _num(_ratio(row, base, "rss_peak_mb"), ".2f", "x"),
                      _num(_ratio(row, base, "rss_steady_mb"), ".2f", "x"),
                      _num(row.get("rss_first_peak_mb"), ".0f")])
    return cells


def memory_summary(rows: list[dict[str, Any]]) -> list[str]:
    """Per compiler: how many models keep their peak RSS within MEMORY_SLACK of eager's, and which do not."""
    eager = _eager_rows(rows)
    lines = []
    for compiler in dict.fromkeys(row["compiler"] for row in rows if row["compiler"] != "eager"):
        ratios = [(row["model"], _ratio(row, eager.get(row["model"]), "rss_peak_mb")) for row in rows
                  if row["compiler"] == compiler]
        ratios = [(model, r) for model, r in ratios if r is not None]
        if not ratios:
            continue
        over = [f"{model} {r:.2f}x" for model, r in ratios if r > MEMORY_SLACK]
        line = (f"{compiler} memory: peak RSS within {100 * (MEMORY_SLACK - 1):.0f}% of eager's for "
                f"{len(ratios) - len(over)}/{len(ratios)} models")
        lines.append(line + (f"; over: {', '.join(over)}" if over else ""))
    return lines


TRAINING_COLUMNS = ("model", "compiler", "step ms", "vs eager", "vs torch.compile", "peak RSS MB",
                    "RSS/eager", "saved MB", "saved/eager", "cold s", "warm s")
BASELINE = "torch.compile"


def _by_model(rows: list[dict[str, Any]], compiler: str) -> dict[str, dict[str, Any]]:
    return {row["model"]: row for row in rows if row["compiler"] == compiler and row["status"] == "pass"}


def training_cells(rows: list[dict[str, Any]]) -> list[list[str]]:
    """One line per training row that passed: step time and its speedup over eager and over torch.compile
    (the ratio of the two speedups, each timed against eager in its own process), peak RSS (the memory
    run), the bytes autograd saved for the backward (worker.saved_activations), compile times."""
    training = [row for row in rows if row.get("mode") == "training" and row["status"] == "pass"]
    eager, baseline = _by_model(rows, "eager"), _by_model(rows, BASELINE)
    cells = []
    for row in training:
        model = row["model"]
        base = baseline.get(model)
        versus = (row["speedup"] / base["speedup"] if base and row.get("speedup") and base.get("speedup")
                  else None)
        cold = None if row["compiler"] == "eager" else row.get("compile_cold_s")
        cells.append([model, row["compiler"], _num(row.get("time_ms"), ".2f"),
                      _num(row.get("speedup"), ".2f", "x"), _num(versus, ".2f", "x"),
                      _num(row.get("rss_peak_mb"), ".0f"), _num(_ratio(row, eager.get(model), "rss_peak_mb"),
                                                               ".2f", "x"),
                      _num(row.get("saved_mb"), ".2f"), _num(_ratio(row, eager.get(model), "saved_mb"),
                                                             ".2f", "x"),
                      _num(cold, ".1f"), _num(row.get("compile_warm_s"), ".1f")])
    return cells


def training_summary(rows: list[dict[str, Any]]) -> list[str]:
    """Per compiler other than eager, over the models where it and the baseline passed: geomean speedup
    over eager and over torch.compile, how many keep peak RSS and saved bytes at or under eager's, and the
    median cold compile time against torch.compile's."""
    eager, baseline = _by_model(rows, "eager"), _by_model(rows, BASELINE)
    lines = []
    compilers = dict.fromkeys(row["compiler"] for row in rows if row.get("mode") == "training")
    for compiler in compilers:
        if compiler == "eager":
            continue
        mine = _by_model(rows, compiler)
        if not mine:
            continue
        line = f"{compiler} training: geomean {_num(geomean([r.get('speedup') for r in mine.values()]), '.2f', 'x')}"
        line += f" vs eager over {len(mine)} models"
        if compiler != BASELINE:
            pairs = [(r["speedup"], baseline[m]["speedup"]) for m, r in mine.items()
                     if m in baseline and r.get("speedup") and baseline[m].get("speedup")]
            line += f", {_num(geomean([a / b for a, b in pairs]), '.2f', 'x')} vs {BASELINE} over {len(pairs)}"
            colds = [r["compile_cold_s"] / baseline[m]["compile_cold_s"] for m, r in mine.items()
                     if m in baseline and r.get("compile_cold_s") is not None and baseline[m].get("compile_cold_s")]
            if colds:
                line += f"; cold compile {statistics.median(colds):.2f} of {BASELINE}'s (median)"
        for key, what in (("rss_peak_mb", "peak RSS"), ("saved_mb", "saved bytes")):
            ratios = [_ratio(r, eager.get(m), key) for m, r in mine.items()]
            ratios = [x for x in ratios if x is not None]
            if ratios:
                line += f"; {what} <= eager for {sum(x <= 1.0 for x in ratios)}/{len(ratios)}"
        lines.append(line)
    return lines


def training_table(rows: list[dict[str, Any]]) -> str:
    """The training comparison (empty without passing training rows)."""
    cells = training_cells(rows)
    if not cells:
        return ""
    return "\n".join(_aligned([list(TRAINING_COLUMNS)] + cells, {0, 1}) + [""] + training_summary(rows))


def _aligned(cells: list[list[str]], left: set[int]) -> list[str]:
    widths = [max(len(line[i]) for line in cells) for i in range(len(cells[0]))]

    def fmt(line: list[str]) -> str:
        padded = [c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))]
        return "  ".join(padded).rstrip()
    return [fmt(cells[0]), "  ".join("-" * w for w in widths)] + [fmt(line) for line in cells[1:]]


def memory_table(rows: list[dict[str, Any]]) -> str:
    """The memory comparison (empty when no row has memory figures)."""
    cells = memory_cells(rows)
    if not cells:
        return ""
    return "\n".join(_aligned([list(MEMORY_COLUMNS)] + cells, {0, 1, 2}) + [""] + memory_summary(rows))


def table(rows: list[dict[str, Any]], meta: dict[str, Any] | None = None) -> str:
    """The terminal table: one line per (model, compiler), the summary below."""
    names = columns(rows)
    cells = [list(names)] + [row_cells(row, _with_fallbacks(rows)) for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(names))]
    left = {0, 1, 2}

    def fmt(line: list[str]) -> str:
        padded = [c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))]
        return "  ".join(padded).rstrip()
    note = busy_note(meta or {})
    out = [f"*** {note} ***"] if note else []
    out += [fmt(cells[0]), "  ".join("-" * w for w in widths)]
    out += [fmt(line) for line in cells[1:]]
    out.append("")
    out += summary_lines(rows)
    if any(unreliable(row) for row in rows):
        out.append(f"{UNRELIABLE}: the speedup's spread over the interleaved pairs (pairs IQR) is wider than "
                   "its distance from 1: not told apart from noise")
    line = machine_line(meta or {})
    if line:
        out.append(line)
    memory = memory_table(rows)
    if memory:
        out += ["", memory]
    training = training_table(rows)
    if training:
        out += ["", training]
    return "\n".join(out)


def markdown(run: dict[str, Any]) -> str:
    """results.md: the run's settings, the table, the summary and what failed."""
    rows, meta = run["rows"], run.get("meta", {})
    out = ["# kiln bench", ""]
    settings = ", ".join(f"{key} {meta[key]}" for key in ("suite", "mode", "precision", "batch", "kiln_backend",
                                                            "torch",
                                                            "threads", "date") if meta.get(key) is not None)
    if settings:
        out += [settings, ""]
    note = busy_note(meta)
    if note:
        out += [f"**{note}**", ""]
    names = columns(rows)
    out.append("| " + " | ".join(names) + " |")
    out.append("|" + "|".join("---" if i < 3 else "---:" for i in range(len(names))) + "|")
    for row in rows:
        cells = row_cells(row, _with_fallbacks(rows))
        out.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    out += [""] + [f"- {line}" for line in summary_lines(rows)]
    memory = memory_cells(rows)
    if memory:
        out += ["", "## Memory", "", "| " + " | ".join(MEMORY_COLUMNS) + " |",
                "|" + "|".join("---" if i < 2 else "---:" for i in range(len(MEMORY_COLUMNS))) + "|"]
        out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in line) + " |" for line in memory]
        out += [""] + [f"- {line}" for line in memory_summary(rows)]
        out += ["", "RSS in MiB, each compiler in its own fresh process: base = model and inputs built; "
                "peak = the highest RSS over steady calls (the last output held); steady = RSS between "
                "calls; 1st call = the peak over the first call (compile included)."]
    training = training_cells(rows)
    if training:
        out += ["", "## Training", "", "| " + " | ".join(TRAINING_COLUMNS) + " |",
                "|" + "|".join("---" if i < 2 else "---:" for i in range(len(TRAINING_COLUMNS))) + "|"]
        out += ["| " + " | ".join(line) + " |" for line in training]
        out += [""] + [f"- {line}" for line in training_summary(rows)]
        out += ["", "A step is forward, backward and an SGD step. vs eager: median eager step ÷ median "
                "compiled step, interleaved in one process; vs torch.compile: that speedup ÷ "
                "torch.compile's; peak RSS: the memory run (MiB); saved MB: the distinct storages autograd "
                "holds for the backward over one step (its saved-tensor pack hook), parameters, buffers "
                "and inputs left out."]
    failed = problems(rows)
    if failed:
        out += ["", "## Not passing", ""] + [f"- {line}" for line in failed]
    line = machine_line(meta)
    if line:
        out += ["", line]
    if meta.get("interrupted"):
        out += ["", "_Interrupted: only the finished rows are shown._"]
    out += ["", "eager ms, ms/iter: median per call of eager and of the compiler, timed alternately in one "
            "process; speedup = their ratio (marked ? when pairs IQR, the interquartile range "
            "of the per-pair ratio eager ÷ compiled, is wider than the speedup's distance from 1); "
            "cold = empty caches, fresh process; warm = cache hit, fresh process; mem = peak RSS growth "
            "over the compile and first call; graphs/brk = kiln's graphs / graph breaks.", ""]
    return "\n".join(out)


def write(run: dict[str, Any], out_dir: str) -> list[str]:
    """Write results.json and results.md into out_dir (created); the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    run = dict(run, summary=summarize(run["rows"]))
    json_path = os.path.join(out_dir, "results.json")
    md_path = os.path.join(out_dir, "results.md")
    for path, text in ((json_path, json.dumps(run, indent=2, default=str) + "\n"), (md_path, markdown(run))):
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)   # a Ctrl-C mid-write leaves the previous complete file
    return [json_path, md_path]
