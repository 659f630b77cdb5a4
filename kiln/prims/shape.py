"""Shape and view prims. View prims' meta rules give eager's exact strides and storage offsets (they alias
their input, as eager).

Views (tag "view"):
  broadcast_in_dim(a, shape, broadcast_dimensions)  input dim i becomes output dim broadcast_dimensions[i]
      (size equal or 1 → stride 0); other output dims have stride 0
  view(a, shape)                    same numel, strides by eager's view rule; refuses a non-viewable shape
  permute(a, dims)                  output dim i is input dim dims[i]
  squeeze(a, dims)                  removes size-1 dims;  expand_dims(a, dims) inserts them
  slice(a, start_indices, limit_indices, strides)   per-dim [start:limit:stride]
  diagonal(a, offset, dim1, dim2)   the diagonal as the last dim
  as_strided(a, shape, strides, storage_offset)
  unfold(a, dim, size, step)        sliding windows as a new last dim
Copies (contiguous unless a memory format says otherwise):
  rev(a, dims), cat(tensors, dim), pad(a, value, config) with (low, high, interior) per dim,
  clone(a, memory_format)
Identity: stop_gradient(a), a's value through which no gradient flows (the maximum softmax subtracts)
"""
from __future__ import annotations

import builtins
import dataclasses
import operator
from typing import Any, Sequence

from ..graph.lazy import is_expr, sympy
import torch

from ..graph.symbolic import SymInt, any_holds, broadcastable, has_symbols, same_sizes, surely_one
from ..graph import TensorMeta
# (kiln.ops imports the layout rules it needs from here too)
from ..graph.layout import (contiguous_strides, is_non_overlapping_and_dense, numel,
                            preserve_strides, strides_in_order)
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
    for i, d in enumerate(dims):
        check(broadcastable(m.shape[i], shape[d]), lambda: f"prims.broadcast_in_dim: input dim {i} of "
              f"size {m.shape[i]} cannot broadcast to size {shape[d]} (input {shape_text(a)}, shape {shape})")
    return TensorMeta(shape, m.dtype, m.device, _broadcast_strides(m, shape, dims),
                      storage_offset=m.storage_offset)


def _broadcast_strides(m: TensorMeta, shape: tuple, dims: tuple) -> tuple:
    """Eager expand's strides: a dim that keeps its size keeps its stride, a broadcast dim gets 0, and a new
    size-1 dim gets the stride it would have if contiguous with the next output dim."""
    source = {d: i for i, d in enumerate(dims)}
    strides: list[Any] = [0] * len(shape)
    for d in range(len(shape) - 1, -1, -1):
        # (a size that may be 1 is not asked about: a size-1 dim's stride is never used for an address)
        if d in source:
            i = source[d]
            if same_sizes((m.shape[i],), (shape[d],)):
                strides[d] = m.strides[i]
            elif type(m.shape[i]) is int and m.shape[i] == 1:
                strides[d] = 0
            else:
                strides[d] = m.strides[i] if m.shape[i] == shape[d] else 0
        elif d + 1 < len(shape) and surely_one(shape[d]):
            strides[d] = shape[d + 1] * strides[d + 1]
    return tuple(strides)


def _broadcast_in_dim_ref(a: torch.Tensor, shape: Sequence[int],
                          broadcast_dimensions: Sequence[int]) -> torch.Tensor:
    strides = _broadcast_strides(TensorMeta.of(a), tuple(shape), tuple(broadcast_dimensions))
    return a.as_strided(tuple(shape), strides, a.storage_offset())


broadcast_in_dim = prim("broadcast_in_dim", _broadcast_in_dim_meta, _broadcast_in_dim_ref, tags=("view",))


# ---- helpers --------------------------------------------------------------------------------------------

def _tensor_meta(op: str, a: Any) -> TensorMeta:
    check(is_tensor(a), lambda: f"prims.{op}: expected a tensor, got {type(a).__name__}", TypeError)
    return meta_of(a)


def _int_tuple(op: str, what: str, values: Any) -> tuple:
    check(isinstance(values, (tuple, list, torch.Size)),
          lambda: f"prims.{op}: {what} must be a tuple of ints, got {type(values).__name__}", TypeError)
    values = tuple(values)
    for v in values:
        check(not isinstance(v, bool) and (isinstance(v, (int, SymInt)) or is_expr(v)),
              lambda: f"prims.{op}: {what} must be ints, got {values}", TypeError)
    return values


def view_strides(shape: Sequence[Any], strides: Sequence[Any], new_shape: Sequence[Any]) -> tuple | None:
    """The strides of `new_shape` viewing a tensor of (shape, strides), or None when no view exists.

    The same chunk walk as eager's view (ATen's computeStride), so the strides are eager's exactly.
    """
    shape, strides, new_shape = tuple(shape), tuple(strides), tuple(new_shape)
    if not shape:
        return (1,) * len(new_shape)
    if has_symbols(shape) and same_sizes(shape, new_shape) and 1 not in [d for d in shape if type(d) is int]:
        return strides  # the walk's answer, without asking whether a size that may be 1 is 1
    total = numel(shape)
    if total == 0 and shape == new_shape:
        return strides
    result: list[Any] = [0] * len(new_shape)
    if total == 0:
        for d in range(len(new_shape) - 1, -1, -1):
            result[d] = 1 if d == len(new_shape) - 1 else builtins.max(new_shape[d + 1], 1) * result[d + 1]
        return tuple(result)
    view_d = len(new_shape) - 1
    chunk_base_stride = strides[-1]
    tensor_numel: Any = 1
    view_numel: Any = 1
    for tensor_d in range(len(shape) - 1, -1, -1):
        tensor_numel = tensor_numel * shape[tensor_d]
        # (the stride first: on a contiguous layout it is decided by its spelling, and a size that may
        # be 1 is not asked about; the size-1 test of the chunk walk is one question with the count's)
        if tensor_d == 0 or (strides[tensor_d - 1] != tensor_numel * chunk_base_stride
                             and shape[tensor_d - 1] != 1):
            while view_d >= 0 and any_holds((operator.lt, view_numel, tensor_numel),
                                            (operator.eq, new_shape[view_d], 1)):
                result[view_d] = view_numel * chunk_base_stride
                view_numel = view_numel * new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_base_stride = strides[tensor_d - 1]
                tensor_numel = 1
                view_numel = 1
    if view_d != -1:
        return None
    return tuple(result)


def memory_format_strides(shape: Sequence[Any], memory_format: torch.memory_format, op: str) -> tuple:
    """Strides of a fresh tensor of `shape` in a (non-preserve) memory format."""
    if memory_format == torch.contiguous_format:
        return contiguous_strides(shape)
    if memory_format in (torch.channels_last, torch.channels_last_3d):
        rank = 4 if memory_format == torch.channels_last else 5
        check(len(shape) == rank, lambda: f"{op}: required rank {rank} tensor to use {memory_format} "
              f"format, got shape {list(shape)}")
        return strides_in_order(shape, [1] + list(range(rank - 1, 1, -1)) + [0])  # C, W, H, (D), N
    raise RuntimeError(f"{op}: unsupported memory format {memory_format}")


# ---- view ----------------------------------------------------------------------------------------------

def _view_meta(a: Any, shape: Sequence[Any]) -> TensorMeta:
    m = _tensor_meta("view", a)
    shape = _int_tuple("view", "shape", shape)
    check(all(s >= 0 for s in shape), lambda: f"prims.view: invalid shape {list(shape)}")
    check(numel(shape) == m.numel(), lambda: f"shape '[{', '.join(map(str, shape))}]' is invalid for input "
          f"of size {m.numel()}")
    strides = view_strides(m.shape, m.strides, shape)
    check(strides is not None, lambda: "view size is not compatible with input tensor's size and stride (at "
          "least one dimension spans across two contiguous subspaces). Use .reshape(...) instead.")
    return TensorMeta(shape, m.dtype, m.device, strides, storage_offset=m.storage_offset)


view = prim("view", _view_meta, lambda a, shape: a.view(tuple(shape)), tags=("view",),
            doc="view(a, shape): `a` with a new shape of the same numel, sharing memory (eager's view "
                "rules).")


# ---- permute --------------------------------------------------------------------------------------------

def _permute_meta(a: Any, dims: Sequence[int]) -> TensorMeta:
    m = _tensor_meta("permute", a)
    dims = _int_tuple("permute", "dims", dims)
    check(sorted(dims) == list(range(m.ndim)), lambda: f"prims.permute: dims {dims} are not a permutation of "
          f"the {m.ndim} dims of {shape_text(a)}")
    return TensorMeta(tuple(m.shape[d] for d in dims), m.dtype, m.device, tuple(m.strides[d] for d in dims),
                      storage_offset=m.storage_offset)


permute = prim("permute", _permute_meta, lambda a, dims: a.permute(tuple(dims)), tags=("view",),
               doc="permute(a, dims): output dim i is input dim dims[i] (a view).")


# ---- squeeze / expand_dims ------------------------------------------------------------------------------

def _squeeze_meta(a: Any, dims: Sequence[int]) -> TensorMeta:
    m = _tensor_meta("squeeze", a)
    dims = _int_tuple("squeeze", "dims", dims)
    check(all(0 <= d < m.ndim for d in dims) and len(set(dims)) == len(dims),
          lambda: f"prims.squeeze: dims {dims} must be distinct dims of {shape_text(a)}", IndexError)
    check(all(m.shape[d] == 1 for d in dims),
          lambda: f"prims.squeeze: dims {dims} of {shape_text(a)} must all have size 1")
    keep = [d for d in range(m.ndim) if d not in dims]
    return TensorMeta(tuple(m.shape[d] for d in keep), m.dtype, m.device, tuple(m.strides[d] for d in keep),
                      storage_offset=m.storage_offset)


def _alias(a: torch.Tensor) -> torch.Tensor:
    """A new view of all of `a`, strides unchanged (a.view(a.shape) would recompute size-1 dims' strides)."""
    return a.as_strided(a.shape, a.stride(), a.storage_offset())


def _squeeze_ref(a: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    return a.squeeze(tuple(dims)) if dims else _alias(a)


squeeze = prim("squeeze", _squeeze_meta, _squeeze_ref, tags=("view",),
               doc="squeeze(a, dims): removes the given size-1 dims (a view).")


def _expand_dims_meta(a: Any, dims: Sequence[int]) -> TensorMeta:
    m = _tensor_meta("expand_dims", a)
    dims = _int_tuple("expand_dims", "dims", dims)
    out_ndim = m.ndim + len(dims)
    check(all(0 <= d < out_ndim for d in dims) and len(set(dims)) == len(dims),
          lambda: f"prims.expand_dims: dims {dims} must be distinct dims of the {out_ndim}-d output",
          IndexError)
    shape, strides = list(m.shape), list(m.strides)
    for d in sorted(dims):
        # as eager's unsqueeze: the new dim's stride makes it look contiguous with the dim it precedes
        stride = 1 if d >= len(shape) else shape[d] * strides[d]
        shape.insert(d, 1)
        strides.insert(d, stride)
    return TensorMeta(tuple(shape), m.dtype, m.device, tuple(strides), storage_offset=m.storage_offset)


def _expand_dims_ref(a: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    out = _alias(a) if not dims else a
    for d in sorted(dims):
        out = out.unsqueeze(d)
    return out


expand_dims = prim("expand_dims", _expand_dims_meta, _expand_dims_ref, tags=("view",),
                   doc="expand_dims(a, dims): inserts size-1 dims at the given output positions (a view).")


# ---- as_strided / diagonal ------------------------------------------------------------------------------

def _as_strided_meta(a: Any, shape: Sequence[Any], strides: Sequence[Any], storage_offset: Any) -> TensorMeta:
    m = _tensor_meta("as_strided", a)
    shape = _int_tuple("as_strided", "shape", shape)
    strides = _int_tuple("as_strided", "strides", strides)
    check(len(shape) == len(strides), lambda: "mismatch in length of strides and shape")
    check(all(s >= 0 for s in shape), lambda: f"prims.as_strided: negative size in {list(shape)}")
    check(all(s >= 0 for s in strides), lambda: f"as_strided: Negative strides are not supported at the "
          f"moment, got strides: {list(strides)}")
    check(storage_offset >= 0, lambda: f"Tensor: invalid storage offset {storage_offset}")
    return TensorMeta(shape, m.dtype, m.device, strides, storage_offset=storage_offset)


as_strided = prim("as_strided", _as_strided_meta,
                  lambda a, shape, strides, storage_offset: a.as_strided(tuple(shape), tuple(strides),
                                                                         storage_offset),
                  tags=("view",),
                  doc="as_strided(a, shape, strides, storage_offset): a view of a's storage "
                      "(storage_offset counts from the storage's start, as eager).")


def _diagonal_meta(a: Any, offset: int = 0, dim1: int = 0, dim2: int = 1) -> TensorMeta:
    m = _tensor_meta("diagonal", a)
    check(0 <= dim1 < m.ndim and 0 <= dim2 < m.ndim and dim1 != dim2,
          lambda: f"prims.diagonal: dims {dim1}, {dim2} must be two distinct dims of {shape_text(a)}",
          IndexError)
    s1, s2 = m.shape[dim1], m.shape[dim2]
    symbolic = is_expr(s1) or is_expr(s2)
    smallest = sympy.Min if symbolic else builtins.min
    largest = sympy.Max if symbolic else builtins.max
    if offset >= 0:
        size = largest(smallest(s1, s2 - offset), 0)
    else:
        size = largest(smallest(s1 + offset, s2), 0)
    keep = [d for d in range(m.ndim) if d not in (dim1, dim2)]
    shape = tuple(m.shape[d] for d in keep) + (size,)
    strides = tuple(m.strides[d] for d in keep) + (m.strides[dim1] + m.strides[dim2],)
    # eager moves the offset to the diagonal's first element, unless the diagonal is empty
    start = 0 if size == 0 else offset * m.strides[dim2] if offset >= 0 else -offset * m.strides[dim1]
    return TensorMeta(shape, m.dtype, m.device, strides, storage_offset=m.storage_offset + start)


diagonal = prim("diagonal", _diagonal_meta,
                lambda a, offset=0, dim1=0, dim2=1: torch.diagonal(a, offset, dim1, dim2), tags=("view",),
                doc="diagonal(a, offset, dim1, dim2): the diagonal of dims dim1, dim2 as the last dim "
                    "(a view).")


def _unfold_meta(a: Any, dim: int, size: int, step: int) -> TensorMeta:
    m = _tensor_meta("unfold", a)
    check(m.ndim == 0 or 0 <= dim < m.ndim,
          lambda: f"prims.unfold: dim {dim} out of range for {shape_text(a)}", IndexError)
    check(step > 0, lambda: f"step is {step} but must be > 0")
    if m.ndim == 0:
        check(size <= 1, lambda: f"maximum size for tensor at dimension {dim} is 1 but size is {size}")
        return TensorMeta((size,), m.dtype, m.device, (1,), storage_offset=m.storage_offset)
    check(size <= m.shape[dim], lambda: f"maximum size for tensor at dimension {dim} is {m.shape[dim]} but "
          f"size is {size}")
    check(size >= 0, lambda: f"size is {size} but must be >= 0")
    shape = list(m.shape)
    strides = list(m.strides)
    shape[dim] = (m.shape[dim] - size) // step + 1
    strides[dim] = m.strides[dim] * step
    return TensorMeta(tuple(shape) + (size,), m.dtype, m.device, tuple(strides) + (m.strides[dim],),
                      storage_offset=m.storage_offset)


unfold = prim("unfold", _unfold_meta, lambda a, dim, size, step: a.unfold(dim, size, step), tags=("view",),
              doc="unfold(a, dim, size, step): windows of `size` every `step` along dim, as a new last dim "
                  "(a view; windows may overlap).")


# ---- copies: rev, cat, pad, clone -----------------------------------------------------------------------

def _rev_meta(a: Any, dims: Sequence[int]) -> TensorMeta:
    m = _tensor_meta("rev", a)
    dims = _int_tuple("rev", "dims", dims)
    check(all(0 <= d < m.ndim for d in dims) and len(set(dims)) == len(dims),
          lambda: f"prims.rev: dims {dims} must be distinct dims of {shape_text(a)}", IndexError)
    return TensorMeta(m.shape, m.dtype, m.device)


rev = prim("rev", _rev_meta, lambda a, dims: torch.flip(a, tuple(dims)).contiguous(),
           doc="rev(a, dims): a contiguous copy of `a` reversed along dims.")


def _cat_meta(tensors: Sequence[Any], dim: int) -> TensorMeta:
    check(isinstance(tensors, (tuple, list)) and len(tensors) > 0 and all(is_tensor(t) for t in tensors),
          lambda: "prims.cat: expected a non-empty sequence of tensors", TypeError)
    metas = [meta_of(t) for t in tensors]
    first = metas[0]
    check(0 <= dim < first.ndim, lambda: f"prims.cat: dim {dim} out of range for {first.ndim}-d tensors",
          IndexError)
    for i, m in enumerate(metas):
        check(m.dtype == first.dtype, lambda: f"prims.cat: tensors must have the same dtype (prims do not "
              f"promote), got {[str(x.dtype) for x in metas]}", TypeError)
        check(m.device == first.device, lambda: f"prims.cat: tensors on different devices {first.device} "
              f"and {m.device}")
        check(m.ndim == first.ndim and all(m.shape[d] == first.shape[d] for d in range(m.ndim) if d != dim),
              lambda: f"prims.cat: Sizes of tensors must match except in dimension {dim}. Expected "
                      f"{list(first.shape)} but got {list(m.shape)} for tensor number {i} in the list.")
    size: Any = 0
    for m in metas:
        size = size + m.shape[dim]
    shape = tuple(size if d == dim else first.shape[d] for d in range(first.ndim))
    return TensorMeta(shape, first.dtype, first.device)


cat = prim("cat", _cat_meta, lambda tensors, dim: torch.cat(tuple(tensors), dim).contiguous(),
           doc="cat(tensors, dim): concatenation of same-dtype, same-rank tensors along dim (contiguous).")


def _pad_sizes(shape: Sequence[Any], config: Sequence[Sequence[int]]) -> tuple:
    out = []
    for size, (lo, hi, interior) in zip(shape, config):
        out.append(lo + hi + size + builtins.max(size - 1, 0) * interior)
    return tuple(out)


def _pad_meta(a: Any, padding_value: Any, padding_config: Sequence[Sequence[int]]) -> TensorMeta:
    m = _tensor_meta("pad", a)
    check(len(padding_config) == m.ndim and all(len(c) == 3 for c in padding_config),
          lambda: f"prims.pad: needs one (low, high, interior) triple per dim of {shape_text(a)}, got "
                  f"{padding_config}")
    check(all(c[2] >= 0 for c in padding_config), lambda: f"prims.pad: interior padding must be >= 0, got "
          f"{padding_config}")
    check(not is_tensor(padding_value), lambda: "prims.pad: the padding value must be a Python number",
          TypeError)
    shape = _pad_sizes(m.shape, padding_config)
    check(all(s >= 0 for s in shape), lambda: f"prims.pad: padding {padding_config} of {shape_text(a)} gives "
          f"a negative size {list(shape)}")
    return TensorMeta(shape, m.dtype, m.device)


def _pad_ref(a: torch.Tensor, padding_value: Any, padding_config: Sequence[Sequence[int]]) -> torch.Tensor:
    grown = [s + builtins.max(s - 1, 0) * c[2] for s, c in zip(a.shape, padding_config)]
    full_shape = [builtins.max(c[0], 0) + g + builtins.max(c[1], 0) for g, c in zip(grown, padding_config)]
    out = torch.full(full_shape, padding_value, dtype=a.dtype, device=a.device)
    place = tuple(builtins.slice(builtins.max(c[0], 0), builtins.max(c[0], 0) + g, c[2] + 1)
                  for g, c in zip(grown, padding_config))
    out[place] = a
    crop = tuple(builtins.slice(builtins.max(-c[0], 0), f - builtins.max(-c[1], 0))
                 for f, c in zip(full_shape, padding_config))
    return out[crop].contiguous()


pad = prim("pad", _pad_meta, _pad_ref,
           doc="pad(a, padding_value, padding_config): per dim (low, high, interior) padding with a "
               "constant; negative low/high crop (as lax.pad). Contiguous result.")


def _clone_meta(a: Any, memory_format: torch.memory_format = torch.contiguous_format) -> TensorMeta:
    m = _tensor_meta("clone", a)
    if memory_format == torch.preserve_format:
        strides = preserve_strides(m.shape, m.strides)
    else:
        strides = memory_format_strides(m.shape, memory_format, "prims.clone")
    return TensorMeta(m.shape, m.dtype, m.device, strides)


clone = prim("clone", _clone_meta,
             lambda a, memory_format=torch.contiguous_format: torch.clone(a, memory_format=memory_format),
             doc="clone(a, memory_format): a copy of `a` with the memory format's strides (preserve_format "
                 "keeps dense strides, as eager).")


def _stop_gradient_meta(a: Any) -> TensorMeta:
    return dataclasses.replace(_tensor_meta("stop_gradient", a), requires_grad=False)


stop_gradient = prim("stop_gradient", _stop_gradient_meta, lambda a: a.detach(),
                     doc="stop_gradient(a): a's value, through which no gradient flows (the maximum softmax "
                         "subtracts only steadies it). Not a view: lowered, it reads a; outside a graph "
                         "it is a.detach().")


# ---- slice (defined last: its name shadows the builtin in this module) ----------------------------------

def _slice_meta(a: Any, start_indices: Sequence[Any], limit_indices: Sequence[Any],
                strides: Sequence[Any] | None = None) -> TensorMeta:
    m = _tensor_meta("slice", a)
    start = _int_tuple("slice", "start_indices", start_indices)
    limit = _int_tuple("slice", "limit_indices", limit_indices)
    steps = _int_tuple("slice", "strides", strides) if strides is not None else (1,) * m.ndim
    check(len(start) == m.ndim and len(limit) == m.ndim and len(steps) == m.ndim,
          lambda: f"prims.slice: needs one start, limit and stride per dim of {shape_text(a)}, got "
                  f"{start}, {limit}, {steps}")
    shape, out_strides = [], []
    offset = m.storage_offset
    for d in range(m.ndim):
        check(0 <= start[d] <= limit[d] <= m.shape[d] and steps[d] >= 1,
              lambda: f"prims.slice: dim {d}: need 0 <= start ({start[d]}) <= limit ({limit[d]}) <= size "
                      f"({m.shape[d]}) and stride ({steps[d]}) >= 1, for {shape_text(a)}", IndexError)
        shape.append((limit[d] - start[d] + steps[d] - 1) // steps[d])
        out_strides.append(m.strides[d] * steps[d])
        offset = offset + start[d] * m.strides[d]
    return TensorMeta(tuple(shape), m.dtype, m.device, tuple(out_strides), storage_offset=offset)


def _slice_ref(a: torch.Tensor, start_indices: Sequence[int], limit_indices: Sequence[int],
               strides: Sequence[int] | None = None) -> torch.Tensor:
    steps = strides if strides is not None else (1,) * a.ndim
    out = _alias(a)
    for d, (lo, hi, step) in enumerate(zip(start_indices, limit_indices, steps)):
        if lo != 0 or hi != a.shape[d] or step != 1:
            out = out[(builtins.slice(None),) * d + (builtins.slice(lo, hi, step),)]
    return out


slice = prim("slice", _slice_meta, _slice_ref, tags=("view",),  # noqa: A001
             doc="slice(a, start_indices, limit_indices, strides=None): per dim [start:limit:stride] "
                 "(a view).")
