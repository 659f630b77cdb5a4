"""Per-call overhead of kiln (backend eager) against torch.compile(backend="eager") and plain eager.

Programs: `a + b` on tiny tensors (pure overhead), a 20-layer MLP on a small batch and nanoGPT tiny (the
zoo's). Each variant is timed interleaved in one run; the figures that matter are the ratios to eager.

Then kiln's capture-side overhead alone: each compiled call with its graph replaced by a stub returning the
graph's outputs, so what is timed is what runs before and after the graph (the module wrapper, the cache
lookup, the guards, the entry function's glue), for `a + b`, a 3-layer MLP and nanoGPT tiny. Medians and
minimums over the repeats (the minimum is the steadier figure on a shared machine).

Then (or alone, `--only cpp`) whole compiled calls through kiln's cpp backend, with and without runs (one C++
entry for consecutive kernels and products), beside eager and torch.compile's default.

    python bench/bench_overhead.py [--repeat 7] [--calls 2000] [--only capture|cpp] [--threads 1]
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

import kiln
from kiln.testing.models import build


def add(a, b):
    return a + b


def make_mlp(layers: int = 20, width: int = 32) -> torch.nn.Module:
    mods: list[torch.nn.Module] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods).eval()


def per_call_us(fn, args, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - start) / calls * 1e6


def bench(name: str, variants: dict, args: tuple, repeat: int, calls: int,
          ratio: tuple[str, str] = ("kiln (eager)", "torch.compile (eager)")) -> dict[str, float]:
    for fn in variants.values():  # warm up: capture / compile outside the timed region
        for _ in range(3):
            fn(*args)
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(repeat):
        for key, fn in variants.items():  # interleaved, so machine noise hits every variant alike
            times[key].append(per_call_us(fn, args, calls))
    medians = {k: statistics.median(v) for k, v in times.items()}
    base = medians["eager"]
    print(f"\n{name}")
    for key, us in medians.items():
        print(f"  {key:<28} {us:9.2f} us/call   {us / base:6.2f}x eager")
    print(f"  {ratio[0]} / {ratio[1]}: {medians[ratio[0]] / medians[ratio[1]]:.2f}x")
    return medians


def stub_graph(compiled, args: tuple, kwargs: dict) -> None:
    """Replace the graph the (single) cache entry of `compiled` calls by a stub returning its outputs."""
    fn = getattr(compiled, "_compiled_forward", compiled)
    (entry,) = fn.cache.entries
    env = entry.fn.__globals__  # the generated entry function's namespace holds the graph as __graph
    graph = env["__graph"]
    seen = []
    env["__graph"] = lambda *inputs: seen.append(graph(*inputs)) or seen[-1]
    compiled(*args, **kwargs)
    out = seen[-1]
    env["__graph"] = lambda *inputs: out


def capture_side(repeat: int, calls: int) -> dict[str, float]:
    """Microseconds per call spent outside the graph, per program (median and minimum of `repeat`)."""
    model, (nargs, nkwargs) = build("nanogpt_tiny")
    programs = [("a + b  (1 op)", add, (torch.randn(8), torch.randn(8)), {}),
                ("MLP 3 x (Linear 32x32 + ReLU)", make_mlp(3), (torch.randn(4, 32),), {}),
                ("nanoGPT tiny", model, tuple(nargs), dict(nkwargs))]
    compiled = []
    for name, fn, args, kwargs in programs:
        c = kiln.compile(fn, backend="eager")
        for _ in range(3):
            c(*args, **kwargs)
        stub_graph(c, args, kwargs)
        compiled.append((name, c, args, kwargs))
    times: dict[str, list[float]] = {name: [] for name, *_ in compiled}
    for _ in range(repeat):
        for name, c, args, kwargs in compiled:
            start = time.perf_counter()
            for _ in range(calls):
                c(*args, **kwargs)
            times[name].append((time.perf_counter() - start) / calls * 1e6)
    print("\nkiln capture-side overhead (graph stubbed): us per call, median / min")
    for name, ts in times.items():
        print(f"  {name:<32} {statistics.median(ts):8.2f} / {min(ts):8.2f}")
    return {name: statistics.median(ts) for name, ts in times.items()}


def compiled_calls(repeat: int, calls: int) -> dict[str, dict[str, float]]:
    """Whole compiled calls, kiln's cpp backend with and without runs (kiln.codegen.cpp_native) beside eager
    and torch.compile's default: `a + b` (the per-call floor: one tiny kernel), a 3-layer and a 20-layer MLP
    at batch 4, nanoGPT tiny."""
    model, (nargs, _) = build("nanogpt_tiny")
    programs = [("a + b  (8 floats)", add, (torch.randn(8), torch.randn(8))),
                ("MLP 3 x (Linear 32x32 + ReLU), batch 4", make_mlp(3), (torch.randn(4, 32),)),
                ("MLP 20 x (Linear 32x32 + ReLU), batch 4", make_mlp(20), (torch.randn(4, 32),)),
                ("nanoGPT tiny (1 block, dim 32, 32 tokens)", model, tuple(nargs))]
    out = {}
    for name, fn, args in programs:
        out[name] = bench(name, {
            "eager": fn,
            "kiln (cpp)": kiln.compile(fn, options={"native_runs": True}),
            "kiln (cpp, no runs)": kiln.compile(fn, options={"native_runs": False}),
            "torch.compile": torch.compile(fn),
        }, args, repeat, calls, ratio=("kiln (cpp)", "torch.compile"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--only", choices=["capture", "cpp"],
                        help="only the capture-side overhead, or only the compiled (cpp backend) calls")
    parser.add_argument("--threads", type=int, default=1)
    opts = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_grad_enabled(False)
    torch.set_num_threads(opts.threads)
    if opts.only == "capture":
        capture_side(max(opts.repeat, 15), opts.calls)
        return
    if opts.only == "cpp":
        compiled_calls(opts.repeat, opts.calls)
        return
    a, b = torch.randn(8), torch.randn(8)
    bench("a + b  (8 floats)", {
        "eager": add,
        "kiln (eager)": kiln.compile(add, backend="eager"),
        "torch.compile (eager)": torch.compile(add, backend="eager"),
    }, (a, b), opts.repeat, opts.calls)
    mlp = make_mlp()
    x = torch.randn(4, 32)
    bench("20-layer MLP (Linear 32x32 + ReLU, batch 4)", {
        "eager": mlp,
        "kiln (eager)": kiln.compile(mlp, backend="eager"),
        "torch.compile (eager)": torch.compile(mlp, backend="eager"),
    }, (x,), opts.repeat, max(opts.calls // 10, 50))
    gpt, (gargs, _) = build("nanogpt_tiny")
    bench("nanoGPT tiny (1 block, dim 32, 32 tokens)", {
        "eager": gpt,
        "kiln (eager)": kiln.compile(gpt, backend="eager"),
        "torch.compile (eager)": torch.compile(gpt, backend="eager"),
    }, tuple(gargs), opts.repeat, max(opts.calls // 10, 50))
    capture_side(max(opts.repeat, 15), opts.calls)
    compiled_calls(opts.repeat, opts.calls)


if __name__ == "__main__":
    main()
