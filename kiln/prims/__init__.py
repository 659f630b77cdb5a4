"""Primitive ops: strict (no promotion, no broadcasting), each with a meta rule and a reference.

`from kiln import prims; prims.add(a, b)` — on tensors it runs the reference, on proxies it records.
`prims.PRIMS` maps every prim's name to its Prim.
"""
from .registry import PRIMS, Prim, check, is_tensor, meta_of, prim, rule, wrap_dim
from .elementwise import *  # noqa: F401,F403
from . import elementwise as _elementwise
from . import elementwise_vjp as _elementwise_vjp  # noqa: F401 - registers the vjp rules

# Each family module defines its prims at import; names are re-exported here.
_FAMILIES = ["elementwise", "reductions", "shape", "creation", "indexing", "extern", "checks", "windows",
             "collectives"]


def _export() -> None:
    import importlib
    g = globals()
    for family in _FAMILIES:
        try:
            module = importlib.import_module(f"{__name__}.{family}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{family}":
                raise
            continue
        for name, value in vars(module).items():
            if isinstance(value, Prim):
                g[name] = value


_export()
del _elementwise
from . import reductions_vjp, shape_vjp, indexing_vjp, extern_vjp  # noqa: E402,F401  (vjp rules)


def count() -> int:
    """The number of prims (the harness prints it)."""
    return len(PRIMS)
