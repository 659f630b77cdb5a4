"""Decompositions of elementwise torch ops: unary math, rounding, classification (isnan, ...), dtype
queries and conversions (Tensor.to, .float(), ...). Binary and ternary ops (and square, which is pow) live
in `elementwise_binary.py`, Bessel functions in `special_bessel*.py`; the helpers they share are in `utils`.

Torch's type promotion and broadcasting come from `utils.elementwise` (dimensioned tensors > 0-d tensors >
Python numbers; float16 computes in float32 unless eager itself rounds each step, noted where it does).
An op whose result equals its input returns a fresh tensor unless eager returns the input itself.
"""
from __future__ import annotations

import builtins
import math
from typing import Any

import torch

from ..graph.symbolic import SymInt
from .. import prims
from ..graph import TensorMeta
from ..graph.layout import is_non_overlapping_and_dense
from ..prims.registry import check
from .registry import NoDecomposition
from .utils import (computation_dtype, convert, decomposition, elementwise, full_like, in_dtype,
                    is_float_dtype, is_tensor, method, refuse_complex, result_type, scalar_type_name, to_bool)


def copy(a: Any) -> Any:
    """A fresh tensor with a's values (an op whose result equals its input must still not alias it)."""
    return prims.convert_element_type(a, a.dtype)


def dtype_of(a: Any) -> torch.dtype:
    return a.dtype if is_tensor(a) else result_type(a)


def _refuse_bool(op: str, a: Any, what: str = "cpu") -> None:
    check(not (is_tensor(a) and a.dtype == torch.bool),
          lambda: f'"{op}_{what}" not implemented for \'Bool\'', NotImplementedError)


# ---- unary math -------------------------------------------------------------------------------------------

def _float_unary(prim: Any, name: str, *targets: Any) -> None:
    """An op computing in floats: integer and bool inputs become the default float dtype. The prim is the
    op itself, so it runs in the input's dtype (float16 too), exactly as eager."""
    def fn(input: Any) -> Any:
        check(is_tensor(input), lambda: f"{name}(): argument 'input' must be Tensor, not "
              f"{type(input).__name__}", TypeError)
        dtype = input.dtype if is_float_dtype(input.dtype) else torch.get_default_dtype()
        if dtype.is_complex:
            try:
                prim.meta(TensorMeta((), dtype))
            except TypeError:
                raise NoDecomposition(f"{name} of complex values") from None
        return prim(convert(input, dtype))
    fn.__name__ = name
    decomposition(*targets)(fn)


_FLOAT_UNARY = [
    (prims.exp, "exp", [torch.exp, method("exp")]),
    (prims.exp2, "exp2", [torch.exp2, method("exp2"), torch.special.exp2]),
    (prims.expm1, "expm1", [torch.expm1, method("expm1"), torch.special.expm1]),
    (prims.log, "log", [torch.log, method("log")]),
    (prims.log2, "log2", [torch.log2, method("log2")]),
    (prims.log10, "log10", [torch.log10, method("log10")]),
    (prims.log1p, "log1p", [torch.log1p, method("log1p"), torch.special.log1p]),
    (prims.sqrt, "sqrt", [torch.sqrt, method("sqrt")]),
    (prims.rsqrt, "rsqrt", [torch.rsqrt, method("rsqrt")]),
    (prims.sin, "sin", [torch.sin, method("sin")]),
    (prims.cos, "cos", [torch.cos, method("cos")]),
    (prims.tan, "tan", [torch.tan, method("tan")]),
    (prims.asin, "asin", [torch.asin, torch.arcsin, method("asin"), method("arcsin")]),
    (prims.acos, "acos", [torch.acos, torch.arccos, method("acos"), method("arccos")]),
    (prims.atan, "atan", [torch.atan, torch.arctan, method("atan"), method("arctan")]),
    (prims.sinh, "sinh", [torch.sinh, method("sinh")]),
    (prims.cosh, "cosh", [torch.cosh, method("cosh")]),
    (prims.tanh, "tanh", [torch.tanh, method("tanh")]),
    (prims.asinh, "asinh", [torch.asinh, torch.arcsinh, method("asinh"), method("arcsinh")]),
    (prims.acosh, "acosh", [torch.acosh, torch.arccosh, method("acosh"), method("arccosh")]),
    (prims.atanh, "atanh", [torch.atanh, torch.arctanh, method("atanh"), method("arctanh")]),
    (prims.erf, "erf", [torch.erf, method("erf"), torch.special.erf]),
    (prims.erfc, "erfc", [torch.erfc, method("erfc"), torch.special.erfc]),
    (prims.erfinv, "erfinv", [torch.erfinv, method("erfinv"), torch.special.erfinv]),
    (prims.lgamma, "lgamma", [torch.lgamma, method("lgamma"), torch.special.gammaln]),
    (prims.digamma, "digamma", [torch.digamma, method("digamma"), torch.special.digamma, torch.special.psi]),
    (prims.sigmoid, "sigmoid", [torch.sigmoid, method("sigmoid"), torch.special.expit]),
    (prims.reciprocal, "reciprocal", [torch.reciprocal, method("reciprocal")]),
    (prims.i0, "i0", [torch.i0, method("i0"), torch.special.i0]),
    (prims.i0e, "i0e", [torch.special.i0e]),
    (prims.i1, "i1", [torch.special.i1]),
    (prims.i1e, "i1e", [torch.special.i1e]),
    (prims.ndtr, "ndtr", [torch.special.ndtr]),
    (prims.ndtri, "ndtri", [torch.special.ndtri]),
    (prims.log_ndtr, "log_ndtr", [torch.special.log_ndtr]),
    (prims.erfcx, "erfcx", [torch.special.erfcx]),
    # eager's modified_bessel_i0/i1 kernels are the Cephes series of i0/i1 (i1 may differ in the last bit)
    (prims.i0, "modified_bessel_i0", [torch.special.modified_bessel_i0]),
    (prims.i1, "modified_bessel_i1", [torch.special.modified_bessel_i1]),
]
for _prim, _name, _targets in _FLOAT_UNARY:
    _float_unary(_prim, _name, *_targets)


def _trigamma(x: Any) -> Any:
    """Eager's scalar trigamma kernel step by step: reflection below 0.5, six recurrence steps, then the
    asymptotic series, every operation in x's dtype."""
    dtype = x.dtype
    pi = in_dtype(math.pi, dtype)
    pi_squared = in_dtype(pi * pi, dtype)
    sixth, thirtieth, fortysecond = (in_dtype(1 / 6, dtype), in_dtype(1 / 30, dtype),
                                     in_dtype(1 / 42, dtype))
    reflect = prims.lt(x, 0.5)
    sin_pi_x = prims.sin(prims.mul(x, pi))
    result = prims.where(reflect, prims.neg(prims.div(pi_squared, prims.mul(sin_pi_x, sin_pi_x))), 0.0)
    x = prims.where(reflect, prims.sub(1.0, x), x)
    for _ in range(6):
        result = prims.add(result, prims.div(1.0, prims.mul(x, x)))
        x = prims.add(x, 1.0)
    ixx = prims.div(1.0, prims.mul(x, x))
    series = prims.mul(ixx, prims.sub(sixth, prims.mul(ixx, prims.sub(thirtieth,
                                                                       prims.mul(ixx, fortysecond)))))
    tail = prims.div(prims.add(prims.add(1.0, prims.div(1.0, prims.mul(x, 2.0))), series), x)
    result = prims.add(result, tail)
    return prims.where(reflect, prims.neg(result), result)


@decomposition(torch.special.spherical_bessel_j0)
def spherical_bessel_j0(input: Any) -> Any:
    """Eager's kernel: a Taylor polynomial below |x| = 0.5, sin(x) / x above, 0 at infinity."""
    dtype = input.dtype if is_float_dtype(input.dtype) else torch.get_default_dtype()
    if dtype not in (torch.float32, torch.float64):
        raise NoDecomposition(f"spherical_bessel_j0 of {dtype} values")
    x = convert(input, dtype)
    xx = prims.mul(x, x)
    series = in_dtype(1.0 / 6227020800.0, dtype)
    for c in (-1.0 / 39916800.0, 1.0 / 362880.0, -1.0 / 5040.0, 1.0 / 120.0, -1.0 / 6.0):
        series = prims.add(prims.mul(xx, series), in_dtype(c, dtype))
    small = prims.add(prims.mul(xx, series), 1.0)
    large = prims.div(prims.sin(x), x)
    out = prims.where(prims.lt(prims.abs(x), 0.5), small, large)
    return prims.where(prims.isinf(x), prims.full(tuple(x.shape), 0.0, dtype, x.device), out)


@decomposition(torch.frexp, method("frexp"))
def frexp(input: Any) -> Any:
    """(mantissa, exponent) with x = mantissa * 2**exponent, 0.5 <= |mantissa| < 1; zero, inf and NaN keep
    their value with exponent 0 (C's frexp). float32 computes in float64, where every power of two it
    needs (subnormals included) is exact."""
    check(is_float_dtype(input.dtype), lambda: "torch.frexp() only supports floating-point dtypes")
    if input.dtype != torch.float32:
        raise NoDecomposition(f"frexp of {input.dtype} values")
    x = prims.convert_element_type(input, torch.float64)
    magnitude = prims.abs(x)
    regular = prims.bitwise_and(prims.isfinite(x), prims.ne(x, 0.0))
    safe = prims.where(regular, magnitude, prims.full(tuple(x.shape), 1.0, torch.float64, x.device))
    exponent = prims.add(prims.floor(prims.log2(safe)), 1.0)
    for _ in range(2):  # log2 may round across a power of two: move the exponent until 0.5 <= m < 1
        scaled = prims.mul(safe, prims.pow(2.0, prims.neg(exponent)))
        exponent = prims.where(prims.ge(scaled, 1.0), prims.add(exponent, 1.0), exponent)
        exponent = prims.where(prims.lt(scaled, 0.5), prims.sub(exponent, 1.0), exponent)
    mantissa = prims.mul(x, prims.pow(2.0, prims.neg(exponent)))
    mantissa = prims.where(regular, mantissa, x)
    exponent = prims.where(regular, exponent, prims.full(tuple(x.shape), 0.0, torch.float64, x.device))
    return torch.return_types.frexp((prims.convert_element_type(mantissa, torch.float32),
                                     prims.convert_element_type(exponent, torch.int32)))


@decomposition(torch.polygamma, torch.special.polygamma)
def polygamma(n: int, input: Any) -> Any:
    """polygamma(0) is digamma, polygamma(1) eager's trigamma kernel, higher orders
    (-1)^(n+1) n! zeta(n + 1, x) as eager computes them (n! as exp(lgamma(n + 1)) in x's dtype)."""
    check(isinstance(n, int) and n >= 0, lambda: "polygamma(n, x) does not support negative n.")
    if n == 0:
        return torch.digamma(input)
    dtype = input.dtype if is_float_dtype(input.dtype) else torch.get_default_dtype()
    if dtype not in (torch.float32, torch.float64):
        raise NoDecomposition(f"polygamma of {dtype} values")
    x = convert(input, dtype)
    if n == 1:
        return _trigamma(x)
    with torch._C.DisableTorchFunction():
        factorial = torch.tensor(float(n) + 1.0, dtype=dtype).lgamma().exp().item()
    scale = factorial if n % 2 else -factorial
    return prims.mul(prims.zeta(float(n + 1), x), scale)


@decomposition(method("polygamma"))
def polygamma_method(input: Any, n: int) -> Any:
    return polygamma(n, input)


@decomposition(torch.abs, torch.absolute, method("abs"), method("absolute"), method("__abs__"))
def abs(input: Any) -> Any:  # noqa: A001
    _refuse_bool("abs", input)
    if input.dtype.is_complex:
        return prims.abs(input)  # the magnitude: a real tensor
    return elementwise(prims.abs, input)


@decomposition(torch.neg, torch.negative, method("neg"), method("negative"), method("__neg__"))
def neg(input: Any) -> Any:
    check(input.dtype != torch.bool, lambda: "Negation, the `-` operator, on a bool tensor is not supported. "
          "If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.")
    return elementwise(prims.neg, input)


@decomposition(torch.positive, method("positive"), method("__pos__"))
def positive(input: Any) -> Any:
    check(input.dtype != torch.bool, lambda: "The `+` operator, on a bool tensor is not supported.")
    return input


@decomposition(torch.sign, method("sign"))
def sign(input: Any) -> Any:
    check(not input.dtype.is_complex, lambda: "Unlike NumPy, torch.sign is not intended to support complex "
          "numbers. Please use torch.sgn instead.", NotImplementedError)
    if input.dtype == torch.bool:
        return copy(input)
    return elementwise(prims.sign, input)


@decomposition(torch.sgn, method("sgn"))
def sgn(input: Any) -> Any:
    refuse_complex("sgn", input)
    return sign(input)


def _rounding(prim: Any, name: str, *targets: Any) -> None:
    def fn(input: Any) -> Any:
        refuse_complex(name, input)
        if not input.dtype.is_floating_point:
            _refuse_bool(name, input, "vml_cpu" if name == "trunc" else "cpu")
            return copy(input)
        return elementwise(prim, input)
    fn.__name__ = name
    decomposition(*targets)(fn)


_rounding(prims.ceil, "ceil", torch.ceil, method("ceil"))
_rounding(prims.floor, "floor", torch.floor, method("floor"))
_rounding(prims.trunc, "trunc", torch.trunc, torch.fix, method("trunc"), method("fix"))


@decomposition(torch.round, method("round"), torch.special.round)
def round(input: Any, *, decimals: int = 0) -> Any:  # noqa: A001
    refuse_complex("round", input)
    if not input.dtype.is_floating_point:
        check(decimals == 0, lambda: f"\"round_cpu\" not implemented for '{scalar_type_name(input.dtype)}'",
              NotImplementedError)
        _refuse_bool("round", input)
        return copy(input)
    if decimals == 0:
        return elementwise(prims.round, input)
    # as torch: nearbyint(x * 10^d) / 10^d, or nearbyint(x / 10^-d) * 10^-d for negative d
    ten_pow = float(10.0 ** builtins.abs(decimals))
    x = convert(input, computation_dtype(input.dtype))
    if decimals > 0:
        out = prims.div(prims.round(prims.mul(x, ten_pow)), ten_pow)
    else:
        out = prims.mul(prims.round(prims.div(x, ten_pow)), ten_pow)
    return convert(out, input.dtype)


@decomposition(torch.frac, method("frac"))
def frac(input: Any) -> Any:
    check(input.dtype.is_floating_point, lambda: f"\"frac_cpu\" not implemented for "
          f"'{scalar_type_name(input.dtype)}'", NotImplementedError)
    x = convert(input, computation_dtype(input.dtype))
    return convert(prims.sub(x, prims.trunc(x)), input.dtype)


@decomposition(torch.deg2rad, method("deg2rad"))
def deg2rad(input: Any) -> Any:
    refuse_complex("deg2rad", input)
    return elementwise(prims.mul, input, math.pi / 180, promotion="int_to_float")


@decomposition(torch.rad2deg, method("rad2deg"))
def rad2deg(input: Any) -> Any:
    refuse_complex("rad2deg", input)
    return elementwise(prims.mul, input, 180 / math.pi, promotion="int_to_float")


@decomposition(torch.sinc, method("sinc"), torch.special.sinc)
def sinc(input: Any) -> Any:
    refuse_complex("sinc", input)
    dtype = result_type(input)
    dtype = dtype if is_float_dtype(dtype) else torch.get_default_dtype()
    x = convert(input, computation_dtype(dtype))
    zero = prims.eq(x, 0)
    # 1 at 0; sin(pi x) / (pi x) of a nonzero stand-in there, so the unused side's gradient (0/0) is no NaN
    product = prims.mul(prims.where(zero, 1.0, x), math.pi)
    out = prims.where(zero, 1.0, prims.div(prims.sin(product), product))
    return convert(out, dtype)


@decomposition(torch.signbit, method("signbit"))
def signbit(input: Any) -> Any:
    refuse_complex("signbit", input)
    if input.dtype == torch.bool or input.dtype == torch.uint8:
        return prims.ne(input, input)  # never negative: all False
    return prims.signbit(input)


@decomposition(torch.isnan, method("isnan"))
def isnan(input: Any) -> Any:
    if not is_float_dtype(input.dtype):
        return prims.ne(input, input)  # integers are never NaN: all False
    return prims.isnan(input)


@decomposition(torch.isinf, method("isinf"))
def isinf(input: Any) -> Any:
    if not is_float_dtype(input.dtype):
        return prims.ne(input, input)
    return prims.isinf(input)


@decomposition(torch.isfinite, method("isfinite"))
def isfinite(input: Any) -> Any:
    if not is_float_dtype(input.dtype):
        return prims.eq(input, input)  # all True
    return prims.isfinite(input)


@decomposition(torch.isposinf, method("isposinf"))
def isposinf(input: Any) -> Any:
    check(not input.dtype.is_complex, lambda: "isposinf does not support complex inputs.")
    if not input.dtype.is_floating_point:
        return prims.ne(input, input)
    return prims.eq(input, math.inf)


@decomposition(torch.isneginf, method("isneginf"))
def isneginf(input: Any) -> Any:
    check(not input.dtype.is_complex, lambda: "isneginf does not support complex inputs.")
    if not input.dtype.is_floating_point:
        return prims.ne(input, input)
    return prims.eq(input, -math.inf)


@decomposition(torch.isreal, method("isreal"))
def isreal(input: Any) -> Any:
    refuse_complex("isreal", input)
    return full_like(input, True, torch.bool)


@decomposition(torch.nan_to_num, method("nan_to_num"))
def nan_to_num(input: Any, nan: float | None = 0.0, posinf: float | None = None,
               neginf: float | None = None) -> Any:
    refuse_complex("nan_to_num", input)
    if not input.dtype.is_floating_point:
        return copy(input)
    info = torch.finfo(input.dtype)
    nan = 0.0 if nan is None else nan
    posinf = info.max if posinf is None else posinf
    neginf = info.min if neginf is None else neginf
    out = prims.where(prims.isnan(input), float(nan), input)
    out = prims.where(prims.eq(input, math.inf), float(posinf), out)
    return prims.where(prims.eq(input, -math.inf), float(neginf), out)


@decomposition(torch.logit, method("logit"), torch.special.logit)
def logit(input: Any, eps: float | None = None) -> Any:
    refuse_complex("logit", input)
    dtype = input.dtype if is_float_dtype(input.dtype) else torch.get_default_dtype()
    x = convert(input, dtype)  # eager computes in the input dtype, float16 included
    if eps is not None:
        x = prims.minimum(prims.maximum(x, float(eps)), 1.0 - float(eps))
    return prims.log(prims.div(x, prims.sub(1.0, x)))


@decomposition(torch.angle, method("angle"))
def angle(input: Any) -> Any:
    refuse_complex("angle", input)
    dtype = result_type(input)
    dtype = dtype if is_float_dtype(dtype) else torch.get_default_dtype()
    x = convert(input, computation_dtype(dtype))
    out = prims.where(prims.isnan(x), x, prims.where(prims.lt(x, 0), math.pi, full_like(x, 0.0, x.dtype)))
    return convert(out, dtype)


@decomposition(torch.bitwise_not, method("bitwise_not"), method("__invert__"))
def bitwise_not(input: Any) -> Any:
    check(not is_float_dtype(input.dtype), lambda: f"\"bitwise_not_cpu\" not implemented for "
          f"'{scalar_type_name(input.dtype)}'", NotImplementedError)
    return prims.bitwise_not(input)


@decomposition(torch.logical_not, method("logical_not"))
def logical_not(input: Any) -> Any:
    return prims.bitwise_not(to_bool(input))


# ---- dtype queries and complex-only ops on real tensors ----------------------------------------------------

@decomposition(torch.is_floating_point)
def is_floating_point(input: Any) -> bool:
    return input.dtype.is_floating_point


@decomposition(torch.is_complex)
def is_complex(input: Any) -> bool:
    return input.dtype.is_complex


@decomposition(torch.is_signed, method("is_signed"))
def is_signed(input: Any) -> bool:
    return input.dtype.is_signed


def _real_identity(name: str, *targets: Any, fresh: bool = False) -> None:
    """conj, real, resolve_conj, resolve_neg of a real tensor: the tensor itself (conj_physical: a copy)."""
    def fn(input: Any) -> Any:
        refuse_complex(name, input)
        return copy(input) if fresh else input
    fn.__name__ = name
    decomposition(*targets)(fn)


_real_identity("conj", torch.conj, method("conj"))
_real_identity("real", torch.real)
_real_identity("resolve_conj", torch.resolve_conj, method("resolve_conj"))
_real_identity("resolve_neg", torch.resolve_neg, method("resolve_neg"))
_real_identity("conj_physical", torch.conj_physical, method("conj_physical"))  # eager: self


# ---- type conversions ----------------------------------------------------------------------------------

_LAST_DIM_ORDERS = {torch.channels_last: (0, 2, 3, 1), torch.channels_last_3d: (0, 2, 3, 4, 1)}


def _is_channels_last(meta: TensorMeta) -> bool:
    """c10's is_channels_last_strides_{2d,3d}: the strides suggest a channels-last layout."""
    if meta.ndim not in (4, 5) or meta.strides[1] == 0:
        return False
    dims = [1, 3, 2, 0] if meta.ndim == 4 else [1, 4, 3, 2, 0]
    smallest = 0
    for d in dims:
        if meta.shape[d] == 0 or meta.strides[d] < smallest:
            return False
        if d == 0 and smallest == meta.strides[1]:
            return False
        smallest = meta.strides[d]
        if meta.shape[d] > 1:
            smallest *= meta.shape[d]
    return True


def _suggest_memory_format(meta: TensorMeta) -> Any:
    if _is_channels_last(meta):
        return torch.channels_last if meta.ndim == 4 else torch.channels_last_3d
    return torch.contiguous_format


def _converted(input: Any, dtype: torch.dtype | None, copy_: bool,
               memory_format: Any = torch.preserve_format) -> Any:
    """Tensor.to's rules: self itself when nothing changes (eager's `to_will_alias`), else a converted copy
    laid out as eager lays it out."""
    meta = input.meta
    if any(not isinstance(v, (int, SymInt)) for v in (*meta.shape, *meta.strides)):
        raise NoDecomposition("a conversion of a tensor with symbolic sizes")
    same_dtype = dtype is None or dtype == input.dtype
    if not copy_ and same_dtype and (memory_format == torch.preserve_format or
                                     _suggest_memory_format(meta) == memory_format):
        return input
    dtype = dtype or input.dtype
    converted = prims.convert_element_type(input, dtype)  # laid out as TensorIterator lays it out
    if memory_format == torch.preserve_format:
        # eager's _to_copy: a dense input's strides (TensorIterator's too), else the suggested format
        if is_non_overlapping_and_dense(meta.shape, meta.strides):
            return converted
        memory_format = _suggest_memory_format(meta)
    if memory_format in _LAST_DIM_ORDERS and input.ndim == len(_LAST_DIM_ORDERS[memory_format]):
        return _laid_out(converted, memory_format)
    if memory_format != torch.contiguous_format:
        raise NoDecomposition(f"a conversion to {memory_format}")
    return _laid_out(converted, memory_format)


def _laid_out(value: Any, memory_format: Any) -> Any:
    """`value` itself when its strides are the memory format's, else a copy with them."""
    strides = prims.shape.memory_format_strides(value.meta.shape, memory_format, "to")
    if tuple(value.meta.strides) == tuple(strides):
        return value
    return prims.clone(value, memory_format)


def _parse_device(device: Any) -> torch.device | None:
    if device is None:
        return None
    if isinstance(device, int):
        return torch.device("cuda", device)
    return torch.device(device)


def _same_device(input: Any, device: torch.device | None) -> bool:
    if device is None:
        return True
    here = input.device
    return here.type == device.type and (device.index is None or device.index == (here.index or 0))


@decomposition(method("to"))
def to(input: Any, *args: Any, **kwargs: Any) -> Any:
    """Tensor.to(dtype | device | other, ..., non_blocking=False, copy=False, memory_format=...)."""
    dtype = kwargs.pop("dtype", None)
    device = kwargs.pop("device", None)
    copy_ = kwargs.pop("copy", False)
    kwargs.pop("non_blocking", None)
    memory_format = kwargs.pop("memory_format", torch.preserve_format)
    if kwargs:
        raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
    positional = list(args)
    if positional and is_tensor(positional[0]):
        other = positional.pop(0)
        dtype, device = other.dtype, other.device
    elif positional and isinstance(positional[0], (str, torch.device, int)) and \
            not isinstance(positional[0], bool):
        device = positional.pop(0)
        if positional and isinstance(positional[0], torch.dtype):
            dtype = positional.pop(0)
    elif positional and isinstance(positional[0], torch.dtype):
        dtype = positional.pop(0)
    if positional:  # non_blocking, copy
        positional.pop(0)
        if positional:
            copy_ = positional.pop(0)
    if positional:
        raise TypeError(f"to() received too many arguments: {args}")
    if not _same_device(input, _parse_device(device)):
        raise NoDecomposition("to() another device")
    return _converted(input, dtype, bool(copy_), memory_format)


def _cast_method(name: str, dtype: torch.dtype) -> None:
    def fn(input: Any, memory_format: Any = torch.preserve_format) -> Any:
        return _converted(input, dtype, False, memory_format)
    fn.__name__ = name
    decomposition(method(name))(fn)


for _name, _dtype in [("float", torch.float32), ("double", torch.float64), ("half", torch.float16),
                      ("bfloat16", torch.bfloat16), ("int", torch.int32), ("long", torch.int64),
                      ("short", torch.int16), ("char", torch.int8), ("byte", torch.uint8),
                      ("bool", torch.bool),
                      ("cfloat", torch.complex64), ("cdouble", torch.complex128), ("chalf", torch.complex32)]:
    _cast_method(_name, _dtype)


@decomposition(method("type_as"))
def type_as(input: Any, other: Any) -> Any:
    return _converted(input, other.dtype, False)


@decomposition(method("type"))
def type_(input: Any, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
    if not isinstance(dtype, torch.dtype):
        raise NoDecomposition("Tensor.type() without a torch.dtype")
    return _converted(input, dtype, False)

