"""`kiln bench`: eager, torch.compile and kiln side by side on the model zoo.

For each model and compiler, a fresh worker process (`python -m kiln.bench.worker`) compiles with empty
caches, checks accuracy (kiln.testing.accuracy), and times eager and compiled calls interleaved; a second
fresh process compiles again with the caches the first one filled (warm compile time); with `memory` (and
always in training mode, where the measuring run also counts the bytes autograd saves for the backward), a
third fresh process measures peak and steady RSS (worker.memory), so each model's eager and compiled
memory stand side by side; with `profile`, a last fresh process per model runs kiln.profile on it (its
table, JSON and roofline PNG under OUT/profile/). Every finished row
is written at once to results.json and results.md, so Ctrl-C (or a crash) leaves the finished rows; a
model that errors, misses accuracy or times out is a row, never the end of the run.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, TextIO

import torch

from .. import config
from ..testing import models as zoo
from . import adapters, machine, plots, report
from . import precision as precisions

log = config.channel("bench")
DEFAULT_BACKENDS = ("eager", "torch.compile", "kiln")


@dataclasses.dataclass
class Options:
    """What to run; the fields mirror `kiln bench`'s flags."""
    suite: str = "quick"
    models: list[str] | None = None       # overrides the suite
    backends: tuple[str, ...] = DEFAULT_BACKENDS
    mode: str = "inference"               # or "training": forward + backward + SGD step
    precision: str = "fp32"               # or bf16, fp16, amp (autocast), bf16-weights, ... (precision.py)
    batch: int | None = None              # None: each model's own batch size
    out: str = "bench_out"
    kiln_backend: str = "auto"
    timeout_s: float = 600.0              # per worker process
    budget_s: float = 2.0                 # timing budget per (model, compiler) after warm-up
    threads: int | None = 1               # torch threads in the workers (None: torch's default); one
                                          # by default: a shared machine's other jobs then steal less of
                                          # each timed call than when every call spreads over every core
    warm: bool = True                     # also measure the warm compile time
    memory: bool = False                  # also measure peak and steady RSS (a fresh process each;
                                          # always in training mode)
    memory_only: bool = False             # only that: no timing, accuracy or compile-time runs
    plots: bool = True
    progress: bool = True
    profile: bool = False                 # also kiln.profile each model after its rows (OUT/profile/)
    profile_only: bool = False            # only that: no eager/torch.compile/kiln rows
    profile_repeat: int = 10              # timed calls per profile


class Progress:
    """A plain progress bar on stderr: redrawn in place on a terminal, one line per step otherwise."""

    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool = True):
        self.total, self.done, self.stream, self.enabled = total, 0, stream or sys.stderr, enabled
        self.start = time.monotonic()
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.logged = ""

    def show(self, label: str) -> None:
        if label and label != self.logged:  # (the `bench` log channel: each step once, bar or no bar)
            self.logged = label
            log.info("%s", label)
        if not self.enabled:
            return
        elapsed = int(time.monotonic() - self.start)
        filled = int(30 * self.done / max(1, self.total))
        line = (f"[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} "
                f"{elapsed // 60}:{elapsed % 60:02d}  {label}")
        if self.tty:
            self.stream.write("\r\033[K" + line[:150])
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def step(self, label: str = "") -> None:
        self.done += 1
        self.show(label)

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _idle_reference(threads: int | None) -> dict[str, Any] | None:
    peaks = machine.cached_peaks(threads)
    if peaks is None:
        return None
    return {key: peaks.get(key) for key in ("copy_gbps", "copy_gbps_median", "load", "measured")}


def machine_snapshot(threads: int | None) -> dict[str, Any] | None:
    """The load and copy bandwidth now, measured in a fresh worker: in this process the copy's 256 MB
    would raise the peak RSS that every worker it starts inherits (and counts in its `mem MB`)."""
    result = run_worker({"phase": "machine", "threads": threads}, 120.0)
    if result.get("status") != "pass":
        log.warning("could not measure the machine: %s", result.get("error"))
        return {"load": machine.load_average()}
    return {key: result.get(key) for key in ("load", "copy_gbps", "copy_gbps_median")}


def run_busy_reasons(meta: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """Why the run's times are not to be trusted: the load before, during (each row's timing) or after
    above the CPUs, or a copy bandwidth well below the idle one ([] for a quiet run)."""
    snapshots = [meta.get("machine_before"), meta.get("machine_after")]
    snapshots += [{"load": row.get(key)} for row in rows for key in ("load_before", "load_after")]
    return machine.busy_reasons(snapshots, meta.get("machine_idle"), meta.get("cpus"))


def select_models(options: Options) -> list[str]:
    """The zoo entries to run: --models, else the suite (entries whose extras are missing are skipped)."""
    if options.models:
        for name in options.models:
            zoo.get(name)   # unknown names fail here, before anything runs
        return list(options.models)
    return zoo.names(options.suite)


def run_worker(job: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Run one job in a fresh process; its result, or an error/timeout result."""
    with tempfile.TemporaryDirectory(prefix="kiln-bench-job-") as tmp:
        result_path = os.path.join(tmp, "result.json")
        stderr_path = os.path.join(tmp, "stderr.txt")
        command = [sys.executable, "-m", "kiln.bench.worker", json.dumps(job), result_path]
        with open(stderr_path, "w") as stderr:
            # its own session, so that a timeout or Ctrl-C ends the worker with its compiler children
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr,
                                       start_new_session=True)
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(process)
                return {"status": "timeout", "error": f"no result after {timeout_s:.0f} s"}
            except BaseException:   # Ctrl-C: the worker must not outlive the run
                _kill_group(process)
                raise
        if os.path.exists(result_path):
            with open(result_path) as f:
                return json.load(f)
        with open(stderr_path) as f:
            tail = f.read()[-2000:]
        return {"status": "error", "error": f"worker exited with code {process.returncode}: {tail.strip()}"}


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        process.kill()
    process.wait()


def bench_one(model: str, compiler: str, options: Options, progress: Progress,
              launch: Callable[[dict[str, Any], float], dict[str, Any]] = run_worker) -> dict[str, Any]:
    """The row of one (model, compiler) pair: a cold measuring run, then a warm compile run."""
    row: dict[str, Any] = {"model": model, "compiler": compiler, "mode": options.mode,
                           "batch": options.batch or zoo.get(model).batch}
    if options.precision != precisions.DEFAULT:
        row["precision"] = options.precision
    kiln_backend = adapters.kiln_backend_of(compiler, options.kiln_backend)
    if kiln_backend is not None:
        row["kiln_backend"] = kiln_backend
        reason = adapters.kiln_availability()
        if reason is not None:
            progress.step(f"{model} / {compiler}: unavailable")
            progress.step(f"{model} / {compiler}: unavailable")
            return dict(row, status="unavailable", error=reason)
    elif compiler != "eager" and compiler not in adapters.baseline_names():
        progress.step(f"{model} / {compiler}: unavailable")
        progress.step(f"{model} / {compiler}: unavailable")
        return dict(row, status="unavailable", error=f"{compiler}: no such baseline in bench/baselines.py")

    cache_dir = tempfile.mkdtemp(prefix="kiln-bench-cache-")
    try:
        job = {"model": model, "backend": compiler, "mode": options.mode, "batch": options.batch,
               "kiln_backend": options.kiln_backend, "cache_dir": cache_dir, "budget_s": options.budget_s,
               "threads": options.threads, "precision": options.precision}
        if options.memory_only:
            progress.show(f"{model} / {compiler}: memory")
            result = launch(dict(job, phase="memory"), options.timeout_s)
            progress.step(f"{model} / {compiler}: memory {result['status']}")
            progress.step(f"{model} / {compiler}: memory {result['status']}")
            row.update(status=result["status"], error=result.get("error"))
            row.update(_memory_fields(result))
            return row
        progress.show(f"{model} / {compiler}: compile (cold) and measure")
        result = launch(dict(job, phase="measure"), options.timeout_s)
        progress.step(f"{model} / {compiler}: {result['status']}")
        row.update(status=result["status"], error=result.get("error"), accuracy=result.get("accuracy"),
                   time_ms=result.get("compiled_ms"), eager_ms=result.get("eager_ms"),
                   speedup=result.get("speedup"), reps=result.get("reps"),
                   compile_cold_s=result.get("compile_s"), peak_mem_mb=result.get("peak_mem_mb"),
                   graph_count=result.get("graph_count"), graph_break_count=result.get("graph_break_count"),
                   counters=result.get("counters"), threads=result.get("threads"),
                   fallbacks=_fallbacks(result.get("counters")))
        row.update({key: result[key] for key in SAVED_FIELDS + SPREAD_FIELDS if key in result})
        if (options.memory or options.mode == "training") and result["status"] in ("pass", "fail_accuracy"):
            progress.show(f"{model} / {compiler}: memory")
            row.update(_memory_fields(launch(dict(job, phase="memory"), options.timeout_s)))
        if compiler == "eager" or result["status"] not in ("pass", "fail_accuracy") or not options.warm:
            if compiler == "eager":
                row.update(compile_cold_s=None)
            progress.step(f"{model} / {compiler}: {result['status']}")
            return row
        progress.show(f"{model} / {compiler}: compile (warm)")
        warm = launch(dict(job, phase="compile"), options.timeout_s)
        progress.step(f"{model} / {compiler}: warm {warm['status']}")
        if warm["status"] == "pass":
            row["compile_warm_s"] = warm["compile_s"]
        else:
            row["warm_error"] = warm.get("error")
        return row
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


def _fallbacks(counters: dict[str, Any] | None) -> int | None:
    """How many nodes kiln ran with torch (kiln.counters' fallback entries); None without counters."""
    if counters is None:
        return None
    return sum(counters.get("fallback", {}).values())


def profile_one(model: str, options: Options, progress: Progress,
                launch: Callable[[dict[str, Any], float], dict[str, Any]] = run_worker) -> dict[str, Any]:
    """kiln.profile of one model in a fresh process (inference): MODEL.txt/.json/.png in OUT/profile."""
    progress.show(f"{model}: kiln.profile")
    job = {"phase": "profile", "model": model, "batch": options.batch, "mode": "inference",
           "threads": options.threads, "repeat": options.profile_repeat, "precision": options.precision,
           "out": os.path.join(options.out, "profile")}
    result = launch(job, options.timeout_s)
    progress.step(f"{model}: profile {result['status']}")
    entry = {"model": model, "status": result["status"]}
    for key in ("error", "table", "files", "wall_us", "outside_kernels_share", "accuracy", "plot_error"):
        if key in result:
            entry[key] = result[key]
    return entry


# training mode: the bytes autograd holds for the backward (worker.saved_activations), kiln's partitioner plan
SAVED_FIELDS = ("saved_mb", "saved_tensors", "saved_storages", "saved_error", "planned_saved_mb",
                "planned_recomputed_mb")
# the speedup's spread over the interleaved pairs (worker.ratio_spread) and the load around the timing
SPREAD_FIELDS = ("speedup_min", "speedup_q1", "speedup_pair_median", "speedup_q3", "speedup_max",
                 "load_before", "load_after")
MEMORY_FIELDS = ("rss_base_mb", "rss_first_peak_mb", "rss_peak_mb", "rss_steady_mb", "peak_reset")


def _memory_fields(result: dict[str, Any]) -> dict[str, Any]:
    """The row fields of a memory run: its figures, or why there are none."""
    if result.get("status") != "pass":
        return {"memory_error": result.get("error") or result.get("status")}
    return {key: result.get(key) for key in MEMORY_FIELDS}


def precompile_kiln() -> bool:
    """Write kiln's bytecode (__pycache__) before any worker starts; whether every module compiled.

    A regular `pip install` does this at install time, an editable one does not, and where
    PYTHONDONTWRITEBYTECODE is set (this project's machines) nothing writes it later: every worker then
    compiled kiln's ~100 modules from source (~0.5 s), counted in kiln's cold and warm compile times, while
    torch.compile's modules come precompiled in site-packages."""
    import compileall
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        return bool(compileall.compile_dir(package, quiet=1))
    except OSError:   # a read-only install: its bytecode was written by the installer
        return False


def run(options: Options, launch: Callable[[dict[str, Any], float], dict[str, Any]] = run_worker,
        stream: TextIO | None = None) -> dict[str, Any]:
    """Run the benchmark; returns {"meta", "rows"} and writes results.json/.md (and plots) to options.out.

    Ctrl-C stops the run after writing the finished rows (meta["interrupted"] is then True)."""
    models = select_models(options)
    meta = {"suite": None if options.models else options.suite, "mode": options.mode, "batch": options.batch,
            "precision": None if options.precision == precisions.DEFAULT else options.precision,
            "backends": list(options.backends), "kiln_backend": options.kiln_backend,
            "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "threads": options.threads or torch.get_num_threads(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "interrupted": False, "kiln_bytecode": precompile_kiln()}
    # the machine before the run: its load and copy bandwidth at the workers' thread count, against the
    # roofs kiln.profile measured on an idle machine (when cached: nothing idle is measured here)
    meta["machine_idle"] = _idle_reference(options.threads)
    meta["machine_before"] = machine_snapshot(options.threads)
    results: dict[str, Any] = {"meta": meta, "rows": []}
    profiling = options.profile or options.profile_only
    steps = (0 if options.profile_only else 2 * len(models) * len(options.backends)) + \
        (len(models) if profiling else 0)
    progress = Progress(steps, stream=stream, enabled=options.progress)
    start = time.monotonic()
    try:
        for model in models if not options.profile_only else ():
            for compiler in options.backends:
                row = bench_one(model, compiler, options, progress, launch)
                results["rows"].append(row)
                report.write(results, options.out)
                log.info("row %s / %s: %s%s", model, compiler, row["status"],
                         f" ({row['error']})" if row.get("error") else "")
        if profiling:
            results["profiles"] = []
            for model in models:
                results["profiles"].append(profile_one(model, options, progress, launch))
                report.write(results, options.out)
    except KeyboardInterrupt:
        meta["interrupted"] = True
    finally:
        progress.close()
    meta["wall_s"] = round(time.monotonic() - start, 1)
    meta["machine_after"] = machine_snapshot(options.threads)
    meta["busy"] = run_busy_reasons(meta, results["rows"])
    results["files"] = report.write(results, options.out)
    for entry in results.get("profiles", ()):
        results["files"] += entry.get("files", [])
    if options.plots:
        results["files"] += plots.write(results["rows"], options.out, meta)
    return results
