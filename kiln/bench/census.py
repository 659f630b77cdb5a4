"""`kiln explain --models NAMES|all`: a graph-break census over the model zoo.

For each model: build it and its example input, call it eagerly, then run `kiln.explain` on it under
`torch.no_grad()` and count

  graphs         graphs kiln captured (each frame's graph with at least one op)
  breaks         graph breaks: every `BreakRecord` of the report, resumed or not
  native         frames run natively: frames whose cache entry runs the function eagerly (a break that
                 could not be resumed, `BreakRecord.resumed is False`), plus frames whose capture failed
                 with an internal error or hit the recompile limit (kiln.counters "capture_errors",
                 "recompile_limit", counted over the explain call)
  capture_s      the wall time of the explain call (capture with the eager backend, and the call itself)
                 minus the fastest of at least eight eager calls of the model: the time capture adds to a
                 first call. One-time costs (imports, kiln's first capture) are paid by a warm-up before.

and the breaks grouped by reason: count, hint, where they happen (the innermost frame, and the innermost
frame inside transformers when there is one). A model that fails is a row with status "error" and the
exception; the census goes on. `isolate=True` runs each model in a fresh worker process
(`python -m kiln.bench.worker`, phase "census") with a timeout, so that a crash or a hang is a row too.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
import traceback
import warnings
from typing import Any, Callable

import torch

from ..testing import models as zoo

# hints for reasons whose break carries none (matched on the reason text, first match wins)
HINTS = (
    ("try or with block", "the break sits inside a try/with block, which kiln cannot resume in; the whole "
                          "frame runs natively. Supporting the instruction inside the block removes the break"),
    ("raises an exception", "an exception raised and caught inside the traced code (e.g. KeyError in "
                            "Mapping.get) needs the interpreter to unwind to the frame's handler"),
    ("call not inlined", "a callee kiln could not inline is captured as its own frame; its own break is the "
                         "one to fix"),
    ("loop", "a break inside a loop cannot be resumed; the frame runs natively"),
    ("internal error", "a bug in kiln's capture: the frame runs eagerly; see the exception"),
    ("recompile_limit", "a frame recaptured too often; the failing guard names the value that changes"),
)


def _short(filename: str) -> str:
    """A path shortened to what follows site-packages/ (or the kiln checkout), for tables."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.relpath(filename, root) if filename.startswith(root) else filename


def _where(stack: list[tuple[str, int]]) -> tuple[str, str | None]:
    """(innermost frame, innermost frame inside transformers or None) as short file:line."""
    inner = f"{_short(stack[0][0])}:{stack[0][1]}" if stack else "?"
    for filename, line in stack:
        if "/transformers/" in filename:
            return inner, f"{_short(filename)}:{line}"
    return inner, None


def hint_for(reason: str, hint: str = "") -> str:
    if hint:
        return hint
    for key, text in HINTS:
        if key in reason:
            return text
    return ""


def group_breaks(breaks: list[Any]) -> list[dict[str, Any]]:
    """Breaks (BreakRecords) grouped by reason, most frequent first: reason, count, native (how many of
    them left their frame running natively), hint, locations {file:line: count}, transformers file:line,
    source line, the captured frame's file:line (outermost)."""
    groups: dict[str, dict[str, Any]] = {}
    for brk in breaks:
        inner, in_transformers = _where(brk.stack)
        group = groups.setdefault(brk.reason, {
            "reason": brk.reason, "count": 0, "native": 0, "hint": hint_for(brk.reason, brk.hint),
            "locations": {}, "transformers": [], "frames": [], "source": brk.source_line})
        group["count"] += 1
        group["native"] += 0 if brk.resumed else 1
        group["locations"][inner] = group["locations"].get(inner, 0) + 1
        if in_transformers and in_transformers not in group["transformers"]:
            group["transformers"].append(in_transformers)
        frame = f"{_short(brk.stack[-1][0])}:{brk.stack[-1][1]}" if brk.stack else "?"
        if frame not in group["frames"]:
            group["frames"].append(frame)
    return sorted(groups.values(), key=lambda g: -g["count"])


def _counter_delta(before: dict[str, dict], category: str) -> dict[str, int]:
    import kiln
    now = kiln.counters.get(category, {})
    old = before.get(category, {})
    return {key: count - old.get(key, 0) for key, count in now.items() if count - old.get(key, 0) > 0}


_WARMED = False


def warm_up() -> None:
    """Pay kiln's one-time costs (imports, tables built on the first capture) outside any model's time."""
    global _WARMED
    if _WARMED:
        return
    import kiln

    def tiny(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x * 2 + 1).softmax(-1).sum()
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        kiln.explain(tiny, torch.randn(4, 4))
    _WARMED = True


def _eager_seconds(model: torch.nn.Module, args: tuple, kwargs: dict, min_calls: int = 8,
                   min_s: float = 0.5, max_calls: int = 50) -> float:
    """The fastest eager call, after enough calls that torch's lazy initialisation is done (some models'
    first few calls take 100x a steady one)."""
    times: list[float] = []
    while len(times) < min_calls or (sum(times) < min_s and len(times) < max_calls):
        start = time.perf_counter()
        model(*args, **kwargs)
        times.append(time.perf_counter() - start)
    return min(times)


def census_one(name: str, batch: int | None = None, check: bool | None = None) -> dict[str, Any]:
    """The census row of one zoo model or `hf:<type>` entry; errors become a row with status "error", never
    an exception, and an entry that cannot be built here a row with status "unbuildable". `check` (default:
    for hf: entries) adds hf_census.judge's verdict and compile time, and TorchDynamo's counts."""
    import kiln

    from . import hf_census
    from ..testing import hf_all
    row: dict[str, Any] = {"model": name, "status": "ok", "threads": torch.get_num_threads()}
    if check is None:
        check = name.startswith(hf_all.PREFIX)
    try:
        warm_up()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            start = time.perf_counter()
            try:
                model, (args, kwargs) = (hf_census.build(name, batch) if name.startswith(hf_all.PREFIX)
                                         else zoo.build(name, batch=batch))
            except hf_all.Unbuildable as e:
                row.update(status="unbuildable", error=str(e))
                return row
            row["build_s"] = time.perf_counter() - start
            row["shrink"] = getattr(model, "kiln_shrink", None)
            with torch.no_grad():
                row["eager_s"] = _eager_seconds(model, args, kwargs)
                before = {category: dict(values) for category, values in kiln.counters.items()}
                start = time.perf_counter()
                with contextlib.redirect_stdout(io.StringIO()):   # (the model's own prints)
                    report = kiln.explain(model, *args, **kwargs)
                row["explain_s"] = time.perf_counter() - start
        errors = _counter_delta(before, "capture_errors")
        limits = _counter_delta(before, "recompile_limit")
        resumed = [brk for brk in report.breaks if brk.resumed]
        row.update(
            graphs=report.graph_count,
            breaks=report.graph_break_count,
            resumed_breaks=len(resumed),
            native=(report.graph_break_count - len(resumed)) + sum(errors.values()) + sum(limits.values()),
            capture_s=max(0.0, row["explain_s"] - row["eager_s"]),
            ops=sum(sum(ops.values()) for ops in report.ops_per_graph),
            fallbacks=sorted({op for fallback in report.fallbacks for op in fallback}),
            custom_ops=sorted({op for ops in getattr(report, "custom_ops", ()) for op in ops}),
            groups=group_breaks(report.breaks),
            # the names of the frames run natively, where kiln.explain reports them
            native_frames=[str(frame) for frame in getattr(report, "frames_run_natively", None) or ()],
            capture_errors=errors,
            recompile_limit=limits,
            recompiles=_counter_delta(before, "recompiles"))
        for key, count in errors.items():
            row["groups"].append({"reason": f"internal error while capturing: {key}", "count": count,
                                  "native": count, "hint": hint_for("internal error"), "locations": {},
                                  "transformers": [], "frames": [key.split(":", 1)[0]], "source": ""})
        for key, count in limits.items():
            row["groups"].append({"reason": f"recompile_limit: {key}", "count": count, "native": count,
                                  "hint": hint_for("recompile_limit"), "locations": {}, "transformers": [],
                                  "frames": [key], "source": ""})
        if check:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                row.update(hf_census.judge(model, args, kwargs))
                row["dynamo"] = hf_census.dynamo(model, args, kwargs)
    except Exception as e:
        lines = traceback.format_exc().strip().splitlines()
        row.update(status="error", error=f"{type(e).__name__}: {e}".strip()[:2000],
                   traceback="\n".join(lines[-20:]))
    return row


def select(models: list[str] | None, suite: str | None = None) -> list[str]:
    """Zoo names: `models` ("all" is every available entry), else a suite; unknown names raise KeyError."""
    if models and models not in (["all"], ["hf-all"]):
        types = None
        for name in models:
            if name.startswith("hf:"):
                from ..testing import hf_all
                types = types if types is not None else set(hf_all.model_types())
                if name[3:] not in types:
                    raise KeyError(f"unknown transformers model type {name[3:]!r} ('hf-all' runs every one)")
            else:
                zoo.get(name)
        return list(models)
    if models == ["all"]:
        return zoo.names()
    if models == ["hf-all"]:
        from ..testing import hf_all
        return [hf_all.PREFIX + t for t in hf_all.model_types()]
    return zoo.names(suite or "quick")  # (kiln explain's default suite, as kiln bench's)


def _isolated(name: str, batch: int | None, timeout_s: float, threads: int | None,
              check: bool | None = None) -> dict[str, Any]:
    from . import runner
    if name.startswith("hf:"):   # (a type with no model class is told apart here, without a worker)
        from ..testing import hf_all
        try:
            hf_all.model_class(hf_all.config_for(name[3:]))
        except hf_all.Unbuildable as e:
            if "no AutoModel class" in str(e):
                return {"model": name, "status": "unbuildable", "error": f"small: {e}"}
        except Exception:
            pass
    result = runner.run_worker({"phase": "census", "model": name, "batch": batch, "threads": threads,
                                "check": check}, timeout_s)
    if result.get("status") in ("timeout", "error") and "model" not in result:
        return {"model": name, "status": result["status"], "error": result.get("error")}
    return result


def run(names: list[str], batch: int | None = None, isolate: bool = False, timeout_s: float = 600.0,
        threads: int | None = 1, progress: Callable[[str], None] | None = None, check: bool | None = None,
        on_row: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """The census rows of `names`, in order (in this process, or one fresh process per model). `threads`
    torch threads (default 1: on a shared machine, eager calls with more threads than idle cores stall
    for whole scheduler slices, and the eager time subtracted from the capture time goes wrong)."""
    rows = []
    saved = torch.get_num_threads()
    if threads and not isolate:
        torch.set_num_threads(threads)
    try:
        for i, name in enumerate(names):
            if progress:
                progress(f"[{i + 1}/{len(names)}] {name}")
            rows.append(_isolated(name, batch, timeout_s, threads, check) if isolate
                        else census_one(name, batch, check))
            if on_row:   # (e.g. the JSON written after every row: a long census is never lost)
                on_row(rows)
    finally:
        torch.set_num_threads(saved)
    return rows


# ---- report ----------------------------------------------------------------------------------------------
def _s(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(rows: list[dict[str, Any]]) -> str:
    """One line per model, then per model its breaks grouped by reason."""
    header = ("model", "status", "graphs", "breaks", "native", "capture s", "eager ms")
    body = []
    checked = any("verdict" in row for row in rows)
    if checked:
        header += ("verdict", "compile s", "dynamo graphs/breaks")
    for row in rows:
        if row["status"] != "ok":
            body.append((row["model"], row["status"]) + ("-",) * (len(header) - 2))
            continue
        line = (row["model"], "ok", str(row["graphs"]), str(row["breaks"]), str(row["native"]),
                _s(row["capture_s"]), f"{row['eager_s'] * 1e3:.2f}")
        if checked:
            theirs = row.get("dynamo") or {}
            line += (row.get("verdict", "-"), _s(row.get("compile_s")),
                     f"{theirs['graphs']}/{theirs['breaks']}" if "graphs" in theirs else "-")
        body.append(line)
    widths = [max(len(header[i]), *(len(line[i]) for line in body)) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)) for line in body]
    total = [row for row in rows if row["status"] == "ok"]
    whole = sum(1 for row in total if row["breaks"] == 0 and row["native"] == 0 and row["graphs"] == 1)
    lines.append("")
    lines.append(f"{len(total)}/{len(rows)} models ran; {whole} captured whole (1 graph, no break); "
                 f"{sum(row['breaks'] for row in total)} breaks, {sum(row['native'] for row in total)} "
                 f"frames run natively in all")
    lines.append("capture s: the explain call (capture with the eager backend, and the call) minus the "
                 "fastest eager call (of 8 or more)")
    if checked:
        from . import hf_census
        lines += hf_census.summary(rows)
        lines += [f"{row['model']}: WRONG: {row['wrong']}" for row in rows if row.get("verdict") == "wrong"]
        lines += [f"{row['model']}: CRASH: {row['error']}" for row in rows if row.get("verdict") == "crash"]
    for row in rows:
        if row["status"] != "ok":
            lines += ["", f"{row['model']}: {row['status'].upper()}: {row.get('error')}"]
            continue
        if not row["groups"]:
            continue
        lines += ["", f"{row['model']}: {row['breaks']} break(s), {row['native']} frame(s) run natively"]
        if row.get("native_frames"):
            lines.append(f"  run natively: {', '.join(row['native_frames'])}")
        for group in row["groups"]:
            native = f", {group['native']} native" if group["native"] else ""
            lines.append(f"  x{group['count']}{native}  {group['reason']}")
            where = ", ".join(f"{loc}" + (f" x{n}" if n > 1 else "") for loc, n in group["locations"].items())
            if where:
                lines.append(f"      at {where}")
            if group["transformers"] and group["transformers"][0] not in group["locations"]:
                lines.append(f"      in transformers: {', '.join(group['transformers'][:3])}")
            if group["source"]:
                lines.append(f"      {group['source']}")
            if group["hint"]:
                lines.append(f"      hint: {group['hint']}")
    return "\n".join(lines)


def summary_of_reasons(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every distinct reason across the models: count, models, transformers locations, hint."""
    reasons: dict[str, dict[str, Any]] = {}
    for row in rows:
        for group in row.get("groups", ()):
            entry = reasons.setdefault(group["reason"], {"reason": group["reason"], "count": 0, "models": [],
                                                         "transformers": [], "locations": [],
                                                         "hint": group["hint"]})
            entry["count"] += group["count"]
            entry["models"].append(row["model"])
            entry["transformers"] += [t for t in group["transformers"] if t not in entry["transformers"]]
            entry["locations"] += [loc for loc in group["locations"] if loc not in entry["locations"]]
    return sorted(reasons.values(), key=lambda r: (-len(r["models"]), -r["count"]))


COMPARED = ("status", "graphs", "breaks", "resumed_breaks", "native", "ops", "fallbacks")


def compare(rows: list[dict[str, Any]], path: str) -> list[str]:
    """What differs between `rows` and the census written to `path` (another Python or torch): per model,
    each of COMPARED that is not equal, as lines. Models in only one of the two are named too."""
    with open(path) as f:
        other = json.load(f)
    theirs = {row["model"]: row for row in other["rows"]}
    where = f"python {other.get('python', '?')}, torch {other.get('torch', '?')}"
    out = []
    for row in rows:
        them = theirs.pop(row["model"], None)
        if them is None:
            out.append(f"{row['model']}: not in {path}")
            continue
        for key in COMPARED:
            if row.get(key) != them.get(key):
                out.append(f"{row['model']}: {key} {row.get(key)!r} here, {them.get(key)!r} on {where}")
    out += [f"{name}: only in {path}" for name in theirs]
    return out


def write_json(rows: list[dict[str, Any]], path: str) -> None:
    data = {"torch": torch.__version__, "python": sys.version.split()[0], "rows": rows,
            "reasons": summary_of_reasons(rows)}
    try:
        import transformers
        data["transformers"] = transformers.__version__
    except ImportError:
        pass
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
