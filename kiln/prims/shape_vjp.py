"""Reverse-mode derivatives (vjp rules) of the shape and view prims: each gradient is the inverse movement of
the incoming gradient — summed over broadcast dims, reshaped, permuted back, placed into zeros where the
prim selected part of its input (slice, diagonal, as_strided), summed where windows overlap (unfold).
"""
from __future__ import annotations

import builtins
from typing import Any, Sequence

import torch

from . import creation
from . import elementwise as ew
from . import indexing, reductions
from .common_vjp import inverse_permutation, no_gradient, positions, reshape, vjp, zeros, zeros_like
from .registry import meta_of
from .shape import (as_strided, broadcast_in_dim, cat, clone, diagonal, expand_dims, pad, permute, rev,
                    slice, squeeze, stop_gradient, unfold, view)
from ..graph.layout import is_non_overlapping, numel, storage_size


@vjp(broadcast_in_dim)
def _broadcast_in_dim_vjp(grads: tuple, outputs: tuple, a: Any, shape: Sequence[Any],
                          broadcast_dimensions: Sequence[int]) -> tuple:
    (g,) = grads
    m = meta_of(a)
    shape = tuple(shape)
    dims = tuple(broadcast_dimensions)
    expanded = [i for i, d in enumerate(dims) if m.shape[i] == 1 and shape[d] != 1]
    summed = sorted(set(d for d in range(len(shape)) if d not in dims) | {dims[i] for i in expanded})
    if not summed:
        return (reshape(g, m.shape), None, None)
    grad = reductions.sum(g, tuple(summed))  # a's dims, less the size-1 dims that were expanded
    if expanded:
        grad = expand_dims(grad, tuple(expanded))
    return (grad, None, None)


@vjp(view)
def _view_vjp(grads: tuple, outputs: tuple, a: Any, shape: Sequence[Any]) -> tuple:
    (g,) = grads
    return (reshape(g, meta_of(a).shape), None)


@vjp(permute)
def _permute_vjp(grads: tuple, outputs: tuple, a: Any, dims: Sequence[int]) -> tuple:
    (g,) = grads
    return (permute(g, inverse_permutation(tuple(dims))), None)


@vjp(squeeze)
def _squeeze_vjp(grads: tuple, outputs: tuple, a: Any, dims: Sequence[int]) -> tuple:
    (g,) = grads
    return (expand_dims(g, tuple(dims)) if dims else g, None)


@vjp(expand_dims)
def _expand_dims_vjp(grads: tuple, outputs: tuple, a: Any, dims: Sequence[int]) -> tuple:
    (g,) = grads
    return (squeeze(g, tuple(dims)) if dims else g, None)


@vjp(as_strided)
def _as_strided_vjp(grads: tuple, outputs: tuple, a: Any, shape: Sequence[Any], strides: Sequence[Any],
                    storage_offset: Any) -> tuple:
    """Scatter-add the gradient into a flat copy of the storage (overlapping output elements add up), then
    read each element of `a` at its storage position."""
    (g,) = grads
    m = meta_of(a)
    if not is_non_overlapping(m.shape, m.strides):
        raise NotImplementedError(f"prims.as_strided: no derivative for an input whose elements share memory "
                                  f"(sizes {list(m.shape)}, strides {list(m.strides)})")
    shape, strides = tuple(shape), tuple(strides)
    if numel(shape) == 0 or m.numel() == 0:
        return (zeros_like(a), None, None, None)
    size = builtins.max(storage_size(m.shape, m.strides, m.storage_offset),
                        storage_size(shape, strides, storage_offset))
    flat_g = reshape(g, (numel(shape),))
    written = reshape(positions(shape, strides, storage_offset, m.device), (numel(shape),))
    storage = indexing.scatter_add(zeros((size,), m.dtype, m.device), 0, written, flat_g)
    read = reshape(positions(m.shape, m.strides, m.storage_offset, m.device), (m.numel(),))
    grad = reshape(indexing.gather(storage, 0, read), m.shape)
    return (grad, None, None, None)


@vjp(diagonal)
def _diagonal_vjp(grads: tuple, outputs: tuple, a: Any, offset: int = 0, dim1: int = 0,
                  dim2: int = 1) -> tuple:
    """The gradient written on the diagonal of zeros: index_put on zeros with (dim1, dim2) moved last."""
    (g,) = grads
    m = meta_of(a)
    length = meta_of(g).shape[-1]
    if length == 0:
        return (zeros_like(a), None, None, None)
    others = [d for d in range(m.ndim) if d not in (dim1, dim2)]
    order = others + [dim1, dim2]
    base = zeros([m.shape[d] for d in order], m.dtype, m.device)
    rows = creation.iota(length, builtins.max(-offset, 0), 1, torch.int64, m.device)
    cols = creation.iota(length, builtins.max(offset, 0), 1, torch.int64, m.device)
    placed = indexing.index_put(base, [None] * len(others) + [rows, cols], g, False)
    return (permute(placed, inverse_permutation(order)), None, None, None)


@vjp(unfold)
def _unfold_vjp(grads: tuple, outputs: tuple, a: Any, dim: int, size: int, step: int) -> tuple:
    """Each window's gradient added back at the positions it covers (windows may overlap)."""
    (g,) = grads
    m = meta_of(a)
    if m.ndim == 0:  # the windows of a 0-d tensor are [a] or []
        return (reductions.sum(g, (0,)), None, None, None)
    windows = meta_of(g).shape[dim]
    if windows * size == 0:
        return (zeros_like(a), None, None, None)
    # window w's element j sits at w * step + j along dim: put the window axis beside dim and flatten both
    order = list(range(dim + 1)) + [m.ndim] + list(range(dim + 1, m.ndim))
    flat_shape = tuple(m.shape[:dim]) + (windows * size,) + tuple(m.shape[dim + 1:])
    flat_g = reshape(permute(g, order), flat_shape)
    starts = creation.iota(windows, 0, step, torch.int64, m.device)
    within = creation.iota(size, 0, 1, torch.int64, m.device)
    covered = ew.add(broadcast_in_dim(starts, (windows, size), (0,)),
                     broadcast_in_dim(within, (windows, size), (1,)))
    covered = reshape(covered, (windows * size,))
    grad = indexing.index_put(zeros_like(a), [None] * dim + [covered], flat_g, True)
    return (grad, None, None, None)


@vjp(rev)
def _rev_vjp(grads: tuple, outputs: tuple, a: Any, dims: Sequence[int]) -> tuple:
    (g,) = grads
    return (rev(g, tuple(dims)), None)


@vjp(cat)
def _cat_vjp(grads: tuple, outputs: tuple, tensors: Sequence[Any], dim: int) -> tuple:
    (g,) = grads
    gm = meta_of(g)
    pieces = []
    start: Any = 0
    for t in tensors:
        length = meta_of(t).shape[dim]
        starts = [0] * gm.ndim
        limits = list(gm.shape)
        starts[dim], limits[dim] = start, start + length
        pieces.append(slice(g, starts, limits))
        start = start + length
    return (pieces, None)


@vjp(pad)
def _pad_vjp(grads: tuple, outputs: tuple, a: Any, padding_value: Any,
             padding_config: Sequence[Sequence[int]]) -> tuple:
    """Undo the low/high padding (a slice; where the forward cropped, zeros pad back), then take every
    (interior + 1)-th element."""
    (g,) = grads
    m = meta_of(a)
    config = [tuple(c) for c in padding_config]
    grown = [s + builtins.max(s - 1, 0) * c[2] for s, c in zip(m.shape, config)]
    if any(lo < 0 or hi < 0 for lo, hi, _ in config):
        g = pad(g, 0, [(-lo, -hi, 0) for lo, hi, _ in config])
        starts = [0] * m.ndim
    else:
        starts = [lo for lo, _, _ in config]
    limits = [s + n for s, n in zip(starts, grown)]
    steps = [c[2] + 1 for c in config]
    return (slice(g, starts, limits, steps), None, None)


@vjp(clone)
def _clone_vjp(grads: tuple, outputs: tuple, a: Any,
               memory_format: torch.memory_format = torch.contiguous_format) -> tuple:
    (g,) = grads
    return (g, None)


@vjp(slice)
def _slice_vjp(grads: tuple, outputs: tuple, a: Any, start_indices: Sequence[Any],
               limit_indices: Sequence[Any], strides: Sequence[Any] | None = None) -> tuple:
    """The gradient padded with zeros back to a's shape. A stepped dim is spread first without interior
    padding (which kiln's lowering leaves to torch): each element followed by step - 1 zeros, as a new dim
    padded at its end and merged into the old one."""
    (g,) = grads
    m = meta_of(a)
    steps = tuple(strides) if strides is not None else (1,) * m.ndim
    config = []
    for d, (size, lo, step) in enumerate(zip(m.shape, start_indices, steps)):
        count = meta_of(g).shape[d]
        if step > 1 and count > 0:
            spread = [(0, 0, 0)] * (m.ndim + 1)
            spread[d + 1] = (0, step - 1, 0)
            g = pad(expand_dims(g, (d + 1,)), 0, spread)
            merged = list(meta_of(g).shape)
            merged[d:d + 2] = [count * step]
            g = reshape(g, merged)
            count = count * step
        config.append((lo, size - lo - count, 0))  # a negative high end crops the last zeros
    return (pad(g, 0, config), None, None, None)


no_gradient(stop_gradient)
