"""Decompositions of binary and ternary elementwise torch ops.

Arithmetic (with reflected operators), division with rounding modes, pow (and square), comparisons, logical
and bitwise ops, min/max, clamp, where, lerp, addcmul/addcdiv, isclose, heaviside.
"""
from __future__ import annotations

import builtins
import math
from typing import Any

import torch

from .. import prims
from ..prims.registry import check
from .registry import DataDependentShape, NoDecomposition
from .utils import (broadcast, convert, decomposition, elementwise, full_like, is_float_dtype, is_number,
                    is_tensor, materialize, method, refuse_complex, result_type, scalar_type_name, to_bool,
                    to_compute, wants_gradient)


def _check_bool_alpha(alpha: Any, *args: Any, op: str) -> None:
    if isinstance(alpha, bool):
        check(result_type(*args) == torch.bool, lambda: f"Boolean alpha only supported for Boolean results.")
    elif isinstance(alpha, float) and not is_float_dtype(result_type(*args)):
        raise RuntimeError(f"For integral input tensors, argument alpha must not be a floating point number.")


def _scaled(other: Any, alpha: Any) -> Any:
    if alpha is None or (alpha == 1 and not isinstance(alpha, bool)):
        return other
    return elementwise(prims.mul, other, alpha)


def _require_tensors(op: str, *args: Any) -> None:
    for a in args:
        check(is_tensor(a), lambda: f"{op}(): argument must be Tensor, not {type(a).__name__}", TypeError)


# ---- arithmetic ----------------------------------------------------------------------------------------

def _numbers_as_tensors(input: Any, other: Any) -> tuple[Any, Any]:
    """torch.add/sub/mul/div of two Python numbers: eager makes each a 0-d CPU tensor (bool, int64, the
    default float dtype, its complex dtype) and returns a 0-d tensor; with a tensor among them, unchanged."""
    if is_tensor(input) or is_tensor(other):
        return input, other
    return tuple(prims.full((), v, _number_dtype(v), torch.device("cpu")) if is_number(v) else v
                 for v in (input, other))


def _number_dtype(value: Any) -> torch.dtype:
    if isinstance(value, bool):
        return torch.bool
    if isinstance(value, complex):
        return torch.complex128 if torch.get_default_dtype() == torch.float64 else torch.complex64
    return torch.get_default_dtype() if isinstance(value, float) else torch.int64


@decomposition(torch.add, method("add"), method("__add__"), method("__radd__"))
def add(input: Any, other: Any, *, alpha: Any = None) -> Any:
    input, other = _numbers_as_tensors(input, other)
    if alpha is not None:
        _check_bool_alpha(alpha, input, other, op="add")
        if not is_tensor(other):
            other = other * alpha
            alpha = None
    return elementwise(prims.add, input, _scaled(other, alpha))


def _check_sub(input: Any, other: Any) -> None:
    check(not (_is_bool(input) and _is_bool(other)),
          lambda: "Subtraction, the `-` operator, with two bool tensors is not supported. "
                  "Use the `^` or `logical_xor()` operator instead.")
    check(not (_is_bool(input) or _is_bool(other)),
          lambda: "Subtraction, the `-` operator, with a bool tensor is not supported. "
                  "If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.")


def _is_bool(a: Any) -> bool:
    return is_tensor(a) and a.dtype == torch.bool


@decomposition(torch.sub, torch.subtract, method("sub"), method("subtract"), method("__sub__"))
def sub(input: Any, other: Any, *, alpha: Any = None) -> Any:
    input, other = _numbers_as_tensors(input, other)
    _check_sub(input, other)
    if alpha is not None:
        _check_bool_alpha(alpha, input, other, op="sub")
        if not is_tensor(other):
            other = other * alpha
            alpha = None
    return elementwise(prims.sub, input, _scaled(other, alpha))


@decomposition(torch.rsub, method("__rsub__"))
def rsub(input: Any, other: Any, *, alpha: Any = None) -> Any:
    check(is_tensor(input) or is_tensor(other), lambda: "rsub() received an invalid combination of arguments "
          f"- got ({type(input).__name__}, {type(other).__name__})", TypeError)
    return sub(other, input, alpha=alpha)


@decomposition(torch.mul, torch.multiply, method("mul"), method("multiply"), method("__mul__"),
               method("__rmul__"))
def mul(input: Any, other: Any) -> Any:
    input, other = _numbers_as_tensors(input, other)
    return elementwise(prims.mul, input, other)


def _floor_divide_float(a: Any, b: Any) -> Any:
    """Python's floor division on floats, as torch's div_floor_floating: (a - fmod(a, b)) / b, fixed up."""
    quotient = prims.div(a, b)
    mod = prims.fmod(a, b)
    div = prims.div(prims.sub(a, mod), b)
    fix = prims.bitwise_and(prims.ne(mod, 0), prims.ne(prims.lt(b, 0), prims.lt(mod, 0)))
    div = prims.where(fix, prims.sub(div, 1.0), div)
    floordiv = prims.floor(div)
    floordiv = prims.where(prims.gt(prims.sub(div, floordiv), 0.5), prims.add(floordiv, 1.0), floordiv)
    floordiv = prims.where(prims.ne(div, 0), floordiv, prims.copysign(prims.mul(a, 0.0), quotient))
    return prims.where(prims.eq(b, 0), quotient, floordiv)


def _floor_divide_int(a: Any, b: Any) -> Any:
    """Floor division of integers by a tensor or a nonzero number `b`."""
    quotient = prims.div(a, b)  # truncates (raises on division by zero, as eager)
    if a.dtype == torch.uint8:
        return quotient
    rem = prims.fmod(a, b)
    if isinstance(b, int):  # the signs differ where the remainder's sign is not b's
        wrong = prims.lt(rem, 0) if b > 0 else prims.gt(rem, 0)
    else:
        wrong = prims.bitwise_and(prims.ne(rem, 0), prims.ne(prims.lt(a, 0), prims.lt(b, 0)))
    return prims.where(wrong, prims.sub(quotient, 1), quotient)


@decomposition(torch.div, torch.divide, method("div"), method("divide"), method("__truediv__"),
               method("__div__"))
def div(input: Any, other: Any, *, rounding_mode: str | None = None) -> Any:
    input, other = _numbers_as_tensors(input, other)
    if rounding_mode is None:
        return elementwise(prims.div, input, other, promotion="int_to_float")
    check(rounding_mode in ("trunc", "floor"), lambda: "div expected rounding_mode to be one of None, "
          f"'trunc', or 'floor' but found '{rounding_mode}'", ValueError)
    refuse_complex("div with rounding_mode", input, other)
    dtype = result_type(input, other)
    if type(other) is int and is_tensor(input) and input.ndim >= 0 and not is_float_dtype(dtype) and \
            dtype not in (torch.bool, torch.uint8) and 1 < abs(other) <= torch.iinfo(dtype).max:
        # an integer tensor by a constant (`perm // top_k`): the constant stays a number, so the kernel can
        # divide by it (a tensor divisor may be zero, which eager raises on, and stays a fallback)
        a = convert(input, dtype)
        return prims.div(a, other) if rounding_mode == "trunc" else _floor_divide_int(a, other)
    compute = dtype  # float16 rounds its quotient to float16 before rounding it to an integer, as eager
    a, b = materialize(*broadcast(convert(input, dtype), convert(other, dtype)))
    if dtype == torch.bool:
        a, b = prims.convert_element_type(a, torch.int64), prims.convert_element_type(b, torch.int64)
    if rounding_mode == "trunc":
        out = prims.trunc(prims.div(a, b)) if is_float_dtype(compute) else prims.div(a, b)
    elif is_float_dtype(compute):
        out = _floor_divide_float(a, b)
    else:
        out = _floor_divide_int(a, b)
    return convert(out, dtype)


@decomposition(torch.true_divide, method("true_divide"))
def true_divide(input: Any, other: Any) -> Any:
    return div(input, other)


@decomposition(method("__rtruediv__"), method("__rdiv__"))
def rtruediv(input: Any, other: Any) -> Any:
    return div(other, input)


@decomposition(torch.floor_divide, method("floor_divide"), method("__floordiv__"))
def floor_divide(input: Any, other: Any) -> Any:
    return div(input, other, rounding_mode="floor")


@decomposition(method("__rfloordiv__"))
def rfloordiv(input: Any, other: Any) -> Any:
    return div(other, input, rounding_mode="floor")


@decomposition(torch.remainder, method("remainder"), method("__mod__"))
def remainder(input: Any, other: Any) -> Any:
    refuse_complex("remainder", input, other)
    return elementwise(prims.remainder, input, other)


@decomposition(method("__rmod__"))
def rmod(input: Any, other: Any) -> Any:
    return remainder(other, input)


@decomposition(torch.fmod, method("fmod"))
def fmod(input: Any, other: Any) -> Any:
    refuse_complex("fmod", input, other)
    return elementwise(prims.fmod, input, other)


# pow with a Python-number exponent: torch computes these exponents with cheaper, more exact ops
_SPECIAL_EXPONENTS = {2: "square", 3: "cube", 0.5: "sqrt", -0.5: "rsqrt", -1: "reciprocal", -2: "rsquare"}


@decomposition(torch.pow, method("pow"), method("__pow__"))
def pow(input: Any, exponent: Any) -> Any:  # noqa: A001
    dtype = result_type(input, exponent)
    if is_tensor(input) and is_number(exponent) and not is_float_dtype(dtype):
        check(not (isinstance(exponent, int) and not isinstance(exponent, bool) and exponent < 0),
              lambda: "Integers to negative integer powers are not allowed.")
    if dtype == torch.bool:
        a, b = (convert(v, torch.int64) for v in (input, exponent))
        return convert(elementwise(prims.pow, a, b), torch.bool)
    if is_tensor(input) and is_number(exponent) and not isinstance(exponent, (bool, complex)):
        kind = _SPECIAL_EXPONENTS.get(exponent)
        if kind is not None and (is_float_dtype(dtype) or kind in ("square", "cube")):
            x = to_compute(input, dtype)
            if kind == "square":
                out = prims.mul(x, x)
            elif kind == "cube":
                out = prims.mul(prims.mul(x, x), x)
            elif kind == "rsquare":
                out = prims.reciprocal(prims.mul(x, x))
            else:
                out = getattr(prims, kind)(x)
            return convert(out, dtype)
    return elementwise(prims.pow, input, exponent)


@decomposition(method("__rpow__"))
def rpow(input: Any, other: Any) -> Any:
    return pow(other, input)


@decomposition(torch.square, method("square"))
def square(input: Any) -> Any:
    return pow(input, 2)


@decomposition(torch.float_power, method("float_power"))
def float_power(input: Any, exponent: Any) -> Any:
    complex_ = any((is_tensor(v) and v.dtype.is_complex) or isinstance(v, complex) for v in (input, exponent))
    dtype = torch.complex128 if complex_ else torch.float64
    a, b = (convert(v, dtype) if is_tensor(v) else (complex(v) if complex_ else float(v))
            for v in (input, exponent))
    return prims.pow(*broadcast(a, b))


def _float_binary(prim: Any, name: str, *targets: Any, real_only: bool = True) -> None:
    def fn(input: Any, other: Any) -> Any:
        if real_only:
            refuse_complex(name, input, other)
        return elementwise(prim, input, other, promotion="int_to_float")
    fn.__name__ = name
    decomposition(*targets)(fn)


_float_binary(prims.atan2, "atan2", torch.atan2, torch.arctan2, method("atan2"), method("arctan2"))
_float_binary(prims.copysign, "copysign", torch.copysign, method("copysign"))
_float_binary(prims.igamma, "igamma", torch.igamma, method("igamma"), torch.special.gammainc)
_float_binary(prims.igammac, "igammac", torch.igammac, method("igammac"), torch.special.gammaincc)
_float_binary(prims.zeta, "zeta", torch.special.zeta)


def _same_float_binary(prim: Any, name: str, *targets: Any) -> None:
    """hypot and nextafter: float inputs only (no integer promotion)."""
    def fn(input: Any, other: Any) -> Any:
        refuse_complex(name, input, other)
        dtype = result_type(input, other)
        check(dtype.is_floating_point,
              lambda: f"\"{name}_cpu\" not implemented for '{scalar_type_name(dtype)}'", NotImplementedError)
        return elementwise(prim, input, other, promotion="no_opmath" if name == "nextafter" else "default")
    fn.__name__ = name
    decomposition(*targets)(fn)


_same_float_binary(prims.hypot, "hypot", torch.hypot, method("hypot"))
_same_float_binary(prims.nextafter, "nextafter", torch.nextafter, method("nextafter"))


def _minmax(prim: Any, name: str, *targets: Any) -> None:
    def fn(input: Any, other: Any) -> Any:
        _require_tensors(name, input, other)
        check(not (input.dtype.is_complex or other.dtype.is_complex),
              lambda: f"{name} not implemented for complex tensors.")
        return elementwise(prim, input, other)
    fn.__name__ = name
    decomposition(*targets)(fn)


_minmax(prims.maximum, "maximum", torch.maximum, method("maximum"))
_minmax(prims.minimum, "minimum", torch.minimum, method("minimum"))
_minmax(prims.fmax, "fmax", torch.fmax, method("fmax"))
_minmax(prims.fmin, "fmin", torch.fmin, method("fmin"))


# ---- comparisons, logical and bitwise ops -----------------------------------------------------------------

def _comparison(prim: Any, name: str, *targets: Any, ordered: bool = True) -> None:
    def fn(input: Any, other: Any) -> Any:
        if ordered:
            refuse_complex(name, input, other)
        return elementwise(prim, input, other, promotion="always_bool")
    fn.__name__ = name
    decomposition(*targets)(fn)


_comparison(prims.eq, "eq", torch.eq, method("eq"), ordered=False)
_comparison(prims.ne, "ne", torch.ne, torch.not_equal, method("ne"), method("not_equal"), ordered=False)


@decomposition(method("__eq__"))
def equality_operator(input: Any, other: Any, *, negate: bool = False) -> Any:
    """`x == other`: as torch.eq for tensors and numbers; `x == None` is False and other types leave the
    comparison to Python (NotImplemented), as eager's Tensor.__eq__ does."""
    if other is None:
        return negate
    if not (is_tensor(other) or is_number(other)):
        return NotImplemented
    return elementwise(prims.ne if negate else prims.eq, input, other, promotion="always_bool")


@decomposition(method("__ne__"))
def inequality_operator(input: Any, other: Any) -> Any:
    return equality_operator(input, other, negate=True)
_comparison(prims.lt, "lt", torch.lt, torch.less, method("lt"), method("less"), method("__lt__"))
_comparison(prims.le, "le", torch.le, torch.less_equal, method("le"), method("less_equal"), method("__le__"))
_comparison(prims.gt, "gt", torch.gt, torch.greater, method("gt"), method("greater"), method("__gt__"))
_comparison(prims.ge, "ge", torch.ge, torch.greater_equal, method("ge"), method("greater_equal"),
            method("__ge__"))


def _logical(prim: Any, name: str, *targets: Any) -> None:
    def fn(input: Any, other: Any) -> Any:
        return elementwise(prim, to_bool(input), to_bool(other))
    fn.__name__ = name
    decomposition(*targets)(fn)


_logical(prims.bitwise_and, "logical_and", torch.logical_and, method("logical_and"))
_logical(prims.bitwise_or, "logical_or", torch.logical_or, method("logical_or"))
_logical(prims.bitwise_xor, "logical_xor", torch.logical_xor, method("logical_xor"))


def _bitwise(prim: Any, name: str, targets: list, reflected: list, kernel: str) -> None:
    def fn(input: Any, other: Any) -> Any:
        dtype = result_type(input, other)
        check(not is_float_dtype(dtype), lambda: f"\"{kernel}_cpu\" not implemented for "
              f"'{scalar_type_name(dtype)}'", NotImplementedError)
        return elementwise(prim, input, other)

    def reflected_fn(input: Any, other: Any) -> Any:
        return fn(other, input)
    fn.__name__ = name
    reflected_fn.__name__ = f"r{name}"
    decomposition(*targets)(fn)
    decomposition(*reflected)(reflected_fn)


_bitwise(prims.bitwise_and, "bitwise_and", [torch.bitwise_and, method("bitwise_and"), method("__and__")],
         [method("__rand__")], "bitwise_and")
_bitwise(prims.bitwise_or, "bitwise_or", [torch.bitwise_or, method("bitwise_or"), method("__or__")],
         [method("__ror__")], "bitwise_or")
_bitwise(prims.bitwise_xor, "bitwise_xor", [torch.bitwise_xor, method("bitwise_xor"), method("__xor__")],
         [method("__rxor__")], "bitwise_xor")
_bitwise(prims.shift_left, "bitwise_left_shift",
         [torch.bitwise_left_shift, method("bitwise_left_shift"), method("__lshift__")],
         [method("__rlshift__")], "lshift")
_bitwise(prims.shift_right, "bitwise_right_shift",
         [torch.bitwise_right_shift, method("bitwise_right_shift"), method("__rshift__")],
         [method("__rrshift__")], "rshift")


# ---- ternary and composite ops --------------------------------------------------------------------------

def _dtype_text(v: Any) -> str:
    return scalar_type_name(v.dtype) if is_tensor(v) else type(v).__name__


@decomposition(torch.where)
def where(condition: Any, input: Any = None, other: Any = None) -> Any:
    if input is None and other is None:
        raise DataDependentShape("where(condition) (nonzero)")
    check(is_tensor(condition) and condition.dtype == torch.bool,
          lambda: f"where expected condition to be a boolean tensor, but got a tensor with dtype "
                  f"{_dtype_text(condition)}")
    dtype = result_type(input, other)
    condition, a, b = broadcast(condition, convert(input, dtype), convert(other, dtype))
    if not is_tensor(a) and not is_tensor(b):
        b = full_like(condition, b, dtype)
    return prims.where(condition, a, b)


@decomposition(method("where"))
def tensor_where(input: Any, condition: Any, other: Any) -> Any:
    return where(condition, input, other)


def _clamp_bound(x: Any, bound: Any, prim: Any) -> Any:
    return x if bound is None else elementwise(prim, x, bound)


def _clamp_routed(x: Any, lo: Any, hi: Any, value: Any) -> Any:
    """clamp's `value` with tensor bounds, its gradient routed as eager's: to x where lo <= x <= hi, to lo
    where x < lo < hi, to hi where x > hi or hi < lo (maximum and minimum would share ties); NaN as value."""
    conditions = []
    if lo is not None:
        below = torch.lt(x, lo)
        conditions.append(torch.ge(x, lo))
    if hi is not None:
        conditions.append(torch.le(x, hi))
    inside = conditions[0] if len(conditions) == 1 else torch.logical_and(*conditions)
    routed = prims.stop_gradient(value)
    if hi is not None:
        above = torch.gt(x, hi) if lo is None else torch.logical_or(torch.gt(x, hi), torch.lt(hi, lo))
        routed = torch.where(above, hi, routed)
    if lo is not None:
        routed = torch.where(below if hi is None else torch.logical_and(below, torch.lt(lo, hi)), lo, routed)
    routed = torch.where(inside, x, routed)
    return torch.where(torch.isnan(value), prims.stop_gradient(value), routed)


@decomposition(torch.clamp, torch.clip, method("clamp"), method("clip"))
def clamp(input: Any, min: Any = None, max: Any = None) -> Any:  # noqa: A002
    check(min is not None or max is not None,
          lambda: "torch.clamp: At least one of 'min' or 'max' must not be None")
    refuse_complex("clamp", input, min, max)
    dtype = result_type(*(v for v in (input, min, max) if v is not None))
    if is_tensor(min) or is_tensor(max):
        shape_args = [v for v in (input, min, max) if is_tensor(v)]
        broadcast(*shape_args)  # raises eager's error for shapes that do not broadcast
    x = c = to_compute(input, dtype)
    # torch: min(max(x, lo), hi), NaN propagating (a NaN bound gives NaN)
    x = _clamp_bound(x, None if min is None else to_compute(min, dtype), prims.maximum)
    x = _clamp_bound(x, None if max is None else to_compute(max, dtype), prims.minimum)
    if (is_tensor(min) or is_tensor(max)) and wants_gradient(input, min, max):
        x = _clamp_routed(c, None if min is None else to_compute(min, dtype),
                          None if max is None else to_compute(max, dtype), x)
    elif wants_gradient(input):
        # eager's gradient is 1 where min <= x <= max, bounds included (maximum's would be 1/2 there)
        inside = [torch.ge(c, min)] if min is not None else []
        inside += [torch.le(c, max)] if max is not None else []
        x = torch.where(inside[0] if len(inside) == 1 else torch.logical_and(*inside), c,
                        prims.stop_gradient(x))
    return convert(x, dtype)


@decomposition(torch.clamp_min, method("clamp_min"))
def clamp_min(input: Any, min: Any) -> Any:  # noqa: A002
    return clamp(input, min, None)


@decomposition(torch.clamp_max, method("clamp_max"))
def clamp_max(input: Any, max: Any) -> Any:  # noqa: A002
    return clamp(input, None, max)


@decomposition(torch.lerp, method("lerp"))
def lerp(input: Any, end: Any, weight: Any) -> Any:
    _require_tensors("lerp", input, end)
    refuse_complex("lerp", input, end, weight)
    check(input.dtype == end.dtype,
          lambda: f"expected dtype {input.dtype} for `end` but got dtype {end.dtype}")
    if is_tensor(weight):
        check(weight.dtype == input.dtype, lambda: f"expected dtype {input.dtype} for `weight` but got dtype "
              f"{weight.dtype}")
    check(input.dtype.is_floating_point, lambda: f"\"lerp_kernel_scalar\" not implemented for "
          f"'{scalar_type_name(input.dtype)}'", NotImplementedError)
    dtype = input.dtype
    start, stop, w = broadcast(to_compute(input, dtype), to_compute(end, dtype), to_compute(weight, dtype))
    diff = prims.sub(stop, start)
    if is_tensor(w):
        small = prims.lt(prims.abs(w), 0.5)
        out = prims.where(small, prims.add(start, prims.mul(w, diff)),
                          prims.sub(stop, prims.mul(diff, prims.sub(1.0, w))))
    elif builtins.abs(w) < 0.5:
        out = prims.add(start, prims.mul(diff, w))
    else:
        out = prims.sub(stop, prims.mul(diff, 1.0 - w))
    return convert(out, dtype)


@decomposition(torch.addcmul, method("addcmul"))
def addcmul(input: Any, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Any:
    refuse_complex("addcmul", input, tensor1, tensor2)
    dtype = result_type(input, tensor1, tensor2)
    a, t1, t2 = broadcast(*(to_compute(v, dtype) for v in (input, tensor1, tensor2)))
    product = prims.mul(t1, t2) if value == 1 else prims.mul(prims.mul(t1, to_compute(value, dtype)), t2)
    return convert(prims.add(a, product), dtype)


@decomposition(torch.addcdiv, method("addcdiv"))
def addcdiv(input: Any, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Any:
    refuse_complex("addcdiv", input, tensor1, tensor2)
    check(is_float_dtype(result_type(tensor1, tensor2)),
          lambda: "Integer division with addcdiv is no longer supported, and in a future release addcdiv "
                  "will perform a true division of tensor1 and tensor2. The historic addcdiv behavior can be "
                  "implemented as (input + value * torch.trunc(tensor1 / tensor2)).to(input.dtype) for "
                  "integer inputs and as (input + value * tensor1 / tensor2) for float inputs. The future "
                  "addcdiv behavior is just the latter implementation: (input + value * tensor1 / tensor2), "
                  "for all dtypes.")
    dtype = result_type(input, tensor1, tensor2)
    a, t1, t2 = broadcast(*(to_compute(v, dtype) for v in (input, tensor1, tensor2)))
    quotient = prims.div(prims.mul(t1, to_compute(value, dtype)), t2) if value != 1 else prims.div(t1, t2)
    return convert(prims.add(a, quotient), dtype)


@decomposition(torch.heaviside, method("heaviside"))
def heaviside(input: Any, values: Any) -> Any:
    _require_tensors("heaviside", input, values)
    refuse_complex("heaviside", input, values)
    check(input.dtype == values.dtype,
          lambda: "heaviside is not yet implemented for tensors with different dtypes.")
    a, v = broadcast(input, values)
    positive = prims.convert_element_type(prims.gt(a, 0) if a.dtype != torch.bool else a, a.dtype)
    return prims.where(prims.eq(a, 0) if a.dtype != torch.bool else prims.bitwise_not(a), v, positive)


@decomposition(torch.isclose, method("isclose"))
def isclose(input: Any, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Any:
    _require_tensors("isclose", input, other)
    refuse_complex("isclose", input, other)
    check(input.dtype == other.dtype, lambda: f"{input.dtype} did not match {other.dtype}")
    check(rtol >= 0, lambda: f"rtol must be greater than or equal to zero, but got {rtol}")
    check(atol >= 0, lambda: f"atol must be greater than or equal to zero, but got {atol}")
    close = elementwise(prims.eq, input, other, promotion="always_bool")
    if equal_nan and input.dtype.is_floating_point:
        both_nan = elementwise(prims.bitwise_and, prims.isnan(input), prims.isnan(other))
        close = elementwise(prims.bitwise_or, close, both_nan)
    if rtol == 0 and atol == 0:
        return close
    a, b = input, other
    if not a.dtype.is_floating_point:
        a, b = convert(a, torch.get_default_dtype()), convert(b, torch.get_default_dtype())
    # each step rounds to the input dtype, as eager's sequence of tensor ops
    allowed = elementwise(prims.add, elementwise(prims.abs, elementwise(prims.mul, b, rtol)), atol)
    actual = elementwise(prims.abs, elementwise(prims.sub, a, b))
    finite_close = elementwise(prims.bitwise_and, prims.isfinite(actual),
                               elementwise(prims.le, actual, allowed, promotion="always_bool"))
    return elementwise(prims.bitwise_or, close, finite_close)


# ---- special binary functions ----------------------------------------------------------------------------

def _float_compute(*args: Any) -> tuple[torch.dtype, list[Any]]:
    """The result dtype (ints promote to the default float) and the broadcast operands in compute dtype."""
    dtype = result_type(*args)
    if not is_float_dtype(dtype):
        dtype = torch.get_default_dtype()
    return dtype, broadcast(*(to_compute(v, dtype) for v in args))


def _xlog(name: str, log_prim: Any, *targets: Any) -> None:
    def fn(input: Any, other: Any) -> Any:
        refuse_complex(name, input, other)
        dtype, (x, y) = _float_compute(input, other)
        x, y = materialize(x, y)
        out = prims.where(prims.eq(x, 0), 0.0, prims.mul(x, log_prim(y)))
        return convert(prims.where(prims.isnan(y), math.nan, out), dtype)
    fn.__name__ = name
    decomposition(*targets)(fn)


_xlog("xlogy", prims.log, torch.xlogy, method("xlogy"), torch.special.xlogy)
_xlog("xlog1py", prims.log1p, torch.special.xlog1py)


@decomposition(torch.special.entr)
def entr(input: Any) -> Any:
    refuse_complex("entr", input)
    dtype, (x,) = _float_compute(input)
    out = prims.where(prims.gt(x, 0), prims.neg(prims.mul(x, prims.log(x))),
                      prims.where(prims.eq(x, 0), 0.0, full_like(x, -math.inf, x.dtype)))
    return convert(prims.where(prims.isnan(x), x, out), dtype)


@decomposition(torch.logaddexp, method("logaddexp"))
def logaddexp(input: Any, other: Any) -> Any:
    return _logaddexp(input, other, base2=False)


@decomposition(torch.logaddexp2, method("logaddexp2"))
def logaddexp2(input: Any, other: Any) -> Any:
    return _logaddexp(input, other, base2=True)


def _logaddexp(input: Any, other: Any, base2: bool) -> Any:
    refuse_complex("logaddexp", input, other)
    dtype = result_type(input, other)
    check(is_float_dtype(dtype), lambda: f"\"logaddexp{'2' if base2 else ''}_cpu\" not implemented for "
          f"'{scalar_type_name(dtype)}'", NotImplementedError)
    a, b = broadcast(to_compute(input, dtype), to_compute(other, dtype))
    big = prims.maximum(a, b)
    gap = prims.neg(prims.abs(prims.sub(a, b)))
    if base2:
        out = prims.add(big, prims.mul(prims.log1p(prims.exp2(gap)), 1 / math.log(2)))
    else:
        out = prims.add(big, prims.log1p(prims.exp(gap)))
    # equal infinities: inf - inf would be NaN; the answer is that infinity
    same_inf = prims.bitwise_and(prims.isinf(a), prims.eq(a, b))
    return convert(prims.where(same_inf, a, out), dtype)


@decomposition(torch.ldexp, method("ldexp"))
def ldexp(input: Any, other: Any) -> Any:
    refuse_complex("ldexp", input, other)
    return elementwise(prims.mul, input, pow(2.0, other) if is_tensor(other) else 2.0 ** other,
                       promotion="int_to_float")
