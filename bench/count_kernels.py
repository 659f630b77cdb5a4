"""Kernels per zoo model (and per bench_kernels case) under the cpp backend: the table that a change to
fusion is compared by (issue 41: equal or fewer kernels, never more).

    PYTHONPATH=<checkout> python bench/count_kernels.py [--suite full] [--models a,b] [--save DIR]
                                                        [--compare DIR] [--json PATH]

Each model is compiled for inference (eval mode, the zoo's example) with the graph cache off, so every
graph goes through fusion; a row is the sum over the model's graphs of kernels, externs/fallbacks and the
memory plan's peak bytes (`Plan.peak_bytes`).
`--save DIR` writes each model's output there; `--compare DIR` says whether this checkout's outputs are
bitwise equal to the saved ones (the same kernels computing the same values in the same order). The last line gives the time spent in the
fusion pass (`kiln.backends.cpp_passes.fuse`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
FUSE_SECONDS: list[float] = []  # each call of the fusion pass


def _flat(out: object) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict) or hasattr(out, "values") and callable(out.values):
        return [t for v in out.values() for t in _flat(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in _flat(v)]
    return []


def count(fn: object, args: tuple, kwargs: dict | None = None) -> tuple[int, int, int, list[torch.Tensor]]:
    """(kernels, externs and fallbacks, the sum of the graphs' planned peak bytes, outputs) of `fn` compiled
    with the cpp backend and run once."""
    import kiln
    from kiln.backends import cpp
    from kiln.backends import cpp_passes
    seen: list[tuple[int, int]] = []
    original = cpp.log_schedule
    real_fuse = cpp_passes.fuse

    def timed_fuse(loop: object, target: object) -> list:
        start = time.perf_counter()
        try:
            return real_fuse(loop, target)
        finally:
            FUSE_SECONDS.append(time.perf_counter() - start)

    def record(backend: str, name: str, schedule: list, seconds: float) -> None:
        from kiln.schedule.fusion import FusedGroup
        kernels = sum(isinstance(s, FusedGroup) for s in schedule)
        seen.append((kernels, len(schedule) - kernels))
        original(backend, name, schedule, seconds)
    peaks: list[int] = []
    real_init = cpp.CompiledGraph.__init__

    def init(self: object, graph: object, loop: object, schedule: object, memory: object, *rest: object,
             **kw: object) -> None:
        real_init(self, graph, loop, schedule, memory, *rest, **kw)
        if memory is not None and loop is not None:
            peaks.append(memory.peak_bytes(loop))
    cpp.log_schedule = record
    cpp_passes.fuse = timed_fuse
    cpp.CompiledGraph.__init__ = init
    try:
        kiln.reset()
        compiled = kiln.compile(fn, backend="cpp")
        with torch.no_grad():
            out = compiled(*args, **(kwargs or {}))
    finally:
        cpp.log_schedule = original
        cpp_passes.fuse = real_fuse
        cpp.CompiledGraph.__init__ = real_init
    return sum(k for k, _ in seen), sum(e for _, e in seen), sum(peaks), _flat(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--suite", default="full")
    parser.add_argument("--models", default=None)
    parser.add_argument("--no-cases", action="store_true", help="skip bench_kernels.py's cases")
    parser.add_argument("--size", type=int, default=256, help="bench_kernels cases at n x n")
    parser.add_argument("--save", default=None)
    parser.add_argument("--compare", default=None)
    parser.add_argument("--json", default=None)
    a = parser.parse_args()
    import kiln
    from kiln import config
    from kiln.testing import models
    config.set("graph_cache", False)
    torch.set_num_threads(1)
    print(f"# kiln from {os.path.dirname(kiln.__file__)}", flush=True)
    rows: dict[str, tuple[int, int, str]] = {}
    jobs: list[tuple[str, object, tuple, dict]] = []
    names = a.models.split(",") if a.models else models.names(a.suite)
    for name in names:
        model, (args, kwargs) = models.build(name)
        jobs.append((name, model, tuple(args), dict(kwargs)))
    if not a.no_cases:
        import bench_kernels
        for case, (fn, args, _) in bench_kernels.cases(a.size).items():
            jobs.append((f"case: {case}", fn, args, {}))
    for name, fn, args, kwargs in jobs:
        kernels, externs, peak, outs = count(fn, args, kwargs)
        same = ""
        key = name.replace(" ", "_").replace("/", "_").replace(":", "")
        if a.save:
            os.makedirs(a.save, exist_ok=True)
            torch.save(outs, os.path.join(a.save, f"{key}.pt"))
        if a.compare:
            path = os.path.join(a.compare, f"{key}.pt")
            if "dropout" in name:
                same = "random"
            elif os.path.exists(path):
                saved = torch.load(path)
                equal = len(saved) == len(outs) and all(
                    s.shape == o.shape and s.dtype == o.dtype and torch.equal(s, o) for s, o in zip(saved, outs))
                same = "bitwise equal" if equal else "DIFFERS"
            else:
                same = "no saved output"
        rows[name] = (kernels, externs, same, peak)
        print(f"{name:32s} kernels {kernels:4d}  externs/fallbacks {externs:4d}  peak {peak / 1024:9.1f} KiB  "
              f"{same}", flush=True)
    print(f"total kernels {sum(r[0] for r in rows.values())}, externs/fallbacks "
          f"{sum(r[1] for r in rows.values())}; the fusion pass ran {len(FUSE_SECONDS)} times, "
          f"{sum(FUSE_SECONDS):.2f} s in all")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
