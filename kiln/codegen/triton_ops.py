"""The Triton spelling of each scalar op of `kiln.lower.ops.SCALAR_OP_TABLE` (tinygrad's `code_for_op`).

`CODE_FOR_OP[name](t, *operands)` is the Triton expression of the op on operands of the dtype `t` describes
(or one of the operands itself, for an op that is the identity on that dtype), or None where the op has no
spelling for that dtype. What is the same for every op is done once, by `TritonHandler.op`
(kiln.codegen.triton), around this table:
- half types (bfloat16, float16) live in float32 registers: a result of their dtype is rounded back to the
  half type (`round_half`) where the type is rounded after every op (config bfloat16_rounding and
  float16_rounding 'op'), except for the ops in `EXACT`, whose result is one of their operands' values;
  else only where it is stored or converted;
- a float-only op (the table's domain) on another dtype is not spelled;
- the result is a bool or the operands' dtype, as the table says.
Integer arithmetic wraps in Triton as in eager: no wrapper.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import torch

from .cpp_ops import infix, logical_infix

TL_TYPES = {torch.bfloat16: "tl.bfloat16", torch.float16: "tl.float16", torch.float32: "tl.float32",
            torch.float64: "tl.float64", torch.int64: "tl.int64", torch.int32: "tl.int32",
            torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1"}
HALF_TYPES = (torch.bfloat16, torch.float16)
# round a float32 register to the half type's nearest value (kept in float32)
ROUND = {torch.bfloat16: "kiln_round_bf16", torch.float16: "kiln_round_fp16"}
# ops whose result is one of their operands' values (or a bit pattern of them): never rounded
EXACT = frozenset("abs sign maximum minimum fmax fmin bitwise_and bitwise_or bitwise_xor bitwise_not "
                  "where".split())


def reg_type(dtype: torch.dtype) -> str:
    """The Triton type a value of `dtype` is held in (halves in float32)."""
    return "tl.float32" if dtype in HALF_TYPES else TL_TYPES[dtype]


def literal(value: Any, dtype: torch.dtype) -> str:
    """A Python literal Triton reads as `value` (halves rounded to their type first)."""
    if dtype == torch.bool:
        return "1" if value else "0"
    if dtype.is_floating_point:
        value = float(value)
        if dtype in HALF_TYPES:
            value = float(torch.tensor(value, dtype=dtype).float())
        if math.isnan(value):
            return 'float("nan")'
        if math.isinf(value):
            return 'float("inf")' if value > 0 else 'float("-inf")'
        return repr(value)
    return str(int(value))


def round_half(text: str, dtype: torch.dtype) -> str:
    """A float32 result of an op on `dtype` operands, rounded to `dtype` when it is a half type."""
    return f"{ROUND[dtype]}({text})" if dtype in HALF_TYPES else text


def is_nan(x: Any) -> str:
    """The Triton kernels' one NaN test: a NaN is the only value unequal to itself."""
    return f"{x} != {x}"


@dataclasses.dataclass(frozen=True)
class TType:
    """The operands' dtype as the spellings need it, and the module the math functions come from."""
    dtype: torch.dtype
    lib: str  # libdevice on a GPU (kiln.runtime.triton supplies the same names under the interpreter)

    @property
    def is_float(self) -> bool:
        return self.dtype.is_floating_point

    @property
    def is_bool(self) -> bool:
        return self.dtype == torch.bool

    @property
    def is_int(self) -> bool:
        return not self.is_float and not self.is_bool

    @property
    def reg(self) -> str:
        return reg_type(self.dtype)


Spelling = Callable[..., Any]


def _lib(name: str) -> Spelling:
    """The math library's function of the same name (a float op: the handler refuses other dtypes)."""
    return lambda t, *xs: f"{t.lib}.{name}({', '.join(map(str, xs))})"


def _select(bool_symbol: str, float_fn: str, int_fn: str) -> Spelling:
    """max/min: `|`/`&` on bools, kiln's NaN-aware function on floats, Triton's on integers."""
    def spell(t: TType, a: Any, b: Any) -> str:
        if t.is_bool:
            return f"{a} {bool_symbol} {b}"
        return f"{float_fn if t.is_float else int_fn}({a}, {b})"
    return spell


def _shift(name: str) -> Spelling:
    return lambda t, a, b: f"kiln_{name}({a}, {b}, {t.dtype.itemsize * 8})" if t.is_int else None


def _sign(t: TType, a: Any) -> Any:
    if t.is_bool:
        return a
    zero, one = literal(0, t.dtype), literal(1, t.dtype)
    return f"tl.where({a} > {zero}, {one}, tl.where({a} < {zero}, -{one}, {zero})).to({t.reg})"


def _signbit(t: TType, a: Any) -> str:
    if t.is_float:
        return f"{a}.to({'tl.int64' if t.dtype == torch.float64 else 'tl.int32'}, bitcast=True) < 0"
    return f"tl.zeros_like({a}) != 0" if t.is_bool else f"{a} < 0"


def _div(t: TType, a: Any, b: Any) -> str:
    if not t.is_float:
        return f"kiln_idiv({a}, {b})"
    # IEEE division (Triton's `/` on float32 is the approximate one)
    return f"{a} / {b}" if t.dtype == torch.float64 else f"tl.math.div_rn({a}, {b})"


def _rsqrt(t: TType, a: Any) -> str:
    if t.dtype == torch.float64:
        return f"1.0 / {t.lib}.sqrt({a})"
    return f"tl.math.div_rn(tl.full([1, 1], 1.0, {t.reg}), tl.sqrt_rn({a}))"


def _sigmoid(t: TType, a: Any) -> str:
    one = f"tl.full([1, 1], 1.0, {t.reg})"
    div = "tl.math.div_rn" if t.dtype != torch.float64 else "kiln_div64"
    return f"{div}({one}, {one} + {t.lib}.exp(-{a}))"


CODE_FOR_OP: dict[str, Spelling] = {
    # arithmetic
    "add": lambda t, a, b: f"{a} | {b}" if t.is_bool else f"{a} + {b}",
    "sub": lambda t, a, b: f"{a} - {b}",
    "mul": lambda t, a, b: f"{a} & {b}" if t.is_bool else f"{a} * {b}",
    "div": _div,
    "neg": lambda t, a: f"-{a}",
    "remainder": lambda t, a, b: (f"kiln_fremainder({a}, {b}, {t.lib}.fmod({a}, {b}))" if t.is_float else
                                  f"kiln_iremainder({a}, {b})"),
    "fmod": lambda t, a, b: (f"{t.lib}.fmod({a}, {b})" if t.is_float else
                             f"kiln_ifmod({a}, {b})" if t.is_int else None),
    "pow": lambda t, a, b: f"{t.lib}.pow({a}, {b})" if t.is_float else None,
    "maximum": _select("|", "kiln_maximum", "tl.maximum"),
    "minimum": _select("&", "kiln_minimum", "tl.minimum"),
    "fmax": _select("|", "kiln_fmax", "tl.maximum"),
    "fmin": _select("&", "kiln_fmin", "tl.minimum"),
    "abs": lambda t, a: a if t.is_bool else f"tl.abs({a})",
    "sign": _sign,
    # bits
    "bitwise_and": lambda t, a, b: f"{a} & {b}",
    "bitwise_or": lambda t, a, b: f"{a} | {b}",
    "bitwise_xor": lambda t, a, b: f"{a} ^ {b}",
    "bitwise_not": lambda t, a: f"{a} == 0" if t.is_bool else f"~{a}",
    "shift_left": _shift("shift_left"),
    "shift_right": _shift("shift_right"),
    # comparisons and tests (bool results)
    "eq": infix("=="), "ne": infix("!="), "lt": infix("<"), "le": infix("<="), "gt": infix(">"), "ge": infix(">="),
    "logical_and": logical_infix("&"), "logical_or": logical_infix("|"), "logical_xor": logical_infix("^"),
    "logical_not": lambda t, a: f"{a} == 0",
    "isnan": lambda t, a: is_nan(a) if t.is_float else f"tl.zeros_like({a}) != 0",
    "isinf": lambda t, a: f"tl.abs({a}) == float(\"inf\")" if t.is_float else f"tl.zeros_like({a}) != 0",
    "isfinite": lambda t, a: (f"({a} == {a}) & (tl.abs({a}) != float(\"inf\"))" if t.is_float else
                              f"tl.zeros_like({a}) == 0"),
    "signbit": _signbit,
    "where": lambda t, c, a, b: f"tl.where({c}, {a}, {b})",
    # float math: IEEE-rounded division and square root, else the math library
    "rsqrt": _rsqrt,
    "reciprocal": lambda t, a: (f"1.0 / {a}" if t.dtype == torch.float64 else
                                f"tl.math.div_rn(tl.full([1, 1], 1.0, tl.float32), {a})"),
    "sigmoid": _sigmoid,
    "round": _lib("nearbyint"),
    "sqrt": lambda t, a: f"{t.lib}.sqrt({a})" if t.dtype == torch.float64 else f"tl.sqrt_rn({a})",
    **{name: _lib(name) for name in ("exp exp2 expm1 log log2 log10 log1p sin cos tan asin acos atan sinh cosh "
                                      "tanh asinh acosh atanh erf erfc erfinv lgamma ceil floor trunc atan2 hypot "
                                      "copysign nextafter").split()},
}
