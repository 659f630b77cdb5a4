"""Per-call overhead of kiln (backend eager) against torch.compile(backend="eager") and plain eager.

Two programs: `a + b` on tiny tensors (pure overhead) and a 20-layer MLP on a small batch. Each variant is
timed interleaved in one run; the figures that matter are the ratios to eager printed at the end.

    python bench/bench_overhead.py [--repeat 7] [--calls 2000]
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

import kiln


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


def bench(name: str, variants: dict, args: tuple, repeat: int, calls: int) -> dict[str, float]:
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
    print(f"  kiln / torch.compile: {medians['kiln (eager)'] / medians['torch.compile (eager)']:.2f}x")
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--calls", type=int, default=1000)
    opts = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_grad_enabled(False)
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


if __name__ == "__main__":
    main()
