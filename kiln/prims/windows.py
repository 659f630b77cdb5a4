"""Window prims: a convolution's input windows gathered into columns (im2col) and scattered back (col2im).

im2col(x, kernel, stride, padding, dilation)
    x [N, C, *S] -> cols [C, *K, N, *O]: cols[c, k.., b, o..] = x[b, c, o*stride + k*dilation - padding],
    0 where that position falls in the padding. K = kernel, O = the convolution's output sizes. Contiguous,
    so `reshape(cols, (C*prod(K), N*prod(O)))` is a view: the matrix a convolution multiplies its weight by.
col2im(cols, input_shape, kernel, stride, padding, dilation)
    the adjoint: cols [C, *K, N, *O] -> x-shaped [N, C, *S], each input position the sum of the columns
    entries that read it.

The two are each other's vjp, so a convolution written as im2col + mm (kiln.ops.conv_gemm) differentiates
into mm + col2im: one gather kernel forward, one summing kernel backward, both plain index arithmetic that
the loop IR vectorizes (kiln.lower.windows).
"""
from __future__ import annotations

import itertools
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from ..graph import TensorMeta
from .common_vjp import vjp
from .registry import check, is_tensor, meta_of, prim, shape_text


def output_sizes(sizes: Sequence[int], kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
                 dilation: Sequence[int]) -> list[int]:
    """A convolution's output sizes along the spatial dims."""
    return [(s + 2 * p - d * (k - 1) - 1) // st + 1
            for s, k, st, p, d in zip(sizes, kernel, stride, padding, dilation)]


def _check_window(name: str, n: int, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
                  dilation: Sequence[int]) -> None:
    lists = {"kernel": kernel, "stride": stride, "padding": padding, "dilation": dilation}
    for what, value in lists.items():
        check(len(value) == n and all(isinstance(v, int) for v in value),
              lambda what=what, value=value: f"prims.{name}: {what} must be {n} ints, got {value}", TypeError)
    check(all(k > 0 for k in kernel) and all(s > 0 for s in stride) and all(d > 0 for d in dilation)
          and all(p >= 0 for p in padding),
          lambda: f"prims.{name}: kernel, stride and dilation must be positive and padding non-negative, got "
                  f"{lists}")


def _im2col_meta(x: Any, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
                 dilation: Sequence[int]) -> TensorMeta:
    check(is_tensor(x), lambda: f"prims.im2col: expected a tensor, got {type(x).__name__}", TypeError)
    m = meta_of(x)
    n = len(kernel)
    check(m.ndim == n + 2, lambda: f"prims.im2col: expected a {n + 2}-d input, got {shape_text(x)}")
    _check_window("im2col", n, kernel, stride, padding, dilation)
    out = output_sizes(m.shape[2:], kernel, stride, padding, dilation)
    check(all(isinstance(o, int) and o > 0 for o in out),
          lambda: f"prims.im2col: no output positions for {shape_text(x)} and kernel {list(kernel)}")
    return TensorMeta((m.shape[1], *kernel, m.shape[0], *out), m.dtype, m.device)


def _windows(kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
             out: Sequence[int]) -> list[tuple[tuple, tuple]]:
    """(kernel offset, the index of padded x's window at that offset) for every offset."""
    result = []
    for offset in itertools.product(*(range(k) for k in kernel)):
        index = (slice(None), slice(None)) + tuple(
            slice(o * d, o * d + (m - 1) * s + 1, s) for o, d, m, s in zip(offset, dilation, out, stride))
        result.append((offset, index))
    return result


def _im2col_ref(x: torch.Tensor, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
                dilation: Sequence[int]) -> torch.Tensor:
    out = output_sizes(x.shape[2:], kernel, stride, padding, dilation)
    pads = [p for p in reversed(padding) for _ in range(2)]
    xp = F.pad(x, pads) if any(padding) else x
    cols = torch.empty((x.shape[1], *kernel, x.shape[0], *out), dtype=x.dtype, device=x.device)
    for offset, index in _windows(kernel, stride, dilation, out):
        cols[(slice(None),) + offset] = xp[index].transpose(0, 1)  # (C, N, *O)
    return cols


im2col = prim("im2col", _im2col_meta, _im2col_ref,
              doc="im2col(x, kernel, stride, padding, dilation): x [N, C, *S] -> [C, *K, N, *O], each "
                  "convolution window's elements (0 in the padding); contiguous.")


def _col2im_meta(cols: Any, input_shape: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
                 padding: Sequence[int], dilation: Sequence[int]) -> TensorMeta:
    check(is_tensor(cols), lambda: f"prims.col2im: expected a tensor, got {type(cols).__name__}", TypeError)
    m = meta_of(cols)
    n = len(kernel)
    _check_window("col2im", n, kernel, stride, padding, dilation)
    shape = tuple(input_shape)
    check(len(shape) == n + 2 and all(isinstance(s, int) for s in shape),
          lambda: f"prims.col2im: input_shape must be {n + 2} ints, got {input_shape}", TypeError)
    out = output_sizes(shape[2:], kernel, stride, padding, dilation)
    expected = (shape[1], *kernel, shape[0], *out)
    check(tuple(m.shape) == expected,
          lambda: f"prims.col2im: columns of {shape_text(cols)} do not match input {list(shape)} and kernel "
                  f"{list(kernel)} (expected {list(expected)})")
    return TensorMeta(shape, m.dtype, m.device)


def _col2im_ref(cols: torch.Tensor, input_shape: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
                padding: Sequence[int], dilation: Sequence[int]) -> torch.Tensor:
    shape = tuple(input_shape)
    out = output_sizes(shape[2:], kernel, stride, padding, dilation)
    padded = [s + 2 * p for s, p in zip(shape[2:], padding)]
    xp = torch.zeros((shape[0], shape[1], *padded), dtype=cols.dtype, device=cols.device)
    for offset, index in _windows(kernel, stride, dilation, out):
        xp[index] += cols[(slice(None),) + offset].transpose(0, 1)
    crop = (slice(None), slice(None)) + tuple(slice(p, p + s) for p, s in zip(padding, shape[2:]))
    return xp[crop].contiguous()


col2im = prim("col2im", _col2im_meta, _col2im_ref,
              doc="col2im(cols, input_shape, kernel, stride, padding, dilation): the adjoint of im2col, "
                  "[C, *K, N, *O] -> input_shape, summing the entries that read each position.")


@vjp(im2col)
def _im2col_vjp(grads: tuple, outputs: tuple, x: Any, kernel: Sequence[int], stride: Sequence[int],
                padding: Sequence[int], dilation: Sequence[int]) -> tuple:
    (g,) = grads
    grad = col2im(g, tuple(meta_of(x).shape), tuple(kernel), tuple(stride), tuple(padding), tuple(dilation))
    return (grad, None, None, None, None)


@vjp(col2im)
def _col2im_vjp(grads: tuple, outputs: tuple, cols: Any, input_shape: Sequence[int], kernel: Sequence[int],
                stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int]) -> tuple:
    (g,) = grads
    return (im2col(g, tuple(kernel), tuple(stride), tuple(padding), tuple(dilation)), None, None, None, None,
            None)
