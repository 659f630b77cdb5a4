"""Shape and view prims. View prims' meta rules give exact strides (they alias their input).

broadcast_in_dim(a, shape, broadcast_dimensions): a view of `a` with the given shape, where input dim i
    becomes output dim broadcast_dimensions[i] (size equal or 1 → stride 0); other output dims have stride 0.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from ..graph import TensorMeta
from .registry import check, is_tensor, meta_of, prim, shape_text


def _broadcast_in_dim_meta(a: Any, shape: Sequence[int], broadcast_dimensions: Sequence[int]) -> TensorMeta:
    check(is_tensor(a), lambda: "prims.broadcast_in_dim: expected a tensor", TypeError)
    m = meta_of(a)
    shape = tuple(shape)
    dims = tuple(broadcast_dimensions)
    check(len(dims) == m.ndim, lambda: f"prims.broadcast_in_dim: {m.ndim}-d input {shape_text(a)} needs "
          f"{m.ndim} broadcast dimensions, got {dims}")
    check(all(0 <= d < len(shape) for d in dims) and list(dims) == sorted(set(dims)),
          lambda: f"prims.broadcast_in_dim: broadcast dimensions {dims} must be increasing and within the "
                  f"{len(shape)}-d output")
    strides: list[Any] = [0] * len(shape)
    for i, d in enumerate(dims):
        check(m.shape[i] == shape[d] or m.shape[i] == 1, lambda: f"prims.broadcast_in_dim: input dim {i} of "
              f"size {m.shape[i]} cannot broadcast to size {shape[d]} (input {shape_text(a)}, shape {shape})")
        # as torch.expand: a dim that keeps its size keeps its stride; a broadcast dim gets stride 0
        strides[d] = m.strides[i] if m.shape[i] == shape[d] else 0
    return TensorMeta(shape, m.dtype, m.device, tuple(strides))


def _broadcast_in_dim_ref(a: torch.Tensor, shape: Sequence[int],
                          broadcast_dimensions: Sequence[int]) -> torch.Tensor:
    view_shape = [1] * len(shape)
    view_strides = [0] * len(shape)
    for i, d in enumerate(broadcast_dimensions):
        view_shape[d] = a.shape[i]
        view_strides[d] = a.stride(i)
    expanded = a.as_strided(view_shape, view_strides, a.storage_offset())
    return expanded.expand(tuple(shape))


broadcast_in_dim = prim("broadcast_in_dim", _broadcast_in_dim_meta, _broadcast_in_dim_ref, tags=("view",))
