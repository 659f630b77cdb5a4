"""Symbolic index arithmetic for the loop IR.

Index expressions are sympy expressions over non-negative integer loop variables. Views fold into them:
a broadcast drops a variable, a permute reorders them, a slice scales and shifts, a reshape divides and
takes remainders. `FloorDiv` and `ModularIndexing` are opaque sympy functions (no float semantics);
`simplify_index` removes them when the loop variables' ranges prove them redundant, which is what keeps
the inner loops of reshaped tensors free of divisions.
"""
from __future__ import annotations

from typing import Sequence

import sympy

from ..graph.layout import contiguous_strides


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


def linear_index(index: Sequence[sympy.Expr], strides: Sequence[int], offset: int = 0) -> sympy.Expr:
    """offset + sum(index[i] * strides[i]) (size-1 dims may carry any stride; their index is 0)."""
    expr = sympy.Integer(offset)
    for i, s in zip(index, strides):
        if s != 0:
            expr = expr + i * s
    return expr


def unravel(linear: sympy.Expr, shape: Sequence[int]) -> list[sympy.Expr]:
    """The multi-dimensional index of row-major position `linear` in `shape`."""
    strides = contiguous_strides(shape)
    out = []
    for size, stride in zip(shape, strides):
        if size <= 1:  # size 0: the tensor is empty, no loop runs
            out.append(sympy.Integer(0))
        else:
            out.append(ModularIndexing(FloorDiv(linear, stride), size))
    return out


def _bounds(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> tuple[int, int] | None:
    """Inclusive [lo, hi] of a linear expression with non-negative coefficients, or None if unknown."""
    expr = sympy.expand(expr)
    lo = hi = 0
    for term in sympy.Add.make_args(expr):
        coeff, rest = term.as_coeff_Mul()
        if rest == 1:
            lo += int(coeff)
            hi += int(coeff)
            continue
        if not isinstance(rest, sympy.Symbol) or rest not in ranges or not coeff.is_Integer:
            return None
        top = int(coeff) * (ranges[rest] - 1)
        lo, hi = lo + min(0, top), hi + max(0, top)
    return lo, hi


def _split_terms(expr: sympy.Expr, d: int) -> tuple[sympy.Expr, sympy.Expr]:
    """(terms whose coefficient is a multiple of d, the other terms)."""
    exact, rest = sympy.Integer(0), sympy.Integer(0)
    for term in sympy.Add.make_args(sympy.expand(expr)):
        coeff, _ = term.as_coeff_Mul()
        if coeff.is_Integer and int(coeff) % d == 0:
            exact += term
        else:
            rest += term
    return exact, rest


def simplify_index(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> sympy.Expr:
    """Remove FloorDiv/ModularIndexing that the loop ranges make redundant (bottom-up)."""
    if not expr.has(FloorDiv, ModularIndexing):
        return expr
    args = [simplify_index(a, ranges) for a in expr.args]
    if isinstance(expr, (FloorDiv, ModularIndexing)) and int(args[1]) <= 0:
        return expr.func(*args)
    if isinstance(expr, FloorDiv):
        base, d = args
        d = int(d)
        exact, rest = _split_terms(base, d)
        b = _bounds(rest, ranges)
        if b is not None and b[0] >= 0 and b[1] < d:
            return sympy.expand(exact / d)
        b = _bounds(base, ranges)
        if b is not None and b[0] >= 0 and b[1] < d:
            return sympy.Integer(0)
        return FloorDiv(base, d)
    if isinstance(expr, ModularIndexing):
        base, m = args
        m = int(m)
        _, rest = _split_terms(base, m)
        b = _bounds(rest, ranges)
        if b is not None and b[0] >= 0 and b[1] < m:
            return rest
        if isinstance(rest, FloorDiv):
            inner_b = _bounds(rest.args[0], ranges)
            if inner_b is not None and inner_b[0] >= 0 and inner_b[1] // int(rest.args[1]) < m:
                return rest
        return ModularIndexing(rest, m)
    return expr.func(*args)


def index_bounds(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> tuple[int, int] | None:
    """Inclusive [lo, hi] of an index expression over the loop ranges (interval arithmetic), or None."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return int(expr), int(expr)
    if expr.is_Symbol:
        if expr not in ranges:
            return None
        return 0, max(ranges[expr] - 1, 0)
    if expr.is_Add:
        lo = hi = 0
        for arg in expr.args:
            b = index_bounds(arg, ranges)
            if b is None:
                return None
            lo, hi = lo + b[0], hi + b[1]
        return lo, hi
    if expr.is_Mul:
        coeff, rest = expr.as_coeff_Mul()
        b = index_bounds(rest, ranges) if rest != expr else None
        if b is None or not coeff.is_Integer:
            return None
        c = int(coeff)
        return min(c * b[0], c * b[1]), max(c * b[0], c * b[1])
    if isinstance(expr, FloorDiv):
        b = index_bounds(expr.args[0], ranges)
        d = int(expr.args[1])
        return None if b is None else (b[0] // d, b[1] // d)
    if isinstance(expr, ModularIndexing):
        b = index_bounds(expr.args[0], ranges)
        m = int(expr.args[1])
        if b is not None and 0 <= b[0] and b[1] < m:
            return b
        return 0, m - 1
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
