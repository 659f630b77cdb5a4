"""Decompositions of composite torch ops built from other decompositions: diff, cross, cov/corrcoef, isin,
sum_to_size, mvlgamma, the sort-based selections (kthvalue, median, nanmedian, quantile, nanquantile),
combinations, gradient, and Python-number helpers (torch.sym_float, ...) that programs call on plain values.

Each follows eager's ATen composite step by step (the same ops in the same order, so results round as
eager's do); calls on proxies route to the callee's own decomposition. Selections sort stably, so a tie
or NaN picks the first occurrence; eager's selection algorithms leave the index among equal values
unspecified.
"""
from __future__ import annotations

import builtins
import itertools
import math
from typing import Any, Sequence

import torch

from .. import prims
from ..graph import Proxy
from .elementwise import decomposition, method
from .registry import NoDecomposition, register
from .utils import check, is_tensor, result_type, wrap_dim

_MAX_PAIRS = 1 << 22  # isin compares every element with every test element up to this many pairs


# ---- Python-number helpers ----------------------------------------------------------------------------

def _plain(op: str, *values: Any) -> None:
    """Refuse proxies: these helpers take Python numbers (a tensor here needs its value)."""
    if any(isinstance(v, Proxy) for v in values):
        raise NoDecomposition(f"{op} of a tensor")


@register(torch.sym_float)
def sym_float(a: Any) -> Any:
    _plain("sym_float", a)
    return builtins.float(a)


@register(torch.sym_int)
def sym_int(a: Any) -> Any:
    _plain("sym_int", a)
    return builtins.int(a)


@register(torch.sym_max)
def sym_max(a: Any, b: Any) -> Any:
    _plain("sym_max", a, b)
    return builtins.max(a, b)


@register(torch.sym_min)
def sym_min(a: Any, b: Any) -> Any:
    _plain("sym_min", a, b)
    return builtins.min(a, b)


@register(torch.sym_not)
def sym_not(a: Any) -> Any:
    _plain("sym_not", a)
    return not a


# ---- diff, cross --------------------------------------------------------------------------------------

@decomposition(torch.diff, method("diff"))
def diff(input: Any, n: int = 1, dim: int = -1, prepend: Any = None, append: Any = None) -> Any:
    check(input.ndim >= 1, lambda: "diff expects input to be at least one-dimensional")
    check(n >= 0, lambda: f"order must be non-negative but got {n}")
    for extra in (prepend, append):
        if extra is not None:
            check(is_tensor(extra) and extra.ndim == input.ndim,
                  lambda: "diff expects prepend or append to be the same dimension as input")
    d = wrap_dim(dim, input.ndim)
    if n == 0:
        return torch.clone(input)
    if prepend is not None or append is not None:
        input = torch.cat([t for t in (prepend, input, append) if t is not None], d)
    size = input.shape[d]
    n = builtins.min(n, size)
    result = input
    length = size - 1
    for _ in range(n):
        later, earlier = result.narrow(d, 1, length), result.narrow(d, 0, length)
        result = torch.logical_xor(later, earlier) if input.dtype == torch.bool else later - earlier
        length -= 1
    return result


def _cross(input: Any, other: Any, dim: int) -> Any:
    check(input.ndim == other.ndim, lambda: "linalg.cross: inputs must have the same number of dimensions.")
    check(input.dtype == other.dtype, lambda: f"expected scalar type {_type_name(input.dtype)} but found "
          f"{_type_name(other.dtype)}")
    d = wrap_dim(dim, input.ndim)
    check(input.shape[d] == 3 and other.shape[d] == 3, lambda: f"linalg.cross: inputs dimension {dim} must "
          f"have length 3. Got {input.shape[d]} and {other.shape[d]}")
    shape = list(torch.broadcast_shapes(tuple(input.shape), tuple(other.shape)))
    a, b = input.expand(shape), other.expand(shape)
    ax, ay, az = (a.select(d, i) for i in range(3))
    bx, by, bz = (b.select(d, i) for i in range(3))
    # eager's kernel: a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]
    parts = [ay * bz - az * by, az * bx - ax * bz, ax * by - ay * bx]
    return torch.stack(parts, d)


def _type_name(dtype: torch.dtype) -> str:
    return {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
            torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char",
            torch.uint8: "Byte", torch.bool: "Bool"}.get(dtype, str(dtype))


@decomposition(torch.linalg.cross)
def linalg_cross(input: Any, other: Any, *, dim: int = -1) -> Any:
    return _cross(input, other, dim)


@decomposition(torch.cross, method("cross"))
def cross(input: Any, other: Any, dim: int | None = None) -> Any:
    if dim is None:  # eager: the first dim of size 3 (deprecated)
        sizes = [i for i, s in enumerate(input.shape) if s == 3]
        check(bool(sizes), lambda: "no dimension of size 3 in input")
        dim = sizes[0]
    return _cross(input, other, dim)


# ---- cov, corrcoef ------------------------------------------------------------------------------------

def _nan_unless(valid: Any, value: Any) -> Any:
    """value where the 0-d bool `valid` holds, NaN elsewhere: eager raises for such input (a check on
    tensor values that a graph cannot make), so the result must not look like a number."""
    return torch.where(valid, value, torch.full_like(value, math.nan))


@decomposition(torch.cov, method("cov"))
def cov(input: Any, *, correction: int = 1, fweights: Any = None, aweights: Any = None) -> Any:
    check(input.ndim <= 2, lambda: f"cov(): expected input to have two or fewer dimensions but got an input "
          f"with {input.ndim} dimensions")
    check(input.dtype != torch.bool, lambda: "cov(): bool dtype is not supported for input")
    if input.dtype.is_complex:
        raise NoDecomposition("cov of complex values")
    x = input.view(1, -1) if input.ndim < 2 else input
    observations = x.shape[1]
    if observations == 1 and (fweights is None) != (aweights is None):
        raise NoDecomposition("cov of one observation with one kind of weights (eager zeroes its input)")
    w = None
    valid = None  # the weight checks eager makes on values: no negative weight, a nonzero sum
    if fweights is not None:
        check(fweights.ndim <= 1, lambda: f"cov(): expected fweights to have one or fewer dimensions but got "
              f"fweights with {fweights.ndim} dimensions")
        check(not fweights.dtype.is_floating_point and not fweights.dtype.is_complex
              and fweights.dtype != torch.bool, lambda: f"cov(): expected fweights to have integral dtype but "
              f"got fweights with {_type_name(fweights.dtype)} dtype")
        check(fweights.numel() == observations, lambda: f"cov(): expected fweights to have the same numel as "
              f"there are observations in the input but got {fweights.numel()} != {observations}")
        w = fweights
        valid = torch.all(fweights >= 0)
    if aweights is not None:
        check(aweights.ndim <= 1, lambda: f"cov(): expected aweights to have one or fewer dimensions but got "
              f"aweights with {aweights.ndim} dimensions")
        check(aweights.dtype.is_floating_point, lambda: f"cov(): expected aweights to have floating point "
              f"dtype but got aweights with {_type_name(aweights.dtype)} dtype")
        check(aweights.numel() == observations, lambda: f"cov(): expected aweights to have the same numel as "
              f"there are observations in the input but got {aweights.numel()} != {observations}")
        nonnegative = torch.all(aweights >= 0)
        valid = nonnegative if valid is None else torch.logical_and(valid, nonnegative)
        w = aweights if w is None else w * aweights
    if w is not None:
        w_sum = w.sum()
        valid = torch.logical_and(valid, w_sum != 0)
        avg = (x * w).sum(1) / w_sum
    else:
        w_sum = torch.scalar_tensor(observations, dtype=torch.int64)
        avg = x.sum(1) / w_sum
    if w is None:
        norm_factor = torch.scalar_tensor(observations - correction, dtype=torch.int64)
        if observations - correction <= 0:
            norm_factor = torch.zeros_like(norm_factor)  # eager warns and divides by zero
    else:
        if correction == 0:
            norm_factor = w_sum
        elif aweights is None:
            norm_factor = w_sum - correction
        elif fweights is None and observations == 1 and correction == 1:
            norm_factor = torch.scalar_tensor(0, dtype=torch.int64)
        else:
            norm_factor = w_sum - correction * (w * aweights).sum() / w_sum
        norm_factor = torch.where(norm_factor <= 0, torch.zeros_like(norm_factor), norm_factor)
    centered = x - avg.unsqueeze(1)
    c = torch.mm(centered, (centered * w if w is not None else centered).t())
    out = torch.true_divide(c, norm_factor).squeeze()
    return out if valid is None else _nan_unless(valid, out)


@decomposition(torch.corrcoef, method("corrcoef"))
def corrcoef(input: Any) -> Any:
    check(input.ndim <= 2, lambda: f"corrcoef(): expected input to have two or fewer dimensions but got an "
          f"input with {input.ndim} dimensions")
    c = torch.cov(input)
    if c.ndim == 0:
        return c / c  # NaN for a covariance of NaN, inf or 0; 1 otherwise
    stddev = torch.sqrt(c.diagonal())
    c = c / stddev.view(-1, 1)
    c = c / stddev.view(1, -1)
    return c.clip(-1, 1)


# ---- isin, sum_to_size, mvlgamma ---------------------------------------------------------------------------

@decomposition(torch.isin)
def isin(elements: Any, test_elements: Any, *, assume_unique: bool = False, invert: bool = False) -> Any:
    check(is_tensor(elements) or is_tensor(test_elements),
          lambda: "isin(): expected elements or test_elements to be a tensor", TypeError)
    dtype = result_type(elements, test_elements)
    if dtype.is_complex:
        raise NoDecomposition("isin of complex values")
    if not is_tensor(elements):
        if not is_tensor(test_elements):
            raise NoDecomposition("isin of two numbers")
        elements = torch.scalar_tensor(elements, dtype=dtype, device=test_elements.device)
    if not is_tensor(test_elements):
        found = elements == test_elements
        return torch.logical_not(found) if invert else found
    if elements.numel() * test_elements.numel() > _MAX_PAIRS:
        raise NoDecomposition("isin of large tensors (compares every pair)")
    a = elements.to(dtype) if elements.dtype != dtype else elements
    b = test_elements.to(dtype) if test_elements.dtype != dtype else test_elements
    if b.numel() == 0:
        found = torch.zeros(tuple(a.shape), dtype=torch.bool, device=a.device)
    else:
        found = (a.unsqueeze(-1) == b.reshape(-1)).any(-1)
    return torch.logical_not(found) if invert else found


@register(method("sum_to_size"))
def sum_to_size(input: Any, *size: Any) -> Any:
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    shape = tuple(input.shape)
    lead = len(shape) - len(size)
    expandable = lead >= 0 and all(s == t or s == 1 for s, t in zip(size, shape[lead:]))
    check(expandable, lambda: f"size {{[{', '.join(str(s) for s in size)}]}} is not expandable to size "
          f"{{[{', '.join(str(s) for s in shape)}]}}.")
    if tuple(size) == shape:
        return input  # eager returns self
    dims = list(range(lead)) + [lead + i for i, s in enumerate(size) if s == 1 and shape[lead + i] != 1]
    out = input.sum(dims, keepdim=True) if dims else input
    return out.view(tuple(size)) if tuple(out.shape) != tuple(size) else out


@decomposition(torch.mvlgamma, method("mvlgamma"), torch.special.multigammaln)
def mvlgamma(input: Any, p: int) -> Any:
    check(p >= 1, lambda: "p has to be greater than or equal to 1")
    dtype = input.dtype
    if not dtype.is_floating_point:
        check(not dtype.is_complex, lambda: "mvlgamma is not implemented for complex inputs")
        dtype = torch.get_default_dtype()
    # eager: lgamma(x + arange(-(p - 1) / 2, 1/2, 1/2)) summed, plus p(p - 1)/4 log(pi)
    offsets = torch.arange(-p * 0.5 + 0.5, 0.5, 0.5, dtype=dtype, device=input.device)
    args = offsets + input.unsqueeze(-1)
    return torch.lgamma(args).sum(-1) + float(p * (p - 1)) * math.log(math.pi) * 0.25
