"""One-row float32 products (a linear at batch 1, a decode step's matrix-vector products): eager's library
gemv, torch.compile and kiln's reduction kernel (kiln/lower/matvec.py), per shape, with the weights out of
cache as in a decode step (enough weights cycled to fill ~400 MB, each call on the next one).

Per shape: microseconds per call (the minimum over the repeats, and the median) and the weight bytes read
per second, and kiln's speedup over eager and over torch.compile. The copy bandwidth measured in the same
run is the roof.

    python bench/bench_matvec.py [--threads 1] [--repeat 5] [--no-torch-compile]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import kiln

SHAPES = [(256, 256), (768, 768), (768, 2048), (2048, 768), (768, 32000)]  # (K, N): x [1, K], W [N, K]


def _time(fn, x, weights, repeat):
    for w in weights:
        fn(x, w)
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        for w in weights:
            fn(x, w)
        runs.append((time.perf_counter() - start) / len(weights))
    return min(runs), statistics.median(runs)


def _copy_gbs(repeat):
    src = torch.empty(100_000_000 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = min(_once(lambda: dst.copy_(src)) for _ in range(repeat))
    return 2 * src.numel() * 4 / best / 1e9


def _once(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-torch-compile", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    compilers = {"eager": F.linear, "kiln": kiln.compile(lambda x, w: F.linear(x, w))}
    if not args.no_torch_compile:
        compilers["torch.compile"] = torch.compile(lambda x, w: F.linear(x, w), dynamic=False)
    print(f"threads {args.threads}, copy {_copy_gbs(args.repeat):.1f} GB/s (read + write)")
    header = f"{'K x N':>12}  " + "  ".join(f"{name:>24}" for name in compilers) + "   kiln x eager  kiln x tc"
    print(header)
    for k, n in SHAPES:
        count = max(4, int(400e6 / (k * n * 4)))
        x = torch.randn(1, k)
        weights = [torch.randn(n, k) for _ in range(count)]
        want = F.linear(x, weights[0])
        cells, best = [], {}
        for name, fn in compilers.items():
            torch.testing.assert_close(fn(x, weights[0]), want, rtol=1e-4, atol=1e-4)
            low, mid = _time(fn, x, weights, args.repeat)
            best[name] = low
            cells.append(f"{low * 1e6:8.1f} us ({k * n * 4 / low / 1e9:5.1f} GB/s)")
        tc = f"{best['torch.compile'] / best['kiln']:9.2f}x" if "torch.compile" in best else "        -"
        print(f"{f'{k} x {n}':>12}  " + "  ".join(f"{c:>24}" for c in cells) +
              f"   {best['eager'] / best['kiln']:11.2f}x  {tc}")


if __name__ == "__main__":
    main()
