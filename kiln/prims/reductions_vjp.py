"""Reverse-mode derivatives (vjp rules) of the reduction prims, as eager autograd computes them.

sum       the gradient broadcast back over the reduced dims
prod      the gradient times the product of the other elements of the group, computed from exclusive
          products from both ends (exact with any number of zeros, where eager's out / a divides by zero)
amax/amin the gradient shared evenly by the elements equal to the result (eager's grad / count * mask)
var       grad * 2 (a - mean) / (N - correction);  var_mean adds the mean's gradient / N
argmax/argmin have none.
"""
from __future__ import annotations

from typing import Any, Sequence

from . import elementwise as ew
from . import extern, shape
from .common_vjp import (inverse_permutation, no_gradient, refuse_complex, reshape, restore_dims,
                         static_size, vjp)
from .reductions import amax, amin, argmax, argmin, prod, sum, var, var_mean  # noqa: A004
from .registry import meta_of


def _group_size(a_shape: Sequence[Any], dims: Sequence[int]) -> Any:
    n: Any = 1
    for d in dims:
        n = n * a_shape[d]
    return n


def _reduced_count(name: str, a_shape: Sequence[Any], dims: Sequence[int]) -> int:
    return static_size(name, _group_size(a_shape, dims))


@vjp(sum)
def _sum_vjp(grads: tuple, outputs: tuple, a: Any, dims: Sequence[int]) -> tuple:
    (g,) = grads
    return (restore_dims(g, meta_of(a).shape, tuple(dims)), None)


# ---- prod -----------------------------------------------------------------------------------------------

def _product_of_others(x: Any, dim: int) -> Any:
    """For each element along `dim`, the product of all the other elements there (no division)."""
    ndim = meta_of(x).ndim
    before = [(0, 0, 0)] * ndim
    after = [(0, 0, 0)] * ndim
    before[dim] = (1, -1, 0)  # [1, x0, ..., x(n-2)]
    after[dim] = (-1, 1, 0)   # [x1, ..., x(n-1), 1]
    left = extern.cumprod(shape.pad(x, 1, before), dim)  # prod of x[k] for k < i
    right = shape.rev(extern.cumprod(shape.rev(shape.pad(x, 1, after), (dim,)), dim), (dim,))  # k > i
    return ew.mul(left, right)


@vjp(prod)
def _prod_vjp(grads: tuple, outputs: tuple, a: Any, dims: Sequence[int]) -> tuple:
    (g,) = grads
    refuse_complex("prod", a)
    dims = tuple(dims)
    m = meta_of(a)
    if not dims:
        return (g, None)
    if len(dims) == 1:
        others = _product_of_others(a, dims[0])
        return (ew.mul(others, restore_dims(g, m.shape, dims)), None)
    # several dims: move them last and flatten them into one, so each group is one row
    kept = [d for d in range(m.ndim) if d not in dims]
    order = kept + list(dims)
    rows = reshape(shape.permute(a, order), [m.shape[d] for d in kept] + [_group_size(m.shape, dims)])
    others = _product_of_others(rows, len(kept))
    rows_shape = meta_of(rows).shape
    grad_rows = ew.mul(others, shape.broadcast_in_dim(g, rows_shape, tuple(range(len(kept)))))
    grad = reshape(grad_rows, [m.shape[d] for d in order])
    return (shape.permute(grad, inverse_permutation(order)), None)


# ---- amax / amin ----------------------------------------------------------------------------------------

def _extremum_vjp(grads: tuple, outputs: tuple, a: Any, dims: Sequence[int]) -> tuple:
    (g,) = grads
    dims = tuple(dims)
    if not dims:
        return (g, None)
    m = meta_of(a)
    mask = ew.convert_element_type(ew.eq(a, restore_dims(outputs[0], m.shape, dims)), m.dtype)
    count = sum(mask, dims)
    # eager's order: (grad / count) * mask, so a NaN result (no element equal to it) gives NaN
    return (ew.mul(restore_dims(ew.div(g, count), m.shape, dims), mask), None)


vjp(amax)(_extremum_vjp)
vjp(amin)(_extremum_vjp)
no_gradient(argmax)
no_gradient(argmin)


# ---- var / var_mean -------------------------------------------------------------------------------------

def _centred_scaled(a: Any, dims: tuple, correction: float, mean: Any) -> Any:
    """2 (a - mean) / (N - correction), the derivative of the variance."""
    m = meta_of(a)
    n = _reduced_count("var", m.shape, dims)
    if mean is None:
        mean = ew.div(sum(a, dims), n) if dims else a
    centred = ew.sub(a, restore_dims(mean, m.shape, dims)) if dims else ew.sub(a, a)
    denominator = n - correction
    scale = 2.0 / denominator if denominator != 0 else float("inf")
    return ew.mul(centred, scale)


@vjp(var)
def _var_vjp(grads: tuple, outputs: tuple, a: Any, dims: Sequence[int], correction: float) -> tuple:
    (g,) = grads
    refuse_complex("var", a)
    dims = tuple(dims)
    grad = ew.mul(_centred_scaled(a, dims, correction, None), restore_dims(g, meta_of(a).shape, dims))
    return (grad, None, None)


@vjp(var_mean)
def _var_mean_vjp(grads: tuple, outputs: tuple, a: Any, dims: Sequence[int], correction: float) -> tuple:
    g_var, g_mean = grads
    refuse_complex("var_mean", a)
    dims = tuple(dims)
    m = meta_of(a)
    grad = None
    if g_var is not None:
        grad = ew.mul(_centred_scaled(a, dims, correction, outputs[1]), restore_dims(g_var, m.shape, dims))
    if g_mean is not None:
        n = _reduced_count("var_mean", m.shape, dims)
        from_mean = restore_dims(ew.div(g_mean, n), m.shape, dims)
        grad = from_mean if grad is None else ew.add(grad, from_mean)
    return (grad, None, None)
