"""Decompositions of indexing ops (gather, scatter, index_select, take, index_add/copy/fill, masked_fill,
advanced indexing, embedding) onto the indexing prims, and of sort/topk/scans onto the extern prims.

Ops whose result shape depends on the data (masked_select, nonzero, argwhere, indexing with a bool mask)
raise NoDecomposition and run as fallbacks.

`advanced_index(x, indices)` and `advanced_index_put(x, indices, values, accumulate)` serve
Tensor.__getitem__ / __setitem__ (kiln/ops/getitem.py): `indices` has one entry per leading dim of x, each an
integer or bool tensor, or None for a whole dim.

Negative indices: index, take, index_fill, index_put and advanced indexing count them from the end (eager);
gather, scatter, index_select, index_add, index_copy and embedding raise for them at run time (eager), and
take_along_dim with a dim takes every index modulo the dim's size (eager).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from .. import prims
from ..prims.common_vjp import reshape as reshape_value
from ..prims.indexing import index_result_shape
from ..prims.registry import check, shape_text, wrap_dim
from .registry import DataDependentShape, NoDecomposition, register
from .utils import broadcast, broadcast_shapes, broadcast_to, is_tensor, preserve_layout

_INDEX_DTYPES = (torch.int64, torch.int32)


def _long(index: Any) -> Any:
    return index if index.dtype == torch.int64 else prims.convert_element_type(index, torch.int64)


def _dims(x: Any) -> tuple:
    return tuple(x.shape) if x.ndim > 0 else (1,)


def _full(value: Any, shape: Sequence[Any], dtype: torch.dtype, device: torch.device) -> Any:
    """A tensor of `shape` on `device` holding one value (a number or a 0-d tensor), as a broadcast view."""
    if is_tensor(value):
        value = value if value.dtype == dtype else prims.convert_element_type(value, dtype)
    else:
        value = torch.tensor(_cast_number(value, dtype), dtype=dtype, device=device)
    return prims.broadcast_in_dim(value, tuple(shape), ())


def _cast_number(value: Any, dtype: torch.dtype) -> Any:
    """A Python number converted as eager converts a fill value to dtype (C++ cast, truncation)."""
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_complex:
        return complex(value)
    if isinstance(value, complex):
        check(value.imag == 0, lambda: f"value cannot be converted to type {dtype} without overflow")
        value = value.real
    if dtype.is_floating_point:
        value = float(value)
        check(not math.isfinite(value) or abs(value) <= torch.finfo(dtype).max,
              lambda: f"value cannot be converted to type {dtype} without overflow")
        return value
    check(not isinstance(value, float) or math.isfinite(value),
          lambda: f"value cannot be converted to type {dtype} without overflow")
    info = torch.iinfo(dtype)
    converted = int(value)
    check(info.min <= converted <= info.max, lambda: f"value cannot be converted to type {dtype} without "
          "overflow")
    return converted


# ---- gather and scatter ---------------------------------------------------------------------------------

def _scatter_index(op: str, index: Any) -> Any:
    """gather/scatter accept int64 and int32 indices (and, when empty, any dtype)."""
    if index.dtype not in _INDEX_DTYPES and index.numel() == 0:
        raise NoDecomposition(f"{op} with an empty {index.dtype} index")
    check(index.dtype in _INDEX_DTYPES, lambda: f"{op}(): Expected dtype int32/int64 for index, got "
          f"{index.dtype}")
    return _long(index)


@register(torch.gather, torch.Tensor.gather)
def gather(input: Any, dim: int, index: Any, *, sparse_grad: bool = False) -> Any:
    return prims.gather(input, dim, _scatter_index("gather", index))


def _scatter_value(input: Any, value: Any) -> Any:
    if is_tensor(value):
        raise NoDecomposition("scatter with a tensor value")
    return _cast_number(value, input.dtype)


@register(torch.scatter, torch.Tensor.scatter)
def scatter(input: Any, dim: int, index: Any, src: Any = None, *, value: Any = None,
            reduce: str | None = None) -> Any:
    index = _scatter_index("scatter", index)
    if src is None:
        src = value
    if not is_tensor(src):
        if reduce is None:
            return prims.scatter(input, dim, index, _scatter_value(input, src))
        src = _full(_scatter_value(input, src), index.shape, input.dtype, input.device)
    if reduce is None:
        return prims.scatter(input, dim, index, src)
    check(reduce in ("add", "multiply"),
          lambda: f"scatter(): reduce argument must be either add or multiply, got {reduce}")
    if reduce == "add":
        return prims.scatter_add(input, dim, index, src)
    return prims.scatter_reduce(input, dim, index, src, "prod", True)


@register(torch.scatter_add, torch.Tensor.scatter_add)
def scatter_add(input: Any, dim: int, index: Any, src: Any) -> Any:
    index = _scatter_index("scatter_add", index)
    return prims.scatter_add(input, dim, index, src)


@register(torch.scatter_reduce, torch.Tensor.scatter_reduce)
def scatter_reduce(input: Any, dim: int, index: Any, src: Any, reduce: str, *,
                   include_self: bool = True) -> Any:
    index = _scatter_index("scatter_reduce", index)
    return prims.scatter_reduce(input, dim, index, src, reduce, include_self)


# ---- index_select, take, take_along_dim -----------------------------------------------------------------

@register(torch.index_select, torch.Tensor.index_select)
def index_select(input: Any, dim: int, index: Any) -> Any:
    check(index.dtype in _INDEX_DTYPES, lambda: f"index_select(): Expected dtype int32 or int64 for index, "
          f"got {index.dtype}")
    check(index.ndim <= 1,
          lambda: f"index_select(): Index is supposed to be a vector, got {shape_text(index)}", IndexError)
    index = _long(index)
    if index.ndim == 0 and input.ndim > 0:
        index = prims.broadcast_in_dim(index, (1,), ())
    return prims.index_select(input, dim, index)


@register(torch.take, torch.Tensor.take)
def take(input: Any, index: Any) -> Any:
    check(index.dtype == torch.int64,
          lambda: f"take(): Expected a long tensor for index, but got {index.dtype}")
    flat = input.reshape(-1)
    if index.ndim == 0:
        return prims.index(flat, [index.reshape(1)]).reshape(())
    return prims.index(flat, [index])


@register(torch.take_along_dim, torch.Tensor.take_along_dim)
def take_along_dim(input: Any, indices: Any, dim: int | None = None) -> Any:
    check(indices.dtype == torch.int64,
          lambda: f"torch.take_along_dim(): dtype of indices should be Long but got {indices.dtype}")
    if dim is None:
        return prims.gather(input.reshape(-1), 0, indices.reshape(-1))
    check(input.ndim == indices.ndim,
          lambda: f"torch.take_along_dim(): input and indices should have the same number of dimensions, but "
                  f"got {input.ndim} dimensions for input, and {indices.ndim} dimensions for indices")
    if input.ndim == 0:
        return prims.gather(input, 0, indices)
    dim = wrap_dim(dim, input.ndim)
    sizes = list(indices.shape)
    sizes[dim] = input.shape[dim]
    shape = list(broadcast_shapes(tuple(sizes), tuple(input.shape)))
    shape[dim] = indices.shape[dim]
    indices = broadcast_to(indices, tuple(shape))
    shape[dim] = input.shape[dim]
    input = broadcast_to(input, tuple(shape))
    if input.shape[dim] == 0:
        raise NoDecomposition("take_along_dim along an empty dim")
    # with a dim, eager takes every index modulo the size (negative ones count from the end)
    return prims.gather(input, dim, prims.remainder(indices, input.shape[dim]))


# ---- index_add, index_copy, index_fill ------------------------------------------------------------------

def _along(index: Any, dim: int, shape: Sequence[Any]) -> Any:
    """A 1-d index laid along `dim` and broadcast to `shape` (for scatter)."""
    return prims.broadcast_in_dim(index, tuple(shape), (dim,))


def _index_source_check(op: str, input: Any, dim: int, index: Any, source: Any, exc: type) -> int:
    dim = wrap_dim(dim, input.ndim)
    check(index.ndim <= 1, lambda: f"{op}(): Index is supposed to be a vector, but got dim: {index.ndim} "
          f"with size: {shape_text(index)}", IndexError)
    count = index.numel()
    src = _dims(source)
    check(len(src) == len(_dims(input)) and src[dim] == count,
          lambda: f"{op}(): Number of indices ({count}) should be equal to source.size(dim) "
                  f"({src[dim] if dim < len(src) else '?'}), for dim: {dim}", exc)
    check(all(d == dim or s == i for d, (s, i) in enumerate(zip(src, _dims(input)))),
          lambda: f"{op}(): source tensor shape must match self tensor shape, excluding the specified "
                  f"dimension. Got self.shape = {shape_text(input)} source.shape = {shape_text(source)}")
    return dim


@register(torch.index_add, torch.Tensor.index_add)
def index_add(input: Any, dim: int, index: Any, source: Any, *, alpha: Any = 1) -> Any:
    check(index.dtype in _INDEX_DTYPES, lambda: f"index_add_(): Expected dtype int32/int64 for index, got "
          f"{index.dtype}")
    check(input.dtype == source.dtype, lambda: f"index_add_(): self ({input.dtype}) and source "
          f"({source.dtype}) must have the same scalar type")
    check(source.ndim == input.ndim, lambda: "index_add_(): source tensor shape must match self tensor "
          f"shape, excluding the specified dimension. Got self.shape = {shape_text(input)} source.shape = "
          f"{shape_text(source)}")
    dim = _index_source_check("index_add_", input, dim, index, source, RuntimeError)
    if not (isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and alpha == 1):
        source = source * alpha
        if source.dtype != input.dtype:
            raise NoDecomposition("index_add with an alpha that changes the dtype")
    x, source = input.reshape(_dims(input)), source.reshape(_dims(source))
    index = _long(index).reshape(-1)
    return prims.scatter_add(x, dim, _along(index, dim, source.shape), source).reshape(input.shape)


@register(torch.index_copy, torch.Tensor.index_copy)
def index_copy(input: Any, dim: int, index: Any, source: Any) -> Any:
    check(index.dtype == torch.int64, lambda: f"index_copy_(): Expected a long tensor for index, but got "
          f"{index.dtype}")
    check(input.dtype == source.dtype, lambda: f"index_copy_(): self and source expected to have the same "
          f"dtype, but got (self) {input.dtype} and (source) {source.dtype}")
    dim = _index_source_check("index_copy_", input, dim, index, source, IndexError)
    x, source = input.reshape(_dims(input)), source.reshape(_dims(source))
    index = index.reshape(-1)
    return prims.scatter(x, dim, _along(index, dim, source.shape), source).reshape(input.shape)


@register(torch.index_reduce, torch.Tensor.index_reduce)
def index_reduce(input: Any, dim: int, index: Any, source: Any, reduce: str, *,
                 include_self: bool = True) -> Any:
    check(reduce in ("prod", "mean", "amax", "amin"), lambda: f"index_reduce(): Expected reduce to be one of "
          f"prod, mean, amax or amin but got {reduce}.")
    check(index.dtype in _INDEX_DTYPES, lambda: f"index_reduce_(): Expected dtype int32/int64 for index, got "
          f"{index.dtype}")
    check(input.dtype == source.dtype, lambda: f"index_reduce_(): self ({input.dtype}) and source "
          f"({source.dtype}) must have the same scalar type")
    dim = _index_source_check("index_reduce_", input, dim, index, source, IndexError)
    if reduce in ("prod", "mean") and input.dtype in (torch.float16, torch.bfloat16):
        raise NoDecomposition("index_reduce prod/mean in half precision (eager's rounding order)")
    x, source = input.reshape(_dims(input)), source.reshape(_dims(source))
    index = _long(index).reshape(-1)
    out = prims.scatter_reduce(x, dim, _along(index, dim, source.shape), source, reduce, include_self)
    return out.reshape(input.shape)


@register(torch.put, torch.Tensor.put)
def put(input: Any, index: Any, source: Any, accumulate: bool = False) -> Any:
    """input.flatten()[index] = source (or +=), negative indices counting from the end."""
    check(index.dtype == torch.int64,
          lambda: f"put_(): Expected a long tensor for index, but got {index.dtype}")
    check(input.dtype == source.dtype, lambda: f"put_(): self and source expected to have the same dtype, "
          f"but got self.dtype = {input.dtype} and source.dtype = {source.dtype}")
    check(index.numel() == source.numel(), lambda: f"put_(): Expected source and index to have the same "
          f"number of elements, but got source.numel() = {source.numel()}, index.numel() = {index.numel()}",
          IndexError)
    out = prims.index_put(input.reshape(-1), [index.reshape(-1)], source.reshape(-1), bool(accumulate))
    return preserve_layout(out.reshape(input.shape), input)  # eager writes into a clone of input


@register(torch.index_fill, torch.Tensor.index_fill)
def index_fill(input: Any, dim: int, index: Any, value: Any) -> Any:
    check(index.dtype == torch.int64, lambda: "index_fill_(): Expected dtype int64 for index.", IndexError)
    check(index.ndim <= 1, lambda: f"Index has to be a vector/scalar, got {shape_text(index)}")
    check(not is_tensor(value) or value.ndim == 0, lambda: f"index_fill_ only supports a 0-dimensional value "
          f"tensor, but got tensor with {value.ndim} dimension(s).")
    dim = wrap_dim(dim, input.ndim)
    x = input.reshape(_dims(input))
    index = index.reshape(-1) if index.ndim == 0 else index
    indices = [None] * dim + [index]
    shape = index_result_shape(x.shape, index.shape, [dim])
    return prims.index_put(x, indices, _full(value, shape, input.dtype, input.device), False).reshape(input.shape)


# ---- masks ----------------------------------------------------------------------------------------------

@register(torch.masked_fill, torch.Tensor.masked_fill)
def masked_fill(input: Any, mask: Any, value: Any) -> Any:
    check(mask.dtype == torch.bool, lambda: f"masked_fill_ only supports boolean masks, but got mask with "
          f"dtype {mask.dtype}")
    if is_tensor(value):
        check(value.ndim == 0, lambda: f"masked_fill_ only supports a 0-dimensional value tensor, but got "
              f"tensor with {value.ndim} dimension(s).")
        value = value if value.dtype == input.dtype else prims.convert_element_type(value, input.dtype)
        mask, value, input = broadcast(mask, value, input)
        return prims.where(mask, value, input).contiguous()  # eager's result is contiguous
    mask, input = broadcast(mask, input)
    return prims.where(mask, _cast_number(value, input.dtype), input).contiguous()


@register(torch.masked_select, torch.Tensor.masked_select, torch.nonzero, torch.Tensor.nonzero,
          torch.argwhere, torch.Tensor.argwhere)
def data_dependent(*args: Any, **kwargs: Any) -> Any:
    """Ops whose output shape depends on the data."""
    raise DataDependentShape("an output shape that depends on the data")


@register(torch.masked_scatter, torch.Tensor.masked_scatter)
def masked_scatter(*args: Any, **kwargs: Any) -> Any:
    """Left to eager (the values it reads depend on the mask's count; its shape does not)."""
    raise NoDecomposition("masked_scatter")


# ---- advanced indexing ----------------------------------------------------------------------------------

def _index_tensors(x: Any, indices: Sequence[Any]) -> list[Any]:
    """Check index tensors as eager does; convert int32 to int64 and broadcast them to one shape."""
    check(len(indices) <= x.ndim, lambda: f"too many indices for tensor of dimension {x.ndim} (got "
          f"{len(indices)})", IndexError)
    out: list[Any] = list(indices)
    shapes = []
    for d, index in enumerate(indices):
        if index is None:
            continue
        check(is_tensor(index), lambda: f"index {d}: expected a tensor or None, got {type(index).__name__}",
              TypeError)
        check(index.dtype in (torch.int64, torch.int32, torch.bool, torch.uint8),
              lambda: "tensors used as indices must be long, int, byte or bool tensors", IndexError)
        if index.dtype in (torch.bool, torch.uint8):
            raise DataDependentShape("indexing with a bool mask (an output shape that depends on the data)")
        if isinstance(index, torch.Tensor) and index.device != x.device:
            # a constant index (x[[0, 2]]) is made on the CPU; eager moves it to x's device, and so does this
            with torch._C.DisableTorchFunction():
                index = index.to(x.device)
        out[d] = _long(index)
        shapes.append(tuple(index.shape))
    try:
        shape = broadcast_shapes(*shapes)
    except RuntimeError:
        raise IndexError("shape mismatch: indexing tensors could not be broadcast together with shapes "
                         + ", ".join(f"[{', '.join(map(str, s))}]" for s in shapes)) from None
    while out and out[-1] is None:
        out.pop()
    return [None if i is None else broadcast_to(i, shape) for i in out]


def advanced_index(x: Any, indices: Sequence[Any]) -> Any:
    """x[indices] for a list of index tensors (int64, int32; bool masks fall back) and None (whole dims)."""
    tensors = _index_tensors(x, indices)
    if not tensors:
        return x
    return prims.index(x, tensors)


def _static_mask_put(x: Any, indices: Sequence[Any], values: Any, accumulate: bool) -> Any:
    """x[mask] = values where the result needs no count of the mask's True entries: values broadcast over
    the dims after the mask (a number, or a tensor whose dim aligned with the selected entries is 1)."""
    positions = [d for d, i in enumerate(indices) if i is not None]
    if len(positions) != 1:
        raise NoDecomposition("indexing with a bool mask among other indices")
    at = positions[0]
    mask = indices[at]
    if mask.dtype != torch.bool:
        raise NoDecomposition("indexing with a uint8 mask")
    check(at + mask.ndim <= x.ndim, lambda: f"too many indices for tensor of dimension {x.ndim}", IndexError)
    for i in range(mask.ndim):
        check(mask.shape[i] == x.shape[at + i], lambda: f"The shape of the mask {shape_text(mask)} at index "
              f"{i} does not match the shape of the indexed tensor {shape_text(x)} at index {at + i}",
              IndexError)
    rest = x.ndim - at - mask.ndim
    if is_tensor(values):
        if values.numel() != 1:  # eager fills a one-element value as masked_fill does, converting it
            _same_dtype_put(x, values)
        values = values if values.dtype == x.dtype else prims.convert_element_type(values, x.dtype)
        if values.ndim > rest:
            # the dim aligned with the selected entries must be 1; then lay values out as x's dims
            lead = values.ndim - rest - 1
            if values.shape[lead] != 1 or lead > at:
                raise NoDecomposition("a bool-mask assignment whose values depend on the selected count")
            values = values.reshape((*values.shape[:lead], *([1] * mask.ndim), *values.shape[lead + 1:]))
        values = broadcast_to(values, tuple(x.shape))
    else:
        values = _cast_number(values, x.dtype)
    full_mask = prims.broadcast_in_dim(mask, tuple(x.shape), tuple(range(at, at + mask.ndim)))
    if accumulate:
        values = x + values
    return prims.where(full_mask, values, x)


def _same_dtype_put(x: Any, values: Any) -> None:
    check(values.dtype == x.dtype, lambda: "Index put requires the source and destination dtypes match, got "
          f"{x.dtype} for the destination and {values.dtype} for the source.")


def advanced_index_put(x: Any, indices: Sequence[Any], values: Any, accumulate: bool = False) -> Any:
    """The value of x after `x[indices] = values` (or `+=` with accumulate), as a new tensor.

    values is a number (converted to x's dtype) or a tensor of x's dtype (eager refuses others), broadcast
    to the indexed shape. A single bool mask (one entry of `indices`, spanning mask.ndim dims of x) works
    when the result needs no count of its True entries (masked_fill-like; a one-element value tensor is
    then converted, as eager does).
    """
    check(len(indices) <= x.ndim, lambda: f"too many indices for tensor of dimension {x.ndim} (got "
          f"{len(indices)})", IndexError)
    if any(is_tensor(i) and i.dtype in (torch.bool, torch.uint8) for i in indices):
        return _static_mask_put(x, indices, values, accumulate)
    tensors = _index_tensors(x, indices)
    if not tensors:
        raise NoDecomposition("index_put without index tensors")
    positions = [d for d, i in enumerate(tensors) if i is not None]
    shape = index_result_shape(x.shape, tensors[positions[0]].shape, positions)
    if not is_tensor(values):
        return prims.index_put(x, tensors, _full(values, shape, x.dtype, x.device), accumulate)
    _same_dtype_put(x, values)
    while values.ndim > len(shape) and values.shape[0] == 1:
        values = values.squeeze(0)  # eager's copy drops leading 1s
    return prims.index_put(x, tensors, _broadcast_values(values, shape), accumulate)


def _broadcast_values(values: Any, shape: Sequence[Any]) -> Any:
    shape = tuple(shape)
    try:
        check(values.ndim <= len(shape) and broadcast_shapes(tuple(values.shape), shape) == shape,
              lambda: "")
    except RuntimeError:
        raise RuntimeError(f"shape mismatch: value tensor of shape {shape_text(values)} cannot be broadcast "
                           f"to indexing result of shape [{', '.join(map(str, shape))}]") from None
    return broadcast_to(values, shape)


@register(torch.ops.aten.index.Tensor)
def aten_index(input: Any, indices: Sequence[Any]) -> Any:
    check(len(indices) > 0, lambda: "at least one index must be provided", IndexError)
    if all(i is None for i in indices):
        raise NoDecomposition("aten.index without index tensors")
    return advanced_index(input, indices)


@register(torch.index_put, torch.Tensor.index_put)
def index_put(input: Any, indices: Sequence[Any], values: Any, accumulate: bool = False) -> Any:
    check(is_tensor(values) and values.dtype == input.dtype, lambda: "Index put requires the source and "
          f"destination dtypes match, got {input.dtype} for the destination and "
          f"{getattr(values, 'dtype', type(values).__name__)} for the source.")
    check(all(is_tensor(i) for i in indices), lambda: "index_put(): expected a tuple of index tensors, got "
          f"{[type(i).__name__ for i in indices]}", TypeError)
    if any(i.dtype in (torch.bool, torch.uint8) for i in indices):  # (eager writes into a clone of input)
        return preserve_layout(_static_mask_put(input, list(indices), values, accumulate), input)
    tensors = _index_tensors(input, list(indices))
    if not tensors:
        raise NoDecomposition("index_put without index tensors")
    positions = [d for d, i in enumerate(tensors) if i is not None]
    shape = index_result_shape(input.shape, tensors[positions[0]].shape, positions)
    out = prims.index_put(input, tensors, _broadcast_values(values, shape), accumulate)
    return preserve_layout(out, input)


# ---- embedding ------------------------------------------------------------------------------------------

def _embedding(weight: Any, indices: Any) -> Any:
    check(indices.dtype in _INDEX_DTYPES, lambda: f"Expected tensor for argument #1 'indices' to have one of "
          f"the following scalar types: Long, Int; but got {indices.dtype} instead (while checking arguments "
          "for embedding)")
    check(weight.ndim == 2, lambda: f"'weight' must be 2-D, got {shape_text(weight)}")
    rows = prims.index_select(weight, 0, reshape_value(_long(indices), (indices.numel(),)))  # (never guards)
    return rows.reshape((*indices.shape, weight.shape[1]))


@register(F.embedding)
def embedding(input: Any, weight: Any, padding_idx: int | None = None, max_norm: float | None = None,
              norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False) -> Any:
    """F.embedding as rows of weight (padding_idx only changes gradients); max_norm (which renormalizes
    weight in place) falls back."""
    if max_norm is not None:
        raise NoDecomposition("embedding with max_norm")
    if padding_idx is not None and weight.ndim == 2:
        check(-weight.shape[0] <= padding_idx < weight.shape[0],
              lambda: f"Padding_idx must be within num_embeddings (got {padding_idx} for weight "
                      f"{shape_text(weight)})", AssertionError)
        if padding_idx < 0:
            padding_idx += weight.shape[0]
    return torch_embedding(weight, input, -1 if padding_idx is None else padding_idx, scale_grad_by_freq)


@register(torch.embedding)
def torch_embedding(weight: Any, indices: Any, padding_idx: int = -1, scale_grad_by_freq: bool = False,
                    sparse: bool = False) -> Any:
    """Rows of weight. With a gradient to compute, the padding row gets none (eager's embedding_backward
    skips the indices equal to padding_idx); scale_grad_by_freq's gradient is not modelled (a fallback)."""
    rows = _embedding(weight, indices)
    if not (torch.is_grad_enabled() and weight.requires_grad):
        return rows
    if scale_grad_by_freq:
        raise NoDecomposition("embedding with scale_grad_by_freq, whose weight requires grad")
    if padding_idx >= 0:
        padding = (indices == padding_idx).unsqueeze(-1)
        rows = torch.where(padding, prims.stop_gradient(rows), rows)
    return rows

# ---- sorting, selection and scans (extern prims) --------------------------------------------------------

@register(torch.sort, torch.Tensor.sort)
def sort(input: Any, dim: int = -1, descending: bool = False, stable: bool | None = False) -> Any:
    values, indices = prims.sort(input, dim, bool(descending), bool(stable))
    return torch.return_types.sort((values, indices))


@register(torch.argsort, torch.Tensor.argsort)
def argsort(input: Any, dim: int = -1, descending: bool = False, stable: bool = False) -> Any:
    return prims.sort(input, dim, bool(descending), bool(stable))[1]


@register(torch.msort, torch.Tensor.msort)
def msort(input: Any) -> Any:
    return prims.sort(input, 0, False, False)[0]


@register(torch.topk, torch.Tensor.topk)
def topk(input: Any, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> Any:
    values, indices = prims.topk(input, k, dim, bool(largest), bool(sorted))
    return torch.return_types.topk((values, indices))


def _scan_dtype(input: Any, dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        return dtype
    if not (input.dtype.is_floating_point or input.dtype.is_complex):
        return torch.int64  # integer and bool inputs accumulate in int64, as eager
    return input.dtype


@register(torch.cumsum, torch.Tensor.cumsum)
def cumsum(input: Any, dim: int, *, dtype: torch.dtype | None = None) -> Any:
    x = input
    target = _scan_dtype(x, dtype)
    x = x if x.dtype == target else prims.convert_element_type(x, target)
    return prims.cumsum(x, dim)


@register(torch.cumprod, torch.Tensor.cumprod)
def cumprod(input: Any, dim: int, *, dtype: torch.dtype | None = None) -> Any:
    x = input
    target = _scan_dtype(x, dtype)
    x = x if x.dtype == target else prims.convert_element_type(x, target)
    return prims.cumprod(x, dim)


@register(torch.cummax, torch.Tensor.cummax)
def cummax(input: Any, dim: int) -> Any:
    values, indices = prims.cummax(input, dim)
    return torch.return_types.cummax((values, indices))


@register(torch.cummin, torch.Tensor.cummin)
def cummin(input: Any, dim: int) -> Any:
    values, indices = prims.cummin(input, dim)
    return torch.return_types.cummin((values, indices))


@register(torch.logcumsumexp, torch.Tensor.logcumsumexp)
def logcumsumexp(input: Any, dim: int) -> Any:
    return prims.logcumsumexp(input, dim)
