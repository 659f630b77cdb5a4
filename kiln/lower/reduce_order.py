"""The order of a reduction's reduced dims: the one its input walks with the smallest stride innermost.

A reduction's loops nest in the order of its reduced dims, the last innermost and vectorized. That order is
the op's (GroupNorm reduces (C/G, H, W)), not the memory's: over a channels-last buffer W's stride is C, and
the vector loop gathered every element. Reordering the reduced dims changes only the summation order (a
maximum's or minimum's not at all); the arg-reductions keep theirs (the first index among equal values is
the answer).
"""
from __future__ import annotations

from typing import Any, Callable

import sympy

from .index import index_var
from .ops import DepsHandler

REORDERABLE = ("sum", "prod", "max", "min", "any", "all")


def _stride(index: sympy.Expr, var: sympy.Symbol) -> int | None:
    """The integer coefficient of `var` in a linear index; None when it appears otherwise (div, mod, ...)."""
    coeff = sympy.Integer(0)
    for term in sympy.Add.make_args(sympy.expand(index)):
        if not term.has(var):
            continue
        c = term / var
        if c.has(var) or not c.is_Integer:
            return None
        coeff += c
    return int(coeff)


def memory_order(dims: tuple, rranges: tuple, rtype: str,
                 body: Callable[[Any, list], Any]) -> tuple[tuple, tuple]:
    """(dims, rranges) reordered so the first load that moves with every reduced dim walks them with
    decreasing strides (the smallest innermost); unchanged when no such load has linear strides.
    `body(h, rindex)` computes the reduced value at `rindex`."""
    if rtype not in REORDERABLE or len(dims) < 2 or not all(isinstance(r, int) for r in rranges):
        return dims, rranges
    rindex = [index_var("r", d) for d in range(len(dims))]
    deps = DepsHandler()
    body(deps, rindex)
    for _, index in deps.loads:
        strides = [_stride(index, r) for r in rindex]
        if any(s is None or s == 0 for s in strides):
            continue
        order = sorted(range(len(dims)), key=lambda d: -abs(strides[d]))   # stable: ties keep the op's order
        return tuple(dims[d] for d in order), tuple(rranges[d] for d in order)
    return dims, rranges
