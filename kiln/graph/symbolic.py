"""Symbolic sizes: `SymInt`, an int-like value standing for a size that varies between calls, and the
`ShapeEnv` that decides questions about them and remembers what it decided.

A dynamic dimension of a graph input gets a symbol (`s0`) with a hint, the size the capture saw. Code that
computes with sizes — user code, decompositions, meta rules — runs unchanged on SymInts: arithmetic builds
sympy expressions, and a question whose answer depends on the size (`if s0 > 1`, `a.shape[0] == b.shape[1]`,
`range(s0)`) is answered from the hints and recorded as a *fact*. The facts become guards: a later call
reuses the graph only where every fact still holds, so every branch taken stays the right one.

Symbols stand for sizes of at least 2: sizes 0 and 1 are specialized at capture (as Dynamo does), which
lets broadcasting checks (`size == 1`) be decided without a guard. A dim automatic dynamic saw at size 1
gets a `SizeOrOne` symbol instead, standing for sizes of at least 1: the graph serves size 1 too unless
something asked whether the size is 1 (that answer is a fact, so a guard), which broadcasting avoids where
the other side is the same size or a literal 1. A conversion to a plain int (`int(s)`,
`operator.index(s)`, `str(s)`, `hash(s)`, float arithmetic) specializes: it records `s == hint` and
returns the hint, so a value kiln cannot keep symbolic costs dynamism, never correctness. Once the guards
of a capture are written the env is *frozen*: a question asked later raises `FrozenShapeEnv` instead of
deciding something no guard checks.
"""
from __future__ import annotations

import contextlib
import logging
import operator
import threading
import traceback
from typing import Any, Callable

from .. import config
from .lazy import sympy

# SizeOrOne, FloorDiv and Mod subclass sympy's classes: they live in .sizefuncs, which imports sympy when a
# symbolic size first needs one (a capture with static sizes never does)
_SIZE_FUNCS = ("SizeOrOne", "FloorDiv", "Mod")


def _f() -> Any:
    from . import sizefuncs
    return sizefuncs


def __getattr__(name: str) -> Any:
    if name in _SIZE_FUNCS:
        return getattr(_f(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

log = config.channel("dynamic")

MIN_SIZE = 2  # symbols stand for sizes >= 2 (0 and 1 are specialized)


def min_size(sym: sympy.Symbol) -> int:
    """The least size a size symbol stands for."""
    return 1 if isinstance(sym, _f().SizeOrOne) else MIN_SIZE


class FrozenShapeEnv(RuntimeError):
    """A symbolic size was questioned after the capture's guards were written."""


class SizeUndecided(Exception):
    """Within `without_facts`: a question about sizes whose answer differs between sizes."""


_quiet = threading.local()


@contextlib.contextmanager
def without_facts() -> Any:
    """Within the block a question about symbolic sizes must be answered the same at every size: one that
    would become a fact (a guard) raises `SizeUndecided` instead, for code with a choice that is right
    either way (a view or a copy of a value nothing updates)."""
    depth = getattr(_quiet, "depth", 0)
    _quiet.depth = depth + 1
    try:
        yield
    finally:
        _quiet.depth = depth


class ShapeEnv:
    """The symbols of one capture: their hints, where they came from, and the facts decided about them."""

    def __init__(self) -> None:
        self.hints: dict[sympy.Symbol, int] = {}
        self.sources: dict[sympy.Symbol, list[str]] = {}  # readable names: ["x.size(1)", "y.size(0)"]
        self.facts: list[sympy.Basic] = []  # relationals that held at capture, in the order decided
        self.on_fact: Callable[[sympy.Basic], None] | None = None
        self.frozen = False
        self._by_hint: dict[int, sympy.Symbol] = {}
        self._decided: dict[sympy.Basic, bool] = {}
        self._subs: dict[sympy.Symbol, sympy.Integer] = {}

    # ---- symbols ----
    def size(self, hint: int, source: str, duck: bool = True, one: bool = False) -> "SymInt | int":
        """The value for a dynamic size `hint` read at `source`: a symbol (shared with earlier sizes of the
        same value when `duck`), or the int itself for 0 and 1. With `one` the symbol also stands for 1
        (a `SizeOrOne`); a dim sharing an earlier symbol is guarded equal to it, so the sharing is sound
        whichever kind the first one made."""
        if hint < MIN_SIZE:
            return hint
        sym = self._by_hint.get(hint) if duck else None
        if sym is None:
            cls = _f().SizeOrOne if one else sympy.Symbol
            sym = cls(f"s{len(self.hints)}", integer=True, positive=True)
            self.hints[sym] = hint
            self._subs[sym] = sympy.Integer(hint)
            self.sources[sym] = []
            if duck:
                self._by_hint[hint] = sym
        self.sources[sym].append(source)
        return SymInt(sym, self)

    @property
    def symbols(self) -> list[sympy.Symbol]:
        return list(self.hints)

    # ---- evaluation and decisions ----
    def hint(self, expr: sympy.Expr) -> int:
        return evaluate(expr, self._subs)

    def decide(self, rel: sympy.Basic) -> bool:
        """The truth of a relational at the hints; recorded as a fact unless it holds for every size."""
        if rel is sympy.true or rel is sympy.false:
            return bool(rel)
        known = self._decided.get(rel)
        if known is not None:
            return known
        value = bool(rel.xreplace(self._subs))
        proved = holds_everywhere(rel)
        if proved is not None and proved != value:
            raise AssertionError(f"kiln: the size fact {rel} was proved {proved} but is {value} at the hints")
        if proved is None:
            if getattr(_quiet, "depth", 0):
                raise SizeUndecided(str(rel))
            if self.frozen:
                raise FrozenShapeEnv(f"the symbolic size fact {rel} was asked for after the capture's guards "
                                     "were written")
            fact = rel if value else sympy.Not(rel)
            self.facts.append(fact)
            log.debug("size fact: %s", fact)
            if self.on_fact is not None:
                self.on_fact(fact)
        self._decided[rel] = value
        return value

    def specialize(self, expr: sympy.Expr) -> int:
        hint = self.hint(expr)
        if not self.frozen and log.isEnabledFor(logging.DEBUG):
            where = next((f"{f.filename}:{f.lineno}" for f in reversed(traceback.extract_stack()[:-2])
                          if "symbolic.py" not in f.filename), "?")
            log.debug("specializing %s = %d (at %s)", expr, hint, where)
        elif not self.frozen:
            log.info("specializing %s = %d", expr, hint)
        self.decide(sympy.Eq(expr, hint))
        return hint

    def freeze(self) -> None:
        self.frozen = True

    def describe(self) -> list[str]:
        """`s0 = x.size(1) (hint 16)` per symbol, then the facts."""
        lines = [f"{s} = {', '.join(self.sources[s])} (was {self.hints[s]}"
                 f"{'; 1 or more' if isinstance(s, _f().SizeOrOne) else ''})" for s in self.hints]
        return lines + [f"{python_expr(f, {s: str(s) for s in self.hints})}" for f in self.facts]


# ---- proofs over every size ----------------------------------------------------------------------------

def holds_everywhere(rel: sympy.Basic) -> bool | None:
    """True (False) when a relational — or an And/Or/Not of them — holds (fails) at every size its symbols
    stand for; None when that depends on the sizes. Each `SizeOrOne` symbol is split into its two cases,
    1 and t + 2; every other symbol is t + 2 (t >= 0). In each case a relation `lhs - rhs` that expands to a
    polynomial in the t's is bounded by its constant term where the other coefficients share a sign."""
    ones = sorted((s for s in rel.free_symbols if isinstance(s, _f().SizeOrOne)), key=str)
    if len(ones) > 4:
        ones = []  # (16 cases at most; beyond, each such symbol counts from 1 in one case)
    shift = {s: sympy.Symbol(f"_t_{s.name}", integer=True, nonnegative=True) + min_size(s)
             for s in rel.free_symbols if isinstance(s, sympy.Symbol)}
    answer: bool | None = None
    for mask in range(1 << len(ones)):
        subs = dict(shift)
        for i, s in enumerate(ones):
            subs[s] = sympy.Integer(1) if mask >> i & 1 else shift[s] + 1
        got = _decide_case(rel.xreplace(subs))
        if got is None or (answer is not None and got != answer):
            return None
        answer = got
    return answer


def _decide_case(rel: sympy.Basic) -> bool | None:
    if rel is sympy.true or rel is sympy.false:
        return bool(rel)
    if isinstance(rel, sympy.Not):
        inner = _decide_case(rel.args[0])
        return None if inner is None else not inner
    if isinstance(rel, (sympy.And, sympy.Or)):
        parts = [_decide_case(a) for a in rel.args]
        short = isinstance(rel, sympy.Or)  # the value that settles it
        if short in parts:
            return short
        return None if None in parts else not short
    kinds = {sympy.Gt: (1, 1), sympy.Ge: (1, 0), sympy.Lt: (-1, 1), sympy.Le: (-1, 0)}
    if isinstance(rel, (sympy.Eq, sympy.Ne)):
        lo, hi = polynomial_bounds(rel.lhs - rel.rhs)
        apart = (lo is not None and lo > 0) or (hi is not None and hi < 0)
        equal = True if lo == hi == 0 else False if apart else None
        return equal if equal is None or isinstance(rel, sympy.Eq) else not equal
    for kind, (sign, strict) in kinds.items():
        if isinstance(rel, kind):  # sign * (lhs - rhs) >= strict
            lo, hi = polynomial_bounds(sign * (rel.lhs - rel.rhs))
            if lo is not None and lo >= strict:
                return True
            if hi is not None and hi < strict:
                return False
            return None
    return None


def polynomial_bounds(expr: sympy.Expr) -> tuple:
    """(lower, upper) bounds of an expression over symbols that are all >= 0, from its constant term where
    the other coefficients of its expansion share a sign (None: unbounded or unknown)."""
    expr = sympy.expand(expr)
    if expr.is_Integer:
        return int(expr), int(expr)
    gens = sorted(expr.free_symbols, key=str)
    if not gens or expr.has(_f().FloorDiv, _f().Mod, sympy.floor, sympy.Mod):
        return None, None
    try:
        poly = sympy.Poly(expr, *gens)
    except sympy.PolynomialError:
        return None, None
    const = poly.coeff_monomial(1)
    rest = [c for m, c in poly.terms() if any(m)]
    if not all(c.is_Rational for c in rest) or not const.is_Rational:
        return None, None
    lo = const if all(c >= 0 for c in rest) else None
    hi = const if all(c <= 0 for c in rest) else None
    return lo, hi


def surely_one(size: Any) -> bool:
    """Whether a size is 1 at every size the graph serves, deciding nothing (a size that may be 1 or more
    is not): for strides of size-1 dims, which no address depends on."""
    if isinstance(size, SymInt):
        return holds_everywhere(sympy.Eq(size.expr, 1)) is True
    return size == 1


def broadcastable(have: Any, want: Any) -> bool:
    """`have == want or have == 1` (a dim that broadcasts to `want`), asking first what the spelling
    decides — the same size, a literal 1 — so a size that may be 1 is asked about last, if at all."""
    if same_sizes((have,), (want,)) or (type(have) is int and have == 1):
        return True
    return have == want or have == 1


def any_holds(*relations: tuple[Callable, Any, Any]) -> bool:
    """`op(a, b) or ...` for (op, a, b) with op one of operator's comparisons, asked of symbolic sizes as
    one question: `n < m or k == 1` is settled without a fact where it holds at every size although neither
    part does (a `SizeOrOne` k). Plain ints are just compared."""
    env = next((v.env for _, a, b in relations for v in (a, b) if isinstance(v, SymInt)), None)
    if env is None:
        return any(op(a, b) for op, a, b in relations)
    kinds = {operator.lt: sympy.Lt, operator.le: sympy.Le, operator.gt: sympy.Gt, operator.ge: sympy.Ge,
             operator.eq: sympy.Eq, operator.ne: sympy.Ne}
    rels = []
    for op, a, b in relations:
        ea, eb = _expr(a), _expr(b)
        if ea is None or eb is None:
            return any(op(x, y) for op, x, y in relations)
        rels.append(kinds[op](ea, eb))
    return env.decide(sympy.Or(*rels))


def _expr(value: Any) -> sympy.Expr | None:
    if isinstance(value, SymInt):
        return value.expr
    if type(value) is int or type(value) is bool:
        return sympy.Integer(int(value))
    return None


class SymInt:
    """An int-like symbolic size. Arithmetic with ints and SymInts stays symbolic; comparisons return bools
    decided by the env (recorded as facts); conversions to int specialize."""

    __slots__ = ("expr", "env")

    def __init__(self, expr: sympy.Expr, env: ShapeEnv):
        self.expr = expr
        self.env = env

    @staticmethod
    def make(expr: sympy.Expr, env: ShapeEnv) -> "SymInt | int":
        expr = sympy.expand(expr) if not isinstance(expr, (sympy.Symbol, _f().FloorDiv, _f().Mod)) else expr
        return int(expr) if expr.is_Integer else SymInt(expr, env)

    # ---- arithmetic ----
    def _binary(self, other: Any, fn: Callable[[sympy.Expr, sympy.Expr], sympy.Expr], reverse: bool = False):
        o = _expr(other)
        if o is None:
            if isinstance(other, float):
                a, b = float(self), other
                return fn(b, a) if reverse else fn(a, b)
            return NotImplemented
        return SymInt.make(fn(o, self.expr) if reverse else fn(self.expr, o), self.env)

    def __add__(self, o): return self._binary(o, operator.add)
    def __radd__(self, o): return self._binary(o, operator.add, True)
    def __sub__(self, o): return self._binary(o, operator.sub)
    def __rsub__(self, o): return self._binary(o, operator.sub, True)
    def __mul__(self, o): return self._binary(o, operator.mul)
    def __rmul__(self, o): return self._binary(o, operator.mul, True)

    def _div(self, a: Any, b: Any, fn: Callable) -> Any:
        ea, eb = _expr(a), _expr(b)
        if ea is None or eb is None:
            return NotImplemented if not isinstance(a if ea is None else b, float) else fn(float(a), float(b))
        if not self.env.decide(sympy.Gt(eb, 0)):  # Python's floor semantics for a negative divisor
            return fn(int(a), int(b))
        return SymInt.make(_f().FloorDiv(ea, eb) if fn is operator.floordiv else _f().Mod(ea, eb), self.env)

    def __floordiv__(self, o): return self._div(self, o, operator.floordiv)
    def __rfloordiv__(self, o): return self._div(o, self, operator.floordiv)
    def __mod__(self, o): return self._div(self, o, operator.mod)
    def __rmod__(self, o): return self._div(o, self, operator.mod)

    def __divmod__(self, o): return self // o, self % o
    def __rdivmod__(self, o): return o // self, o % self

    def __truediv__(self, o): return float(self) / o
    def __rtruediv__(self, o): return o / float(self)

    def __pow__(self, o):
        if type(o) is int and o >= 0:
            return SymInt.make(self.expr ** o, self.env)
        return float(self) ** o if isinstance(o, float) else int(self) ** o

    def __rpow__(self, o): return o ** int(self)
    def __neg__(self): return SymInt.make(-self.expr, self.env)
    def __pos__(self): return self
    def __abs__(self): return self if self.env.decide(sympy.Ge(self.expr, 0)) else -self

    # ---- comparisons (decided, recorded) ----
    def _compare(self, other: Any, rel: Callable) -> Any:
        o = _expr(other)
        if o is None:
            if isinstance(other, float):
                return rel(float(self), other)
            return NotImplemented
        return self.env.decide(rel(self.expr, o))

    def __eq__(self, o): return self._compare(o, sympy.Eq)
    def __ne__(self, o): return self._compare(o, sympy.Ne)
    def __lt__(self, o): return self._compare(o, sympy.Lt)
    def __le__(self, o): return self._compare(o, sympy.Le)
    def __gt__(self, o): return self._compare(o, sympy.Gt)
    def __ge__(self, o): return self._compare(o, sympy.Ge)

    def __bool__(self) -> bool:
        return self.env.decide(sympy.Ne(self.expr, 0))

    # ---- conversions (specialize) ----
    def __index__(self) -> int:
        return self.env.specialize(self.expr)

    __int__ = __index__

    def __float__(self) -> float:
        return float(self.env.specialize(self.expr))

    def __hash__(self) -> int:
        return hash(self.env.specialize(self.expr))

    def __str__(self) -> str:
        return str(self.env.specialize(self.expr))

    def __format__(self, spec: str) -> str:
        return format(self.env.specialize(self.expr), spec)

    def __round__(self, ndigits: Any = None) -> Any:
        return self if ndigits is None else round(int(self), ndigits)

    def __trunc__(self) -> "SymInt":
        return self

    __floor__ = __ceil__ = __trunc__

    def __repr__(self) -> str:
        # user code sees a number (repr of a list holding a size, f"{x!r}"): specialized like str();
        # kiln's own printing (metas, graphs) uses dim_text, which decides nothing
        return repr(self.env.specialize(self.expr))

    def __reduce__(self):
        raise TypeError("a symbolic size cannot be pickled")


def dim_text(d: Any) -> str:
    """A size as kiln prints it: the expression of a SymInt (deciding nothing), else repr."""
    return str(d.expr) if isinstance(d, SymInt) else repr(d)


def evaluate(expr: sympy.Expr, subs: dict) -> int:
    """The int a size expression takes with its symbols replaced by `subs` (ValueError if none)."""
    value = expr.xreplace(subs)
    if not value.is_Integer:
        value = sympy.simplify(value)
    if not value.is_Integer:
        raise ValueError(f"size expression {expr} does not evaluate to an integer under {subs}")
    return int(value)


def same_sizes(a: Any, b: Any) -> bool:
    """Whether two shapes are the same for every value of the symbols (structurally: equal ints, equal
    expressions), deciding nothing. For shortcuts whose other branch is also right (`already this shape`)."""
    a, b = tuple(a), tuple(b)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, SymInt) or isinstance(y, SymInt):
            ex, ey = _expr(x), _expr(y)
            if ex is None or ey is None or sympy.expand(ex - ey) != 0:
                return False
        elif x != y:
            return False
    return True


def is_symbolic(value: Any) -> bool:
    return isinstance(value, SymInt)


def has_symbols(value: Any) -> bool:
    """Whether a (nested) value holds a SymInt: a meta's shape, strides or offset, node arguments, or a
    proxy (anything with a TensorMeta `.meta`) with symbolic sizes."""
    if isinstance(value, SymInt):
        return True
    meta = getattr(value, "meta", None) if type(value).__name__ == "Proxy" else None
    if meta is not None:
        return has_symbols(meta)
    if isinstance(value, (tuple, list)):
        return any(has_symbols(v) for v in value)
    if isinstance(value, slice):
        return has_symbols((value.start, value.stop, value.step))
    if hasattr(value, "map_sizes") and hasattr(value, "sizes"):  # a view chain: its steps' arguments
        return has_symbols(value.sizes())
    if isinstance(value, dict):
        return any(has_symbols(v) for v in value.values())
    shape = getattr(value, "shape", None)
    if shape is not None and type(value).__name__ == "TensorMeta":
        return has_symbols(value.shape) or has_symbols(value.strides) or has_symbols(value.storage_offset)
    return False


def substitute(value: Any, values: dict[sympy.Symbol, int]) -> Any:
    """`value` with every SymInt replaced by its int under `values` (nested tuples, lists, dicts, metas)."""
    if isinstance(value, SymInt):
        return evaluate(value.expr, {s: sympy.Integer(v) for s, v in values.items()})
    if isinstance(value, slice):
        return slice(substitute(value.start, values), substitute(value.stop, values),
                     substitute(value.step, values))
    if hasattr(value, "map_sizes") and hasattr(value, "sizes"):
        return value.map_sizes(lambda v: substitute(v, values)) if has_symbols(value) else value
    if isinstance(value, tuple):
        items = [substitute(v, values) for v in value]
        if hasattr(value, "_fields"):
            return type(value)(*items)
        return type(value)(items) if hasattr(value, "n_fields") else tuple(items)
    if isinstance(value, list):
        return [substitute(v, values) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, values) for k, v in value.items()}
    if type(value).__name__ == "TensorMeta" and has_symbols(value):
        return value.with_(shape=substitute(value.shape, values), strides=substitute(value.strides, values),
                           storage_offset=substitute(value.storage_offset, values))
    return value


def hint_of(value: Any) -> Any:
    """`value` with each SymInt replaced by its hint, deciding nothing (for example runs while tracing)."""
    if isinstance(value, SymInt):
        return value.env.hint(value.expr)
    if isinstance(value, slice):
        return slice(hint_of(value.start), hint_of(value.stop), hint_of(value.step))
    if isinstance(value, (tuple, list, dict)) or type(value).__name__ == "TensorMeta":
        if not has_symbols(value):
            return value
        env = _env_of(value)
        return substitute(value, env.hints) if env is not None else value
    return value


def specialize_all(value: Any) -> None:
    """Specialize every symbol a (nested) value mentions — SymInts, and the shapes, strides and offsets of
    proxies (anything with a `.meta`) — to its hint, each recorded as a fact."""
    for v in _leaves(value):
        meta = getattr(v, "meta", None) if not isinstance(v, SymInt) else None
        for d in ((v,) if isinstance(v, SymInt) else
                  (*meta.shape, *meta.strides, meta.storage_offset) if type(meta).__name__ == "TensorMeta"
                  else ()):
            if isinstance(d, SymInt):
                for sym in d.expr.free_symbols:
                    d.env.specialize(sym)


def _leaves(value: Any) -> list:
    if isinstance(value, (tuple, list)):
        return [x for v in value for x in _leaves(v)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _leaves(v)]
    if isinstance(value, slice):
        return [value.start, value.stop, value.step]
    return [value]


def _env_of(value: Any) -> ShapeEnv | None:
    if isinstance(value, SymInt):
        return value.env
    if isinstance(value, (tuple, list)):
        items = value
    elif isinstance(value, dict):
        items = list(value.values())
    elif type(value).__name__ == "TensorMeta":
        items = (*value.shape, *value.strides, value.storage_offset)
    else:
        return None
    for v in items:
        env = _env_of(v)
        if env is not None:
            return env
    return None


# ---- printing expressions as Python -------------------------------------------------------------------

def python_expr(expr: sympy.Basic, names: dict[sympy.Symbol, str]) -> str:
    """Python source computing a size expression or fact, with each symbol spelled by `names`."""
    p = lambda e: python_expr(e, names)  # noqa: E731
    if isinstance(expr, sympy.Symbol):
        return names[expr]
    if expr.is_Integer:
        return str(int(expr))
    if expr is sympy.true or expr is sympy.false:
        return str(bool(expr))
    if isinstance(expr, sympy.Add):
        return "(" + " + ".join(p(a) for a in expr.args) + ")"
    if isinstance(expr, sympy.Mul):
        coeff, rest = expr.as_coeff_Mul()
        if not coeff.is_Integer:
            raise ValueError(f"size expression {expr} has a fractional coefficient")
        factors = ([] if coeff == 1 else [str(int(coeff))]) + [p(a) for a in sympy.Mul.make_args(rest)]
        return "(" + " * ".join(factors) + ")"
    if isinstance(expr, sympy.Pow):
        base, exp = expr.args
        if not (exp.is_Integer and int(exp) >= 0):
            raise ValueError(f"size expression {expr} has a negative or fractional power")
        return f"({p(base)} ** {int(exp)})"
    if isinstance(expr, _f().FloorDiv):
        return f"({p(expr.args[0])} // {p(expr.args[1])})"
    if isinstance(expr, (_f().Mod, sympy.Mod)):
        return f"({p(expr.args[0])} % {p(expr.args[1])})"
    if isinstance(expr, (sympy.Max, sympy.Min)):
        fn = "max" if isinstance(expr, sympy.Max) else "min"
        return f"{fn}({', '.join(p(a) for a in expr.args)})"
    if isinstance(expr, sympy.Not):
        return f"(not {p(expr.args[0])})"
    ops = {sympy.Eq: "==", sympy.Ne: "!=", sympy.Lt: "<", sympy.Le: "<=", sympy.Gt: ">", sympy.Ge: ">="}
    for kind, op in ops.items():
        if isinstance(expr, kind):
            return f"({p(expr.lhs)} {op} {p(expr.rhs)})"
    if isinstance(expr, (sympy.And, sympy.Or)):
        op = " and " if isinstance(expr, sympy.And) else " or "
        return "(" + op.join(p(a) for a in expr.args) + ")"
    raise ValueError(f"cannot print size expression {expr} ({type(expr).__name__}) as Python")


def symbols_of(value: Any) -> set[sympy.Symbol]:
    out: set[sympy.Symbol] = set()
    if isinstance(value, SymInt):
        out |= value.expr.free_symbols
    elif isinstance(value, (tuple, list)):
        for v in value:
            out |= symbols_of(v)
    elif isinstance(value, dict):
        for v in value.values():
            out |= symbols_of(v)
    elif isinstance(value, slice):
        out |= symbols_of((value.start, value.stop, value.step))
    elif hasattr(value, "map_sizes") and hasattr(value, "sizes"):
        out |= symbols_of(value.sizes())
    return out


__all__ = ["dim_text", "SymInt", "ShapeEnv", "FloorDiv", "Mod", "FrozenShapeEnv", "MIN_SIZE", "SizeOrOne",
           "min_size", "holds_everywhere", "polynomial_bounds", "any_holds", "surely_one", "broadcastable",
           "SizeUndecided", "without_facts", "is_symbolic", "has_symbols", "substitute", "hint_of",
           "python_expr", "symbols_of"]
