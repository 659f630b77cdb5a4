"""Tensor.__getitem__ and Tensor.__setitem__: basic indexing (ints, slices with steps, None, Ellipsis) as
views with eager's strides; tensor, list and bool-scalar indices go to `kiln.ops.indexing`'s advanced
indexing. `x[idx] = v` is traced functionally: the updated tensor is built with pad and where (basic
indices) or `advanced_index_put`, and replaces x (the op is marked in-place).
"""
from __future__ import annotations

import operator
from typing import Any, Sequence

import torch

from ..graph.symbolic import SymInt
from .. import prims
from ..prims.registry import check
from . import indexing
from .creation import _fill_value
from .registry import DataDependentShape, NoDecomposition, mark_inplace, mark_view, register
from .shape import _expand, _reshape, slice_dim
from .utils import is_tensor


def _constant(values: list, dtype: torch.dtype) -> torch.Tensor:
    """A real index tensor (a graph constant), made without recording it."""
    with torch._C.DisableTorchFunction():
        return torch.tensor(values, dtype=dtype)


def _normalize(index: Any) -> tuple:
    if isinstance(index, tuple):
        items = index
    elif isinstance(index, list) and any(i is None or i is Ellipsis or isinstance(i, (slice, list, tuple))
                                         or is_tensor(i) for i in index):
        items = tuple(index)  # eager (as numpy once did) reads such a list as a tuple
    else:
        items = (index,)
    out = []
    for item in items:
        if isinstance(item, list):
            check(all(isinstance(v, (int, bool)) for v in item),
                  lambda: "kiln supports only flat lists of ints as indices", TypeError)
            if not item:
                raise NoDecomposition("an empty list index")
            item = _constant(item, torch.bool if all(isinstance(v, bool) for v in item) else torch.int64)
        elif not (item is None or item is Ellipsis or isinstance(item, (slice, bool)) or is_tensor(item)):
            try:
                item = operator.index(item)
            except TypeError:
                raise IndexError("only integers, slices (`:`), ellipsis (`...`), None and long or byte "
                                 "Variables are valid indices (got " + type(item).__name__ + ")") from None
        out.append(item)
    return tuple(out)


def _consumes(item: Any) -> int:
    """How many dims of the input an index item uses."""
    if item is None or item is Ellipsis or isinstance(item, bool):
        return 0
    if is_tensor(item) and item.dtype in (torch.bool, torch.uint8):
        return max(item.ndim, 1)
    return 1


def _slice_bounds(s: slice, size: int) -> tuple[int, int, int]:
    def value(v: Any, default: int) -> int:
        if v is None:
            return default
        if is_tensor(v):
            raise NoDecomposition("a slice with tensor bounds")
        return v if isinstance(v, SymInt) else operator.index(v)
    step = value(s.step, 1)
    check(step > 0, lambda: "step must be greater than zero", ValueError)
    start, stop = value(s.start, 0), value(s.stop, size)
    start = min(max(start + size if start < 0 else start, 0), size)
    stop = min(max(stop + size if stop < 0 else stop, 0), size)
    return start, max(start, stop), step


def basic_view(a: Any, index: Any) -> tuple[Any, list]:
    """The view selected by the basic part of `index`, and per dim of that view its advanced index tensor
    (or None)."""
    items = _normalize(index)
    check(sum(1 for i in items if i is Ellipsis) <= 1,
          lambda: "an index can only have a single ellipsis ('...')", IndexError)
    used = sum(_consumes(i) for i in items)
    check(used <= a.ndim, lambda: f"too many indices for tensor of dimension {a.ndim}", IndexError)
    expanded: list = []
    for item in items:
        if item is Ellipsis:
            expanded.extend([slice(None)] * (a.ndim - used))
        else:
            expanded.append(item)
    if not any(i is Ellipsis for i in items):
        expanded.extend([slice(None)] * (a.ndim - used))
    result = a
    advanced: list = []
    dim = 0  # the current dim of `result`
    for item in expanded:
        if item is None:
            result = prims.expand_dims(result, (dim,))
            advanced.append(None)
            dim += 1
        elif isinstance(item, bool):
            result = prims.expand_dims(result, (dim,))
            advanced.append(_constant([0] if item else [], torch.int64))
            dim += 1
        elif isinstance(item, (int, SymInt)):
            size = result.shape[dim]
            check(-size <= item < size, lambda: f"index {item} is out of bounds for dimension {dim} with "
                  f"size {size}", IndexError)
            i = item + size if item < 0 else item
            result = prims.squeeze(slice_dim(result, dim, i, i + 1), (dim,))
        elif isinstance(item, slice):
            start, stop, step = _slice_bounds(item, result.shape[dim])
            if (start, stop, step) != (0, result.shape[dim], 1):
                result = slice_dim(result, dim, start, stop, step)
            advanced.append(None)
            dim += 1
        else:  # an index tensor
            if item.dtype in (torch.bool, torch.uint8) and item.ndim > 1:
                raise DataDependentShape("a multi-dimensional bool mask index")
            if item.dtype in (torch.bool, torch.uint8) and item.ndim == 0:
                raise DataDependentShape("a 0-d bool mask index")
            advanced.append(item)
            dim += 1
    if result is a and all(i is None for i in advanced):
        result = prims.squeeze(a, ())  # x[...] and x[:] are new views with x's strides
    return result, advanced


@register(torch.Tensor.__getitem__)
def getitem(a: Any, index: Any) -> Any:
    result, advanced = basic_view(a, index)
    if all(i is None for i in advanced):
        return result
    return indexing.advanced_index(result, advanced)


def zero_of(dtype: torch.dtype) -> Any:
    """The Python zero of a dtype's kind (False, 0, 0.0, 0j)."""
    if dtype == torch.bool:
        return False
    return 0j if dtype.is_complex else (0.0 if dtype.is_floating_point else 0)


def _region(a: Any, index: Any) -> tuple[list, tuple]:
    """Per input dim, (start, count, step) of the part of `a` the index reaches (an index tensor reaches its
    whole dim), and the shape of that region."""
    items = _normalize(index)
    if any(isinstance(i, bool) for i in items):
        raise NoDecomposition("__setitem__ with a bool scalar index")
    if any(is_tensor(i) and i.dtype in (torch.bool, torch.uint8) and i.ndim != 1 for i in items):
        raise NoDecomposition("__setitem__ with a multi-dimensional mask")
    used = sum(_consumes(i) for i in items)
    check(used <= a.ndim, lambda: f"too many indices for tensor of dimension {a.ndim}", IndexError)
    expanded: list = []
    for item in items:
        expanded.extend([slice(None)] * (a.ndim - used) if item is Ellipsis else [item])
    if not any(i is Ellipsis for i in items):
        expanded.extend([slice(None)] * (a.ndim - used))
    ranges, dim = [], 0
    for item in expanded:
        if item is None:
            continue
        if isinstance(item, (int, SymInt)):
            size = a.shape[dim]
            check(-size <= item < size, lambda: f"index {item} is out of bounds for dimension {dim} with "
                  f"size {size}", IndexError)
            ranges.append((item + size if item < 0 else item, 1, 1))
        elif isinstance(item, slice):
            start, stop, step = _slice_bounds(item, a.shape[dim])
            ranges.append((start, -(-(stop - start) // step), step))
        else:
            ranges.append((0, a.shape[dim], 1))
        dim += 1
    return ranges, tuple(n for _, n, _ in ranges)


@register(torch.Tensor.__setitem__)
def setitem(a: Any, index: Any, value: Any) -> Any:
    """The value of `a` after `a[index] = value`, as a new tensor (the op is in-place)."""
    ranges, region_shape = _region(a, index)
    view, advanced = basic_view(a, index)
    if any(i is not None for i in advanced):
        # the basic view with its advanced part updated (eager's index_put_ on the view), then written back
        updated = indexing.advanced_index_put(view, advanced, value, accumulate=False)
        region = _reshape(updated, region_shape)
        if all(start == 0 and n == size for (start, n, _), size in zip(ranges, a.shape)):
            return region
        return place(a, region, ranges)
    if is_tensor(value):
        check(value.ndim <= view.ndim or all(s == 1 for s in value.shape[:value.ndim - view.ndim]),
              lambda: f"shape mismatch: value tensor of shape {list(value.shape)} cannot be broadcast to "
                      f"indexing result of shape {list(view.shape)}")
        if value.ndim > view.ndim:
            value = _reshape(value, tuple(value.shape[value.ndim - view.ndim:]))
        value = _expand(value, tuple(view.shape))
        if value.dtype != a.dtype:
            value = prims.convert_element_type(value, a.dtype)
        value = _reshape(value, region_shape)
    else:
        value = prims.full(region_shape, _fill_value(value, a.dtype), a.dtype, a.device)
    return place(a, value, ranges)


def place(a: Any, value: Any, ranges: Sequence[tuple[int, int, int]]) -> Any:
    """A copy of `a` whose region (per dim: start, count, step) holds `value` (shaped like the region, of a's
    dtype): the value is padded out to a's shape and chosen by a mask padded the same way."""
    region_shape = tuple(n for _, n, _ in ranges)
    check(tuple(value.shape) == region_shape and value.dtype == a.dtype,
          lambda: f"place: value {value.dtype}{list(value.shape)} does not fit region {list(region_shape)} "
                  f"of {a.dtype}{list(a.shape)}")
    if any(n == 0 for n in region_shape):
        return prims.clone(a, torch.contiguous_format)
    config = [(start, size_a - (start + (n - 1) * step + 1), step - 1)
              for (start, n, step), size_a in zip(ranges, a.shape)]
    placed = prims.pad(value, zero_of(a.dtype), config)
    mask = prims.pad(prims.full(region_shape, True, torch.bool, a.device), False, config)
    return prims.where(mask, placed, a)


mark_view(torch.Tensor.__getitem__)
mark_inplace(torch.Tensor.__setitem__)
