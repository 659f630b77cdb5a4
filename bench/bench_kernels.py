"""Memory-bound kernels: eager vs torch.compile (Inductor, CPU) vs kiln's cpp backend, side by side.

    python bench/bench_kernels.py [--size 4096] [--reps 15] [--no-inductor] [--cases softmax,layer_norm]

Each case runs the three implementations interleaved (one call of each per round, `--reps` rounds) and
reports medians, the speedup over eager, kiln's ratio to torch.compile, and kiln's GB/s (bytes that must
move: inputs read once, outputs written once) against the copy bandwidth of a 256 MB tensor measured in
the same run. Compile times: kiln cold (empty disk cache) and warm (disk cache hit, in-memory caches
cleared), torch.compile cold (fresh cache directory, first call). The machine is shared: absolute times
are noise, ratios within one run are the figures.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import kiln.ops  # noqa: E402
from kiln import config  # noqa: E402
from kiln.backends.cpp import compile_graph  # noqa: E402
from kiln.runtime import forget_loaded  # noqa: E402


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def cases(n: int) -> dict:
    a, b = torch.randn(n, n), torch.randn(n, n)
    w, bias = torch.randn(n), torch.randn(n)
    mb = a.numel() * 4
    return {
        "pointwise chain": (lambda a, b: torch.tanh(a * b + 1) * a - b, (a, b), 3 * mb),
        "gelu(a*b+1).sum(-1)": (lambda a, b: F.gelu(a * b + 1).sum(-1), (a, b), 2 * mb),
        "softmax": (lambda a: torch.softmax(a, -1), (a,), 2 * mb),
        "layer_norm": (lambda a, w, bias: F.layer_norm(a, (n,), w, bias), (a, w, bias), 2 * mb),
        "RMSNorm": (rms_norm, (a, w), 2 * mb),
        "dropout+residual": (lambda a, b: F.dropout(a, 0.1, training=True) + b, (a, b), 3 * mb),
    }


class MLP(torch.nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Attention(torch.nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(torch.nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.attn, self.mlp = Attention(d, heads), MLP(d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def blocks() -> dict:
    torch.manual_seed(0)
    d, t = 256, 128
    result = {}
    for name, module in [("MLP block", MLP(d)), ("attention block", Attention(d, 4)),
                         ("transformer block", Block(d, 4))]:
        module.eval()
        for batch in (1, 16):
            x = torch.randn(batch, t, d)
            result[f"{name} b={batch}"] = (module, (x,), 0)
    return result


def timed(fn, inputs) -> float:
    start = time.perf_counter()
    fn(*inputs)
    return time.perf_counter() - start


def copy_bandwidth(reps: int) -> float:
    src = torch.randn(64 * 1024 * 1024)  # 256 MB
    dst = torch.empty_like(src)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return 2 * src.numel() * 4 / statistics.median(times) / 1e9


def kiln_compile(fn, inputs):
    graph = kiln.ops.trace(fn, *inputs)
    return compile_graph(graph, list(inputs))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--no-inductor", action="store_true")
    parser.add_argument("--cases", default=None)
    parser.add_argument("--no-blocks", action="store_true")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    bw = copy_bandwidth(args.reps)
    print(f"# threads={torch.get_num_threads()} size={args.size}x{args.size} float32, "
          f"copy bandwidth {bw:.1f} GB/s (256 MB tensor)")
    selected = cases(args.size)
    if not args.no_blocks:
        selected.update(blocks())
    if args.cases:
        wanted = args.cases.split(",")
        selected = {k: v for k, v in selected.items() if any(w in k for w in wanted)}
    print("| case | eager ms | inductor ms | kiln ms | kiln/eager speedup | kiln vs inductor | kiln GB/s "
          "| % copy BW | kernels (+extern calls) | kiln compile cold/warm s | inductor cold s |")
    print("|" + "---|" * 11, flush=True)
    torch.set_grad_enabled(False)
    ratios = []
    for name, (fn, inputs, nbytes) in selected.items():
        row = measure(fn, inputs, args)
        med, cold, warm, icold, kfn = row
        ind = med.get("inductor", float("nan"))
        vs = ind / med["kiln"]
        if vs == vs and nbytes:
            ratios.append(vs)
        gbs = nbytes / med["kiln"] / 1e9
        bw_text = f"{gbs:.1f} | {100 * gbs / bw:.0f}%" if nbytes else "- | -"
        print(f"| {name} | {med['eager'] * 1e3:.2f} | {ind * 1e3:.2f} | {med['kiln'] * 1e3:.2f} | "
              f"{med['eager'] / med['kiln']:.2f}x | {vs:.2f}x | {bw_text} | "
              f"{kfn.kernel_count} (+{len(kfn.externs)}) | {cold:.2f}/{warm:.2f} | {icold:.1f} |", flush=True)
    if ratios:
        print(f"# geomean kiln vs inductor over the memory-bound set: "
              f"{statistics.geometric_mean(ratios):.2f}x (>1: kiln faster)")


def measure(fn, inputs, args) -> tuple:
    """Compile with kiln (cold, then warm) and torch.compile, then time all interleaved."""
    with tempfile.TemporaryDirectory() as cache, config.patch(cache_dir=cache):
        start = time.perf_counter()
        kfn = kiln_compile(fn, inputs)
        kfn(*inputs)
        kiln_cold = time.perf_counter() - start
        forget_loaded()
        start = time.perf_counter()
        kfn = kiln_compile(fn, inputs)
        kfn(*inputs)
        kiln_warm = time.perf_counter() - start
    impls = {"eager": fn, "kiln": kfn}
    inductor_cold = float("nan")
    if not args.no_inductor:
        torch._dynamo.reset()
        with tempfile.TemporaryDirectory() as cache:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
            cfn = torch.compile(fn)
            start = time.perf_counter()
            cfn(*inputs)
            inductor_cold = time.perf_counter() - start
        impls["inductor"] = cfn
    times = {k: [] for k in impls}
    for _ in range(args.reps):
        for k, f in impls.items():
            times[k].append(timed(f, inputs))
    med = {k: statistics.median(v) for k, v in times.items()}
    return med, kiln_cold, kiln_warm, inductor_cold, kfn


if __name__ == "__main__":
    main()
