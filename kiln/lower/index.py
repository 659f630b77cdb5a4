"""Symbolic index arithmetic for the loop IR.

Index expressions are sympy expressions over non-negative integer loop variables. Views fold into them:
a broadcast drops a variable, a permute reorders them, a slice scales and shifts, a reshape divides and
takes remainders. `FloorDiv` and `ModularIndexing` are opaque sympy functions (no float semantics);
`simplify_index` removes them when the loop variables' ranges prove them redundant, which is what keeps
the inner loops of reshaped tensors free of divisions.
"""
from __future__ import annotations

import functools
from typing import Sequence

import sympy

from ..graph.layout import contiguous_strides
from ..graph.symbolic import FloorDiv as SizeFloorDiv, Mod as SizeMod
from .sizes import is_size_symbol, known_le, known_lt, nonnegative


class FloorDiv(sympy.Function):
    """Integer division of a non-negative index by a positive constant."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, base, divisor):  # noqa: ANN001, ANN206 - sympy's protocol
        if divisor == 1:
            return base
        if base.is_Integer and divisor.is_Integer:
            return sympy.Integer(int(base) // int(divisor))
        if base == 0:
            return sympy.Integer(0)
        return None


class ModularIndexing(sympy.Function):
    """`base % modulus` for a non-negative index and a positive constant."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, base, modulus):  # noqa: ANN001, ANN206
        if modulus == 1:
            return sympy.Integer(0)
        if base.is_Integer and modulus.is_Integer:
            return sympy.Integer(int(base) % int(modulus))
        if base == 0:
            return sympy.Integer(0)
        return None


def index_var(prefix: str, i: int) -> sympy.Symbol:
    return sympy.Symbol(f"{prefix}{i}", integer=True, nonnegative=True)


def indirect_var(n: int) -> sympy.Symbol:
    """The index a body computed from a loaded value (`h.indirect`): a gather's row, an embedding's token.
    Non-negative: the kernel checks it is inside the indexed dim before any load uses it."""
    return sympy.Symbol(f"ind{n}", integer=True, nonnegative=True)


def is_indirect(s: object) -> bool:
    return isinstance(s, sympy.Symbol) and s.name.startswith("ind")


def has_indirect(expr: object) -> bool:
    """Whether an index expression depends on a loaded value: then it is no function of the loop variables
    alone (what moves along a loop cannot be read off its terms)."""
    return isinstance(expr, sympy.Basic) and any(is_indirect(s) for s in expr.free_symbols)


def linear_index(index: Sequence[sympy.Expr], strides: Sequence[int], offset: int = 0) -> sympy.Expr:
    """offset + sum(index[i] * strides[i]) (size-1 dims may carry any stride; their index is 0)."""
    return _linear_index(tuple(index), tuple(strides), offset)


@functools.lru_cache(maxsize=4096)
def _linear_index(index: tuple, strides: tuple, offset: object) -> sympy.Expr:
    # one Add of all the terms (adding them one by one re-flattens the sum each time); memoized, as most
    # loads of a graph index the same loop variables with the same strides
    return sympy.Add(sympy.sympify(offset), *(i * s for i, s in zip(index, strides) if s != 0))


def unravel(linear: sympy.Expr, shape: Sequence[int]) -> list[sympy.Expr]:
    """The multi-dimensional index of row-major position `linear` in `shape`."""
    strides = contiguous_strides(shape)
    out = []
    for size, stride in zip(shape, strides):
        if isinstance(size, int) and size <= 1:  # size 0: the tensor is empty, no loop runs
            out.append(sympy.Integer(0))
        else:
            out.append(ModularIndexing(FloorDiv(linear, stride), size))
    return out


def _size_factor(term: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr]:
    """(the product of a term's size symbols, the rest): sizes are positive, so they scale bounds."""
    sizes, rest = sympy.Integer(1), sympy.Integer(1)
    for f in sympy.Mul.make_args(term):
        if is_size_symbol(f) or (f.is_Pow and is_size_symbol(f.base) and f.exp.is_Integer and f.exp > 0):
            sizes *= f
        else:
            rest *= f
    return sizes, rest


def _bounds(expr: sympy.Expr, ranges: dict) -> tuple | None:
    """Inclusive [lo, hi] of a linear expression in the loop variables (ints, or expressions of symbolic
    sizes), or None if unknown."""
    expr = sympy.expand(expr)
    lo = hi = sympy.Integer(0)
    for term in sympy.Add.make_args(expr):
        coeff, rest = term.as_coeff_Mul()
        if not coeff.is_Integer:
            return None
        sizes, var = _size_factor(rest)
        if var == 1:
            lo, hi = lo + term, hi + term
            continue
        if not isinstance(var, sympy.Symbol) or var not in ranges:
            return None
        top = coeff * sizes * (ranges[var] - 1)
        if coeff > 0:
            hi = hi + top
        else:
            lo = lo + top
    return _number(lo), _number(hi)


def _number(e: sympy.Expr) -> object:
    e = sympy.expand(e)
    return int(e) if e.is_Integer else e


def _exact_multiple(term: sympy.Expr, d: object) -> bool:
    """`term` is `d` times a polynomial with integer coefficients (so it drops out of `% d`)."""
    if isinstance(d, int):
        coeff, _ = term.as_coeff_Mul()
        return coeff.is_Integer and int(coeff) % d == 0
    q = sympy.cancel(term / d)
    num, den = sympy.fraction(q)
    if den != 1:
        return False
    try:
        return all(c.is_Integer for c in sympy.Poly(num).coeffs())
    except (sympy.PolynomialError, sympy.polys.polyerrors.GeneratorsNeeded):
        return bool(num.is_Integer)


def _split_terms(expr: sympy.Expr, d: object) -> tuple[sympy.Expr, sympy.Expr]:
    """(terms that are multiples of d, the other terms)."""
    exact, rest = sympy.Integer(0), sympy.Integer(0)
    for term in sympy.Add.make_args(sympy.expand(expr)):
        if _exact_multiple(term, d):
            exact += term
        else:
            rest += term
    return exact, rest


def _within(b: tuple | None, m: object) -> bool:
    """Bounds [lo, hi] inside [0, m) at every size."""
    return b is not None and nonnegative(b[0]) and known_lt(b[1], m)


def _divisor(e: sympy.Expr) -> object:
    """A FloorDiv/ModularIndexing divisor as an int, or its expression when symbolic (None: not positive
    at every size, so left alone)."""
    if e.is_Integer:
        return int(e) if int(e) > 0 else None
    return e if known_le(1, e) else None


def simplify_index(expr: sympy.Expr, ranges: dict) -> sympy.Expr:
    """Remove FloorDiv/ModularIndexing that the loop ranges make redundant (bottom-up). Ranges and divisors
    may be symbolic: a division goes only where that is proved for every size."""
    if not expr.has(FloorDiv, ModularIndexing):
        return expr
    args = [simplify_index(a, ranges) for a in expr.args]
    if not isinstance(expr, (FloorDiv, ModularIndexing)):
        return expr.func(*args)
    base, d = args
    d = _divisor(d)
    if d is None:
        return expr.func(*args)
    if isinstance(expr, FloorDiv):
        exact, rest = _split_terms(base, d)
        if _within(_bounds(rest, ranges), d):
            return sympy.expand(exact / d)
        if _within(_bounds(base, ranges), d):
            return sympy.Integer(0)
        return FloorDiv(base, d)
    _, rest = _split_terms(base, d)
    b = _bounds(rest, ranges)
    if _within(b, d):
        return rest
    if isinstance(rest, FloorDiv):
        inner_b = _bounds(rest.args[0], ranges)
        inner_d = _divisor(rest.args[1])
        if inner_d is not None and _within(inner_b, sympy.expand(d * inner_d)):
            return rest  # hi // inner_d < d exactly when hi < d * inner_d
    if b is not None and nonnegative(b[0]):
        return ModularIndexing(rest, d)
    # dropping the multiples of d could leave a negative base (`(s0 - 1 + 2*i) % s0` -> `(2*i - 1) % s0`),
    # and the emitted % truncates: keep the whole (non-negative) base
    return ModularIndexing(base, d)


def index_bounds(expr: sympy.Expr, ranges: dict) -> tuple | None:
    """Inclusive [lo, hi] of an index expression over the loop ranges (interval arithmetic), or None.
    With symbolic sizes the bounds are expressions of them (valid at every size; maybe not tight)."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return int(expr), int(expr)
    if expr.is_Symbol:
        if is_size_symbol(expr):
            return expr, expr
        if expr not in ranges:
            return None
        size = ranges[expr]
        return 0, (max(size - 1, 0) if isinstance(size, int) else _number(size - 1))
    if expr.is_Add:
        lo = hi = 0
        for arg in expr.args:
            b = index_bounds(arg, ranges)
            if b is None:
                return None
            lo, hi = lo + b[0], hi + b[1]
        return _number(sympy.sympify(lo)), _number(sympy.sympify(hi))
    if expr.is_Mul:
        coeff, rest = expr.as_coeff_Mul()
        if not coeff.is_Integer:
            return None
        sizes, var = _size_factor(rest)
        if var == rest and rest == expr:
            return None
        b = index_bounds(var, ranges) if var != 1 else (1, 1)
        if b is None:
            return None
        c = coeff * sizes
        lo, hi = (c * b[0], c * b[1]) if coeff > 0 else (c * b[1], c * b[0])
        return _number(sympy.sympify(lo)), _number(sympy.sympify(hi))
    if isinstance(expr, FloorDiv):
        b = index_bounds(expr.args[0], ranges)
        d = _divisor(expr.args[1])
        if b is None or d is None:
            return None
        if isinstance(d, int) and isinstance(b[0], int) and isinstance(b[1], int):
            return b[0] // d, b[1] // d
        if not nonnegative(b[0]):
            return None
        return 0, b[1]  # hi // d <= hi for hi >= 0, d >= 1
    if isinstance(expr, ModularIndexing):
        b = index_bounds(expr.args[0], ranges)
        m = _divisor(expr.args[1])
        if m is None:
            return None
        if _within(b, m):
            return b
        return 0, _number(sympy.sympify(m) - 1)
    return None


def index_code(expr: sympy.Expr, floordiv: str, what: str) -> str:
    """Source text of an integer index expression for a C-like target: `floordiv` spells FloorDiv ("/" in
    C++, "//" in Triton), `%` ModularIndexing (exact: their operands are non-negative); integer powers as
    products. `what` names the emitter in the error for anything else."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return str(int(expr))
    if expr.is_Symbol:
        return expr.name
    if isinstance(expr, (SizeFloorDiv, SizeMod)):
        # sizes' // and % are Python's (floored; an operand may be negative): C's / and % truncate
        if floordiv != "/":
            raise NotImplementedError(f"{what}: size expression {expr}")
        fn = "kiln_floordiv" if isinstance(expr, SizeFloorDiv) else "kiln_floormod"
        return f"{fn}({index_code(expr.args[0], floordiv, what)}, {index_code(expr.args[1], floordiv, what)})"
    if isinstance(expr, FloorDiv):
        return f"({index_code(expr.args[0], floordiv, what)} {floordiv} {index_code(expr.args[1], floordiv, what)})"
    if isinstance(expr, ModularIndexing):
        return f"({index_code(expr.args[0], floordiv, what)} % {index_code(expr.args[1], floordiv, what)})"
    if expr.is_Add or expr.is_Mul:
        joint = " + " if expr.is_Add else " * "
        return "(" + joint.join(index_code(a, floordiv, what) for a in expr.args) + ")"
    if expr.is_Pow and expr.exp.is_Integer and int(expr.exp) > 0:
        return "(" + " * ".join([index_code(expr.base, floordiv, what)] * int(expr.exp)) + ")"
    raise NotImplementedError(f"{what}: index expression {expr}")
