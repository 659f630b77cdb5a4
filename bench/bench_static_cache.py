"""The static KV cache update of a 12-layer decoder, per token: keys and values (1, 12, L, 64) float32 per layer,
`index_copy_` of one position (HF StaticCache.update), compiled by kiln with the scatter fallback run in place
(the default) and with `cpp_in_place` off (torch.scatter into a new cache, then the write-back copy), in turns,
one thread. Median [min..max] ms per token.

    python bench/bench_static_cache.py [--lengths 136,2048] [--repeat 30]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import kiln


def update(keys, values, pos, k, v):
    outs = []
    for K, V in zip(keys, values):
        K.index_copy_(2, pos, k)
        V.index_copy_(2, pos, v)
        outs.append(K[:, :, 0, 0] + V[:, :, 0, 0])
    return outs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="136,2048")
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for length in (int(x) for x in args.lengths.split(",")):
        keys = [torch.zeros(1, 12, length, 64) for _ in range(12)]
        values = [torch.zeros(1, 12, length, 64) for _ in range(12)]
        k, v = torch.randn(1, 12, 1, 64), torch.randn(1, 12, 1, 64)
        variants = {"in place": kiln.compile(update, backend="cpp"),
                    "scatter + write-back": kiln.compile(update, backend="cpp", options={"cpp_in_place": False})}
        times: dict[str, list[float]] = {name: [] for name in variants}
        for fn in variants.values():
            fn(keys, values, torch.tensor([0]), k, v)
        for r in range(args.repeat):
            for name, fn in variants.items():
                pos = torch.tensor([r % length])
                start = time.perf_counter()
                fn(keys, values, pos, k, v)
                times[name].append(time.perf_counter() - start)
        for name, t in times.items():
            print(f"L={length} {name}: {statistics.median(t) * 1e3:.3f} ms "
                  f"[{min(t) * 1e3:.3f}..{max(t) * 1e3:.3f}] per token "
                  f"(24 caches of {12 * length * 64 * 4 / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
