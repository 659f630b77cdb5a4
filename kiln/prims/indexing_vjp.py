"""Reverse-mode derivatives (vjp rules) of the indexing prims, as eager autograd computes them.

gather        scatter_add of the gradient into zeros at the gathered positions (repeats add up)
scatter       self: the gradient with the written positions zeroed; src: the gradient gathered there
scatter_add   self: the gradient; src: the gradient gathered
scatter_reduce  sum, mean, amax and amin as eager (amax/amin share among ties); prod is refused
index_select, index   index_put with accumulate into zeros
index_put     self: the gradient, with the written positions zeroed unless accumulating; values: the
              gradient indexed
Index tensors get no gradient.
"""
from __future__ import annotations

from typing import Any, Sequence

from . import creation
from . import elementwise as ew
from . import shape
from .common_vjp import reshape, vjp, zeros, zeros_like
from .indexing import gather, index, index_put, index_select, scatter, scatter_add, scatter_reduce
from .registry import is_tensor, meta_of, wrap_dim


def _fit(grad: Any, like: Any) -> Any:
    """A gradient gathered at `index` (index's shape) padded with zeros to the shape of `like`, whose dims
    may be longer (scatter reads only src[:index.shape])."""
    gm, lm = meta_of(grad), meta_of(like)
    if tuple(gm.shape) == tuple(lm.shape):
        return grad
    if gm.ndim != lm.ndim:  # a 0-d src with a 1-element index
        return reshape(grad, lm.shape)
    return shape.pad(grad, 0, [(0, s - n, 0) for n, s in zip(gm.shape, lm.shape)])


def _full_like(a: Any, value: Any) -> Any:
    m = meta_of(a)
    return creation.full(m.shape, value, m.dtype, m.device)


@vjp(gather)
def _gather_vjp(grads: tuple, outputs: tuple, a: Any, dim: int, index_: Any) -> tuple:
    (g,) = grads
    dim = wrap_dim(dim, meta_of(a).ndim)
    return (scatter_add(zeros_like(a), dim, index_, g), None, None)


@vjp(scatter)
def _scatter_vjp(grads: tuple, outputs: tuple, a: Any, dim: int, index_: Any, src: Any) -> tuple:
    (g,) = grads
    dim = wrap_dim(dim, meta_of(a).ndim)
    grad_self = scatter(g, dim, index_, 0)
    grad_src = _fit(gather(g, dim, index_), src) if is_tensor(src) else None
    return (grad_self, None, None, grad_src)


@vjp(scatter_add)
def _scatter_add_vjp(grads: tuple, outputs: tuple, a: Any, dim: int, index_: Any, src: Any) -> tuple:
    (g,) = grads
    dim = wrap_dim(dim, meta_of(a).ndim)
    return (g, None, None, _fit(gather(g, dim, index_), src))


@vjp(scatter_reduce)
def _scatter_reduce_vjp(grads: tuple, outputs: tuple, a: Any, dim: int, index_: Any, src: Any, reduce: str,
                        include_self: bool = True) -> tuple:
    (g,) = grads
    m = meta_of(a)
    dim = wrap_dim(dim, m.ndim)
    if reduce == "sum":
        grad_self = g
        grad_src = gather(g, dim, index_)
    elif reduce == "mean":
        # each output element was divided by the number of values it averaged (self counted when included)
        counts = _full_like(a, 1 if include_self else 0)
        counts = scatter_add(counts, dim, index_, _full_like(src, 1))
        counts = ew.where(ew.eq(counts, 0), 1, counts)
        grad_self = ew.div(g, counts)
        grad_src = gather(grad_self, dim, index_)
    elif reduce in ("amax", "amin"):
        result = outputs[0]
        self_is_result = ew.convert_element_type(ew.eq(a, result), m.dtype)
        src_is_result = ew.convert_element_type(ew.eq(src, gather(result, dim, index_)), m.dtype)
        ties = scatter_add(self_is_result, dim, index_, src_is_result)
        shared = ew.div(g, ties)
        grad_self = ew.mul(self_is_result, shared)
        grad_src = ew.mul(src_is_result, gather(shared, dim, index_))
    else:
        raise NotImplementedError(f"prims.scatter_reduce: no derivative for reduce={reduce!r} (the product's "
                                  "derivative needs each group's zero count); sum, mean, amax and amin have "
                                  "one")
    if not include_self:
        grad_self = scatter(grad_self, dim, index_, 0)
    return (grad_self, None, None, _fit(grad_src, src), None, None)


@vjp(index_select)
def _index_select_vjp(grads: tuple, outputs: tuple, a: Any, dim: int, index_: Any) -> tuple:
    (g,) = grads
    m = meta_of(a)
    if m.ndim == 0:
        return (g, None, None)
    dim = wrap_dim(dim, m.ndim)
    if meta_of(index_).ndim == 0:
        index_ = shape.expand_dims(index_, (0,))
    return (index_put(zeros_like(a), [None] * dim + [index_], g, True), None, None)


@vjp(index)
def _index_vjp(grads: tuple, outputs: tuple, a: Any, indices: Sequence[Any]) -> tuple:
    (g,) = grads
    return (index_put(zeros_like(a), list(indices), g, True), None)


@vjp(index_put)
def _index_put_vjp(grads: tuple, outputs: tuple, a: Any, indices: Sequence[Any], values: Any,
                   accumulate: bool = False) -> tuple:
    (g,) = grads
    indices = list(indices)
    vm = meta_of(values)
    grad_self = g if accumulate else index_put(g, indices, zeros(vm.shape, vm.dtype, vm.device), False)
    return (grad_self, None, index(g, indices), None)
