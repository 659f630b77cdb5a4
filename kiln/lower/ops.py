"""The scalar op set of loop bodies, and the handlers that interpret it.

An inner function `fn(h, index)` computes one element by calling scalar ops on a handler `h`:
`h.load(name, index_expr)`, `h.constant(value, dtype)`, `h.index_expr(expr, dtype)`, `h.to_dtype(x, dtype)`,
`h.where(c, a, b)` and the math below (`h.add(a, b)`, `h.exp(a)`, ...). Swapping the handler changes what
running the body means: `PrintHandler` prints it as Python, `DepsHandler` records what it reads,
`CountHandler` measures its cost, the C++ handler in `kiln.codegen.cpp` emits code.

`SCALAR_OP_TABLE` is the one description of the math ops: each op's arity, the kind of its result (a bool,
or its operands' dtype), whether it is defined only on floats (or only on integers and bool), and its cost.
The op sets below, the cost model and the code emitters' own tables (`kiln.codegen.cpp_ops`,
`kiln.codegen.triton_ops`: one entry per op of this table) all read it; adding a scalar op is one row here
and one entry per target.
"""
from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any

import sympy
import torch
from sympy.printing.str import StrPrinter

from .. import config
from .index import FloorDiv, ModularIndexing, indirect_var, simplify_index

class Result(enum.Enum):
    """What a scalar op returns: a bool, or a value of its operands' dtype (`where`: of its values')."""
    BOOL = "bool"
    SAME = "same"


class Domain(enum.Enum):
    """The operand dtypes an op is defined on (prims are strict: the decompositions convert first)."""
    ANY = "any"
    FLOAT = "float"  # floating point only
    INTEGER = "integer"  # integers and bool only (bit operations)


@dataclasses.dataclass(frozen=True)
class ScalarOp:
    name: str
    arity: int
    result: Result = Result.SAME
    domain: Domain = Domain.ANY
    cost: int = 1  # CountHandler units: 1 for an instruction or two, 10 for a transcendental call

    @property
    def float_only(self) -> bool:
        return self.domain is Domain.FLOAT


def _ops(names: str, arity: int, **kw: Any) -> list[ScalarOp]:
    return [ScalarOp(n, arity, **kw) for n in names.split()]


SCALAR_OP_TABLE: dict[str, ScalarOp] = {op.name: op for op in [
    *_ops("abs neg sign", 1),
    *_ops("exp exp2 expm1 log log2 log10 log1p sin cos tan asin acos atan sinh cosh tanh asinh acosh atanh "
          "erf erfc lgamma sigmoid", 1, domain=Domain.FLOAT, cost=10),
    *_ops("erfinv", 1, domain=Domain.FLOAT, cost=40),
    *_ops("sqrt rsqrt reciprocal ceil floor round trunc", 1, domain=Domain.FLOAT),
    *_ops("bitwise_not", 1, domain=Domain.INTEGER),
    *_ops("isnan isinf isfinite signbit logical_not", 1, result=Result.BOOL),
    *_ops("add sub mul div remainder fmod maximum minimum fmax fmin", 2),
    *_ops("pow", 2, cost=10),
    *_ops("atan2 hypot", 2, domain=Domain.FLOAT, cost=10),
    *_ops("copysign nextafter", 2, domain=Domain.FLOAT),
    *_ops("bitwise_and bitwise_or bitwise_xor shift_left shift_right", 2, domain=Domain.INTEGER),
    *_ops("eq ne lt le gt ge logical_and logical_or logical_xor", 2, result=Result.BOOL),
    ScalarOp("where", 3),  # where(cond, a, b): a value of a's dtype
]}

UNARY_OPS = frozenset(n for n, op in SCALAR_OP_TABLE.items() if op.arity == 1)
BINARY_OPS = frozenset(n for n, op in SCALAR_OP_TABLE.items() if op.arity == 2)
COMPARISONS = frozenset(n for n, op in SCALAR_OP_TABLE.items() if op.result is Result.BOOL)  # bool results
OTHER_OPS = frozenset(["load", "constant", "index_expr", "to_dtype", "where", "indirect"])
SCALAR_OPS = UNARY_OPS | BINARY_OPS | OTHER_OPS


def rounded_once() -> frozenset[torch.dtype]:
    """The half types a kernel computes in float and rounds once, where a value is stored or converted to a
    dtype other than float32, rather than after every op (config bfloat16_rounding, float16_rounding): read
    by the code emitters when they start a kernel."""
    return frozenset(dtype for dtype, flag in ((torch.bfloat16, "bfloat16_rounding"),
                                               (torch.float16, "float16_rounding"))
                     if config.get(flag) == "store")


def keeps_register(source: torch.dtype, dtype: torch.dtype, round_once: frozenset[torch.dtype]) -> bool:
    """Whether a kernel converts a value of `source` to `dtype` by keeping its float register as it is:
    between float32 and a half type rounded once (the decompositions compute a half-precision op in float
    between two conversions; torch.compile drops such pairs too). A value of such a type converted to any
    other dtype is rounded to its type first."""
    return (source in round_once and dtype == torch.float32) or (dtype in round_once and source == torch.float32)


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

    def indirect(self, value: Any, size: Any, wrap: bool = False) -> sympy.Symbol:
        """An integer value (a loaded index) as an index into a dim of `size`, for index expressions: a
        symbol `indN` that later loads put in their index. With `wrap`, a negative value counts from the end
        (advanced indexing); a value outside the dim is an error the kernel reports (the wrapper then raises
        eager's error, found in the index values: `LoopGraph.index_checks`), never a read outside the
        buffer. Handlers that only look at a body get a fresh symbol per call."""
        count = self.__dict__.get("indirect_count", 0)
        self.__dict__["indirect_count"] = count + 1
        return indirect_var(count)

    def masked(self, cond: Any, body: Any, other: Any, dtype: Any) -> Any:
        """`body()` where cond holds, else `other()`; only the taken branch runs (its loads are in bounds)."""
        raise NotImplementedError


class _IndexPrinter(StrPrinter):
    """sympy's str form, which is Python for integer polynomials, with kiln's index functions spelled as
    the reference's helpers. Anything else (a fraction, a float, another function) has no spelling."""

    def doprint(self, expr: Any) -> str:
        spelled = (FloorDiv, ModularIndexing, sympy.Symbol, sympy.Integer, sympy.Add, sympy.Mul)
        for node in sympy.preorder_traversal(expr):
            if isinstance(node, spelled):
                continue
            if isinstance(node, sympy.Pow) and node.exp.is_Integer and int(node.exp) >= 0:
                continue
            raise NotImplementedError(f"no Python spelling for {node} ({type(node).__name__})")
        return super().doprint(expr)

    def _print_FloorDiv(self, expr: Any) -> str:
        return f"floordiv({self._print(expr.args[0])}, {self._print(expr.args[1])})"

    def _print_ModularIndexing(self, expr: Any) -> str:
        return f"modular_indexing({self._print(expr.args[0])}, {self._print(expr.args[1])})"


_INDEX_PRINTER = _IndexPrinter()


class PrintHandler(Handler):
    """Renders a body as Python statements, one temporary per op (`t3 = ops.add(t1, t2)`).

    The text runs: index expressions print as Python (FloorDiv/ModularIndexing as `floordiv`/
    `modular_indexing` of `kiln.lower.reference`), constants as literals, a `masked` op's branches as local
    functions. With `ranges` (loop variable -> size) index expressions are first simplified over them, as a
    kernel simplifies them. Run the body on it, then read `lines` and the returned temporary.
    """

    def __init__(self, indent: str = "    ", ranges: dict | None = None) -> None:
        self.lines: list[str] = []
        self.indent = indent
        self.ranges = ranges
        self.count = 0

    @staticmethod
    def index_text(expr: Any) -> str:
        """Python text of an index expression (one without a Python spelling fails when it runs)."""
        try:
            return _INDEX_PRINTER.doprint(sympy.sympify(expr))
        except NotImplementedError as e:
            return f"unprintable({f'index expression {expr}: {e}'!r})()"

    @staticmethod
    def value_text(value: Any) -> str:
        """A Python literal for a constant (NaN and infinities included)."""
        if isinstance(value, float) and not math.isfinite(value):
            return "float('nan')" if math.isnan(value) else ("float('inf')" if value > 0 else "-float('inf')")
        return repr(value)

    def index(self, expr: Any) -> str:
        if self.ranges is not None:
            expr = simplify_index(sympy.expand(expr), self.ranges)
        return self.index_text(expr)

    def emit(self, text: str) -> str:
        self.count += 1
        name = f"t{self.count}"
        self.lines.append(f"{self.indent}{name} = {text}")
        return name

    def op(self, name: str, *args: Any) -> str:
        texts = [a if isinstance(a, str) else self.value_text(a) for a in args]
        return self.emit(f"ops.{name}({', '.join(texts)})")

    def load(self, name: str, index: sympy.Expr) -> str:
        return self.emit(f"ops.load({name!r}, {self.index(index)})")

    def constant(self, value: Any, dtype: Any) -> str:
        return self.emit(f"ops.constant({self.value_text(value)}, {dtype})")

    def index_expr(self, expr: sympy.Expr, dtype: Any) -> str:
        return self.emit(f"ops.index_expr({self.index(expr)}, {dtype})")

    def to_dtype(self, x: Any, dtype: Any) -> str:
        return self.emit(f"ops.to_dtype({x}, {dtype})")

    def indirect(self, value: Any, size: Any, wrap: bool = False) -> sympy.Symbol:
        symbol = super().indirect(value, size, wrap)
        self.lines.append(f"{self.indent}{symbol.name} = ops.indirect({value}, {self.index(size)}, {wrap})")
        return symbol

    def masked(self, cond: Any, body: Any, other: Any, dtype: Any) -> str:
        self.count += 1
        n = self.count
        for fn_name, branch in ((f"masked{n}", body), (f"other{n}", other)):
            self.lines.append(f"{self.indent}def {fn_name}():")
            outer = self.indent
            self.indent += "    "
            value = branch()
            self.lines.append(f"{self.indent}return {value}")
            self.indent = outer
        return self.emit(f"ops.masked({cond}, masked{n}, other{n}, {dtype})")


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

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def op(self, name: str, *args: Any) -> None:
        self.ops += SCALAR_OP_TABLE[name].cost if name in SCALAR_OP_TABLE else 1

    def load(self, name: str, index: sympy.Expr) -> None:
        self.ops += 1
        super().load(name, index)


class WideConvertHandler(Handler):
    """Whether a body converts a 64-bit integer to a float (`to_dtype` of an int64 value, or an index
    expression computed as a float). Values are their dtypes; `dtypes` gives each buffer's."""

    WIDE = ("int64", "uint64")

    def __init__(self, dtypes: dict) -> None:
        self.dtypes = dtypes
        self.found = False

    def _wide(self, dtype: Any) -> bool:
        return str(dtype).rsplit(".", 1)[-1] in self.WIDE

    def op(self, name: str, *args: Any) -> Any:
        if name in COMPARISONS:
            return "torch.bool"
        return args[1] if name == "where" else args[0]

    def load(self, name: str, index: sympy.Expr) -> Any:
        return self.dtypes.get(name)

    def constant(self, value: Any, dtype: Any) -> Any:
        return dtype

    def index_expr(self, expr: sympy.Expr, dtype: Any) -> Any:
        if getattr(dtype, "is_floating_point", False):
            self.found = True
        return dtype

    def to_dtype(self, x: Any, dtype: Any) -> Any:
        if self._wide(x) and getattr(dtype, "is_floating_point", False):
            self.found = True
        return dtype

    def masked(self, cond: Any, body: Any, other: Any, dtype: Any) -> Any:
        body()
        other()
        return dtype


def cast_scalar(value: Any, dtype: torch.dtype) -> Any:
    """A Python number as the prim converts it to `dtype`: an int past the type's range modulo its width, as
    eager takes `int64_tensor + 2**63` (-2**63)."""
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_floating_point:
        return float(torch.tensor(value).to(dtype).item()) if not isinstance(value, float) else value
    if isinstance(value, int):
        bits = 8 * dtype.itemsize
        wrapped = value % 2 ** bits
        return wrapped - 2 ** bits if dtype.is_signed and wrapped >= 2 ** (bits - 1) else wrapped
    return int(torch.tensor(value).to(dtype).item())
