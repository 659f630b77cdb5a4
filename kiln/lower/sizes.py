"""Sizes below capture: ints, or sympy expressions over the symbols of a graph compiled for every size.

A graph with symbolic sizes (`kiln.graph.symbolic`) is lowered, fused, planned and emitted once: kernels
take the symbols as int64 arguments, and the wrapper reads them from its inputs' shapes on each call. Each
stage asks two kinds of questions about sizes, and this module answers both:

- **Heuristics** (thread a kernel? stream its stores? which order keeps memory low?) are asked of the
  *hints*, the sizes the capture saw (`hint`). Any answer is correct at every size; only speed depends on it.
- **Facts** the generated code relies on (this index never leaves its buffer, this division is exact) must
  hold for every size the graph can be called at. `nonnegative` proves them — symbols stand for sizes >= 2
  (>= 1 for a `SizeOrOne`), so `s -> t + 2` with `t >= 0` turns the question into "has this polynomial only non-negative
  coefficients". `decide` answers a relation that way, or raises `SizeDecision` when neither it nor its
  negation holds for every size: the compile then fails loudly and the graph is compiled per size instead
  (never a guess that could be wrong at another size).

The hints of the compile in progress are set by `size_hints` (one compile at a time per thread).
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import sympy

from ..graph.symbolic import FloorDiv as SizeFloorDiv, Mod as SizeMod, SymInt, evaluate, min_size, polynomial_bounds


class SizeDecision(NotImplementedError):
    """A question about symbolic sizes whose answer differs between sizes the graph may be called at."""


_local = threading.local()


def _hints() -> dict:
    return getattr(_local, "hints", {})


@contextlib.contextmanager
def size_hints(hints: dict) -> Iterator[None]:
    """Within the block, `hint` evaluates each size symbol to its value in `hints`."""
    saved = _hints()
    _local.hints = dict(hints)
    try:
        yield
    finally:
        _local.hints = saved


def is_size_symbol(s: Any) -> bool:
    """A symbol standing for a symbolic size (`s0`), as opposed to a loop variable (`x0`, `r1`, `i2`)."""
    return isinstance(s, sympy.Symbol) and bool(s.is_positive) and s.name.startswith("s")


def size_symbols(value: Any) -> set:
    """The size symbols in an expression (or a nested tuple/list of them)."""
    if isinstance(value, (tuple, list)):
        out: set = set()
        for v in value:
            out |= size_symbols(v)
        return out
    if isinstance(value, sympy.Basic):
        return {s for s in value.free_symbols if is_size_symbol(s)}
    return set()


def is_static(value: Any) -> bool:
    """No size symbol in it (an int, or an expression of loop variables only)."""
    return not size_symbols(value)


def dim(value: Any) -> Any:
    """A size as the loop IR holds it: an int, or a sympy expression when it is symbolic (a `SymInt` of a
    meta gives its expression; an expression that is a number gives the int)."""
    if isinstance(value, SymInt):
        value = value.expr
    if isinstance(value, sympy.Basic):
        value = sympy.expand(value) if not isinstance(value, (SizeFloorDiv, SizeMod)) else value
        return int(value) if value.is_Integer else value
    return int(value)


def dims(values: Any) -> tuple:
    return tuple(dim(v) for v in values)


def hint(value: Any) -> int:
    """The value at the hints (for heuristics: any answer derived from it must be right at every size)."""
    if isinstance(value, SymInt):
        value = value.expr
    if not isinstance(value, sympy.Basic):
        return int(value)
    if value.is_Integer:
        return int(value)
    try:
        return evaluate(value, {s: sympy.Integer(v) for s, v in _hints().items()})
    except ValueError:
        raise SizeDecision(f"no hint for the size {value}") from None


def nonnegative(expr: Any) -> bool:
    """Whether `expr` (ints and size symbols; no loop variables) is >= 0 at every size: True only when
    proved — with each symbol s = t + its least size (t >= 0; 2, or 1 for a `SizeOrOne`), a polynomial in
    the t's with no negative coefficient."""
    expr = sympy.expand(sympy.sympify(expr))
    if expr.is_Integer:
        return int(expr) >= 0
    syms = expr.free_symbols
    if not syms or not all(is_size_symbol(s) for s in syms):
        return False
    if expr.has(sympy.floor, sympy.Mod):
        return False
    # a floor division or remainder of sizes is an unknown >= 0 where its operands are provably so (a
    # variable of its own, not shifted): `s1*(FloorDiv(s0 + 2, 3) - 1) + s1 - ...` still proves
    opaque: dict = {}
    for atom in sorted(expr.atoms(SizeFloorDiv, SizeMod), key=str):
        if not (nonnegative(atom.args[0]) and known_le(1, atom.args[1])):
            return False
        opaque[atom] = sympy.Symbol(f"_u{len(opaque)}", integer=True, nonnegative=True)
    expr = sympy.expand(expr.xreplace(opaque))
    syms = {s for s in expr.free_symbols if s not in opaque.values()}
    shift = {s: sympy.Symbol(f"_t_{s.name}", integer=True, nonnegative=True) + min_size(s) for s in syms}
    low, _ = polynomial_bounds(expr.xreplace(shift))
    return low is not None and low >= 0


def known_le(a: Any, b: Any) -> bool:
    """a <= b at every size (proved)."""
    return nonnegative(sympy.sympify(b) - sympy.sympify(a))


def known_lt(a: Any, b: Any) -> bool:
    return nonnegative(sympy.sympify(b) - sympy.sympify(a) - 1)


def decide_le(a: Any, b: Any, what: str) -> bool:
    """a <= b, when that is the same at every size; else SizeDecision naming `what`."""
    if known_le(a, b):
        return True
    if known_lt(b, a):
        return False
    raise SizeDecision(f"{what}: whether {a} <= {b} depends on the sizes")


def is_positive(value: Any) -> bool:
    """value >= 1 at every size (proved); an int is just tested."""
    return known_le(1, value)


def same(a: Any, b: Any) -> bool:
    """Equal at every size (structurally, after expansion): a False may still be equal at some sizes."""
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return sympy.expand(sympy.sympify(a) - sympy.sympify(b)) == 0


def dense(shape: Any, strides: Any) -> bool:
    """Non-overlapping and dense (a permutation of a contiguous layout) at every size, not empty: dims
    ordered by their strides' hints, then each stride proved to be the product of the sizes inside it."""
    if not all(is_positive(s) for s in shape):
        return False
    placed = sorted(((hint(st), st, sz) for sz, st in zip(shape, strides) if not same(sz, 1)),
                    key=lambda t: t[0])
    expected: Any = 1
    for _, stride, size in placed:
        if not same(stride, expected):
            return False
        expected = sympy.expand(expected * size)
    return True
