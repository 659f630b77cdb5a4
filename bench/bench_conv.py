"""Small CPU convolutions: oneDNN's (the extern) against gather + matrix product (kiln.ops.conv_gemm).

    python bench/bench_conv.py [--threads N] [--reps 200]

For each shape (the zoo's CNNs: resnet_tiny, resnet18, mobilenet's ungrouped convolutions), a compiled
`relu(conv2d(x, w))`, forward alone under no_grad, and forward + backward with x and w requiring grad, each
compiled twice by the cpp backend: with `conv_gemm_max_macs=0` (oneDNN) and with no limit (gemm). Eager in
the same run for scale. Medians in microseconds, interleaved; the ratio oneDNN / gemm (> 1: gemm wins) is
what `conv_gemm_max_macs` (kiln/config.py) is set from.
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
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
