"""`kiln bisect script.py [args]`: the first optimization decision that makes a script's result wrong.

The protocol: the script exits 0 when kiln's result is right and nonzero when it is wrong. It compiles its
model with kiln and compares with eager, e.g.

    expected = model(x)
    torch.testing.assert_close(kiln.compile(model)(x), expected)   # raises: a nonzero exit

Every optimizing decision of the compiler (a fusion, a CSE merge, a bias fold, an in-place write, a memory
reorder) spends a unit of optimization fuel (`kiln.graph.pipeline.FUEL`); with `KILN_FUEL=n` a process takes
only its first n decisions and refuses the rest. The script runs in fresh processes (`python -m
kiln.testing.bisect SCRIPT ARGS...` runs it as `__main__` and, with `KILN_FUEL_REPORT=path`, writes the
fuel it used to that file at exit): first with unlimited fuel (a budget no program reaches, so that the
decisions are counted: N) to see it fail, then with fuel 0 to see it pass, then a binary search over n in
(0, N]: about 2 + log2(N) runs. The first failing n names decision n, reported with its pass and
description, and the loop IR before and after it: each run dumps its IR (`KILN_DEBUG_DIR`), and the first
dump that differs between the runs with fuel n-1 and n is shown as a diff. The runs share one kernel cache
(it is keyed by the source, so a kernel of one run is never another's). Decisions are numbered in the
order the process makes them, so the script must compile the same way each time (PYTHONHASHSEED is fixed).
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

from .. import config
from ..graph.pipeline import FUEL

UNLIMITED = 1 << 40  # fuel no program spends: every decision is taken, and counted
OUTPUT_TAIL = 3000


@dataclasses.dataclass
class Run:
    """One run of the script with a fuel budget (None: unlimited)."""

    fuel: int | None
    returncode: int
    used: int | None = None  # decisions the run took (from its fuel report)
    last: tuple[int, str, str] | None = None  # (number, pass, description) of the last one
    debug_dir: str | None = None
    output: str = ""  # the tail of its stderr and stdout
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.returncode != 0

    def label(self) -> str:
        return "unlimited fuel" if self.fuel is None else f"fuel {self.fuel}"


@dataclasses.dataclass
class Bisection:
    """What `bisect` found: the runs, and the first bad decision (or why there is none)."""

    runs: list[Run]
    decision: tuple[int, str, str] | None = None  # (number, pass, description)
    total: int | None = None  # decisions of the unlimited run
    before: Run | None = None  # the run with one decision fewer (passes)
    after: Run | None = None  # the run that takes the decision (fails)
    diff: str = ""  # the first IR dump that differs between before and after
    reason: str = ""  # when no decision was found: why

    def __str__(self) -> str:
        return report(self)


Launch = Callable[[int | None, str], Run]


def child_environment(fuel: int | None, debug_dir: str, report_path: str, cache_dir: str) -> dict[str, str]:
    """The environment of one run: this process's, with the fuel, dump, report and cache flags set."""
    env = dict(config.process_environment())
    env["KILN_FUEL"] = str(UNLIMITED if fuel is None else fuel)
    env["KILN_DEBUG_DIR"] = debug_dir
    env["KILN_FUEL_REPORT"] = report_path
    env["KILN_CACHE_DIR"] = cache_dir
    env.setdefault("PYTHONHASHSEED", "0")
    root = os.path.dirname(os.path.dirname(os.path.abspath(config.__file__)))  # the dir holding kiln/
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def run_script(script: str, args: list[str], fuel: int | None, workdir: str, timeout_s: float = 600.0) -> Run:
    """Run the script once in a fresh process with this fuel; its exit status and the fuel it used."""
    name = "unlimited" if fuel is None else f"fuel_{fuel}"
    debug_dir = os.path.join(workdir, name)
    os.makedirs(debug_dir, exist_ok=True)
    report_path = os.path.join(workdir, f"{name}.json")
    env = child_environment(fuel, debug_dir, report_path, os.path.join(workdir, "cache"))
    command = [sys.executable, "-m", "kiln.testing.bisect", script, *args]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)
        returncode, output = done.returncode, (done.stderr + done.stdout)[-OUTPUT_TAIL:]
    except subprocess.TimeoutExpired:
        returncode, output = -1, f"no exit after {timeout_s:.0f} s: counted as a failure"
    run = Run(fuel, returncode, debug_dir=debug_dir, output=output, seconds=time.perf_counter() - start)
    if os.path.exists(report_path):
        with open(report_path) as f:
            used = json.load(f)
        run.used = used["used"]
        run.last = tuple(used["last"]) if used["last"] else None
    return run


def bisect(script: str, args: list[str] | None = None, workdir: str | None = None, timeout_s: float = 600.0,
           launch: Launch | None = None, progress: Callable[[str], None] | None = None) -> Bisection:
    """Find the first decision that makes `script` fail (module docstring). `launch(fuel, workdir)` runs it
    once (default: `run_script` in a fresh process); `progress` gets a line per run."""
    args = list(args or [])
    workdir = workdir or tempfile.mkdtemp(prefix="kiln-bisect-")
    if launch is None:
        def launch(fuel: int | None, where: str) -> Run:
            return run_script(script, args, fuel, where, timeout_s)
    runs: list[Run] = []

    def attempt(fuel: int | None) -> Run:
        run = launch(fuel, workdir)
        runs.append(run)
        if progress is not None:
            verdict = f"FAILS (exit {run.returncode})" if run.failed else "passes"
            taken = "" if run.used is None else f", {run.used} decision(s) taken"
            progress(f"run {len(runs)}: {run.label()}: {verdict}{taken} ({run.seconds:.1f} s)")
        return run

    full = attempt(None)
    if not full.failed:
        return Bisection(runs, reason="the script passes with every optimization: there is nothing to bisect "
                                      "(it must exit nonzero when kiln's result is wrong)")
    if full.used is None:
        return Bisection(runs, reason="the failing run reported no fuel (did it import kiln, or end with "
                                      f"os._exit?); its output:\n{full.output}")
    none = attempt(0)
    if none.failed:
        return Bisection(runs, total=full.used,
                         reason="the script fails with no optimization decision at all: the wrong result "
                                "does not come from a fusion or rewrite (a lowering, a kernel, or the script "
                                "itself: try kiln.check); its output:\n" + none.output)
    good, bad = none, full
    low, high = 0, full.used  # fuel `low` passes, fuel `high` fails
    while high - low > 1:
        middle = (low + high) // 2
        run = attempt(middle)
        if run.failed:
            high, bad = middle, run
        else:
            low, good = middle, run
    if bad.last is None or bad.last[0] != high:
        return Bisection(runs, total=full.used, before=good, after=bad,
                         reason=f"fuel {low} passes and {high} fails, but the failing run's last decision is "
                                f"{bad.last}: the decisions differ between runs (is the script "
                                "deterministic?)")
    return Bisection(runs, decision=bad.last, total=full.used, before=good, after=bad,
                     diff=dump_diff(good.debug_dir, bad.debug_dir))


# ---- the IR before and after the decision ----------------------------------------------------------------

_TIMING = re.compile(r" \(\d+(\.\d+)? ms\)")


def _graph_dumps(directory: str | None) -> list[tuple[str, str]]:
    """(graph name, dump dir) of each graph a run compiled, in the order it compiled them."""
    if not directory or not os.path.isdir(directory):
        return []
    found = []
    for entry in os.scandir(directory):
        if entry.is_dir():
            files = [f.path for f in os.scandir(entry.path)]
            first = min((os.stat(f).st_mtime_ns for f in files), default=0)
            found.append((first, entry.name.rsplit("_", 1)[0], entry.path))
    return [(name, path) for _, name, path in sorted(found)]


def _read_dump(path: str) -> list[str]:
    with open(path) as f:
        return [_TIMING.sub("", line) for line in f.read().splitlines()]


def dump_diff(before: str | None, after: str | None, max_lines: int = 160) -> str:
    """The first IR dump (in compile order, then pass order) that differs between two runs, as a unified
    diff headed by the graph and pass; the later dumps that differ are listed after it."""
    pairs: dict[str, list[list[str]]] = {}
    for side, directory in ((0, before), (1, after)):
        for name, path in _graph_dumps(directory):
            pairs.setdefault(name, [[], []])[side].append(path)
    first, others = "", []
    for name, (olds, news) in pairs.items():
        for old, new in zip(olds, news):
            files = sorted(f for f in os.listdir(new) if f.endswith(".py"))
            for file in files:
                old_path, new_path = os.path.join(old, file), os.path.join(new, file)
                if not os.path.exists(old_path):
                    continue
                a, b = _read_dump(old_path), _read_dump(new_path)
                if a == b:
                    continue
                if first:
                    others.append(f"{name}/{file}")
                    continue
                lines = list(difflib.unified_diff(a, b, old_path, new_path, lineterm=""))
                if len(lines) > max_lines:
                    lines = lines[:max_lines] + [f"... ({len(lines) - max_lines} more diff lines)"]
                first = f"graph {name}, pass {file[3:-3]}: the IR without (-) and with (+) the decision\n" + \
                    "\n".join(lines)
    if not first:
        return "(no IR dump differs between the two runs)"
    if others:
        first += "\nlater dumps that differ too: " + ", ".join(others)
    return first


def report(b: Bisection, runs: bool = True) -> str:
    """The bisection as text: the runs (with `runs`), the decision and its IR diff, or why there is none."""
    lines = []
    for i, r in enumerate(b.runs if runs else []):
        taken = "" if r.used is None else f", {r.used} decision(s)"
        lines.append(f"run {i + 1}: {r.label()}: {'FAILS' if r.failed else 'passes'}{taken}")
    if b.decision is None:
        return "\n".join(lines + [f"kiln bisect: no decision found: {b.reason}"])
    number, pass_name, what = b.decision
    failure = b.runs[0].output.strip().splitlines()[-3:]
    lines += [""] if lines else []
    lines += [f"first bad decision: {number} of {b.total}, pass {pass_name}: {what}",
              f"found in {len(b.runs)} runs: KILN_FUEL={number - 1} passes, KILN_FUEL={number} fails",
              "the failure (unlimited fuel): " + " / ".join(line.strip() for line in failure),
              f"IR dumps: {b.before.debug_dir if b.before else '-'} (passes), "
              f"{b.after.debug_dir if b.after else '-'} (fails)", "", b.diff]
    return "\n".join(lines)


# ---- the child: run the script as __main__, report the fuel at exit --------------------------------------

def write_fuel_report(path: str) -> None:
    """The fuel this process used, as JSON: {"used", "last": [number, pass, description], "refused"}."""
    with open(path, "w") as f:
        json.dump({"used": FUEL.used, "last": list(FUEL.last) if FUEL.last else None,
                   "refused": FUEL.refused}, f)


def run_child(argv: list[str]) -> Any:
    """Run `argv[0]` as the main script with arguments argv[1:], as `python SCRIPT ARGS` would."""
    import atexit
    import runpy
    if not argv:
        print("usage: python -m kiln.testing.bisect SCRIPT [ARGS...]", file=sys.stderr)
        sys.exit(2)
    report_path = config.get("fuel_report")
    if report_path:
        atexit.register(write_fuel_report, report_path)
    script = os.path.abspath(argv[0])
    sys.argv = [script, *argv[1:]]
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    run_child(sys.argv[1:])
