"""Elementwise prims: unary and binary math, comparisons, bitwise and logical ops, where, type conversion.

Strict rules: tensor operands of a binary prim have the same shape and dtype; one operand may be a
Python number whose kind (bool < int < float < complex) does not exceed the tensor's dtype. Float-only
math refuses integer and bool tensors (decompositions convert first). Comparisons return bool.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ..graph.symbolic import SymInt
from ..graph import TensorMeta
from ..graph.layout import elementwise_strides
from .registry import Prim, check, is_tensor, meta_of, prim, shape_text


def _kind(dtype_or_value: Any) -> int:
    if isinstance(dtype_or_value, torch.dtype):
        if dtype_or_value == torch.bool:
            return 0
        if dtype_or_value.is_complex:
            return 3
        return 2 if dtype_or_value.is_floating_point else 1
    if isinstance(dtype_or_value, bool):
        return 0
    if isinstance(dtype_or_value, (int, SymInt)):
        return 1
    if isinstance(dtype_or_value, float):
        return 2
    if isinstance(dtype_or_value, complex):
        return 3
    raise TypeError(f"expected a tensor or a Python number, got {type(dtype_or_value).__name__}")


def _elementwise_meta(name: str, operands: tuple, out_dtype: torch.dtype | None = None,
                      allowed: Callable[[torch.dtype], bool] | None = None, what: str = "") -> TensorMeta:
    tensors = [meta_of(a) for a in operands if is_tensor(a)]
    check(bool(tensors), lambda: f"prims.{name}: expected at least one tensor operand", TypeError)
    first = tensors[0]
    for t in tensors[1:]:
        check(t.shape == first.shape, lambda: f"prims.{name}: operands must have the same shape "
              f"(prims do not broadcast), got {', '.join(shape_text(a) for a in operands)}")
        check(t.dtype == first.dtype, lambda: f"prims.{name}: operands must have the same dtype "
              f"(prims do not promote), got "
              f"{', '.join(str(meta_of(a).dtype) for a in operands if is_tensor(a))}",
              TypeError)
        check(t.device == first.device, lambda: f"prims.{name}: operands on different devices "
              f"{first.device} and {t.device}")
    for a in operands:
        if not is_tensor(a):
            check(_kind(a) <= _kind(first.dtype), lambda: f"prims.{name}: a {type(a).__name__} scalar "
                  f"cannot combine with a {first.dtype} tensor without promotion", TypeError)
    if allowed is not None:
        check(allowed(first.dtype), lambda: f"prims.{name}: not defined for {first.dtype} tensors{what}",
              TypeError)
    return TensorMeta(first.shape, out_dtype or first.dtype, first.device, _strides(operands))


def _strides(operands: tuple) -> tuple:
    """The result's strides: eager's TensorIterator rule over the operands (kiln.graph.layout)."""
    tensors = [meta_of(a) for a in operands if is_tensor(a)]
    return elementwise_strides(tensors[0].shape, [t.strides for t in tensors],
                               scalars=len(tensors) < len(operands))


def _laid_out(out: torch.Tensor, operands: tuple) -> torch.Tensor:
    """A reference's result with the strides its meta promises (torch's kernels mostly agree already)."""
    strides = _strides(operands)
    if tuple(out.stride()) == tuple(strides):
        return out
    fresh = torch.empty_strided(out.shape, strides, dtype=out.dtype, device=out.device)
    fresh.copy_(out)
    return fresh


def _is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


def _is_real_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


def _is_integral(dtype: torch.dtype) -> bool:
    return not dtype.is_floating_point and not dtype.is_complex


def _not_complex(dtype: torch.dtype) -> bool:
    return not dtype.is_complex


def scalar_tensor(value: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A Python number as a 0-d tensor of dtype, converted as torch converts a wrapped scalar (integers
    wrap around, large doubles round to the float type); tensors pass through."""
    if isinstance(value, torch.Tensor):
        return value
    wide = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}
    return torch.tensor(value, dtype=wide.get(type(value)), device=device).to(dtype)


def _not_complex_or_bool(dtype: torch.dtype) -> bool:
    return not dtype.is_complex and dtype != torch.bool


def _is_float32_or_64(dtype: torch.dtype) -> bool:
    return dtype in (torch.float32, torch.float64)  # torch has no float16 kernel for these


def _unary(name: str, ref: Callable[..., Any], allowed: Callable[[torch.dtype], bool] | None = None,
           out_dtype: torch.dtype | None = None, tags: tuple = ("elementwise",)) -> Prim:
    def meta(a: Any) -> TensorMeta:
        check(is_tensor(a), lambda: f"prims.{name}: expected a tensor, got {type(a).__name__}", TypeError)
        return _elementwise_meta(name, (a,), out_dtype, allowed)

    def laid_out_ref(a: Any) -> Any:
        return _laid_out(ref(a), (a,))  # a fresh tensor, laid out as the meta says
    return prim(name, meta, laid_out_ref, tags=tags + ("unary",))


def _binary(name: str, ref: Callable[..., Any], allowed: Callable[[torch.dtype], bool] | None = None,
            out_dtype: torch.dtype | None = None, tags: tuple = ("elementwise",)) -> Prim:
    def meta(a: Any, b: Any) -> TensorMeta:
        return _elementwise_meta(name, (a, b), out_dtype, allowed)

    def strict_ref(a: Any, b: Any) -> Any:
        # A Python number operand becomes a 0-d tensor of the other operand's dtype: the prim computes in
        # that dtype (torch's own scalar overloads would promote, and some ops have none for a first scalar).
        tensor = a if isinstance(a, torch.Tensor) else b
        operands = (a, b)
        a = scalar_tensor(a, tensor.dtype, tensor.device)
        b = scalar_tensor(b, tensor.dtype, tensor.device)
        out = ref(a, b)
        dtype = out_dtype or tensor.dtype
        out = out if out.dtype == dtype else out.to(dtype)
        return _laid_out(out, operands)  # a fresh tensor, laid out as the meta says
    return prim(name, meta, strict_ref, tags=tags + ("binary",))


# ---- unary math -----------------------------------------------------------------------------------------
abs = _unary("abs", torch.abs, lambda d: d != torch.bool)  # noqa: A001 - complex: see below
neg = _unary("neg", torch.neg, lambda d: d != torch.bool)
sign = _unary("sign", torch.sign, _not_complex)
exp = _unary("exp", torch.exp, _is_float)
exp2 = _unary("exp2", torch.exp2, _is_real_float)
expm1 = _unary("expm1", torch.expm1, _is_float)
log = _unary("log", torch.log, _is_float)
log2 = _unary("log2", torch.log2, _is_float)
log10 = _unary("log10", torch.log10, _is_float)
log1p = _unary("log1p", torch.log1p, _is_float)
sqrt = _unary("sqrt", torch.sqrt, _is_float)
rsqrt = _unary("rsqrt", torch.rsqrt, _is_float)
reciprocal = _unary("reciprocal", torch.reciprocal, _is_float)
sin = _unary("sin", torch.sin, _is_float)
cos = _unary("cos", torch.cos, _is_float)
tan = _unary("tan", torch.tan, _is_float)
asin = _unary("asin", torch.asin, _is_float)
acos = _unary("acos", torch.acos, _is_float)
atan = _unary("atan", torch.atan, _is_float)
sinh = _unary("sinh", torch.sinh, _is_float)
cosh = _unary("cosh", torch.cosh, _is_float)
tanh = _unary("tanh", torch.tanh, _is_float)
asinh = _unary("asinh", torch.asinh, _is_float)
acosh = _unary("acosh", torch.acosh, _is_float)
atanh = _unary("atanh", torch.atanh, _is_float)
erf = _unary("erf", torch.erf, _is_real_float)
erfc = _unary("erfc", torch.erfc, _is_real_float)
erfinv = _unary("erfinv", torch.erfinv, _is_real_float)
lgamma = _unary("lgamma", torch.lgamma, _is_real_float)
digamma = _unary("digamma", torch.digamma, _is_real_float)
sigmoid = _unary("sigmoid", torch.sigmoid, _is_float)
ceil = _unary("ceil", torch.ceil, _is_real_float)
floor = _unary("floor", torch.floor, _is_real_float)
round = _unary("round", torch.round, _is_real_float)  # noqa: A001 - half to even, as torch.round
trunc = _unary("trunc", torch.trunc, _is_real_float)
bitwise_not = _unary("bitwise_not", torch.bitwise_not, _is_integral)
isnan = _unary("isnan", torch.isnan, out_dtype=torch.bool)
isinf = _unary("isinf", torch.isinf, out_dtype=torch.bool)
isfinite = _unary("isfinite", torch.isfinite, out_dtype=torch.bool)
signbit = _unary("signbit", torch.signbit, _not_complex, out_dtype=torch.bool)
# special functions (torch.special); the rarer ones stay fallbacks in kiln.ops
i0 = _unary("i0", torch.i0, _is_real_float)
i0e = _unary("i0e", torch.special.i0e, _is_real_float)
i1 = _unary("i1", torch.special.i1, _is_real_float)
i1e = _unary("i1e", torch.special.i1e, _is_real_float)
ndtr = _unary("ndtr", torch.special.ndtr, _is_real_float)
ndtri = _unary("ndtri", torch.special.ndtri, _is_float32_or_64)
log_ndtr = _unary("log_ndtr", torch.special.log_ndtr, _is_float32_or_64)
erfcx = _unary("erfcx", torch.special.erfcx, _is_float32_or_64)



def _abs_meta(a: Any) -> TensorMeta:
    m = _elementwise_meta("abs", (a,), None, lambda d: d != torch.bool)
    return m.with_(dtype=m.dtype.to_real()) if m.dtype.is_complex else m


abs.meta = _abs_meta  # the absolute value of a complex number is real

# ---- binary math ----------------------------------------------------------------------------------------


def _div_ref(a: Any, b: Any) -> Any:
    dtype = a.dtype if isinstance(a, torch.Tensor) else b.dtype
    if _is_float(dtype):
        return torch.true_divide(a, b)
    # torch's truncating division traps on min // -1 (SIGFPE) where floor_divide wraps: divide by -1 as a
    # negation (which wraps) and leave the hardware only the other divisors
    minus_one = torch.eq(torch.as_tensor(b), -1) if isinstance(b, torch.Tensor) else b == -1
    if isinstance(minus_one, bool):
        return torch.neg(torch.as_tensor(a)) if minus_one and isinstance(a, torch.Tensor) else \
            torch.div(a, b, rounding_mode="trunc")
    if minus_one.device.type == "meta" or not bool(minus_one.any()):
        return torch.div(a, b, rounding_mode="trunc")
    safe = torch.where(minus_one, torch.ones_like(torch.as_tensor(b)), b)
    return torch.where(minus_one, torch.neg(torch.as_tensor(a)), torch.div(a, safe, rounding_mode="trunc"))


add = _binary("add", torch.add, lambda d: True)
sub = _binary("sub", torch.sub, lambda d: d != torch.bool)
mul = _binary("mul", torch.mul)
div = _binary("div", _div_ref, lambda d: d != torch.bool)  # true division for floats, truncation for integers
remainder = _binary("remainder", torch.remainder, _not_complex_or_bool)  # sign of the divisor, as Python's %
fmod = _binary("fmod", torch.fmod, _not_complex_or_bool)  # sign of the dividend, as C's fmod
pow = _binary("pow", torch.pow, lambda d: d != torch.bool)  # noqa: A001
atan2 = _binary("atan2", torch.atan2, _is_real_float)
hypot = _binary("hypot", torch.hypot, _is_real_float)
copysign = _binary("copysign", torch.copysign, _is_real_float)
nextafter = _binary("nextafter", torch.nextafter, _is_real_float)
maximum = _binary("maximum", torch.maximum, _not_complex)  # propagates NaN
minimum = _binary("minimum", torch.minimum, _not_complex)
fmax = _binary("fmax", torch.fmax, _not_complex)  # ignores NaN
fmin = _binary("fmin", torch.fmin, _not_complex)
bitwise_and = _binary("bitwise_and", torch.bitwise_and, _is_integral)
bitwise_or = _binary("bitwise_or", torch.bitwise_or, _is_integral)
bitwise_xor = _binary("bitwise_xor", torch.bitwise_xor, _is_integral)
shift_left = _binary("shift_left", torch.bitwise_left_shift, lambda d: _is_integral(d) and d != torch.bool)
shift_right = _binary("shift_right", torch.bitwise_right_shift,  # arithmetic for signed types
                      lambda d: _is_integral(d) and d != torch.bool)
zeta = _binary("zeta", torch.special.zeta, _is_float32_or_64)
igamma = _binary("igamma", torch.igamma, _is_real_float)
igammac = _binary("igammac", torch.igammac, _is_real_float)

eq = _binary("eq", torch.eq, out_dtype=torch.bool)
ne = _binary("ne", torch.ne, out_dtype=torch.bool)
lt = _binary("lt", torch.lt, _not_complex, out_dtype=torch.bool)
le = _binary("le", torch.le, _not_complex, out_dtype=torch.bool)
gt = _binary("gt", torch.gt, _not_complex, out_dtype=torch.bool)
ge = _binary("ge", torch.ge, _not_complex, out_dtype=torch.bool)


# ---- where and type conversion --------------------------------------------------------------------------

def _where_meta(pred: Any, a: Any, b: Any) -> TensorMeta:
    check(is_tensor(pred) and meta_of(pred).dtype == torch.bool,
          lambda: "prims.where: the condition must be a bool tensor", TypeError)
    values = _elementwise_meta("where", (a, b) if (is_tensor(a) or is_tensor(b)) else (pred,))
    if not (is_tensor(a) or is_tensor(b)):
        raise TypeError("prims.where: at least one of the values must be a tensor")
    check(meta_of(pred).shape == values.shape, lambda: f"prims.where: condition shape "
          f"{shape_text(pred)} differs from value shape [{', '.join(map(str, values.shape))}]")
    return values.with_(strides=_strides((pred, a, b)))


def _where_ref(pred: torch.Tensor, a: Any, b: Any) -> torch.Tensor:
    tensor = a if isinstance(a, torch.Tensor) else b
    out = torch.where(pred, scalar_tensor(a, tensor.dtype, tensor.device),
                      scalar_tensor(b, tensor.dtype, tensor.device))
    return _laid_out(out, (pred, a, b))


where = prim("where", _where_meta, _where_ref, tags=("elementwise", "ternary"))


def _convert_meta(a: Any, dtype: torch.dtype) -> TensorMeta:
    check(is_tensor(a), lambda: "prims.convert_element_type: expected a tensor", TypeError)
    check(isinstance(dtype, torch.dtype),
          lambda: f"prims.convert_element_type: expected a dtype, got {dtype!r}",
          TypeError)
    m = meta_of(a)
    return TensorMeta(m.shape, dtype, m.device, _strides((a,)))


def _convert_ref(a: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # A fresh tensor laid out as every elementwise prim lays out its result.
    return _laid_out(a.to(dtype, copy=True), (a,))


convert_element_type = prim("convert_element_type", _convert_meta, _convert_ref,
                            tags=("elementwise", "unary"))

