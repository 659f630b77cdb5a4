"""Indexing prims: gather, scatter, index_select, advanced indexing (index, index_put).

Strict rules: integer indices are int64 (decompositions convert int32 and refuse bool masks, whose result
shapes depend on data); tensor operands that combine share one dtype; nothing broadcasts.

gather(a, dim, index)                   out[i][j] = a[index[i][j]][j] (dim 0); shape of index
scatter(a, dim, index, src)             a copy of `a` with src (a tensor or a number) written at index
scatter_add(a, dim, index, src)         ... with src added at index
scatter_reduce(a, dim, index, src, reduce, include_self)   reduce is sum, prod, mean, amax or amin
index_select(a, dim, index)             a with dim `dim` replaced by the entries index (1-d) selects
index(a, indices)                       advanced indexing; indices has one entry per leading dim of `a`:
                                        None (the whole dim) or an int64 tensor; the tensors share one shape.
                                        Negative indices count from the end, as in eager `a[idx]`.
index_put(a, indices, values, accumulate)  a copy of `a` with `values` (shaped as index(a, indices))
                                        written (or added) at the indexed positions
gather, scatter and index_select do not wrap negative indices; out-of-range indices raise at run time.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from ..graph import TensorMeta
from ..graph.layout import elementwise_strides
from .shape import view_strides
from .registry import check, is_tensor, meta_of, prim, rule, shape_text, wrap_dim


def _tensor(name: str, what: str, v: Any) -> TensorMeta:
    check(is_tensor(v), lambda: f"prims.{name}: expected {what} to be a tensor, got {type(v).__name__}",
          TypeError)
    return meta_of(v)


def _long_index(name: str, index: Any) -> TensorMeta:
    m = _tensor(name, "index", index)
    check(m.dtype == torch.int64, lambda: f"prims.{name}: Expected dtype int64 for index, got {m.dtype}")
    return m


def _dims(m: TensorMeta) -> tuple:
    """Shape with a 0-d tensor counted as 1-d of size 1, as eager's gather/scatter checks do."""
    return tuple(m.shape) if m.ndim > 0 else (1,)


# ---- gather ---------------------------------------------------------------------------------------------

def _gather_meta(a: Any, dim: int, index: Any) -> TensorMeta:
    m = _tensor("gather", "input", a)
    dim = wrap_dim(dim, m.ndim, "gather")
    im = _long_index("gather", index)
    check(max(m.ndim, 1) == max(im.ndim, 1),
          lambda: "gather(): Index tensor must have the same number of dimensions as input tensor "
                  f"(input {shape_text(a)}, index {shape_text(index)})")
    if im.numel() != 0:
        for d, (isz, asz) in enumerate(zip(_dims(im), _dims(m))):
            check(d == dim or isz <= asz,
                  lambda: f"gather(): Size does not match at dimension {d} expected index "
                          f"{shape_text(index)} to be no larger than self {shape_text(a)} apart from "
                          f"dimension {dim}")
    return TensorMeta(im.shape, m.dtype, m.device)


gather = prim("gather", _gather_meta, lambda a, dim, index: torch.gather(a, dim, index), tags=("indexing",))


# ---- scatter family -------------------------------------------------------------------------------------

def _scatter_check(name: str, a: Any, dim: int, index: Any, src: Any, number_ok: bool) -> TensorMeta:
    m = _tensor(name, "input", a)
    dim = wrap_dim(dim, m.ndim, name)
    im = _long_index(name, index)
    check(max(m.ndim, 1) == max(im.ndim, 1),
          lambda: f"{name}(): Index tensor must have the same number of dimensions as self tensor "
                  f"(self {shape_text(a)}, index {shape_text(index)})")
    if is_tensor(src):
        sm = meta_of(src)
        check(sm.dtype == m.dtype, lambda: f"{name}(): Expected self.dtype to be equal to src.dtype "
              f"(got {m.dtype} and {sm.dtype})")
        check(max(sm.ndim, 1) == max(im.ndim, 1),
              lambda: f"{name}(): Index tensor must have the same number of dimensions as src tensor "
                      f"(src {shape_text(src)}, index {shape_text(index)})")
        if im.numel() != 0:
            ok = all((d == dim or isz <= asz) and isz <= ssz
                     for d, (isz, asz, ssz) in enumerate(zip(_dims(im), _dims(m), _dims(sm))))
            check(ok, lambda: f"{name}(): Expected index {shape_text(index)} to be no larger than self "
                              f"{shape_text(a)} apart from dimension {dim} and to be no larger size than "
                              f"src {shape_text(src)}")
    else:
        check(number_ok and isinstance(src, (bool, int, float, complex)),
              lambda: f"prims.{name}: expected src to be a tensor, got {type(src).__name__}", TypeError)
        kinds = {bool: 0, int: 1, float: 2, complex: 3}
        kind = (0 if m.dtype == torch.bool else 3 if m.dtype.is_complex
                else 2 if m.dtype.is_floating_point else 1)
        check(kinds[type(src)] <= kind, lambda: f"prims.{name}: a {type(src).__name__} value cannot be "
              f"written to a {m.dtype} tensor without conversion", TypeError)
        if im.numel() != 0:
            ok = all(d == dim or isz <= asz for d, (isz, asz) in enumerate(zip(_dims(im), _dims(m))))
            check(ok, lambda: f"{name}(): Expected index {shape_text(index)} to be no larger than self "
                              f"{shape_text(a)} apart from dimension {dim}")
    return TensorMeta(m.shape, m.dtype, m.device)


def _scatter_meta(a: Any, dim: int, index: Any, src: Any) -> TensorMeta:
    return _scatter_check("scatter", a, dim, index, src, number_ok=True)


def _scatter_ref(a: torch.Tensor, dim: int, index: torch.Tensor, src: Any) -> torch.Tensor:
    return torch.scatter(a, dim, index, src)


scatter = prim("scatter", _scatter_meta, _scatter_ref, tags=("indexing",))


@rule("inplace_ref", scatter)
def _scatter_inplace_ref(a: torch.Tensor, dim: int, index: torch.Tensor, src: Any) -> torch.Tensor:
    """scatter into `a` itself, returning `a`: the fallback of a scatter whose result is the new value of
    the graph input `a` (a static KV cache's index_copy_), which reads nothing of `a` after it
    (kiln.schedule.memory decides). It writes only the scattered elements where the out-of-place scatter
    and the write-back copy would read and write all of `a` twice. Where `index` or `src` shares `a`'s
    memory, the copy is taken first, as the out-of-place scatter does."""
    shared = a.untyped_storage().data_ptr()
    if any(isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == shared for t in (index, src)) \
            or a.requires_grad:
        with torch.no_grad():
            return a.copy_(torch.scatter(a, dim, index, src))
    return a.scatter_(dim, index, src)


def _scatter_add_meta(a: Any, dim: int, index: Any, src: Any) -> TensorMeta:
    return _scatter_check("scatter_add", a, dim, index, src, number_ok=False)


scatter_add = prim("scatter_add", _scatter_add_meta,
                   lambda a, dim, index, src: torch.scatter_add(a, dim, index, src), tags=("indexing",))

SCATTER_REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")


def _scatter_reduce_meta(a: Any, dim: int, index: Any, src: Any, reduce: str,
                         include_self: bool = True) -> TensorMeta:
    check(reduce in SCATTER_REDUCTIONS, lambda: "scatter_reduce(): reduce argument must be either sum, prod, "
          f"mean, amax or amin, got {reduce}")
    return _scatter_check("scatter_reduce", a, dim, index, src, number_ok=False)


def _scatter_reduce_ref(a: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, reduce: str,
                        include_self: bool = True) -> torch.Tensor:
    return torch.scatter_reduce(a, dim, index, src, reduce, include_self=include_self)


scatter_reduce = prim("scatter_reduce", _scatter_reduce_meta, _scatter_reduce_ref, tags=("indexing",))


# ---- index_select ---------------------------------------------------------------------------------------

def _index_select_meta(a: Any, dim: int, index: Any) -> TensorMeta:
    m = _tensor("index_select", "input", a)
    dim = wrap_dim(dim, m.ndim, "index_select")
    im = _long_index("index_select", index)
    check(im.ndim <= 1, lambda: f"index_select(): Index is supposed to be a vector, got {shape_text(index)}",
          IndexError)
    count = im.numel()
    if m.ndim == 0:
        check(count == 1, lambda: f"index_select(): Index to scalar can have only 1 value, got {count} "
              "value(s)", IndexError)
        return TensorMeta((), m.dtype, m.device)
    shape = list(m.shape)
    shape[dim] = count
    return TensorMeta(tuple(shape), m.dtype, m.device)


index_select = prim("index_select", _index_select_meta,
                    lambda a, dim, index: torch.index_select(a, dim, index), tags=("indexing",))


# ---- advanced indexing ----------------------------------------------------------------------------------

def index_result_shape(shape: Sequence[Any], index_shape: Sequence[Any], positions: Sequence[int]) -> tuple:
    """The shape of `a[indices]` for tensor indices (of one shape) at `positions` among a's dims.

    Adjacent positions put the index shape where they stand; separated ones put it first (numpy's rule).
    """
    positions = list(positions)
    rest = [s for d, s in enumerate(shape) if d not in positions]
    adjacent = positions == list(range(positions[0], positions[-1] + 1))
    at = positions[0] if adjacent else 0
    return tuple(rest[:at]) + tuple(index_shape) + tuple(rest[at:])


def _index_check(name: str, a: Any, indices: Any) -> tuple[TensorMeta, tuple]:
    m = _tensor(name, "input", a)
    check(isinstance(indices, (list, tuple)), lambda: f"prims.{name}: indices must be a list of tensors or "
          f"None, got {type(indices).__name__}", TypeError)
    check(len(indices) > 0, lambda: f"{name}(): at least one index must be provided", IndexError)
    check(len(indices) <= m.ndim, lambda: f"{name}(): too many indices for tensor of dimension {m.ndim} "
          f"(got {len(indices)})", IndexError)
    positions = [d for d, i in enumerate(indices) if i is not None]
    check(bool(positions), lambda: f"prims.{name}: at least one index must be a tensor", IndexError)
    first = None
    for d in positions:
        im = _tensor(name, f"index {d}", indices[d])
        check(im.dtype == torch.int64, lambda: f"prims.{name}: index {d} must be int64, got {im.dtype} "
              "(decompositions convert int32 and refuse bool masks)", IndexError)
        check(im.device == m.device,
              lambda: f"prims.{name}: index {d} is on {im.device}, input on {m.device}")
        if first is None:
            first = im
        check(im.shape == first.shape, lambda: f"prims.{name}: index tensors must have one shape (prims do "
              f"not broadcast), got {', '.join(shape_text(indices[p]) for p in positions)}", IndexError)
    return m, index_result_shape(m.shape, first.shape, positions)


def _index_meta(a: Any, indices: Sequence[Any]) -> TensorMeta:
    m, shape = _index_check("index", a, indices)
    return TensorMeta(shape, m.dtype, m.device, _index_strides(m, indices, shape))


def _index_strides(m: TensorMeta, indices: Sequence[Any], shape: tuple) -> tuple:
    """Eager's layout of an advanced-indexing result: a TensorIterator over the input restrided to the
    result's shape (its indexed dims, moved to the front when not adjacent, replaced by the index shape with
    stride 0) and the index tensors (stride 0 outside the index shape)."""
    positions = [d for d, i in enumerate(indices) if i is not None]
    index_meta = meta_of(indices[positions[0]])
    adjacent = positions == list(range(positions[0], positions[-1] + 1))
    order = list(range(m.ndim)) if adjacent else positions + [d for d in range(m.ndim) if d not in positions]
    before = positions[0] if adjacent else 0
    after = m.ndim - before - len(positions)
    k = len(index_meta.shape)
    source = [m.strides[d] for d in order]
    operands = [tuple(source[:before]) + (0,) * k + tuple(source[before + len(positions):])]
    for d in positions:  # eager views each index as (1,) * before + its shape + (1,) * after
        im = meta_of(indices[d])
        viewed = view_strides(im.shape, im.strides, (1,) * before + tuple(im.shape) + (1,) * after)
        viewed = viewed or (0,) * len(shape)
        # a dim the index broadcasts along has stride 0; a size-1 dim of the result keeps the view's
        operands.append(tuple(s if before <= d < before + k or shape[d] == 1 else 0
                              for d, s in enumerate(viewed)))
    return elementwise_strides(shape, operands, scalars=bool(before or after))


def _index_ref(a: torch.Tensor, indices: Sequence[Any]) -> torch.Tensor:
    return torch.ops.aten.index.Tensor(a, list(indices))


index = prim("index", _index_meta, _index_ref, tags=("indexing",))


def _index_put_meta(a: Any, indices: Sequence[Any], values: Any, accumulate: bool = False) -> TensorMeta:
    m, shape = _index_check("index_put", a, indices)
    vm = _tensor("index_put", "values", values)
    check(vm.dtype == m.dtype, lambda: "Index put requires the source and destination dtypes match, got "
          f"{m.dtype} for the destination and {vm.dtype} for the source.")
    check(tuple(vm.shape) == tuple(shape),
          lambda: f"prims.index_put: values of shape {shape_text(values)} must have the indexing result's "
                  f"shape [{', '.join(map(str, shape))}] (prims do not broadcast)")
    return TensorMeta(m.shape, m.dtype, m.device)


def _index_put_ref(a: torch.Tensor, indices: Sequence[Any], values: torch.Tensor,
                   accumulate: bool = False) -> torch.Tensor:
    return torch.ops.aten.index_put.default(a, list(indices), values, accumulate)


index_put = prim("index_put", _index_put_meta, _index_put_ref, tags=("indexing",))
