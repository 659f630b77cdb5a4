"""sympy, imported on first use: `from kiln.graph.lazy import sympy` reads like `import sympy`.

Importing sympy costs ~0.4 s, most of a warm compile (a graph-cache hit, kiln.backends.graph_cache) of a
model with static sizes, which never builds a symbolic expression. The modules a capture and a cache hit
run name sympy through this stand-in; the first attribute read imports sympy and keeps the attribute, so
later reads cost a plain module attribute. No value can be a sympy object before sympy is imported, so
`is_expr` answers False without importing it. The lowering, fusion and C++ stages import sympy itself.
"""
from __future__ import annotations

import sys
import types
from typing import Any


class _LazySympy(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        import sympy as real
        value = getattr(real, name)
        setattr(self, name, value)
        return value


sympy: Any = _LazySympy("sympy")


def is_expr(value: Any) -> bool:
    """isinstance(value, sympy.Expr), without importing sympy."""
    real = sys.modules.get("sympy")
    return real is not None and isinstance(value, real.Expr)


def is_basic(value: Any) -> bool:
    """isinstance(value, sympy.Basic) (an expression, a relation, a boolean), without importing sympy."""
    real = sys.modules.get("sympy")
    return real is not None and isinstance(value, real.Basic)
