"""Optimizer steps: `kiln.compile(opt.step)` against eager's step, SGD with momentum, Adam and AdamW.

For each optimizer and model size (a stack of Linear layers), in one process: five training steps through
both (the parameters after them must agree), then the median time of `step()` alone over repeated calls
with fixed gradients, kiln and eager interleaved.

    python bench/bench_optim.py [--sizes 256x8,2048x4] [--optimizers sgd,adam,adamw] [--threads N]
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))   # this checkout's kiln

import kiln  # noqa: E402

OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-3),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01),
}


def run(kind: str, width: int, layers: int, calls: int = 30) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    ref = copy.deepcopy(model)
    opt, ref_opt = OPTIMIZERS[kind](model.parameters()), OPTIMIZERS[kind](ref.parameters())
    step = kiln.compile(opt.step)
    x = torch.randn(16, width)
    for _ in range(5):
        model(x).pow(2).mean().backward()
        step()
        opt.zero_grad()
        ref(x).pow(2).mean().backward()
        ref_opt.step()
        ref_opt.zero_grad()
    diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), ref.parameters()))
    for m in (model, ref):
        for p in m.parameters():
            p.grad = torch.randn_like(p) * 1e-3
    times: dict[str, list[float]] = {"kiln": [], "eager": []}
    for _ in range(calls):
        for name, fn in (("kiln", step), ("eager", ref_opt.step)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    k, e = statistics.median(times["kiln"]), statistics.median(times["eager"])
    params = sum(p.numel() for p in model.parameters())
    return dict(optimizer=kind, params=params, max_param_diff=diff, kiln_ms=k * 1e3, eager_ms=e * 1e3,
                speedup=e / k)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="256x8,2048x4", help="WIDTHxLAYERS,...")
    parser.add_argument("--optimizers", default="sgd,adam,adamw")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print("| optimizer | params | max param diff after 5 steps | kiln ms | eager ms | speedup |")
    print("|---|---:|---:|---:|---:|---:|")
    for size in args.sizes.split(","):
        width, layers = (int(v) for v in size.split("x"))
        for kind in args.optimizers.split(","):
            r = run(kind, width, layers)
            print(f"| {r['optimizer']} | {r['params']} | {r['max_param_diff']:.1e} | {r['kiln_ms']:.3f} | "
                  f"{r['eager_ms']:.3f} | {r['speedup']:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
