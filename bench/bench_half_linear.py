"""A biased Linear under bf16/fp16 autocast: eager's gemm against the one kiln's decomposition runs.

    python bench/bench_half_linear.py [--threads 1] [--reps 25] [--dtype bfloat16]

kiln decomposes a half-precision `linear` with a bias as float32 `mm` of the upcast operands, the bias added
in float32 and one rounding at the end (kiln.ops.nn.linear: the values eager's fused addmm gives), so its
extern is a float32 gemm reading twice the bytes; eager calls one half-precision addmm (oneDNN: AMX or
AVX512-BF16 where the CPU has them). Per shape (the zoo's transformer Linears: rows = batch * tokens,
in, out), interleaved medians in microseconds of: eager's `torch.addmm(b, x, w.t())` in the half dtype;
kiln's float32 addmm of the upcast operands (the upcasts done beforehand, as kiln's kernels do); the same
with the upcasts timed. The ratio is what a half-precision gemm extern in kiln would save per Linear.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

SHAPES = [(64, 32, 96), (256, 128, 384), (256, 128, 512), (512, 256, 1024), (512, 768, 768),
          (512, 768, 3072)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=25)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    print(f"| rows, in, out | eager {args.dtype} addmm us | float32 addmm of upcasts us | with the upcasts us "
          "| ratio |\n|---|---:|---:|---:|---:|")
    for m, k, n in SHAPES:
        x, w, b = torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype), torch.randn(n, dtype=dtype)
        x32, w32, b32 = x.float(), w.float(), b.float()
        variants = {"half": lambda: torch.addmm(b, x, w.t()),
                    "fp32": lambda: torch.addmm(b32, x32, w32.t()),
                    "fp32+casts": lambda: torch.addmm(b.float(), x.float(), w.float().t()).to(dtype)}
        times: dict[str, list[float]] = {name: [] for name in variants}
        for fn in variants.values():
            for _ in range(3):
                fn()
        for _ in range(args.reps):
            for name, fn in variants.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        med = {name: statistics.median(t) * 1e6 for name, t in times.items()}
        print(f"| {m}, {k}, {n} | {med['half']:.0f} | {med['fp32']:.0f} | {med['fp32+casts']:.0f} | "
              f"{med['fp32'] / med['half']:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
