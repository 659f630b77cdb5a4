"""Reduction prims: sum, prod, amax, amin, argmax, argmin, var.

Strict rules: `dims` is a tuple of distinct, increasing, non-negative dims of the input; the reduced dims
are removed from the output (keepdim is not a prim argument: decompositions re-insert size-1 dims with
broadcast_in_dim). An empty `dims` reduces nothing: the result is a copy of the input (var of a single
element). The output dtype is the input dtype, except argmax/argmin (int64) and var (the real dtype).
sum and prod refuse bool (decompositions convert to int64 first, as torch does).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from ..graph import TensorMeta
from .registry import check, is_tensor, meta_of, prim, shape_text


def _check_dims(name: str, a: Any, dims: Sequence[int]) -> tuple[int, ...]:
    check(is_tensor(a), lambda: f"prims.{name}: expected a tensor, got {type(a).__name__}", TypeError)
    check(isinstance(dims, (tuple, list)) and all(isinstance(d, int) for d in dims),
          lambda: f"prims.{name}: dims must be a tuple of ints, got {dims!r}", TypeError)
    ndim = meta_of(a).ndim
    dims = tuple(dims)
    check(all(0 <= d < ndim for d in dims) and list(dims) == sorted(set(dims)),
          lambda: f"prims.{name}: dims {dims} must be distinct, increasing and within the {ndim}-d input "
                  f"{shape_text(a)}", IndexError)
    return dims


def _reduced_meta(a: Any, dims: tuple[int, ...], dtype: torch.dtype) -> TensorMeta:
    m = meta_of(a)
    shape = tuple(s for i, s in enumerate(m.shape) if i not in dims)
    return TensorMeta(shape, dtype, m.device)


def _check_nonempty(name: str, a: Any, dims: tuple[int, ...]) -> None:
    m = meta_of(a)
    for d in dims:
        check(m.shape[d] != 0, lambda: f"{name}(): Expected reduction dim {d} to have non-zero size.",
              IndexError)


def _reduction(name: str, ref: Callable[..., Any], allowed: Callable[[torch.dtype], bool],
               needs_elements: bool = False, doc: str = "") -> Any:
    def meta(a: Any, dims: Sequence[int]) -> TensorMeta:
        dims = _check_dims(name, a, dims)
        dtype = meta_of(a).dtype
        check(allowed(dtype), lambda: f"prims.{name}: not defined for {dtype} tensors", TypeError)
        if needs_elements:
            _check_nonempty(name, a, dims)
        return _reduced_meta(a, dims, dtype)

    def strict_ref(a: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
        if not dims:
            return a.clone(memory_format=torch.contiguous_format)
        return ref(a, tuple(dims))
    return prim(name, meta, strict_ref, tags=("reduction",), doc=doc)


def _not_bool(dtype: torch.dtype) -> bool:
    return dtype != torch.bool


def _real(dtype: torch.dtype) -> bool:
    return not dtype.is_complex


def _prod_ref(a: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    if len(dims) == a.ndim:
        return torch.prod(a, dtype=a.dtype)
    out = a  # torch.prod takes one dim at a time
    for d in reversed(dims):
        out = torch.prod(out, d, dtype=a.dtype)
    return out


sum = _reduction("sum", lambda a, dims: torch.sum(a, dims, dtype=a.dtype), _not_bool)  # noqa: A001
prod = _reduction("prod", _prod_ref, _not_bool)
amax = _reduction("amax", lambda a, dims: torch.amax(a, dims), _real, needs_elements=True,
                  doc="maximum over dims; NaN propagates")
amin = _reduction("amin", lambda a, dims: torch.amin(a, dims), _real, needs_elements=True)


# ---- argmax / argmin: the index into the row-major flattening of the reduced dims -----------------------

def _arg_meta(name: str) -> Callable[..., TensorMeta]:
    def meta(a: Any, dims: Sequence[int]) -> TensorMeta:
        dims = _check_dims(name, a, dims)
        m = meta_of(a)
        check(not m.dtype.is_complex and m.dtype != torch.bool,
              lambda: f"prims.{name}: not defined for {m.dtype} tensors", TypeError)
        check(len(dims) == 1 or len(dims) == m.ndim, lambda: f"prims.{name}: reduces one dim or every dim, "
              f"got dims {dims} of {shape_text(a)}")
        if len(dims) == m.ndim:
            check(m.numel() != 0, lambda: f"{name}(): Expected reduction dim to be specified for "
                  f"input.numel() == 0.", IndexError)
        else:
            _check_nonempty(name, a, dims)
        return _reduced_meta(a, dims, torch.int64)
    return meta


def _arg_ref(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def ref(a: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
        if len(dims) == a.ndim:
            return fn(a)
        return fn(a, dims[0])
    return ref


argmax = prim("argmax", _arg_meta("argmax"), _arg_ref(torch.argmax), tags=("reduction",),
              doc="index of the first maximum (NaN counts as the maximum) over one dim or every dim")
argmin = prim("argmin", _arg_meta("argmin"), _arg_ref(torch.argmin), tags=("reduction",))


# ---- var ---------------------------------------------------------------------------------------------------

def _var_meta(a: Any, dims: Sequence[int], correction: float) -> TensorMeta:
    dims = _check_dims("var", a, dims)
    m = meta_of(a)
    check(m.dtype.is_floating_point or m.dtype.is_complex,
          lambda: "std and var only support floating point and complex dtypes", RuntimeError)
    check(isinstance(correction, (int, float)) and not isinstance(correction, bool),
          lambda: f"prims.var: correction must be a number, got {correction!r}", TypeError)
    dtype = m.dtype.to_real() if m.dtype.is_complex else m.dtype
    return _reduced_meta(a, dims, dtype)


def _var_ref(a: torch.Tensor, dims: Sequence[int], correction: float) -> torch.Tensor:
    if not dims:
        return torch.var(a.unsqueeze(-1), -1, correction=correction)
    return torch.var(a, tuple(dims), correction=correction)


var = prim("var", _var_meta, _var_ref, tags=("reduction",),
           doc="variance over dims: sum(|x - mean|^2) / (N - correction)")


def _var_mean_meta(a: Any, dims: Sequence[int], correction: float) -> tuple[TensorMeta, TensorMeta]:
    variance = _var_meta(a, dims, correction)
    return variance, variance.with_(dtype=meta_of(a).dtype)


def _var_mean_ref(a: torch.Tensor, dims: Sequence[int],
                  correction: float) -> tuple[torch.Tensor, torch.Tensor]:
    if not dims:
        v, m = torch.var_mean(a.unsqueeze(-1), -1, correction=correction)
    else:
        v, m = torch.var_mean(a, tuple(dims), correction=correction)
    return v, m


var_mean = prim("var_mean", _var_mean_meta, _var_mean_ref, tags=("reduction",),
                doc="(variance, mean) over dims in one pass (Welford): an infinity in a group makes its mean "
                    "depend on the order, so the mean is not sum / N")
