"""The scalar op set of loop bodies, and the handlers that interpret it.

An inner function `fn(h, index)` computes one element by calling scalar ops on a handler `h`:
`h.load(name, index_expr)`, `h.constant(value, dtype)`, `h.index_expr(expr, dtype)`, `h.to_dtype(x, dtype)`,
`h.where(c, a, b)` and the math below (`h.add(a, b)`, `h.exp(a)`, ...). Swapping the handler changes what
running the body means: `PrintHandler` prints it, `DepsHandler` records what it reads, `CountHandler`
measures its cost, the C++ handler in `kiln.codegen.cpp` emits code.
"""
from __future__ import annotations

from typing import Any

import sympy

UNARY_OPS = frozenset("""
abs neg sign exp exp2 expm1 log log2 log10 log1p sqrt rsqrt reciprocal sin cos tan asin acos atan sinh cosh
tanh asinh acosh atanh erf erfc lgamma sigmoid ceil floor round trunc bitwise_not isnan isinf isfinite
signbit logical_not
""".split())
BINARY_OPS = frozenset("""
add sub mul div remainder fmod pow atan2 hypot copysign nextafter maximum minimum fmax fmin bitwise_and
bitwise_or bitwise_xor shift_left shift_right eq ne lt le gt ge logical_and logical_or logical_xor
""".split())
COMPARISONS = frozenset("eq ne lt le gt ge isnan isinf isfinite signbit logical_not logical_and logical_or "
                        "logical_xor".split())
OTHER_OPS = frozenset(["load", "constant", "index_expr", "to_dtype", "where"])
SCALAR_OPS = UNARY_OPS | BINARY_OPS | OTHER_OPS


class Handler:
    """Base of the op handlers: `h.add(a, b)` calls `self.op("add", a, b)`."""

    def op(self, name: str, *args: Any) -> Any:
        raise NotImplementedError

    def __getattr__(self, name: str) -> Any:
        if name in UNARY_OPS or name in BINARY_OPS:
            return lambda *args: self.op(name, *args)
        raise AttributeError(f"scalar op set has no op {name!r}")

    def load(self, name: str, index: sympy.Expr) -> Any:
        raise NotImplementedError

    def constant(self, value: Any, dtype: Any) -> Any:
        raise NotImplementedError

    def index_expr(self, expr: sympy.Expr, dtype: Any) -> Any:
        raise NotImplementedError

    def to_dtype(self, x: Any, dtype: Any) -> Any:
        raise NotImplementedError

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        return self.op("where", cond, a, b)

    def masked(self, cond: Any, body: Any, other: Any, dtype: Any) -> Any:
        """`body()` where cond holds, else `other()`; only the taken branch runs (its loads are in bounds)."""
        raise NotImplementedError


class PrintHandler(Handler):
    """Renders a body as a Python expression over `ops.*` calls (for debug dumps)."""

    def op(self, name: str, *args: Any) -> str:
        return f"ops.{name}({', '.join(str(a) for a in args)})"

    def load(self, name: str, index: sympy.Expr) -> str:
        return f"ops.load({name!r}, {index})"

    def constant(self, value: Any, dtype: Any) -> str:
        return f"ops.constant({value!r}, {dtype})"

    def index_expr(self, expr: sympy.Expr, dtype: Any) -> str:
        return f"ops.index_expr({expr}, {dtype})"

    def to_dtype(self, x: Any, dtype: Any) -> str:
        return f"ops.to_dtype({x}, {dtype})"

    def masked(self, cond: Any, body: Any, other: Any, dtype: Any) -> str:
        return f"ops.masked({cond}, lambda: {body()}, lambda: {other()})"


class DepsHandler(Handler):
    """Records every (buffer, index) a body loads."""

    def __init__(self) -> None:
        self.loads: list[tuple[str, sympy.Expr]] = []

    def op(self, name: str, *args: Any) -> None:
        return None

    def load(self, name: str, index: sympy.Expr) -> None:
        self.loads.append((name, index))

    def constant(self, value: Any, dtype: Any) -> None:
        return None

    def index_expr(self, expr: sympy.Expr, dtype: Any) -> None:
        return None

    def to_dtype(self, x: Any, dtype: Any) -> None:
        return None

    def masked(self, cond: Any, body: Any, other: Any, dtype: Any) -> None:
        body()
        other()


class CountHandler(DepsHandler):
    """Counts the ops of a body (its cost when inlined into several consumers)."""

    EXPENSIVE = frozenset("exp exp2 expm1 log log2 log10 log1p sin cos tan asin acos atan sinh cosh tanh "
                          "asinh acosh atanh erf erfc lgamma pow atan2 hypot sigmoid".split())

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def op(self, name: str, *args: Any) -> None:
        self.ops += 10 if name in self.EXPENSIVE else 1

    def load(self, name: str, index: sympy.Expr) -> None:
        self.ops += 1
        super().load(name, index)
