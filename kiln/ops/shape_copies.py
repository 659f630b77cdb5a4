"""Decompositions whose results are new tensors assembled by shape prims: cat/stack and friends, flip, roll,
rot90, repeat/tile/repeat_interleave, tril/triu, diag/diag_embed, the *_scatter ops and the *_copy ops.
"""
from __future__ import annotations

import builtins
from typing import Any, Sequence

import torch

from .. import prims
from ..prims.registry import check, wrap_dim
from . import shape as views
from .getitem import _slice_bounds, place, zero_of
from .registry import DataDependentShape, NoDecomposition, register
from .shape import _expand, _reshape, _sizes, _transpose, slice_dim
from .utils import is_tensor, preserve_layout, result_type


# ---- joining: cat / stack and friends -----------------------------------------------------------------

def _tensor_list(tensors: Any, op: str) -> list:
    check(isinstance(tensors, (tuple, list)), lambda: f"{op}(): argument 'tensors' must be tuple of Tensors",
          TypeError)
    for t in tensors:
        check(is_tensor(t), lambda: f"{op}(): expected Tensor as element in argument 0, but got "
              f"{type(t).__name__}", TypeError)
    return list(tensors)


@register(torch.cat, torch.concat, torch.concatenate)
def cat(tensors: Any, dim: int = 0, *, axis: Any = None, out: Any = None) -> Any:
    if out is not None:
        raise NoDecomposition("cat with out=")
    if axis is not None:
        dim = axis
    if isinstance(dim, str):
        raise NoDecomposition("cat with a named dim")
    tensors = _tensor_list(tensors, "cat")
    check(len(tensors) > 0, lambda: "torch.cat(): expected a non-empty list of Tensors")
    for i, t in enumerate(tensors):
        check(t.ndim > 0, lambda: f"zero-dimensional tensor (at position {i}) cannot be concatenated")
    dtype = result_type(*[t.dtype for t in tensors])
    # eager skips 1-D empty tensors (legacy behaviour) when checking and joining shapes
    kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    device = tensors[0].device
    if not kept:
        return prims.full((0,), False if dtype == torch.bool else 0, dtype, device)
    ref = kept[0]
    d = wrap_dim(dim, ref.ndim)
    for i, t in enumerate(tensors):
        if t.ndim == 1 and t.shape[0] == 0:
            continue
        check(t.ndim == ref.ndim, lambda: f"Tensors must have same number of dimensions: got {ref.ndim} and "
              f"{t.ndim}")
        for k in range(ref.ndim):
            check(k == d or t.shape[k] == ref.shape[k], lambda: f"Sizes of tensors must match except in "
                  f"dimension {d}. Expected size {ref.shape[k]} but got size {t.shape[k]} for tensor number "
                  f"{i} in the list.")
    converted = [t if t.dtype == dtype else prims.convert_element_type(t, dtype) for t in kept]
    perm = _channels_last_perm(kept)
    if perm is None:
        return prims.cat(converted, d)
    # eager keeps a memory format all inputs share: join in memory order, then permute back
    inverse = tuple(perm.index(k) for k in range(len(perm)))
    joined = prims.cat([prims.permute(t, perm) for t in converted], perm.index(d))
    return prims.permute(joined, inverse)


def _channels_last_perm(tensors: list) -> tuple | None:
    """The (N, *spatial, C) dim order when every tensor is laid out channels-last (eager's cat keeps it)."""
    from ..prims.shape import memory_format_strides
    ndim = tensors[0].ndim
    if ndim not in (4, 5):
        return None
    fmt = torch.channels_last if ndim == 4 else torch.channels_last_3d
    for t in tensors:
        shape = tuple(t.shape)
        if t.ndim != ndim or t.meta.is_contiguous():
            return None
        if tuple(t.stride()) != memory_format_strides(shape, fmt, "cat"):
            return None
    return (0,) + tuple(range(2, ndim)) + (1,)


@register(torch.stack)
def stack(tensors: Any, dim: int = 0, *, out: Any = None) -> Any:
    if out is not None:
        raise NoDecomposition("stack with out=")
    tensors = _tensor_list(tensors, "stack")
    check(len(tensors) > 0, lambda: "stack expects a non-empty TensorList")
    first = tensors[0]
    for i, t in enumerate(tensors):
        check(tuple(t.shape) == tuple(first.shape), lambda: f"stack expects each tensor to be equal size, "
              f"but got {list(first.shape)} at entry 0 and {list(t.shape)} at entry {i}")
    d = wrap_dim(dim, first.ndim + 1)
    return cat([prims.expand_dims(t, (d,)) for t in tensors], d)


def _atleast(a: Any, n: int) -> Any:
    if a.ndim >= n:
        return a
    if n == 1 or a.ndim == 0:
        return prims.view(a, (1,) * n)
    if n == 2:
        return prims.expand_dims(a, (0,))
    return prims.expand_dims(a, (0, 2)) if a.ndim == 1 else prims.expand_dims(a, (2,))


def _atleast_op(n: int) -> Any:
    def atleast(*tensors: Any) -> Any:
        if len(tensors) == 1 and is_tensor(tensors[0]):
            return _atleast(tensors[0], n)
        if len(tensors) == 1:
            tensors = tuple(tensors[0])
        return tuple(_atleast(t, n) for t in tensors)
    return atleast


atleast_1d = register(torch.atleast_1d)(_atleast_op(1))
atleast_2d = register(torch.atleast_2d)(_atleast_op(2))
atleast_3d = register(torch.atleast_3d)(_atleast_op(3))


@register(torch.hstack)
def hstack(tensors: Any) -> Any:
    tensors = [_atleast(t, 1) for t in _tensor_list(tensors, "hstack")]
    return cat(tensors, 0 if tensors and tensors[0].ndim == 1 else 1)


@register(torch.vstack, torch.row_stack)
def vstack(tensors: Any) -> Any:
    return cat([_atleast(t, 2) for t in _tensor_list(tensors, "vstack")], 0)


@register(torch.dstack)
def dstack(tensors: Any) -> Any:
    return cat([_atleast(t, 3) for t in _tensor_list(tensors, "dstack")], 2)


@register(torch.column_stack)
def column_stack(tensors: Any) -> Any:
    tensors = _tensor_list(tensors, "column_stack")
    cols = [_reshape(t, (t.numel(), 1)) if t.ndim <= 1 else t for t in tensors]
    return cat(cols, 1)


# ---- reordering copies: flip / roll / rot90 -----------------------------------------------------------

def _layout_perm(a: Any) -> tuple:
    """Dims from outermost to innermost in memory (by stride), the order eager's copies keep."""
    from ..prims.shape import preserve_strides
    shape = tuple(a.shape)
    strides = preserve_strides(shape, tuple(a.stride()))
    return tuple(sorted(range(a.ndim), key=lambda d: (-strides[d], -shape[d], d)))


@register(torch.flip, torch.Tensor.flip)
def flip(a: Any, *dims: Any, **kwargs: Any) -> Any:
    if "dims" in kwargs:
        dims = (kwargs.pop("dims"),)
    check(not kwargs, lambda: f"flip() got unexpected keyword arguments {sorted(kwargs)}", TypeError)
    dims = _sizes(dims, "flip")
    wrapped = tuple(wrap_dim(d, a.ndim) for d in dims)
    check(len(set(wrapped)) == len(wrapped), lambda: f"dims has duplicates, original flip dims size="
          f"{len(dims)}, but unique flip dims size={len(set(wrapped))}")
    perm = _layout_perm(a)
    if perm == tuple(range(a.ndim)):
        return prims.rev(a, tuple(sorted(wrapped)))
    # flip in memory order and permute back, so the copy keeps the input's layout as eager's does
    inverse = [0] * a.ndim
    for i, d in enumerate(perm):
        inverse[d] = i
    flipped = prims.rev(prims.permute(a, perm), tuple(sorted(inverse[d] for d in wrapped)))
    return prims.permute(flipped, tuple(inverse))


@register(torch.fliplr, torch.Tensor.fliplr)
def fliplr(a: Any) -> Any:
    check(a.ndim >= 2, lambda: "Input must be >= 2-d.")
    return flip(a, (1,))


@register(torch.flipud, torch.Tensor.flipud)
def flipud(a: Any) -> Any:
    check(a.ndim >= 1, lambda: "Input must be >= 1-d.")
    return flip(a, (0,))


@register(torch.roll, torch.Tensor.roll)
def roll(a: Any, shifts: Any, dims: Any = None) -> Any:
    shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    if dims is None:
        check(len(shifts) == 1, lambda: f"shifts and dimensions must align. shifts: {len(shifts)}, dims:0")
        return prims.view(roll(_reshape(a, (-1,)), shifts, (0,)), tuple(a.shape))
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    check(len(shifts) == len(dims), lambda: f"shifts and dimensions must align. shifts: {len(shifts)}, "
          f"dims:{len(dims)}")
    out = a
    for shift, dim in zip(shifts, dims):
        d = wrap_dim(dim, a.ndim)
        size = a.shape[d]
        if size == 0:
            continue
        s = shift % size
        out = prims.cat([slice_dim(out, d, size - s, size), slice_dim(out, d, 0, size - s)], d)
    return out if out is not a else prims.clone(a, torch.contiguous_format)


@register(torch.rot90, torch.Tensor.rot90)
def rot90(a: Any, k: int = 1, dims: Sequence[int] = (0, 1)) -> Any:
    dims = tuple(dims)
    check(len(dims) == 2, lambda: f"expected total rotation dims == 2, but got dims = {len(dims)}")
    check(a.ndim >= 2, lambda: f"expected total dims >= 2, but got total dims = {a.ndim}")
    d0, d1 = wrap_dim(dims[0], a.ndim), wrap_dim(dims[1], a.ndim)
    check(d0 != d1, lambda: f"expected rotation dims to be different, but got dim0 = {d0} and dim1 = {d1}")
    k = k % 4
    if k == 1:
        return _transpose(flip(a, (d1,)), d0, d1)
    if k == 2:
        return flip(a, (d0, d1))
    if k == 3:
        return _transpose(flip(a, (d0,)), d0, d1)
    return prims.clone(a, torch.contiguous_format)


# ---- repetition ---------------------------------------------------------------------------------------

@register(torch.Tensor.repeat)
def repeat(a: Any, *sizes: Any, **kwargs: Any) -> Any:
    if "repeats" in kwargs:
        sizes = (kwargs.pop("repeats"),)
    check(not kwargs, lambda: f"repeat() got unexpected keyword arguments {sorted(kwargs)}", TypeError)
    sizes = _sizes(sizes, "repeat")
    check(len(sizes) >= a.ndim, lambda: "Number of dimensions of repeat dims can not be smaller than number "
          "of dimensions of tensor")
    check(all(s >= 0 for s in sizes),
          lambda: f"Trying to create tensor with negative dimension: {list(sizes)}")
    shape = (1,) * (len(sizes) - a.ndim) + tuple(a.shape)
    a = prims.view(a, shape) if a.ndim != len(sizes) else a
    # (r0, s0, r1, s1, ...) with the input on the odd dims, then merge each pair
    expanded_shape = tuple(x for r, s in zip(sizes, shape) for x in (r, s))
    expanded = prims.broadcast_in_dim(a, expanded_shape, tuple(range(1, 2 * len(shape), 2)))
    out_shape = tuple(r * s for r, s in zip(sizes, shape))
    return prims.view(prims.clone(expanded, torch.contiguous_format), out_shape)


@register(torch.tile, torch.Tensor.tile)
def tile(a: Any, *dims: Any, **kwargs: Any) -> Any:
    if "dims" in kwargs:
        dims = (kwargs.pop("dims"),)
    check(not kwargs, lambda: f"tile() got unexpected keyword arguments {sorted(kwargs)}", TypeError)
    dims = _sizes(dims, "tile")
    if len(dims) < a.ndim:
        dims = (1,) * (a.ndim - len(dims)) + dims
    return repeat(a, dims)


@register(torch.repeat_interleave, torch.Tensor.repeat_interleave)
def repeat_interleave(a: Any, repeats: Any = None, dim: Any = None, *, output_size: Any = None) -> Any:
    if (is_tensor(repeats) or repeats is None) and output_size is None:  # (alone, `a` is the repeats)
        raise DataDependentShape("repeat_interleave with tensor repeats")
    if not isinstance(repeats, int) or isinstance(repeats, bool) or not is_tensor(a):
        raise NoDecomposition("repeat_interleave with tensor repeats")
    check(repeats >= 0, lambda: "repeats can not be negative")
    if dim is None:
        a = _reshape(a, (-1,))
        d = 0
    else:
        d = wrap_dim(dim, a.ndim)
    shape = tuple(a.shape)
    expanded_shape = shape[:d + 1] + (repeats,) + shape[d + 1:]
    dims = tuple(range(d + 1)) + tuple(range(d + 2, len(expanded_shape)))
    expanded = prims.broadcast_in_dim(a, expanded_shape, dims)
    out_shape = shape[:d] + (shape[d] * repeats,) + shape[d + 1:]
    return prims.view(prims.clone(expanded, torch.contiguous_format), out_shape)


# ---- triangles and diagonals --------------------------------------------------------------------------

def _triangle(a: Any, diagonal: int, op: str, lower: bool) -> Any:
    check(a.ndim >= 2, lambda: f"{op}: input tensor must have at least 2 dimensions")
    rows, cols = a.shape[-2], a.shape[-1]
    device = a.device
    r = prims.broadcast_in_dim(prims.iota(rows, 0, 1, torch.int64, device), (rows, cols), (0,))
    c = prims.broadcast_in_dim(prims.iota(cols, 0, 1, torch.int64, device), (rows, cols), (1,))
    offset = prims.sub(c, r)
    mask = prims.le(offset, diagonal) if lower else prims.ge(offset, diagonal)
    mask = prims.broadcast_in_dim(mask, tuple(a.shape), (a.ndim - 2, a.ndim - 1))
    dtype = a.dtype
    zero = zero_of(dtype)
    return prims.where(mask, a, zero)


@register(torch.tril, torch.Tensor.tril)
def tril(a: Any, diagonal: int = 0, *, out: Any = None) -> Any:
    if out is not None:
        raise NoDecomposition("tril with out=")
    return _triangle(a, diagonal, "tril", True)


@register(torch.triu, torch.Tensor.triu)
def triu(a: Any, diagonal: int = 0, *, out: Any = None) -> Any:
    if out is not None:
        raise NoDecomposition("triu with out=")
    return _triangle(a, diagonal, "triu", False)


def _embed_last(a: Any, offset: int, rows: int | None = None, cols: int | None = None,
                fill: Any = None) -> Any:
    """The last dim of `a` (length L) placed on diagonal `offset` of new trailing rows x cols dims (square,
    N = L + |offset|, by default), by padding: consecutive diagonal entries are cols + 1 apart in the
    flattened matrix."""
    length = a.shape[-1]
    if rows is None:
        rows = cols = length + builtins.abs(offset)
    low = offset if offset >= 0 else -offset * cols
    high = rows * cols - low - length - builtins.max(length - 1, 0) * cols
    dtype = a.dtype
    if fill is None:
        fill = zero_of(dtype)
    config = [(0, 0, 0)] * (a.ndim - 1) + [(low, high, cols)]
    return prims.view(prims.pad(a, fill, config), tuple(a.shape[:-1]) + (rows, cols))


@register(torch.diag_embed, torch.Tensor.diag_embed)
def diag_embed(a: Any, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Any:
    out_ndim = a.ndim + 1
    d1, d2 = wrap_dim(dim1, out_ndim), wrap_dim(dim2, out_ndim)
    check(d1 != d2, lambda: f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    embedded = _embed_last(a, offset)  # (..., rows, cols)
    batch = iter(range(a.ndim - 1))
    perm = tuple(a.ndim - 1 if p == d1 else a.ndim if p == d2 else next(batch) for p in range(out_ndim))
    if perm == tuple(range(out_ndim)):
        return embedded
    return prims.clone(prims.permute(embedded, perm), torch.contiguous_format)


@register(torch.diag, torch.Tensor.diag)
def diag(a: Any, diagonal: int = 0, *, out: Any = None) -> Any:
    if out is not None:
        raise NoDecomposition("diag with out=")
    check(a.ndim in (1, 2), lambda: "diag(): Supports 1D or 2D tensors. Got {}D".format(a.ndim))
    if a.ndim == 1:
        return _embed_last(a, diagonal)
    return prims.clone(prims.diagonal(a, diagonal, 0, 1), torch.contiguous_format)


@register(torch.diagflat)
def diagflat(a: Any, offset: int = 0) -> Any:
    return _embed_last(_reshape(a, (-1,)), offset)


# ---- scatters: a copy with one region replaced ----------------------------------------------------------

def _same_dtype(op: str, a: Any, src: Any) -> None:
    check(is_tensor(src), lambda: f"{op}(): argument 'src' must be Tensor", TypeError)
    check(src.dtype == a.dtype, lambda: f"{op}: expected src to have the same dtype as self, got {src.dtype} "
          f"and {a.dtype}")


def _scatter_region(op: str, a: Any, src: Any, dim: int, region: tuple, view_shape: tuple) -> Any:
    _same_dtype(op, a, src)
    check(tuple(src.shape) == view_shape, lambda: f"{op}: expected src to have a size equal to the slice of "
          f"self. src size = {list(src.shape)}, slice size = {list(view_shape)}")
    ranges = [(0, s, 1) for s in a.shape]
    ranges[dim] = region
    value = src if src.ndim == a.ndim else prims.expand_dims(src, (dim,))
    return preserve_layout(place(a, value, ranges), a)  # eager writes src into a clone of a


@register(torch.select_scatter)
def select_scatter(a: Any, src: Any, dim: int, index: int) -> Any:
    d = wrap_dim(dim, a.ndim)
    size = a.shape[d]
    check(-size <= index < size, lambda: f"select_scatter(): index {index} out of range for tensor of size "
          f"{list(a.shape)} at dimension {dim}", IndexError)
    index = index + size if index < 0 else index
    view_shape = tuple(a.shape[:d]) + tuple(a.shape[d + 1:])
    return _scatter_region("select_scatter", a, src, d, (index, 1, 1), view_shape)


@register(torch.slice_scatter)
def slice_scatter(a: Any, src: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Any:
    d = wrap_dim(dim, a.ndim)
    lo, hi, step = _slice_bounds(slice(start, end, step), a.shape[d])
    count = -(-(hi - lo) // step)
    view_shape = tuple(count if k == d else s for k, s in enumerate(a.shape))
    return _scatter_region("slice_scatter", a, src, d, (lo, count, step), view_shape)


@register(torch.diagonal_scatter)
def diagonal_scatter(a: Any, src: Any, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Any:
    _same_dtype("diagonal_scatter", a, src)
    d1, d2 = wrap_dim(dim1, a.ndim), wrap_dim(dim2, a.ndim)
    check(d1 != d2, lambda: f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    diag_view = prims.diagonal(a, offset, d1, d2)
    check(tuple(src.shape) == tuple(diag_view.shape), lambda: f"diagonal_scatter: expected src to have a "
          f"size equal to the diagonal of self. src size = {list(src.shape)}, diagonal size = "
          f"{list(diag_view.shape)}")
    rows, cols = a.shape[d1], a.shape[d2]
    placed = _embed_last(src, offset, rows, cols)  # (batch..., rows, cols)
    mask = _embed_last(prims.full(tuple(src.shape), True, torch.bool, a.device), offset, rows, cols, False)
    batch = iter(range(a.ndim - 2))
    perm = tuple(a.ndim - 2 if p == d1 else a.ndim - 1 if p == d2 else next(batch) for p in range(a.ndim))
    if perm != tuple(range(a.ndim)):  # contiguous operands, so the result is laid out as a fresh tensor
        mask = prims.clone(prims.permute(mask, perm), torch.contiguous_format)
        placed = prims.clone(prims.permute(placed, perm), torch.contiguous_format)
    return preserve_layout(prims.where(mask, placed, a), a)  # eager writes src into a clone of a


# ---- grids ----------------------------------------------------------------------------------------------

@register(torch.meshgrid)
def meshgrid(*tensors: Any, indexing: str | None = None) -> Any:
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    indexing = indexing or "ij"
    check(indexing in ("ij", "xy"), lambda: f"torch.meshgrid: indexing must be one of \"xy\" or \"ij\", but "
          f"received: {indexing}")
    for t in tensors:
        check(t.ndim <= 1,
              lambda: f"torch.meshgrid: Expected 0D or 1D tensor in the tensor list but got: {t}")
    check(len(tensors) > 0, lambda: "meshgrid expects a non-empty TensorList")
    for t in tensors[1:]:
        check(t.dtype == tensors[0].dtype, lambda: "meshgrid expects all tensors to have the same dtype")
    swap = indexing == "xy" and len(tensors) >= 2
    order = list(range(len(tensors)))
    if swap:
        order[0], order[1] = 1, 0
    ordered = [tensors[i] for i in order]
    shape = tuple(t.numel() for t in ordered)
    grids = []
    for i, t in enumerate(ordered):
        view_shape = tuple(shape[i] if k == i else 1 for k in range(len(shape)))
        grids.append(_expand(prims.view(t, view_shape), shape))
    if swap:  # 'xy': the grid was built for (t1, t0, ...); return the tensors' grids in their given order
        grids[0], grids[1] = grids[1], grids[0]
    return tuple(grids)


@register(torch.cartesian_prod)
def cartesian_prod(*tensors: Any) -> Any:
    if len(tensors) == 1:
        return tensors[0]
    grids = meshgrid(*tensors, indexing="ij")
    return stack([_reshape(g, (-1,)) for g in grids], 1)


@register(torch.block_diag)
def block_diag(*tensors: Any) -> Any:
    for i, t in enumerate(tensors):
        check(t.ndim <= 2, lambda: f"torch.block_diag: Input tensors must have 2 or fewer dimensions. Input "
              f"{i} has {t.ndim} dimensions")
    if not tensors:
        return prims.full((1, 0), 0.0, torch.get_default_dtype())
    dtype = result_type(*[t.dtype for t in tensors])
    mats = [prims.view(t, (1, t.numel()) if t.ndim < 2 else tuple(t.shape)) for t in tensors]
    total = sum(m.shape[1] for m in mats)
    zero = zero_of(dtype)
    rows, col = [], 0
    for m in mats:
        m = m if m.dtype == dtype else prims.convert_element_type(m, dtype)
        rows.append(prims.pad(m, zero, [(0, 0, 0), (col, total - col - m.shape[1], 0)]))
        col += m.shape[1]
    return prims.cat(rows, 0)


# ---- the *_copy ops: the view op's result, copied to a contiguous tensor --------------------------------

def _copy_of(view_op: Any) -> Any:
    def copy(*args: Any, out: Any = None, **kwargs: Any) -> Any:
        if out is not None:
            raise NoDecomposition("a *_copy op with out=")
        result = view_op(*args, **kwargs)
        if isinstance(result, (tuple, list)):
            return type(result)(prims.clone(r, torch.contiguous_format) for r in result)
        return prims.clone(result, torch.contiguous_format)
    return copy


def _register_copies() -> None:
    pairs = [("view_copy", views.view), ("permute_copy", views.permute), ("expand_copy", views.expand),
             ("diagonal_copy", views.diagonal), ("squeeze_copy", views.squeeze),
             ("unsqueeze_copy", views.unsqueeze), ("transpose_copy", views.transpose), ("t_copy", views.t),
             ("unbind_copy", views.unbind), ("split_with_sizes_copy", views.split_with_sizes),
             ("split_copy", views.split), ("narrow_copy", views.narrow), ("select_copy", views.select),
             ("unfold_copy", views.unfold), ("alias_copy", lambda a: prims.squeeze(a, ()))]
    for name, view_op in pairs:
        for target in (getattr(torch, name, None), getattr(torch.Tensor, name, None)):
            if target is not None:
                register(target)(_copy_of(view_op))


_register_copies()
