"""Small CPU convolutions: oneDNN's (the extern) against gather + matrix product (kiln.ops.conv_gemm).

    python bench/bench_conv.py [--threads N] [--reps 200] [--layout [--dtype bfloat16]]

For each shape (the zoo's CNNs: resnet_tiny, resnet18, mobilenet's ungrouped convolutions), a compiled
`relu(conv2d(x, w))`, forward alone under no_grad, and forward + backward with x and w requiring grad, each
compiled twice by the cpp backend: with `conv_gemm_max_macs=0` (oneDNN) and with no limit (gemm). Eager in
the same run for scale. Medians in microseconds, interleaved; the ratio oneDNN / gemm (> 1: gemm wins) is
what `conv_gemm_max_macs` (kiln/config.py) is set from.

`--layout`: oneDNN's 3x3 convolution (torch's, eager) over the zoo's resnet18 stage shapes at batch 1 and 8,
NCHW against NHWC input with the weight as it is (torch converts it per call) and with an NHWC weight, and
the weight's conversion alone; what kiln.lower.conv_layout's NHWC_MIN_PIXELS is set from. `--dtype
bfloat16` (or float16): the same in half precision, where every convolution runs NHWC (HALF_DTYPES).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, __file__.rsplit("/", 2)[0])

import kiln  # noqa: E402
from kiln import config  # noqa: E402

# (N, C, H, O, kernel, stride)
SHAPES = [(4, 3, 16, 8, 3, 1), (4, 8, 16, 8, 3, 1), (4, 8, 16, 16, 3, 2), (4, 16, 8, 16, 3, 1),
          (4, 8, 16, 16, 1, 2), (8, 3, 32, 16, 3, 1), (8, 16, 32, 32, 1, 2), (8, 16, 32, 16, 1, 1),
          (8, 64, 8, 128, 1, 1), (8, 16, 32, 32, 3, 2), (8, 64, 16, 24, 1, 1), (8, 16, 32, 16, 3, 1)]


def median_us(fn, reps: int) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


# (C, H, O, stride): the zoo's resnet18 stages (32x32 images)
LAYOUT_SHAPES = [(16, 32, 16, 1), (16, 32, 32, 2), (32, 16, 32, 1), (32, 16, 64, 2), (64, 8, 64, 1),
                 (64, 8, 128, 2), (128, 4, 128, 1)]


def layout_table(reps: int, dtype: torch.dtype = torch.float32) -> None:
    cl = torch.channels_last
    print("| N, C, H, O, s | out pixels | NCHW us | NHWC input us | NHWC input + weight us | weight to NHWC us "
          "|\n|---|---:|---:|---:|---:|---:|")
    for n in (1, 8):
        for c, h, o, s in LAYOUT_SHAPES:
            x, w = torch.randn(n, c, h, h, dtype=dtype), torch.randn(o, c, 3, 3, dtype=dtype)
            xl, wl = x.contiguous(memory_format=cl), w.contiguous(memory_format=cl)
            times = [median_us(lambda a=a, b=b: F.conv2d(a, b, None, s, 1), reps)
                     for a, b in ((x, w), (xl, w), (xl, wl))]
            times.append(median_us(lambda: w.contiguous(memory_format=cl), reps))
            pixels = n * ((h + 2 - 3) // s + 1) ** 2
            print(f"| {n}, {c}, {h}, {o}, {s} | {pixels} | " + " | ".join(f"{t:.1f}" for t in times) + " |",
                  flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--layout", action="store_true", help="NCHW against NHWC (see the module doc)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                        help="with --layout: the convolutions' dtype")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.layout:
        layout_table(args.reps, getattr(torch, args.dtype))
        return 0
    print(f"| N, C, H, O, k, s | MACs | eager fwd | oneDNN fwd | gemm fwd | ratio | eager f+b | oneDNN f+b | "
          f"gemm f+b | ratio |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, c, h, o, k, s in SHAPES:
        x = torch.randn(n, c, h, h)
        w = torch.randn(o, c, k, k)
        pad = k // 2
        out = (h + 2 * pad - k) // s + 1
        macs = n * o * out * out * c * k * k
        row = []
        for grad in (False, True):
            xs, ws = x.clone().requires_grad_(grad), w.clone().requires_grad_(grad)
            kiln.reset()
            fns = {"eager": lambda *a: F.relu(F.conv2d(a[0], a[1], None, a[2], a[3]))}
            with config.patch(conv_gemm_max_macs=0):
                fns["onednn"] = kiln.compile(lambda x, w, s, p: F.relu(F.conv2d(x, w, None, s, p)), dynamic=False)
                fns["onednn"](xs, ws, s, pad)
            with config.patch(conv_gemm_max_macs=1 << 40, conv_gemm_max_bytes=1 << 40):
                fns["gemm"] = kiln.compile(lambda x, w, s, p: F.relu(F.conv2d(x, w, None, s, p)), dynamic=False)
                fns["gemm"](xs, ws, s, pad)

            def run(fn):
                if grad:
                    return lambda: fn(xs, ws, s, pad).sum().backward()
                return lambda: fn(xs, ws, s, pad)
            ctx = torch.enable_grad() if grad else torch.no_grad()
            with ctx:
                times = {name: median_us(run(fn), args.reps) for name, fn in fns.items()}
            row += [times["eager"], times["onednn"], times["gemm"], times["onednn"] / times["gemm"]]
        cells = " | ".join(f"{v:.0f}" if i % 4 != 3 else f"{v:.2f}" for i, v in enumerate(row))
        print(f"| {n}, {c}, {h}, {o}, {k}, {s} | {macs / 1e6:.2f}M | {cells} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
