"""One measurement of one model with one compiler, in a fresh process.

    python -m kiln.bench.worker '<job json>' RESULT_FILE

`kiln bench` runs this for every (model, compiler) pair, so each compile starts with no in-memory cache; the
job names a cache directory, empty for a cold compile and reused for the warm one. Phases:
  measure  compile (cold), accuracy against eager and fp64, interleaved eager/compiled timing, peak memory;
           in training mode also the bytes autograd saves for the backward (saved_activations)
  compile  the first call only (warm compile time), and one steady call to subtract
  census   kiln.explain on the model: graphs, breaks grouped by reason, frames run natively (census.py)
  memory   resident memory (Linux /proc/self/status): peak and steady RSS of steady calls (`memory`)
  profile  kiln.profile on the model: per-kernel table, JSON and roofline PNG into the job's `out` dir
  machine  the load average and a copy-bandwidth measurement (machine.snapshot), for the runner
The result is written as JSON to RESULT_FILE; errors become {"status": "error", ...}, never a crash.
"""
from __future__ import annotations

import copy
import gc
import json
import os
import resource
import statistics
import sys
import time
import traceback
from typing import Any, Callable

import torch

from ..backends import cpp
from ..testing import accuracy
from ..testing import models as zoo
from . import adapters, machine, precision as precisions

SGD_LR = 1e-3


def current_rss_mb() -> float | None:
    """Resident memory of this process now, in MiB (Linux)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
    except OSError:
        return None
    return pages * resource.getpagesize() / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # KiB on Linux


def status_mb(field: str) -> float | None:
    """A memory field of /proc/self/status (VmRSS: resident now, VmHWM: its peak) in MiB; None off Linux."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024   # kB
    except OSError:
        pass
    return None


def reset_peak_rss() -> bool:
    """Restart VmHWM from the resident size now (Linux 4.0+: "5" into /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return True


class Step:
    """One benchmark step of `fn` (the eager or compiled model): inference, or forward+backward+SGD.

    A training step copies the gradients out (before the SGD step) only while `checking`: the accuracy
    calls compare them; the timed calls, like a training loop, do not (a copy of every gradient each step
    would add the same time to every compiler's step)."""

    def __init__(self, fn: Callable[..., Any], module: torch.nn.Module, example: zoo.Example, mode: str,
                 checking: bool = True, precision: precisions.Precision | None = None):
        self.fn, self.module, self.mode = fn, module, mode
        self.args, self.kwargs = example
        self.optimizer = torch.optim.SGD(module.parameters(), lr=SGD_LR) if mode == "training" else None
        self.checking = checking
        self.precision = precision or precisions.get(None)
        self.scaler = self.precision.grad_scaler() if mode == "training" else None

    def __call__(self) -> Any:
        if self.optimizer is None:
            with torch.no_grad(), self.precision.context():
                return self.fn(*self.args, **self.kwargs)
        self.optimizer.zero_grad(set_to_none=True)
        with self.precision.context():   # the forward and the loss (torch's AMP recipe)
            out = self.fn(*self.args, **self.kwargs)
            loss = scalar_loss(out)
        if self.scaler is None:
            loss.backward()
        else:   # the gradients unscaled before they are read (and inf-checked), as for clipping
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
        grads = None
        if self.checking:
            grads = [p.grad.detach().clone() if p.grad is not None else None for p in self.module.parameters()]
        if self.scaler is None:
            self.optimizer.step()
        else:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        return {"output": detach(out), "grads": grads}


def scalar_loss(out: Any) -> torch.Tensor:
    """A scalar to differentiate: the sum of the means of the floating-point outputs (as PyTorch's runner);
    a half-precision output's mean in float32, as a loss under autocast is (the mean's backward would turn
    GradScaler's 2**16 into float16's inf)."""
    leaves = [leaf for _, leaf in accuracy.flatten(out)
              if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.requires_grad]
    if not leaves:
        raise ValueError("training mode: the model returns no floating-point tensor that requires grad")
    return sum((leaf.float() if leaf.dtype in HALF else leaf).mean() for leaf in leaves)


HALF = (torch.bfloat16, torch.float16)


def detach(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, dict):
        return {key: detach(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return tuple(detach(item) for item in value)
    if isinstance(value, list):
        return [detach(item) for item in value]
    return value


def saved_activations(step: Step) -> dict[str, Any]:
    """What autograd holds for the backward over one training step of `step`: the distinct storages handed
    to its pack hook (torch.autograd.graph.saved_tensors_hooks) other than the module's parameters and
    buffers and the example's tensors, which live anyway. Eager's ops, kiln's autograd Function and
    torch.compile's all save through that hook, so the three columns are measured alike. A view saved
    counts its whole storage (it keeps it alive)."""
    live = {t.untyped_storage().data_ptr() for t in (*step.module.parameters(), *step.module.buffers())}
    live |= {t.untyped_storage().data_ptr() for _, t in accuracy.flatten((step.args, step.kwargs))
             if isinstance(t, torch.Tensor)}
    storages: dict[int, int] = {}
    count = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal count
        count += 1
        storage = t.untyped_storage()
        if storage.data_ptr() not in live and storage.nbytes():
            storages[storage.data_ptr()] = storage.nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return {"saved_mb": sum(storages.values()) / 2**20, "saved_tensors": count,
            "saved_storages": len(storages)}


def kiln_partitioner_bytes(counters: dict[str, Any] | None) -> dict[str, Any]:
    """What kiln's partitioner planned when it compiled (kiln.counters' autograd entries), in MiB."""
    planned = (counters or {}).get("autograd", {})
    if "bytes saved for backward" not in planned:
        return {}
    return {"planned_saved_mb": planned["bytes saved for backward"] / 2**20,
            "planned_recomputed_mb": planned.get("bytes the backward recomputes instead of saving", 0) / 2**20}


def first_optimizer() -> None:
    """Construct a first optimizer before a compile is timed: torch.optim's first one imports torch._dynamo
    and torch._inductor (1-2.5 s here), a cost of every training script, eager's included, not of the
    compiler being timed (the timed step constructs its own SGD)."""
    torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=SGD_LR)


def timed(step: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = step()
    return out, time.perf_counter() - start


def warm_up(step: Callable[[], Any], min_calls: int = 5, min_s: float = 0.5, max_calls: int = 50) -> float:
    """Call `step` until warm (lazy initialisation in torch's libraries takes the first few calls); the
    estimated seconds per call."""
    times: list[float] = []
    while len(times) < min_calls or (sum(times) < min_s and len(times) < max_calls):
        times.append(timed(step)[1])
    return statistics.median(times[-3:])


MIN_REPS = 21   # enough pairs that the quartiles of the per-pair speedup say something


def interleaved(eager: Step, compiled: Step | None, budget_s: float, min_reps: int = MIN_REPS,
                max_reps: int = 200) -> tuple[list[float], list[float]]:
    """Seconds per call, alternating eager and compiled calls after warm-up: pair i is eager_times[i] and
    compiled_times[i], timed one after the other under the same load."""
    per_round = warm_up(eager) + (warm_up(compiled) if compiled is not None else 0.0)
    reps = int(max(min_reps, min(max_reps, budget_s / max(per_round, 1e-6))))
    eager_times, compiled_times = [], []
    for _ in range(reps):
        eager_times.append(timed(eager)[1])
        if compiled is not None:
            compiled_times.append(timed(compiled)[1])
    return eager_times, compiled_times


def ratio_spread(eager_times: list[float], compiled_times: list[float]) -> dict[str, float]:
    """The spread of the speedup over the interleaved pairs (eager ÷ compiled per pair): min, quartiles,
    median and max. The speedup reported stays median eager ÷ median compiled; its spread is the
    interquartile range of these per-pair ratios (report.unreliable)."""
    ratios = sorted(e / c for e, c in zip(eager_times, compiled_times) if c > 0)
    if len(ratios) < 2:
        return {}
    q1, median, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return {"speedup_min": ratios[0], "speedup_q1": q1, "speedup_pair_median": median, "speedup_q3": q3,
            "speedup_max": ratios[-1]}


def measure(job: dict[str, Any]) -> dict[str, Any]:
    """The `measure` phase (module docstring)."""
    mode, name = job["mode"], job["backend"]
    adapter = adapters.get(name, job.get("kiln_backend", "auto"))
    precision = precisions.get(job.get("precision"))
    model, example = precision.convert(*zoo.build(job["model"], batch=job.get("batch")))
    model.train(mode == "training")
    fp64_model = copy.deepcopy(model).double()
    compiled_module = copy.deepcopy(model)
    result: dict[str, Any] = {"threads": torch.get_num_threads()}

    if mode == "training":
        first_optimizer()
    rss_before = current_rss_mb()
    start = time.perf_counter()
    compiled_fn = adapter(compiled_module, job.get("cache_dir"))
    compiled = Step(compiled_fn, compiled_module, example, mode, precision=precision)
    seed = torch.initial_seed()
    torch.manual_seed(seed + 1)
    compiled_out = compiled()                      # compiles on the first call
    result["first_call_s"] = time.perf_counter() - start
    if rss_before is not None:
        result["peak_mem_mb"] = max(0.0, peak_rss_mb() - rss_before)

    # Accuracy of the first call (capture and compile) and of the second (the cached, guarded path); in
    # training mode the second step starts from the weights each one's first SGD step left.
    eager = Step(model, model, example, mode, precision=precision)
    fp64_example = (accuracy.to_fp64(example[0]), accuracy.to_fp64(example[1]))
    fp64 = Step(fp64_model, fp64_model, fp64_example, mode)
    # each run of a call draws from the same generator state (dropout in train mode: hf_bert's eager row
    # failed its own accuracy check on call 2, its masks drawn after the compiled step's)
    for call in (1, 2):
        if call == 2:
            torch.manual_seed(seed + call)
            compiled_out = compiled()
        torch.manual_seed(seed + call)
        eager_out = eager()
        torch.manual_seed(seed + call)
        verdict = accuracy.check(compiled_out, eager_out, accuracy.to_fp64(fp64()),
                                 tol=job.get("tol", precision.tol))
        if not verdict.passed:
            verdict.reason = f"call {call}: {verdict.reason}"
            break
    result["accuracy"] = verdict.to_dict()
    del fp64_model, fp64

    is_eager = name == "eager"
    eager.checking = compiled.checking = False
    result["load_before"] = machine.load_average()
    eager_times, compiled_times = interleaved(eager, None if is_eager else compiled, job.get("budget_s", 2.0))
    result["load_after"] = machine.load_average()
    if is_eager:
        compiled_times = eager_times
    else:
        result.update(ratio_spread(eager_times, compiled_times))
    result["eager_ms"] = statistics.median(eager_times) * 1e3
    result["compiled_ms"] = statistics.median(compiled_times) * 1e3
    result["reps"] = len(compiled_times)
    result["speedup"] = result["eager_ms"] / result["compiled_ms"]
    result["compile_s"] = 0.0 if is_eager else max(0.0, result["first_call_s"] - min(compiled_times))
    if mode == "training":   # after the timing: the hooks slow the step they watch
        try:
            result.update(saved_activations(compiled))
        except Exception as e:   # extra information; a failure is noted, not fatal
            result["saved_error"] = f"{type(e).__name__}: {e}"

    if adapters.kiln_backend_of(name, "auto") is not None:
        try:
            with precision.context():
                result.update(adapters.kiln_graph_counts(copy.deepcopy(model), *example))
        except Exception as e:   # the counts are extra information; a failure is noted, not fatal
            result["graph_count_error"] = f"{type(e).__name__}: {e}"
        if mode == "training":
            result.update(kiln_partitioner_bytes(result.get("counters")))
    result["status"] = "pass" if verdict.passed else "fail_accuracy"
    return result


def compile_only(job: dict[str, Any]) -> dict[str, Any]:
    """The `compile` phase: first-call time minus a steady call, with the job's (warm) cache."""
    adapter = adapters.get(job["backend"], job.get("kiln_backend", "auto"))
    precision = precisions.get(job.get("precision"))
    model, example = precision.convert(*zoo.build(job["model"], batch=job.get("batch")))
    model.train(job["mode"] == "training")
    if job["mode"] == "training":
        first_optimizer()
    start = time.perf_counter()
    step = Step(adapter(model, job.get("cache_dir")), model, example, job["mode"], checking=False,
                precision=precision)
    step()
    first = time.perf_counter() - start
    steady = min(timed(step)[1] for _ in range(3))
    return {"status": "pass", "first_call_s": first, "compile_s": max(0.0, first - steady)}


MEMORY_WARM_CALLS = 3
MEMORY_CALLS = 5


def memory(job: dict[str, Any]) -> dict[str, Any]:
    """The `memory` phase: resident memory of eager or a compiled model, in this fresh process.

    Both columns import kiln before anything is read, so that the imports weigh alike. `base`: RSS with the
    model and inputs built; `first_peak`: the peak over the first call (a compiler's compile included);
    then, after warm-up calls, the peak is restarted and `peak` is the highest RSS over MEMORY_CALLS steady
    calls (`out = step()`: the caller holds the last output while the next call runs, as a loop does), and
    `steady` the RSS between calls afterwards (the last output held). Where the peak cannot be restarted
    (`peak_reset` false), `peak` is the whole process's.
    """
    import kiln.api  # noqa: F401
    adapter = adapters.get(job["backend"], job.get("kiln_backend", "auto"))
    precision = precisions.get(job.get("precision"))
    model, example = precision.convert(*zoo.build(job["model"], batch=job.get("batch")))
    model.train(job["mode"] == "training")
    step = Step(adapter(model, job.get("cache_dir")), model, example, job["mode"], checking=False,
                precision=precision)
    gc.collect()
    base = status_mb("VmRSS")
    if base is None:
        raise adapters.Unavailable("memory: no /proc/self/status (RSS is read on Linux only)")
    reset_peak_rss()
    out = step()
    first_peak = status_mb("VmHWM")
    for _ in range(MEMORY_WARM_CALLS):
        out = step()
    gc.collect()
    peak_reset = reset_peak_rss()
    for _ in range(MEMORY_CALLS):
        out = step()
    peak = status_mb("VmHWM")
    gc.collect()
    steady = status_mb("VmRSS")
    del out
    return {"status": "pass", "rss_base_mb": base, "rss_first_peak_mb": first_peak, "rss_peak_mb": peak,
            "rss_steady_mb": steady, "peak_reset": peak_reset}


PROFILE_REPEAT = 10


def profile(job: dict[str, Any]) -> dict[str, Any]:
    """The `profile` phase: kiln.profile on the model (inference, under no_grad), its table, JSON and
    roofline PNG written as MODEL.txt, MODEL.json, MODEL.png into the job's `out` directory."""
    import kiln
    precision = precisions.get(job.get("precision"))
    model, example = precision.convert(*zoo.build(job["model"], batch=job.get("batch")))
    args, kwargs = example
    with torch.no_grad(), precision.context():
        report = kiln.profile(model, *args, repeat=int(job.get("repeat", PROFILE_REPEAT)), **kwargs)
    fp64_model = copy.deepcopy(model).double()
    with torch.no_grad():   # the profiled call's result against eager's and the fp64 reference
        with precision.context():
            eager_out = model(*args, **kwargs)
        fp64_out = fp64_model(*accuracy.to_fp64(args), **accuracy.to_fp64(kwargs))
    verdict = accuracy.check(report.result, eager_out, accuracy.to_fp64(fp64_out),
                             tol=job.get("tol", precision.tol))
    out = job["out"]
    os.makedirs(out, exist_ok=True)
    base = os.path.join(out, job["model"])
    text = str(report)
    with open(base + ".txt", "w") as f:
        f.write(text + "\n")
    files = [base + ".txt", report.save_json(base + ".json")]
    result: dict[str, Any] = {"status": "pass" if verdict.passed else "fail_accuracy", "table": text,
                              "accuracy": verdict.to_dict(), "wall_us": report.wall_us,
                              "outside_kernels_share": report.outside_kernels_share, "rows": len(report.rows)}
    try:
        files.append(report.plot(base + ".png"))
    except ImportError as e:
        result["plot_error"] = str(e)
    result["files"] = files
    return result


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Run one job; every failure is a result with a status, never an exception."""
    torch.manual_seed(0)
    if job.get("threads"):
        torch.set_num_threads(int(job["threads"]))   # before compiling: inductor bakes the count into C++
    # every compiler (and eager) under the malloc thresholds kiln's first compiled graph sets: the ratios
    # compare compilers, not glibc's page faults (kiln.runtime.malloc; the flag malloc_thresholds)
    cpp.malloc.settle()
    try:
        if job["phase"] == "measure":
            return measure(job)
        if job["phase"] == "compile":
            return compile_only(job)
        if job["phase"] == "memory":
            return memory(job)
        if job["phase"] == "profile":
            return profile(job)
        if job["phase"] == "machine":   # the load and copy bandwidth now (runner.machine_snapshot)
            return dict(machine.snapshot(job.get("threads")), status="pass")
        if job["phase"] == "census":   # kiln explain --isolate: one model's graph-break census
            from . import census
            return census.census_one(job["model"], job.get("batch"), job.get("check"))
        raise ValueError(f"unknown phase {job['phase']!r} (measure, compile, memory, profile, census, "
                         "machine)")
    except adapters.Unavailable as e:
        return {"status": "unavailable", "error": str(e)}
    except Exception as e:
        lines = traceback.format_exc().strip().splitlines()
        return {"status": "error", "error": f"{type(e).__name__}: {e}".strip()[:2000],
                "traceback": "\n".join(lines[-30:])}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m kiln.bench.worker JOB_JSON RESULT_FILE", file=sys.stderr)
        return 2
    result = run_job(json.loads(argv[0]))
    with open(argv[1], "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
