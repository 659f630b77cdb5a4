"""A matrix product with one row (`x @ W.t()` at batch 1: a decode step's linears) as a kiln reduction.

At batch 1 each linear reads its weight once and does one multiply-add per element: it is a memory-bound
dot product per output. The BLAS's gemv read the weights at 17-21 GB/s on this machine (one thread,
weights out of cache, `python bench/bench_matvec.py`), kiln's vectorized row reduction at 34-38 GB/s, near
the copy bandwidth; and as a kernel it takes its neighbours (the bias add, an activation, the input's
normalization) where an extern call would stand alone between kernels.

`product(a, b)` is the box of the elementwise products `a[i, k] * b[k, j]` over [M, N, K], which the
lowering sums over K. Only float32 products (a half-precision product would round each term; eager's
library call does not) with one row and enough weight to matter take this path.
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


def applies(node: Node) -> bool:
    """Whether `node` is a float32 mm with one row and a weight of at least MIN_WEIGHT elements."""
    if node.target is not prims.mm or node.meta.dtype != torch.float32:
        return False
    a, b = node.args
    (m, k), (_, n) = a.meta.shape, b.meta.shape
    return is_static((m, k, n)) and m == 1 and k * n >= MIN_WEIGHT


def product(a: Box, b: Box) -> Box:
    m, k = a.shape
    n = b.shape[1]
    left, right = a.loader, b.loader

    def load(h: Any, index: list) -> Any:
        i, j, r = index
        return h.op("mul", left(h, [i, r]), right(h, [r, j]))
    return Box((m, n, k), a.dtype, load)
