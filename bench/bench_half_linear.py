"""A biased Linear in bf16/fp16: eager's gemm, the float32 gemm kiln's decomposition used to run, and kiln's.

    python bench/bench_half_linear.py [--threads 1] [--reps 25] [--dtype bfloat16]

Until prims.addmm, kiln decomposed a half-precision `linear` with a bias as a float32 `mm` of the upcast
operands, the bias added in float32 and one rounding at the end, so its extern was a float32 gemm reading
twice the bytes; eager calls one half-precision addmm (oneDNN: AMX or AVX512-BF16 where the CPU has them),
and so does kiln now (kiln.ops.linalg.half_linear) for products of at least config half_addmm_min_macs
multiply-adds (8M: every shape here but the first, which keeps the float32 mm). Per shape (the zoo's
transformer Linears: rows = batch * tokens, in, out), interleaved medians (in a shuffled order each round)
in microseconds of: eager's `torch.addmm(b, x, w.t())` in the half dtype; the float32 addmm of the upcast
operands (the upcasts done beforehand, as kiln's kernels did); the same with the upcasts timed;
`kiln.compile(F.linear)` on the half-precision tensors (the whole compiled call: guards, wrapper, extern).
The ratios: float32 gemm / eager (what the old decomposition paid per Linear) and kiln / eager.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import kiln

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
    rng = random.Random(0)
    print(f"| rows, in, out | eager {args.dtype} addmm us | float32 addmm of upcasts us | "
          "with the upcasts us | kiln us | float32 / eager | kiln / eager |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for m, k, n in SHAPES:
        x, w, b = torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype), torch.randn(n, dtype=dtype)
        x32, w32, b32 = x.float(), w.float(), b.float()
        compiled = kiln.compile(lambda x, w, b: F.linear(x, w, b))
        variants = {"half": lambda: torch.addmm(b, x, w.t()),
                    "fp32": lambda: torch.addmm(b32, x32, w32.t()),
                    "fp32+casts": lambda: torch.addmm(b.float(), x.float(), w.float().t()).to(dtype),
                    "kiln": lambda: compiled(x, w, b)}
        times: dict[str, list[float]] = {name: [] for name in variants}
        for fn in variants.values():
            for _ in range(3):
                fn()
        order = list(variants.items())
        for _ in range(args.reps):
            rng.shuffle(order)  # each variant follows each other one as often (the caches they leave differ)
            for name, fn in order:
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        med = {name: statistics.median(t) * 1e6 for name, t in times.items()}
        print(f"| {m}, {k}, {n} | {med['half']:.0f} | {med['fp32']:.0f} | {med['fp32+casts']:.0f} | "
              f"{med['kiln']:.0f} | {med['fp32'] / med['half']:.2f}x | {med['kiln'] / med['half']:.2f}x |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
