"""The compile report's record: what this process captured and compiled, kept for `kiln.report`.

Nothing here derives anything anew; it keeps what the stages already record:

- every capture (kiln.capture.cache's cache entries through a process-wide `Recording`: frame, file:line,
  time, graph, break with reason and hint, guards, symbolic sizes) and every internal capture error;
- every pipeline run (kiln.graph.pipeline's `OBSERVERS`): its passes with their times, its kernels and
  externs with the user lines lowered into each (the loop IR's origins, which the cpp backend keeps when
  `trace_dir` is set: `kiln.lower.origins`), and the generated code, cut at `CODE_LIMIT` characters;
- every `kiln.profile` report;
- the process's counters (recompiles with the guard that failed, fallbacks), read when the page is written.

The record starts when kiln's API is imported and `kiln.reset()` empties it. `KILN_TRACE_DIR=dir` writes
`dir/kiln_report_<pid>.html` at exit (`write_at_exit`); `kiln.report(path)` writes the page at any time
(kiln.report_html renders it).
"""
from __future__ import annotations

import atexit
import dataclasses
import os
import sys
import time
import weakref
from typing import Any

from . import config
from .capture.cache import CacheEntry, Recording, start_recording
from .graph.pipeline import OBSERVERS, CompileContext, CompileState
from .report_html import cut, render

CODE_LIMIT = 20_000  # characters of each generated source kept (the rest is cut, with a note)
MAX_COMPILES = 400  # pipeline runs kept (later ones are counted, not kept)
DEFAULT_DIRECTORY = "kiln_trace"  # KILN_TRACE_DIR=1


@dataclasses.dataclass
class KernelRecord:
    """One step of a compiled graph: a fused kernel, an extern or a fallback, with its user lines."""

    name: str
    kind: str  # "kernel", "extern" or "fallback"
    what: str  # a kernel's members (buffer:role), an extern's op
    lines: list[str]  # origins (file:line) of the nodes lowered into it


@dataclasses.dataclass
class CompileRecord:
    """One pipeline run: a graph compiled by a backend."""

    pipeline: str  # the runner's name, "cpp MLP_forward"
    graph_name: str
    origin: str  # the captured frame and its file:line, when the graph keeps them
    passes: list[tuple[str, float]]  # (pass, ms) in order
    kernels: list[KernelRecord]
    code: dict[str, str]  # title -> source (cut at CODE_LIMIT)
    captures_before: int  # captures recorded when it ran (to find its capture)
    graph: Any = None  # a weak reference to the graph compiled (to find its capture by identity)
    profiling: bool = False  # kiln.profile's timing compile
    lines_known: bool = False  # the lowering kept each buffer's user lines

    @property
    def total_ms(self) -> float:
        return sum(ms for _, ms in self.passes)


class _WeakEntries:
    """The capture entries recorded, held weakly: the record is always on, and must not keep a compiled
    function's graphs (and the parameters they hold) alive after the user dropped it. While a report is
    asked for (`trace_dir`, KILN_TRACE_DIR) it keeps them: the page at exit shows every capture of the run,
    those of models compiled and dropped in a loop too (a debugging run trades their memory for that)."""

    def __init__(self) -> None:
        self._refs: list[weakref.ref] = []
        self._kept: list[CacheEntry] = []

    def append(self, entry: CacheEntry) -> None:
        self._refs.append(weakref.ref(entry))
        if trace_directory() is not None:
            self._kept.append(entry)

    def clear(self) -> None:
        self._refs.clear()
        self._kept.clear()

    def live(self) -> list[CacheEntry]:
        return [e for e in (r() for r in self._refs) if e is not None]


class Trace:
    """The process's record (`TRACE`): captures, capture errors, compiles, profiles."""

    def __init__(self) -> None:
        self.recording = Recording()
        self.recording.entries = _WeakEntries()  # type: ignore[assignment]
        self.compiles: list[CompileRecord] = []
        self.compiles_dropped = 0
        self.profiles: list[Any] = []  # kiln.profiler.ProfileReport
        self.started = time.time()

    @property
    def captures(self) -> list[CacheEntry]:
        return self.recording.entries.live()  # type: ignore[attr-defined]

    @property
    def capture_errors(self) -> list:
        return self.recording.errors

    def clear(self) -> None:
        self.recording.entries.clear()
        self.recording.errors.clear()
        self.compiles.clear()
        self.profiles.clear()
        self.compiles_dropped = 0

    def observe(self, name: str, state: CompileState, context: CompileContext) -> None:
        """A pipeline ran (kiln.graph.pipeline.OBSERVERS)."""
        if len(self.compiles) >= MAX_COMPILES:
            self.compiles_dropped += 1
            return
        graph = state.graph
        origins = getattr(state, "origins", None)
        self.compiles.append(CompileRecord(
            name, getattr(graph, "name", "?"), getattr(graph, "origin", "") or "",
            [(r.name, r.ms) for r in state.records], kernel_records(state, origins or {}),
            generated_code(name, state), len(self.captures), _weak(graph),
            profiling=bool(context.options.get("profile", False)), lines_known=origins is not None))

    def capture_of(self, record: CompileRecord) -> int | None:
        """The index of the capture whose graph `record` compiled: the same graph object, else the capture
        of that graph name nearest to when it ran (a backward compiles later, a forward during capture)."""
        base = record.graph_name.removesuffix("_backward")
        named = []
        for i, entry in enumerate(self.captures):
            if entry.graph is None:
                continue
            if record.graph is not None and entry.graph is record.graph():
                return i
            if entry.graph.name == base:
                named.append(i)
        if not named:
            return None
        later = [i for i in named if i >= record.captures_before]
        return later[0] if later else named[-1]


def _weak(graph: Any) -> Any:
    try:
        return weakref.ref(graph)  # (the record must not keep a compiled graph, and its constants, alive)
    except TypeError:
        return None


def kernel_records(state: CompileState, origins: dict[str, list[str]]) -> list[KernelRecord]:
    """The schedule of a compiled graph as kernel records, in order (none when it has no schedule)."""
    from .lower.ir import ExternNode
    records = []
    for item in getattr(state, "schedule", None) or ():
        if isinstance(item, ExternNode):
            lines = [o for out in item.outputs for o in origins.get(out.name, ())]
            records.append(KernelRecord(item.outputs[0].name if item.outputs else item.name, item.kind,
                                        item.target_name, list(dict.fromkeys(lines))))
            continue
        members = getattr(item, "members", ())
        lines = [o for m in members for o in origins.get(m.buffer.name, ())]
        what = ", ".join(f"{m.buffer.name}:{m.role}" for m in members)
        records.append(KernelRecord(getattr(item, "name", "?"), "kernel", what, list(dict.fromkeys(lines))))
    return records


def generated_code(name: str, state: CompileState) -> dict[str, str]:
    language = "Triton" if name.startswith("triton") else "C++"
    code = {}
    for title, text in ((f"generated {language}", getattr(state, "cpp_source", None)),
                        ("Python wrapper", getattr(state, "wrapper_source", None))):
        if text:
            code[title] = cut(text, CODE_LIMIT)
    return code


TRACE = Trace()
start_recording(TRACE.recording)
OBSERVERS.append(TRACE.observe)


def note_profile(report: Any) -> None:
    """A kiln.profile report, for the page's profile section."""
    TRACE.profiles.append(report)


def trace_directory() -> str | None:
    """The directory KILN_TRACE_DIR names (1/true/yes/on: ./kiln_trace), or None when it is not set."""
    value = config.get("trace_dir")
    if not value:
        return None
    return DEFAULT_DIRECTORY if str(value).strip().lower() in ("1", "true", "yes", "on") else str(value)


def default_path() -> str:
    return os.path.join(trace_directory() or ".", f"kiln_report_{os.getpid()}.html")


def write_report(path: str | None = None) -> str:
    """Write the page for what this process captured and compiled so far; returns its path."""
    path = path or default_path()
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    page = render(TRACE)
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path


_AT_EXIT = [False]


def write_at_exit() -> None:
    """With KILN_TRACE_DIR set: write the page when the process exits (once, however often called)."""
    if _AT_EXIT[0]:
        return
    _AT_EXIT[0] = True
    atexit.register(_write_at_exit)


def _write_at_exit() -> None:
    if trace_directory() is None:
        return
    try:
        path = write_report()
    except Exception as e:  # (at exit: say it, never turn a run that passed into a failure)
        print(f"kiln: could not write the compile report: {type(e).__name__}: {e}", file=sys.stderr)
        return
    print(f"kiln: wrote the compile report {path}", file=sys.stderr)
