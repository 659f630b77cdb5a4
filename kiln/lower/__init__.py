"""Lowering: prims → the loop IR (Pointwise, Reduction, Extern, Fallback; views fold into indices).

The names below load with their modules on first use: the loop IR imports sympy, which a graph-cache hit
(kiln.backends.graph_cache) never needs, though it reads the backend's Target (.target).
"""
from typing import Any

_WHERE = {**{name: "ir" for name in ("Buffer", "BufferRef", "ComputedBuffer", "ExternNode", "InputBuffer",
                                     "Layout", "LoopGraph", "OutputView", "Pointwise", "Reduction", "Scan")},
          **{name: "lowering" for name in ("LOWERINGS", "Box", "Lowering", "Unlowerable", "lower")},
          "Target": "target"}

__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
