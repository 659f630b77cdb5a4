"""Decompositions of composite torch ops built from other decompositions: diff, cross, cov/corrcoef, isin,
sum_to_size, mvlgamma, trace, kron, fftshift, dist, renorm, matrix_power, vander, trapezoid rules,
combinations, _chunk_cat, gradient, softmax's backward, and Python-number helpers (torch.sym_float, ...)
that programs call on plain values.

Each follows eager's ATen composite step by step (the same ops in the same order, so results round as
eager's do); calls on proxies route to the callee's own decomposition. Selections and searches (kthvalue,
median, quantile, searchsorted, ...) live in `selection.py`.

Checks eager makes on tensor values (cov's weights, normal's std, quantile's q tensor) cannot raise while
the graph is built; `prims.check_values` makes them when it runs, raising eager's exception type.
"""
from __future__ import annotations

import builtins
import itertools
import math
from typing import Any, Sequence

import torch

from ..graph import Proxy
from ..prims.registry import check, wrap_dim
from .registry import NoDecomposition, register
from .utils import checked, decomposition, is_tensor, method, result_type

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
    return {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half",
            torch.bfloat16: "BFloat16",
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
        integral = not (fweights.dtype.is_floating_point or fweights.dtype.is_complex
                        or fweights.dtype == torch.bool)
        check(integral, lambda: f"cov(): expected fweights to have integral dtype but got fweights with "
              f"{_type_name(fweights.dtype)} dtype")
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
        w_sum = torch.scalar_tensor(observations, dtype=torch.int64, device=x.device)
        avg = x.sum(1) / w_sum
    if w is None:
        norm_factor = torch.scalar_tensor(observations - correction, dtype=torch.int64, device=x.device)
        if observations - correction <= 0:
            norm_factor = torch.zeros_like(norm_factor)  # eager warns and divides by zero
    else:
        if correction == 0:
            norm_factor = w_sum
        elif aweights is None:
            norm_factor = w_sum - correction
        elif fweights is None and observations == 1 and correction == 1:
            norm_factor = torch.scalar_tensor(0, dtype=torch.int64, device=x.device)
        else:
            norm_factor = w_sum - correction * (w * aweights).sum() / w_sum
        norm_factor = torch.where(norm_factor <= 0, torch.zeros_like(norm_factor), norm_factor)
    centered = x - avg.unsqueeze(1)
    c = torch.mm(centered, (centered * w if w is not None else centered).t())
    out = torch.true_divide(c, norm_factor).squeeze()
    return out if valid is None else checked(valid, out, "cov(): weights cannot be negative, and their sum "
                                                         "cannot be zero")


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
    if len(size) == 0:
        return input.sum()  # eager: a new tensor, in sum's dtype
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


# ---- trace, kron, fftshift, dist, renorm, matrix_power, vander --------------------------------------------

@decomposition(torch.trace, method("trace"))
def trace(input: Any) -> Any:
    check(input.ndim == 2, lambda: f"trace: expected a matrix, but got tensor with dim {input.ndim}")
    check(input.dtype != torch.bool, lambda: "\"trace\" not implemented for 'Bool'", NotImplementedError)
    if input.dtype.is_complex:
        raise NoDecomposition("trace of complex values")
    return input.diagonal().sum()


@decomposition(torch.kron)
def kron(input: Any, other: Any) -> Any:
    ndim = builtins.max(input.ndim, other.ndim)
    a = input.reshape((1,) * (ndim - input.ndim) + tuple(input.shape))
    b = other.reshape((1,) * (ndim - other.ndim) + tuple(other.shape))
    # a[i] * b[j] at i * b.shape + j: interleave a's and b's dims, multiply, then merge each pair
    a = a.reshape(tuple(itertools.chain.from_iterable((s, 1) for s in a.shape)))
    b = b.reshape(tuple(itertools.chain.from_iterable((1, s) for s in b.shape)))
    return (a * b).reshape(tuple(x * y for x, y in zip(a.shape[::2], b.shape[1::2])))


def _shift(input: Any, dim: Any, inverse: bool) -> Any:
    dims = range(input.ndim) if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    dims = [wrap_dim(d, input.ndim) for d in dims]
    shifts = [(input.shape[d] + 1) // 2 if inverse else input.shape[d] // 2 for d in dims]
    if not dims:
        return torch.clone(input)
    return torch.roll(input, shifts, dims)


@decomposition(torch.fft.fftshift)
def fftshift(input: Any, dim: Any = None) -> Any:
    return _shift(input, dim, inverse=False)


@decomposition(torch.fft.ifftshift)
def ifftshift(input: Any, dim: Any = None) -> Any:
    return _shift(input, dim, inverse=True)


@decomposition(torch.dist, method("dist"))
def dist(input: Any, other: Any, p: Any = 2) -> Any:
    if is_tensor(p):
        raise NoDecomposition("dist with a tensor p")
    check(input.dtype == other.dtype, lambda: f"dist: expected both inputs to have the same dtype, got "
          f"{input.dtype} and {other.dtype}")
    return torch.linalg.vector_norm(input - other, p)


@decomposition(torch.renorm, method("renorm"))
def renorm(input: Any, p: Any, dim: int, maxnorm: Any) -> Any:
    check(not input.dtype.is_complex, lambda: "renorm: Complex dtypes are not supported")
    check(p > 0, lambda: "renorm: non-positive-norm not supported")
    check(maxnorm >= 0, lambda: f"renorm: expected maxnorm to be >= 0 but got {maxnorm}")
    if input.dtype != torch.float32 and input.dtype != torch.float64:
        raise NoDecomposition(f"renorm of {input.dtype} values")
    d = wrap_dim(dim, input.ndim)
    dims = [i for i in range(input.ndim) if i != d]
    norm = torch.linalg.vector_norm(input, float(p), dims, keepdim=True)
    # eager: maxnorm / (norm + 1e-7) where the norm exceeds maxnorm, else 1
    factor = torch.where(norm > maxnorm, float(maxnorm) / (norm + 1e-7), torch.ones_like(norm))
    return (input * factor).contiguous()  # eager allocates its result contiguous


@decomposition(torch.linalg.matrix_power, torch.matrix_power, method("matrix_power"))
def matrix_power(input: Any, n: int) -> Any:
    check(input.ndim >= 2 and input.shape[-1] == input.shape[-2],
          lambda: f"linalg.matrix_power: A must be batches of square matrices, but they are "
          f"{input.shape[-2] if input.ndim >= 2 else input.ndim} by {input.shape[-1] if input.ndim else 0} "
          f"matrices")
    if n < 0:
        raise NoDecomposition("matrix_power with a negative exponent (an inverse)")
    if n == 0:
        size = input.shape[-1]
        return torch.eye(size, dtype=input.dtype, device=input.device).expand(tuple(input.shape)).clone()
    if n == 1:
        return torch.clone(input, memory_format=torch.contiguous_format)
    # eager's binary decomposition of n, least significant bit first
    z = result = None
    while n > 0:
        bit, n = n % 2, n // 2
        z = input if z is None else torch.matmul(z, z)
        if bit:
            result = z if result is None else torch.matmul(result, z)
    return result


@decomposition(torch.linalg.vander)
def vander(x: Any, *, N: Any = None) -> Any:
    check(x.dtype in (torch.float32, torch.float64) or not (x.dtype.is_floating_point or x.dtype.is_complex
                                                           or x.dtype == torch.bool),
          lambda: f"linalg.vander supports floating point, complex, and integer tensors, but got {x.dtype}")
    if x.dtype.is_complex:
        raise NoDecomposition("vander of complex values")
    x = x.unsqueeze(-1) if x.ndim == 0 else x
    n = N if N is not None else x.shape[-1]
    check(n > 1, lambda: "N must be greater than 1.")
    shape = tuple(x.shape) + (n - 1,)
    powers = torch.cumprod(x.unsqueeze(-1).expand(shape), -1)
    ones = powers.new_ones(tuple(x.shape) + (1,))
    return torch.cat([ones, powers], -1)


# ---- trapezoid rules ---------------------------------------------------------------------------------------

def _spacing(y: Any, x: Any, d: int, op: str) -> Any:
    """x's differences along d, shaped to broadcast with y's (eager does not broadcast x to y first)."""
    if x.ndim == 1:
        check(x.shape[0] == y.shape[d], lambda: f"{op}: There must be one `x` value for each sample point")
        shape = [1] * y.ndim
        shape[d] = x.shape[0]
        x = x.view(shape)
    elif x.ndim < y.ndim:
        x = x.view((1,) * (y.ndim - x.ndim) + tuple(x.shape))
    size = x.shape[d]
    return x.narrow(d, 1, builtins.max(size - 1, 0)) - x.narrow(d, 0, builtins.max(size - 1, 0))


def _trapezoid_args(op: str, y: Any, x: Any, dx: Any) -> None:
    check(y.dtype != torch.bool and not (is_tensor(x) and x.dtype == torch.bool),
          lambda: f"{op}: received a bool input for `x` or `y`, but bool is not supported")
    check(not (is_tensor(x) and dx is not None), lambda: f"{op}: Cannot specify both x and dx")
    if y.dtype.is_complex or (is_tensor(x) and x.dtype.is_complex) or isinstance(dx, (complex, bool)):
        raise NoDecomposition(f"{op} of complex values")


def _trapezoid(op: str, y: Any, x: Any, dx: Any, dim: int) -> Any:
    _trapezoid_args(op, y, x, dx)
    d = wrap_dim(dim, y.ndim)
    if y.shape[d] == 0:
        return torch.zeros(tuple(s for i, s in enumerate(y.shape) if i != d), dtype=y.dtype, device=y.device)
    size = y.shape[d]
    if is_tensor(x):
        left, right = y.narrow(d, 0, size - 1), y.narrow(d, 1, size - 1)
        return (_spacing(y, x, d, op) * (left + right)).sum(d) / 2.0
    step = 1.0 if dx is None else float(dx)
    return (y.sum(d) - (y.select(d, 0) + y.select(d, -1)) * 0.5) * step


@decomposition(torch.trapezoid)
def trapezoid(y: Any, x: Any = None, *, dx: Any = None, dim: int = -1) -> Any:
    return _trapezoid("trapezoid", y, x, dx, dim)


@decomposition(torch.trapz)
def trapz(y: Any, x: Any = None, *, dx: Any = None, dim: int = -1) -> Any:
    return _trapezoid("trapezoid", y, x, dx, dim)


@decomposition(torch.cumulative_trapezoid)
def cumulative_trapezoid(y: Any, x: Any = None, *, dx: Any = None, dim: int = -1) -> Any:
    op = "cumulative_trapezoid"
    _trapezoid_args(op, y, x, dx)
    d = wrap_dim(dim, y.ndim)
    size = builtins.max(y.shape[d] - 1, 0)
    left, right = y.narrow(d, 0, size), y.narrow(d, 1, size) if y.shape[d] > 0 else y.narrow(d, 0, 0)
    if is_tensor(x):
        return ((_spacing(y, x, d, op) * (left + right)) / 2.0).cumsum(d)
    step = 1.0 if dx is None else float(dx)
    return (step / 2.0 * (left + right)).cumsum(d)


# ---- combinations, _chunk_cat ------------------------------------------------------------------------------

@decomposition(torch.combinations)
def combinations(input: Any, r: int = 2, with_replacement: bool = False) -> Any:
    check(input.ndim == 1, lambda: f"Expect a 1D vector, but got shape {list(input.shape)}")
    check(r >= 0, lambda: f"Expect a non-negative number, but got {r}")
    if r == 0:
        return input.new_empty((0,))
    pick = itertools.combinations_with_replacement if with_replacement else itertools.combinations
    n = input.shape[0]
    count = (math.comb(n + r - 1, r) if with_replacement else math.comb(n, r)) if n > 0 else 0
    if count * r > _MAX_PAIRS:
        raise NoDecomposition("combinations with too many results")
    if count == 0:
        return input.new_empty((0, r))
    positions = [i for combination in pick(range(n), r) for i in combination]
    index = torch.tensor(positions, dtype=torch.int64, device=input.device)
    return input.index_select(0, index).view(count, r)


@decomposition(getattr(torch, "_chunk_cat", None))
def chunk_cat(tensors: Sequence[Any], dim: int, num_chunks: int) -> Any:
    check(len(tensors) > 0, lambda: "_chunk_cat expects a non-empty input tensor list")
    check(num_chunks >= 1, lambda: "_chunk_cat expects positive num_chunks")
    first = tensors[0]
    if all(t.ndim == first.ndim for t in tensors):
        d = wrap_dim(dim, first.ndim)
    else:
        check(dim >= 0, lambda: "_chunk_cat expects non-negative dim when input tensors have different ndims")
        check(all(dim < t.ndim for t in tensors),
              lambda: "_chunk_cat expects dim < ndim for all input tensors")
        d = dim
    if any(t.dtype != first.dtype for t in tensors):
        raise NoDecomposition("_chunk_cat of tensors of different dtypes")
    pieces = []
    for t in tensors:
        check(tuple(t.shape[:d]) == tuple(first.shape[:d]),
              lambda: "_chunk_cat expects same sizes of 0,...,dim-1 dimensions for all tensors")
        size = t.shape[d]
        chunk = -(-size // num_chunks)
        if chunk * num_chunks != size:
            pad_shape = list(t.shape)
            pad_shape[d] = chunk * num_chunks - size
            t = torch.cat([t, t.new_zeros(tuple(pad_shape))], d)
        pieces.append(t.reshape(tuple(t.shape[:d]) + (num_chunks, -1)))
    return torch.cat(pieces, d + 1)


# ---- gradient -----------------------------------------------------------------------------------------

def _gradient_uniform(x: Any, d: int, dx: Any, edge_order: int) -> Any:
    """Central differences along d with a uniform spacing dx (eager's formulas, in its order)."""
    def part(start: int, stop: int | None = None) -> Any:
        return torch.ops.aten.slice.Tensor(x, d, start, stop)
    center = (part(2) - part(0, -2)) / dx
    if edge_order == 1:
        first = (part(1, 2) - part(0, 1)) / dx
        last = (part(-1) - part(-2, -1)) / dx
    else:
        first = (-1.5 * part(0, 1) + 2 * part(1, 2) - 0.5 * part(2, 3)) / dx
        last = (0.5 * part(-3, -2) - 2 * part(-2, -1) + 1.5 * part(-1)) / dx
    return torch.cat([first, center / 2, last], d)


def _gradient_coordinates(x: Any, d: int, coordinates: Any, edge_order: int) -> Any:
    """Differences along d for sample points at `coordinates` (eager's second-order formulas)."""
    def part(start: int, stop: int | None = None) -> Any:
        return torch.ops.aten.slice.Tensor(x, d, start, stop)
    shape = [1] * x.ndim
    shape[d] = -1
    dx = coordinates.diff(1, 0)
    dx1, dx2 = dx[:-1], dx[1:]
    a = (-dx2 / (dx1 * (dx1 + dx2))).reshape(shape)
    b = ((dx2 - dx1) / (dx1 * dx2)).reshape(shape)
    c = (dx1 / (dx2 * (dx1 + dx2))).reshape(shape)
    center = a * part(0, -2) + b * part(1, -1) + c * part(2)
    if edge_order == 1:
        first = (part(1, 2) - part(0, 1)) / dx[0]
        last = (part(-1) - part(-2, -1)) / dx[-1]
    else:
        a = -(2.0 * dx[0] + dx[1]) / (dx[0] * (dx[0] + dx[1]))
        b = (dx[0] + dx[1]) / (dx[0] * dx[1])
        c = (-dx[0]) / (dx[1] * (dx[0] + dx[1]))
        first = a * part(0, 1) + b * part(1, 2) + c * part(2, 3)
        a = dx[-1] / (dx[-2] * (dx[-1] + dx[-2]))
        b = -(dx[-1] + dx[-2]) / (dx[-1] * dx[-2])
        c = (2 * dx[-1] + dx[-2]) / (dx[-1] * (dx[-1] + dx[-2]))
        last = a * part(-3, -2) + b * part(-2, -1) + c * part(-1)
    return torch.cat([first, center, last], d)


@decomposition(torch.gradient)
def gradient(input: Any, *, spacing: Any = 1, dim: Any = None, edge_order: int = 1) -> Any:
    check(edge_order in (1, 2), lambda: "torch.gradient only supports edge_order=1 and edge_order=2.")
    if input.dtype.is_complex or input.dtype == torch.bool:
        raise NoDecomposition(f"gradient of {input.dtype} values")
    dims = list(range(input.ndim)) if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    dims = [wrap_dim(d, input.ndim) for d in dims]
    if spacing is None:
        spacing = 1
    spacings = list(spacing) if isinstance(spacing, (list, tuple)) else [spacing] * len(dims)
    check(len(spacings) == len(dims), lambda: f"torch.gradient expected spacing to be unspecified, a scalar "
          f"or it's spacing and dim arguments to have the same length, but got a spacing argument of length "
          f"{len(spacings)} and a dim argument of length {len(dims)}.")
    for d in dims:
        check(input.shape[d] >= edge_order + 1,
              lambda: "torch.gradient expected each dimension size to be at least edge_order+1")
    results = []
    for d, step in zip(dims, spacings):
        if is_tensor(step):
            check(step.ndim == 1 and step.shape[0] == input.shape[d],
                  lambda: "torch.gradient expected each tensor to be on the same device and to have one "
                  "value per sample point")
            if step.dtype.is_complex or input.dtype != step.dtype and not input.dtype.is_floating_point:
                raise NoDecomposition("gradient with coordinates of another kind")
            results.append(_gradient_coordinates(input, d, step, edge_order))
        else:
            if isinstance(step, (complex, bool)):
                raise NoDecomposition("gradient with a complex or bool spacing")
            results.append(_gradient_uniform(input, d, step, edge_order))
    return tuple(results)


@register(torch.ops.aten._softmax_backward_data, torch.ops.aten._softmax_backward_data.default)
def softmax_backward_data(grad_output: Any, output: Any, dim: int, input_dtype: torch.dtype) -> Any:
    """softmax's gradient: output * (grad_output - sum(grad_output * output, dim))."""
    if grad_output.dtype != input_dtype or not input_dtype.is_floating_point or output.dtype != input_dtype:
        raise NoDecomposition("_softmax_backward_data across dtypes")
    d = wrap_dim(dim, builtins.max(grad_output.ndim, 1))
    if grad_output.ndim == 0:
        return output * (grad_output - grad_output * output)
    total = (grad_output * output).sum(d, keepdim=True)
    return (grad_output - total) * output
