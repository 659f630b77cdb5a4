"""Decompositions of torch reductions: sum, mean, prod, amax/amin, max/min, argmax/argmin, var/std and
their _mean forms, norms, logsumexp, any/all, count_nonzero, aminmax, nansum/nanmean.

Reduction prims take explicit dims and drop them; `keepdim=True` re-inserts size-1 dims with
`prims.broadcast_in_dim`. Dtypes follow torch: integer and bool sums and products accumulate in int64,
`dtype=` converts the input first, float16/bfloat16 accumulate in float32 and round back.
"""
from __future__ import annotations

import builtins
import math
from typing import Any, Sequence

import torch

from ..graph.symbolic import SymInt
from .. import prims
from ..prims.registry import check, wrap_dim
from .registry import NoDecomposition
from .utils import (computation_dtype, convert, decomposition, full_like, is_float_dtype, is_tensor, method,
                    root_of_sum, scalar_type_name, wants_gradient)


def reduction_dims(input: Any, dim: Any) -> tuple[int, ...]:
    """dim (None, an int, or a sequence; empty means every dim) as sorted non-negative dims of input."""
    ndim = input.ndim
    if dim is None:
        return tuple(range(ndim))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    wrapped = tuple(wrap_dim(d, ndim) for d in dims)
    check(len(set(wrapped)) == len(wrapped),
          lambda: f"dim {wrapped[0]} appears multiple times in the list of dims")
    if ndim == 0:
        return ()
    return tuple(sorted(set(wrapped))) if wrapped else tuple(range(ndim))


def keep_dims(out: Any, input: Any, dims: Sequence[int], keepdim: bool) -> Any:
    """Re-insert the reduced dims as size-1 dims when keepdim is set."""
    if not keepdim or not dims:
        return out
    shape = tuple(1 if i in dims else s for i, s in enumerate(input.shape))
    kept = tuple(i for i in range(input.ndim) if i not in dims)
    return prims.broadcast_in_dim(out, shape, kept)


def _numel(input: Any, dims: Sequence[int]) -> Any:
    n = 1
    for d in dims:
        n = n * input.shape[d]
    return n


# ---- sum, prod, mean ------------------------------------------------------------------------------------

def _accumulate_dtype(input: Any, dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        return dtype
    if not is_float_dtype(input.dtype):
        return torch.int64
    return input.dtype


def _sum_prod(prim: Any, input: Any, dim: Any, keepdim: bool, dtype: torch.dtype | None) -> Any:
    out_dtype = _accumulate_dtype(input, dtype)
    dims = reduction_dims(input, dim)
    # the input converts to dtype first; a bool result accumulates in int64 (sum: any, prod: all). A float16
    # sum stays a float16 prim: its meaning is eager's (accumulate in float32, round once).
    compute = torch.int64 if out_dtype == torch.bool else out_dtype
    x = convert(convert(input, out_dtype), compute)
    out = convert(prim(x, dims), out_dtype)
    return keep_dims(out, input, dims, keepdim)


@decomposition(torch.sum, method("sum"))
def sum(input: Any, dim: Any = None, keepdim: bool = False, *,  # noqa: A001
        dtype: torch.dtype | None = None) -> Any:
    if isinstance(dim, torch.dtype):  # sum(input, dtype) positionally
        dim, dtype = None, dim
    return _sum_prod(prims.sum, input, dim, keepdim, dtype)


@decomposition(torch.nansum, method("nansum"))
def nansum(input: Any, dim: Any = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Any:
    check(not input.dtype.is_complex, lambda: "nansum does not support complex inputs")
    if input.dtype.is_floating_point:
        input = prims.where(prims.isnan(input), 0.0, input)
    return _sum_prod(prims.sum, input, dim, keepdim, dtype)


@decomposition(torch.prod, method("prod"))
def prod(input: Any, dim: Any = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Any:
    if isinstance(dim, torch.dtype):
        dim, dtype = None, dim
    check(dim is None or isinstance(dim, int), lambda: f"prod(): dim must be an int, got {dim!r}", TypeError)
    return _sum_prod(prims.prod, input, dim, keepdim, dtype)


def _check_mean_dtype(op: str, input: Any, dtype: torch.dtype | None) -> torch.dtype:
    result = dtype if dtype is not None else input.dtype
    check(is_float_dtype(result), lambda: f"{op}(): could not infer output dtype. "
          f"{'Input' if dtype is None else 'Optional'} dtype must be either a floating point or complex "
          f"dtype. "
          f"Got: {scalar_type_name(result)}")
    return result


@decomposition(torch.mean, method("mean"))
def mean(input: Any, dim: Any = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Any:
    if isinstance(dim, torch.dtype):
        dim, dtype = None, dim
    out_dtype = _check_mean_dtype("mean", input, dtype)
    dims = reduction_dims(input, dim)
    compute = computation_dtype(out_dtype)
    total = prims.sum(convert(convert(input, out_dtype), compute), dims)
    n = _numel(input, dims)
    out = convert(prims.div(total, n if isinstance(n, SymInt) else float(n)), out_dtype)
    return keep_dims(out, input, dims, keepdim)


@decomposition(torch.nanmean, method("nanmean"))
def nanmean(input: Any, dim: Any = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Any:
    out_dtype = _check_mean_dtype("nanmean", input, dtype)
    check(input.dtype.is_floating_point, lambda: "nanmean(): expected input to have floating point or "
          f"complex dtype but got {scalar_type_name(input.dtype)}")
    dims = reduction_dims(input, dim)
    compute = computation_dtype(out_dtype)
    x = convert(convert(input, out_dtype), compute)
    present = prims.bitwise_not(prims.isnan(x))
    total = prims.sum(prims.where(present, x, 0.0), dims)
    count = prims.sum(prims.convert_element_type(present, compute), dims)
    return keep_dims(convert(prims.div(total, count), out_dtype), input, dims, keepdim)


# ---- amax, amin, max, min, argmax, argmin -----------------------------------------------------------------

def _extreme(prim: Any, name: str, input: Any, dim: Any, keepdim: bool) -> Any:
    check(not input.dtype.is_complex, lambda: f"{name}(): does not support complex input")
    dims = reduction_dims(input, dim)
    return keep_dims(prim(input, dims), input, dims, keepdim)


@decomposition(torch.amax, method("amax"))
def amax(input: Any, dim: Any = (), keepdim: bool = False) -> Any:
    return _extreme(prims.amax, "amax", input, dim, keepdim)


@decomposition(torch.amin, method("amin"))
def amin(input: Any, dim: Any = (), keepdim: bool = False) -> Any:
    return _extreme(prims.amin, "amin", input, dim, keepdim)


def _arg(prim: Any, name: str, input: Any, dim: Any, keepdim: bool) -> Any:
    check(not input.dtype.is_complex, lambda: f"{name}(): does not support complex input")
    check(input.dtype != torch.bool, lambda: f"{name}(): does not support bool input")
    if dim is None:
        dims = tuple(range(input.ndim))
        out = prim(input, dims)
        if keepdim:
            out = prims.broadcast_in_dim(out, (1,) * input.ndim, ())
        return out
    d = wrap_dim(dim, input.ndim)
    dims = (d,) if input.ndim > 0 else ()
    if input.ndim == 0:
        return full_like(input, 0, torch.int64)
    return keep_dims(prim(input, dims), input, dims, keepdim)


@decomposition(torch.argmax, method("argmax"))
def argmax(input: Any, dim: int | None = None, keepdim: bool = False) -> Any:
    return _arg(prims.argmax, "argmax", input, dim, keepdim)


@decomposition(torch.argmin, method("argmin"))
def argmin(input: Any, dim: int | None = None, keepdim: bool = False) -> Any:
    return _arg(prims.argmin, "argmin", input, dim, keepdim)


def _max_min(name: str, input: Any, args: tuple, kwargs: dict) -> Any:
    reduce_prim, arg_prim, pairwise = ((prims.amax, prims.argmax, "maximum") if name == "max" else
                                       (prims.amin, prims.argmin, "minimum"))
    other = kwargs.pop("other", None)
    if args and is_tensor(args[0]):
        other = args[0]
        args = args[1:]
    if other is not None:
        check(not args and not kwargs, lambda: f"{name}(input, other) takes no other arguments")
        return getattr(torch, pairwise)(input, other)
    dim = args[0] if args else kwargs.pop("dim", None)
    keepdim = args[1] if len(args) > 1 else kwargs.pop("keepdim", False)
    check(not kwargs, lambda: f"{name}() got unexpected arguments {sorted(kwargs)}", TypeError)
    check(not input.dtype.is_complex, lambda: f"{name}(): does not support complex input")
    if dim is None:
        check(input.numel() != 0, lambda: f"{name}(): Expected reduction dim to be specified for "
              f"input.numel() == 0. Specify the reduction dim with the 'dim' argument.")
        return reduce_prim(input, tuple(range(input.ndim)))
    check(isinstance(dim, int), lambda: f"{name}(): dim must be an int, got {dim!r}", TypeError)
    d = wrap_dim(dim, input.ndim)
    if input.ndim == 0:
        values = prims.convert_element_type(input, input.dtype)
        indices = full_like(values, 0, torch.int64)
    else:
        check(input.shape[d] != 0, lambda: f"{name}(): Expected reduction dim {d} to have non-zero size.",
              IndexError)
        ordered = prims.convert_element_type(input, torch.uint8) if input.dtype == torch.bool else input
        indices = keep_dims(arg_prim(ordered, (d,)), input, (d,), keepdim)
        if wants_gradient(input):  # eager's gradient goes to the index alone (amax's splits among ties)
            kept = indices if keepdim else torch.unsqueeze(indices, d)
            values = keep_dims(torch.squeeze(torch.gather(input, d, kept), d), input, (d,), keepdim)
        else:
            values = keep_dims(reduce_prim(input, (d,)), input, (d,), keepdim)
    result_type = torch.return_types.max if name == "max" else torch.return_types.min
    return result_type((values, indices))


@decomposition(torch.max, method("max"))
def max(input: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: A001
    return _max_min("max", input, args, kwargs)


@decomposition(torch.min, method("min"))
def min(input: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: A001
    return _max_min("min", input, args, kwargs)


@decomposition(torch.aminmax, method("aminmax"))
def aminmax(input: Any, *, dim: int | None = None, keepdim: bool = False) -> Any:
    if dim is None:
        check(input.numel() != 0, lambda: "aminmax(): cannot compute aminmax over an empty dimension as the "
              "operation has no identity.")
    dims = reduction_dims(input, dim)
    if dim is not None and input.ndim > 0:
        check(input.shape[dims[0]] != 0, lambda: "aminmax(): Expected reduction dim "
              f"{dims[0]} to have non-zero size.", IndexError)
    low = keep_dims(prims.amin(input, dims), input, dims, keepdim)
    high = keep_dims(prims.amax(input, dims), input, dims, keepdim)
    return torch.return_types.aminmax((low, high))


# ---- any, all, count_nonzero ------------------------------------------------------------------------------

def _any_all(prim: Any, input: Any, dim: Any, keepdim: bool) -> Any:
    dims = reduction_dims(input, dim)
    flags = input if input.dtype == torch.bool else prims.ne(input, 0)
    if flags.numel() == 0 or builtins.any(input.shape[d] == 0 for d in dims):
        # amax/amin need elements; the empty any is False and the empty all is True
        identity = prim is prims.amin
        padded = prims.sum(prims.convert_element_type(flags, torch.int64), dims)
        out = prims.eq(padded, 0) if identity else prims.ne(padded, padded)
    else:
        out = prim(flags, dims)
    if input.dtype == torch.uint8:
        out = prims.convert_element_type(out, torch.uint8)
    return keep_dims(out, input, dims, keepdim)


@decomposition(torch.any, method("any"))
def any(input: Any, dim: Any = None, keepdim: bool = False) -> Any:  # noqa: A001
    return _any_all(prims.amax, input, dim, keepdim)


@decomposition(torch.all, method("all"))
def all(input: Any, dim: Any = None, keepdim: bool = False) -> Any:  # noqa: A001
    return _any_all(prims.amin, input, dim, keepdim)


@decomposition(torch.count_nonzero, method("count_nonzero"))
def count_nonzero(input: Any, dim: Any = None) -> Any:
    dims = reduction_dims(input, dim)
    flags = input if input.dtype == torch.bool else prims.ne(input, 0)
    return prims.sum(prims.convert_element_type(flags, torch.int64), dims)


# ---- var, std and their _mean forms -----------------------------------------------------------------------

def _parse_correction(op: str, args: tuple, kwargs: dict) -> tuple[Any, float, bool]:
    """var(input, dim=None, *, correction=1, keepdim=False) and the legacy forms with `unbiased`."""
    args = list(args)
    dim = kwargs.pop("dim", None)
    unbiased = kwargs.pop("unbiased", None)
    correction = kwargs.pop("correction", None)
    keepdim = kwargs.pop("keepdim", False)
    if args and isinstance(args[0], bool):  # var(input, unbiased)
        unbiased = args.pop(0)
    elif args:  # var(input, dim, unbiased=True, keepdim=False) or var(input, dim, *, correction, keepdim)
        dim = args.pop(0)
        if args:
            unbiased = args.pop(0)
        if args:
            keepdim = args.pop(0)
    if args:
        raise NoDecomposition(f"{op}: unrecognized arguments {args}")
    check(not kwargs, lambda: f"{op}() got unexpected keyword arguments {sorted(kwargs)}", TypeError)
    check(unbiased is None or correction is None,
          lambda: f"{op}: Cannot specify both unbiased and correction")
    if correction is None:
        correction = 0 if unbiased is False else 1
    return dim, correction, keepdim


def _var(op: str, input: Any, args: tuple, kwargs: dict, root: bool, with_mean: bool) -> Any:
    dim, correction, keepdim = _parse_correction(op, args, dict(kwargs))
    check(is_float_dtype(input.dtype), lambda: "std and var only support floating point and complex dtypes")
    if input.dtype.is_complex:
        raise NoDecomposition(f"{op} of complex values")
    dims = reduction_dims(input, dim)
    # var of float16 is a float16 prim (float32 inside, one rounding, as eager); std takes its root before
    # eager rounds, so it computes in float32
    x = convert(input, computation_dtype(input.dtype)) if root else input
    if with_mean:
        out, average = prims.var_mean(x, dims, correction)
    else:
        out = prims.var(x, dims, correction)
    if root:
        out = root_of_sum(out, prims.sqrt, input)
    out = keep_dims(convert(out, input.dtype), input, dims, keepdim)
    if not with_mean:
        return out
    return out, keep_dims(convert(average, input.dtype), input, dims, keepdim)


@decomposition(torch.var, method("var"))
def var(input: Any, *args: Any, **kwargs: Any) -> Any:
    return _var("var", input, args, kwargs, root=False, with_mean=False)


@decomposition(torch.std, method("std"))
def std(input: Any, *args: Any, **kwargs: Any) -> Any:
    return _var("std", input, args, kwargs, root=True, with_mean=False)


@decomposition(torch.var_mean)
def var_mean(input: Any, *args: Any, **kwargs: Any) -> Any:
    return _var("var_mean", input, args, kwargs, root=False, with_mean=True)


@decomposition(torch.std_mean)
def std_mean(input: Any, *args: Any, **kwargs: Any) -> Any:
    return _var("std_mean", input, args, kwargs, root=True, with_mean=True)


# ---- norms and logsumexp ----------------------------------------------------------------------------------

@decomposition(torch.linalg.vector_norm)
def vector_norm(input: Any, ord: Any = 2, dim: Any = None, keepdim: bool = False, *,  # noqa: A002
                dtype: torch.dtype | None = None) -> Any:
    check(is_float_dtype(input.dtype), lambda: "linalg.vector_norm: Expected a floating point or complex "
          f"tensor as input. Got {scalar_type_name(input.dtype)}")
    if input.dtype.is_complex or (dtype is not None and dtype.is_complex):
        raise NoDecomposition("vector_norm of complex values")
    check(not isinstance(ord, bool) and isinstance(ord, (int, float)),
          lambda: f"linalg.vector_norm: ord must be a number, got {ord!r}", TypeError)
    out_dtype = dtype if dtype is not None else input.dtype
    dims = reduction_dims(input, dim)
    if ord < 0 or ord == math.inf:
        empty = builtins.any(input.shape[d] == 0 for d in dims)
        check(not empty, lambda: f"linalg.vector_norm cannot compute the {ord} norm on an empty tensor "
              "because the operation does not have an identity")
    compute = computation_dtype(out_dtype)
    x = prims.abs(convert(convert(input, out_dtype), compute))
    if ord == math.inf:
        out = prims.amax(x, dims)
    elif ord == -math.inf:
        out = prims.amin(x, dims)
    elif ord == 0:
        out = prims.sum(prims.convert_element_type(prims.ne(x, 0), compute), dims)
    elif ord == 1:
        out = prims.sum(x, dims)
    elif ord == 2:
        out = root_of_sum(prims.sum(prims.mul(x, x), dims), prims.sqrt, input)
    elif ord > 0:
        out = root_of_sum(prims.sum(prims.pow(x, float(ord)), dims), lambda s: prims.pow(s, 1.0 / ord),
                          input)
    else:
        out = prims.pow(prims.sum(prims.pow(x, float(ord)), dims), 1.0 / ord)
    return keep_dims(convert(out, out_dtype), input, dims, keepdim)


@decomposition(torch.norm, method("norm"))
def norm(input: Any, p: Any = "fro", dim: Any = None, keepdim: bool = False, dtype: torch.dtype | None = None,
         **kwargs: Any) -> Any:
    if kwargs:
        raise NoDecomposition(f"norm with {sorted(kwargs)}")
    if p == "fro" and (dim is None or isinstance(dim, int) or len(dim) <= 2):
        p = 2
    if isinstance(p, str) or p is None:
        raise NoDecomposition(f"norm with p={p!r}")
    return vector_norm(input, p, dim, keepdim, dtype=dtype)


@decomposition(torch.logsumexp, method("logsumexp"), torch.special.logsumexp)
def logsumexp(input: Any, dim: Any = (), keepdim: bool = False) -> Any:
    dtype = input.dtype if is_float_dtype(input.dtype) else torch.get_default_dtype()
    if input.dtype.is_complex:
        raise NoDecomposition("logsumexp of complex values")
    dims = reduction_dims(input, dim)
    compute = dtype  # eager rounds each step (x - max, exp, sum, log, + max) to a float16 input's dtype
    x = convert(input, compute)
    if input.numel() == 0 or builtins.any(input.shape[d] == 0 for d in dims):
        out = prims.log(prims.sum(prims.exp(x), dims))
        return keep_dims(convert(out, dtype), input, dims, keepdim)
    big = prims.amax(prims.stop_gradient(x), dims)  # only steadies exp: no gradient flows through it
    # an infinite maximum would give inf - inf = NaN; shift by 0 there instead
    shift = prims.where(prims.isinf(big), full_like(big, 0.0, compute), big)
    kept = tuple(i for i in range(input.ndim) if i not in dims)
    spread = prims.broadcast_in_dim(shift, tuple(input.shape), kept)
    total = prims.sum(prims.exp(prims.sub(x, spread)), dims)
    out = prims.add(prims.log(total), shift)
    return keep_dims(convert(out, dtype), input, dims, keepdim)

