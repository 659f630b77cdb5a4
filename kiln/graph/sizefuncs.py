"""The sympy functions of symbolic sizes: `SizeOrOne` symbols, exact `FloorDiv` and opaque `Mod`.

Apart from kiln.graph.symbolic (which names them) because defining them imports sympy, which a capture with
static sizes never needs (kiln.graph.lazy).
"""
from __future__ import annotations

import sympy


class SizeOrOne(sympy.Symbol):
    """A size symbol that also stands for 1 (a dim seen at size 1 before it became dynamic)."""



class FloorDiv(sympy.Function):
    """Integer division of sizes (positive operands), kept exact: `FloorDiv(s0, 2)` prints as `s0 // 2`."""

    is_integer = True

    @classmethod
    def eval(cls, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
        if b == 1:
            return a
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) // int(b))
        q = a / b
        if q.is_Rational:  # (32*s0) // (2*s0)
            return sympy.floor(q)
        num, den = sympy.fraction(sympy.together(q))
        if den == 1 and _integer_coefficients(num):  # (s0*s1) // s1: exact
            return num
        if b.is_Integer and a.is_Mul:
            coeff, rest = a.as_coeff_Mul()
            if coeff.is_Integer and int(coeff) % int(b) == 0:
                return sympy.Integer(int(coeff) // int(b)) * rest
        if a == b:
            return sympy.Integer(1)
        return None


def _integer_coefficients(expr: sympy.Expr) -> bool:
    try:
        return all(c.is_Integer for c in sympy.Poly(expr).coeffs())
    except (sympy.PolynomialError, sympy.polys.polyerrors.GeneratorsNeeded):
        return False


class Mod(sympy.Function):
    """Python's `a % b` of sizes, kept opaque: sympy's own Mod rewrites Mod(3*Mod(3*s, 7), 7) as
    3*Mod(3*s, 7) (wrong: for s = 4 it gives 15, Python 1), so only exact cases evaluate here."""

    is_integer = True

    @classmethod
    def eval(cls, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
        if a.is_Integer and b.is_Integer and int(b) != 0:
            return sympy.Integer(int(a) % int(b))
        if b == 1 or a == 0 or a == b:
            return sympy.Integer(0)
        num, den = sympy.fraction(sympy.together(a / b))
        # (s0*s1) % s1, (768*s0*s1) % (64*s0*s1): exact
        if den == 1 and (num.is_Integer or _integer_coefficients(num)):
            return sympy.Integer(0)
        if b.is_Integer and a.is_Mul:
            coeff, _ = a.as_coeff_Mul()
            if coeff.is_Integer and int(b) != 0 and int(coeff) % int(b) == 0:
                return sympy.Integer(0)  # (8*s0) % 4
        return None
