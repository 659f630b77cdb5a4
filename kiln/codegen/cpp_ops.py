"""The C++ spelling of each scalar op of `kiln.lower.ops.SCALAR_OP_TABLE` (tinygrad's `code_for_op`).

`CODE_FOR_OP[name](t, *operands)` is the C++ expression of the op on operands of the C type `t` describes,
or None where the op has no spelling for that dtype. What is the same for every op is done once, by
`CppHandler.op` (kiln.codegen.cpp), around this table:
- half types (bfloat16, float16) compute in float: the operands live in float registers; the result is
  rounded back to the half type's values where the type is rounded after every op (config
  bfloat16_rounding, float16_rounding 'op'; a bool result is kept as it is, an `EXACT` op's needs
  nothing), else only where it is stored or converted;
- a float-only op (the table's domain) on another dtype is not spelled;
- signed integer add, sub, mul and neg wrap on overflow as eager's integers do (`WRAPPING`: computed in
  the unsigned type, as C++'s signed overflow is undefined);
- the result is a bool or the operands' dtype, as the table says.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

# ops whose result is one of their operands' values: on a half type, nothing to round
EXACT = frozenset("abs neg sign maximum minimum fmax fmin where".split())
# the symbol of each op computed by `kiln.codegen.cpp_columns.wrapping` on signed integers (neg: 0 - a)
WRAPPING = {"add": "+", "sub": "-", "mul": "*", "neg": "-"}


@dataclasses.dataclass(frozen=True)
class CType:
    """The operands' dtype as the spellings need it."""
    dtype: torch.dtype
    ctype: str  # its C++ type: float, int64_t... (the half types compute in float)

    @property
    def is_float(self) -> bool:
        return self.dtype.is_floating_point

    @property
    def is_bool(self) -> bool:
        return self.dtype == torch.bool

    @property
    def is_int(self) -> bool:
        return not self.is_float and not self.is_bool


def is_nan(x: Any) -> str:
    """The C++ kernels' one NaN test: a NaN is the only value unequal to itself."""
    return f"{x} != {x}"


Spelling = Callable[..., "str | None"]


def infix(symbol: str) -> Spelling:
    """`a <symbol> b`: comparisons, spelled the same in C++ and Triton."""
    return lambda t, a, b: f"{a} {symbol} {b}"


def logical_infix(symbol: str) -> Spelling:
    # (C++ and Triton alike) & and | of the two flags, not && and ||: both are computed already, and g++ 12 finds no vector mask
    # type for a masked load under `(a != 0) && (b != 0)` (the loop stays scalar)
    return lambda t, a, b: f"({a} != 0) {symbol} ({b} != 0)"


def _std(name: str) -> Spelling:
    """std::name of the operands (a float op: the handler refuses other dtypes first)."""
    return lambda t, *xs: f"std::{name}({', '.join(map(str, xs))})"


def _kiln(name: str) -> Spelling:
    """kiln's own template from the kernel header (kiln.codegen.header), instantiated at the C type."""
    return lambda t, *xs: f"{name}<{t.ctype}>({', '.join(map(str, xs))})"


CODE_FOR_OP: dict[str, Spelling] = {
    # arithmetic (signed add/sub/mul/neg wrap: WRAPPING)
    "add": lambda t, a, b: f"{a} | {b}" if t.is_bool else f"{a} + {b}",
    "sub": lambda t, a, b: f"{a} - {b}",
    "mul": lambda t, a, b: f"{a} & {b}" if t.is_bool else f"{a} * {b}",
    "div": lambda t, a, b: f"kiln_idiv<{t.ctype}>({a}, {b})" if t.is_int else f"{a} / {b}",
    "neg": lambda t, a: f"-{a}",
    "remainder": _kiln("kiln_remainder"),
    "fmod": lambda t, a, b: (f"std::fmod({a}, {b})" if t.is_float else
                             None if t.is_bool else f"kiln_ifmod<{t.ctype}>({a}, {b})"),
    "pow": lambda t, a, b: f"std::pow({a}, {b})",
    "maximum": _kiln("kiln_max"),
    "minimum": _kiln("kiln_min"),
    "fmax": lambda t, a, b: f"std::fmax({a}, {b})" if t.is_float else f"std::max<{t.ctype}>({a}, {b})",
    "fmin": lambda t, a, b: f"std::fmin({a}, {b})" if t.is_float else f"std::min<{t.ctype}>({a}, {b})",
    "abs": lambda t, a: f"std::abs({a})" if t.is_float else (a.name if t.is_bool else f"({a} < 0 ? -{a} : {a})"),
    "sign": lambda t, a: a.name if t.is_bool else f"kiln_sign<{t.ctype}>({a})",
    # bits
    "bitwise_and": lambda t, a, b: f"{a} & {b}",
    "bitwise_or": lambda t, a, b: f"{a} | {b}",
    "bitwise_xor": lambda t, a, b: f"{a} != {b}" if t.is_bool else f"{a} ^ {b}",
    "bitwise_not": lambda t, a: f"!{a}" if t.is_bool else f"~{a}",
    "shift_left": _kiln("kiln_shl"),
    "shift_right": _kiln("kiln_shr"),
    # comparisons and tests (bool results)
    "eq": infix("=="), "ne": infix("!="), "lt": infix("<"), "le": infix("<="), "gt": infix(">"), "ge": infix(">="),
    "logical_and": logical_infix("&"), "logical_or": logical_infix("|"), "logical_xor": logical_infix("!="),
    "logical_not": lambda t, a: f"!({a} != 0)",
    "isnan": lambda t, a: is_nan(a) if t.is_float else "false",
    "isinf": lambda t, a: f"std::isinf({a})" if t.is_float else "false",
    "isfinite": lambda t, a: f"std::isfinite({a})" if t.is_float else "true",
    "signbit": lambda t, a: f"std::signbit({a})" if t.is_float else ("false" if t.is_bool else f"{a} < 0"),
    "where": lambda t, c, a, b: f"{c} ? {a} : {b}",
    # float math: kiln's vectorizable exp/tanh/erf (kiln.codegen.header), else the standard library
    "exp": lambda t, a: f"kiln_exp({a})",
    "tanh": lambda t, a: f"kiln_tanh({a})",
    "erf": lambda t, a: f"kiln_erf({a})",
    "erfinv": lambda t, a: f"kiln_erfinv<{t.ctype}>({a})",
    "sigmoid": lambda t, a: f"{t.ctype}(1) / ({t.ctype}(1) + kiln_exp(-{a}))",
    "rsqrt": lambda t, a: f"{t.ctype}(1) / std::sqrt({a})",
    "reciprocal": lambda t, a: f"{t.ctype}(1) / {a}",
    "round": _std("nearbyint"),
    **{name: _std(name) for name in ("exp2 expm1 log log2 log10 log1p sqrt sin cos tan asin acos atan sinh "
                                      "cosh asinh acosh atanh erfc lgamma ceil floor trunc atan2 hypot "
                                      "copysign nextafter").split()},
}
