"""Lowerings of the window prims (kiln.prims.windows): index arithmetic, no copies beyond the result.

im2col's element [c, k.., b, o..] loads x[b, c, o*stride + k*dilation - padding] (masked to 0 in the
padding); its innermost loop runs along the last output dim, so a stride-1 convolution's gather reads x
contiguously. col2im's element sums, over every kernel offset, the column entry that read it: the offset
reaches it when its position less the offset is a multiple of the stride inside the output range.
"""
from __future__ import annotations

import itertools
from typing import Any, Sequence

import sympy
import torch

from .index import FloorDiv, ModularIndexing


def _inside(h: Any, expr: Any, low: int, high: int) -> Any:
    """low <= expr <= high, as a bool value of the kernel."""
    pos = h.index_expr(expr, torch.int64)
    return h.op("logical_and", h.op("ge", pos, h.constant(low, torch.int64)),
                h.op("le", pos, h.constant(high, torch.int64)))


def _all(h: Any, conds: list) -> Any:
    result = None
    for c in conds:
        result = c if result is None else h.op("logical_and", result, c)
    return result


def im2col_loader(x_shape: Sequence[Any], x_loader: Any, dtype: torch.dtype, kernel: Sequence[int],
                  stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int]) -> Any:
    """loader(h, index) of im2col's result, from its input's shape and loader."""
    n = len(kernel)
    sizes = [int(s) for s in x_shape[2:]]

    def load(h: Any, index: list) -> Any:
        c, ks, b, os_ = index[0], index[1:1 + n], index[1 + n], index[2 + n:]
        pos = [o * s + k * d - p for o, k, s, d, p in zip(os_, ks, stride, dilation, padding)]
        conds = [_inside(h, e, 0, size - 1) for e, p, size in zip(pos, padding, sizes) if p > 0]
        if not conds:
            return x_loader(h, [b, c, *pos])
        return h.masked(_all(h, conds), lambda: x_loader(h, [b, c, *pos]),
                        lambda: h.constant(0, dtype), dtype)
    return load


def col2im_loader(cols_shape: Sequence[Any], cols_loader: Any, dtype: torch.dtype, kernel: Sequence[int],
                  stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int]) -> Any:
    """loader(h, index) of col2im's result, from its columns' shape and loader."""
    n = len(kernel)
    out = [int(s) for s in cols_shape[2 + n:]]

    def load(h: Any, index: list) -> Any:
        b, c, xs = index[0], index[1], index[2:]
        total = None
        for ks in itertools.product(*(range(k) for k in kernel)):
            # t = x + padding - k*dilation is o*stride for the output position o that read x at offset k
            ts = [x + p - k * d for x, p, k, d in zip(xs, padding, ks, dilation)]
            conds, os_ = [], []
            for t, s, m, k, d in zip(ts, stride, out, ks, dilation):
                if s == 1:
                    conds.append(_inside(h, t, 0, m - 1))
                    os_.append(t)
                    continue
                shift = s * -(-(k * d) // s)  # a multiple of s that keeps t + shift non-negative
                conds.append(_inside(h, t, 0, (m - 1) * s))
                rem = h.index_expr(ModularIndexing(t + shift, sympy.Integer(s)), torch.int64)
                conds.append(h.op("eq", rem, h.constant(0, torch.int64)))
                os_.append(FloorDiv(t + shift, sympy.Integer(s)) - shift // s)
            term = h.masked(_all(h, conds), lambda ks=ks, os_=os_: cols_loader(h, [c, *ks, b, *os_]),
                            lambda: h.constant(0, dtype), dtype)
            total = term if total is None else h.op("add", total, term)
        return total
    return load
