"""Compile time of one bench_kernels case with one compiler, in this (fresh) process.

    python bench/compile_worker.py --case NAME --compiler kiln|inductor --cache DIR [--size N] [--profile]
                                   [--steady-window S]

`bench/bench_kernels.py --compile-times fresh` runs this twice per case and compiler: cold (DIR empty) and
warm (a new process on the DIR the cold one filled). The case is built as the timed case is (same seeds,
shapes and inputs, grad off, modules in eval mode); then, as `kiln/bench/worker.py` measures it:

    first   = compile + first call        (kiln.compile(fn, backend="cpp") / torch.compile(fn))
    steady  = fastest of the further calls made in 2 s (at least 5)
    compile = first - steady

(kiln/bench/worker.py takes the fastest of 3 calls; here the window is longer because on a busy machine
the calls right after a compile of a small case are often slow for a while, see `steady_calls`.)

The clock starts after the imports: `import torch` is not compile time, and the import each compiler's
entry point needs (`import kiln` + `kiln.compile`, which loads kiln.api; `import torch._dynamo`, which
torch.compile imports on its first call) is reported apart as `import_s`. Later, lazy imports inside the
compile (kiln's cpp backend, inductor's codegen) count as compile time. Prints one JSON line on stdout;
`--profile` also prints cProfile's top 30 (cumulative) of the compile + first call on stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

START = time.perf_counter()


def cache_paths(cache: str) -> dict[str, str]:
    """The environment that points every compiler cache at `cache` (kiln, inductor, triton)."""
    return {"KILN_CACHE_DIR": os.path.join(cache, "kiln"),
            "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache, "inductor"),
            "TRITON_CACHE_DIR": os.path.join(cache, "triton")}


def count_files(directory: str) -> int:
    return sum(len(files) for _, _, files in os.walk(directory))


def build_case(name: str, size: int) -> tuple:
    """(fn, inputs) of the bench_kernels case called `name`, built as bench_kernels builds it."""
    import bench_kernels
    for make in (bench_kernels.blocks, lambda: bench_kernels.cases(size)):
        found = make()
        if name in found:
            fn, inputs, _ = found[name]
            return fn, inputs
    raise SystemExit(f"unknown case {name!r}")


def import_compiler(compiler: str):
    """Import the compiler's entry point; (compile function, seconds the import took)."""
    start = time.perf_counter()
    if compiler == "kiln":
        import kiln
        kiln_compile = kiln.compile               # loads kiln.api (kiln imports it lazily)

        def compile_fn(fn):
            return kiln_compile(fn, backend="cpp")
    elif compiler == "inductor":
        import torch
        import torch._dynamo  # noqa: F401  (torch.compile's own import on its first call)
        compile_fn = torch.compile
    else:
        raise SystemExit(f"unknown compiler {compiler!r} (kiln, inductor)")
    return compile_fn, time.perf_counter() - start


def steady_calls(compiled, inputs, min_calls: int = 5, window_s: float = 2.0, max_calls: int = 500) -> list:
    """Seconds of calls after the first: at least `min_calls`, for `window_s`. On a busy machine calls of
    a small case right after a compile are often slow for a while (OpenMP threads waiting on busy cores:
    0.14 s instead of 2 ms); the fastest of a few calls would then understate the compile time."""
    times: list[float] = []
    window_end = time.perf_counter() + window_s
    while len(times) < min_calls or (time.perf_counter() < window_end and len(times) < max_calls):
        call_start = time.perf_counter()
        compiled(*inputs)
        times.append(time.perf_counter() - call_start)
    return times


def kiln_notes() -> dict:
    """kiln's counters that would make a compile time misleading (nothing compiled, fell back to torch)."""
    import kiln
    counters = kiln.counters
    return {"graphs": sum(counters.get("graphs", {}).values()),
            "graph_breaks": sum(counters.get("graph_breaks", {}).values()),
            "capture_errors": sum(counters.get("capture_errors", {}).values()),
            "graphs_run_with_torch": counters.get("cpp", {}).get("graphs run with torch", 0)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", required=True)
    parser.add_argument("--compiler", required=True, choices=["kiln", "inductor"])
    parser.add_argument("--cache", required=True, help="cache directory: empty = cold, reused = warm")
    parser.add_argument("--size", type=int, default=4096, help="n of the n x n memory-bound cases")
    parser.add_argument("--profile", action="store_true", help="cProfile the compile + first call")
    parser.add_argument("--steady-window", type=float, default=2.0,
                        help="seconds of calls after the first, the fastest of which is the steady call")
    args = parser.parse_args(argv)
    os.makedirs(args.cache, exist_ok=True)
    os.environ.update(cache_paths(args.cache))     # before kiln's config or inductor read them

    import torch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    torch.set_grad_enabled(False)
    fn, inputs = build_case(args.case, args.size)
    compile_fn, import_s = import_compiler(args.compiler)
    files_before = count_files(args.cache)

    profiler = None
    if args.profile:
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
    start = time.perf_counter()
    compiled = compile_fn(fn)
    compiled(*inputs)
    first = time.perf_counter() - start
    if profiler is not None:
        profiler.disable()
    steady_times = steady_calls(compiled, inputs, window_s=args.steady_window)
    steady = min(steady_times)

    result = {"case": args.case, "compiler": args.compiler, "compile_s": max(0.0, first - steady),
              "first_call_s": first, "steady_s": steady, "steady_calls": len(steady_times),
              "import_s": import_s,
              "cache_files_before": files_before, "cache_files_after": count_files(args.cache),
              "process_s": time.perf_counter() - START, "threads": torch.get_num_threads()}
    if args.compiler == "kiln":
        result.update(kiln_notes())
    if profiler is not None:
        import pstats
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(30)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
