"""A matrix product with one row (`x @ W.t()` at batch 1: a decode step's linears) as a kiln reduction.

At batch 1 each linear reads its weight once and does one multiply-add per element: it is a memory-bound
dot product per output. The BLAS's gemv read float32 weights at 17-23 GB/s on this machine (one thread,
weights out of cache, `python bench/bench_matvec.py`), kiln's vectorized row reduction at 35-40 GB/s,
near the copy bandwidth (bfloat16: oneDNN 13-16 GB/s, kiln 26-32); and as a kernel it takes its
neighbours (the bias add, an activation, the input's normalization) where an extern call would stand alone
between kernels.

`product(a, b)` is the box of the elementwise products `a[i, k] * b[k, j]` over [M, N, K] in float32, which
the lowering sums over K (and rounds once to a half type, as eager's library call does). Products with one
row and enough weight to matter take this path.
"""
from __future__ import annotations

from typing import Any

import torch

from .. import prims
from ..graph import Node
from .box import Box
from .sizes import is_static

# the smallest weight (K * N elements) a one-row product is a kernel for: below it the call is all overhead
MIN_WEIGHT = 4096


# float16 stays the library's: kiln's float16 loads convert bit by bit (no F16C), and its one-row kernel
# read at 9 GB/s where eager's call read at 24-26 (bfloat16: kiln 26-32 GB/s, eager 13-16; same values)
DTYPES = (torch.float32, torch.bfloat16)


def applies(node: Node) -> bool:
    """Whether `node` is an mm (float32 or bfloat16) with one row and a weight of at least MIN_WEIGHT
    elements."""
    if node.target is not prims.mm or node.meta.dtype not in DTYPES:
        return False
    a, b = node.args
    (m, k), (_, n) = a.meta.shape, b.meta.shape
    return is_static((m, k, n)) and m == 1 and k * n >= MIN_WEIGHT


def product(a: Box, b: Box) -> Box:
    """The float32 terms: half-precision operands widen first (eager's library multiplies and accumulates
    them in float32 and rounds the sum once, which the lowering does after the sum)."""
    m, k = a.shape
    n = b.shape[1]
    left, right = a.loader, b.loader
    wide = a.dtype != torch.float32

    def load(h: Any, index: list) -> Any:
        i, j, r = index
        x, w = left(h, [i, r]), right(h, [r, j])
        if wide:
            x, w = h.to_dtype(x, torch.float32), h.to_dtype(w, torch.float32)
        return h.op("mul", x, w)
    return Box((m, n, k), torch.float32, load)
