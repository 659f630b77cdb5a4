"""The torch surface: torch functions, Tensor methods, Python operators and torch.nn.functional,
each decomposed into prims with torch's type promotion, broadcasting and argument handling.

Importing this package registers every decomposition and installs the handler that records torch calls
on proxies.
"""
import importlib as _importlib

from .registry import (DECOMPOSITIONS, NoDecomposition, UnsupportedError, call, lookup, mark_inplace,
                       mark_view, register, symbolic_call)
from .trace import trace

# Decomposition modules, imported for their registrations.
_MODULES = ["elementwise", "reductions", "shape", "creation", "indexing", "linalg", "nn", "nn_loss",
            "nn_pool", "misc", "inplace"]
for _m in _MODULES:
    try:
        _importlib.import_module(f"{__name__}.{_m}")
    except ModuleNotFoundError as _e:
        if _e.name != f"{__name__}.{_m}":
            raise

__all__ = ["DECOMPOSITIONS", "NoDecomposition", "UnsupportedError", "call", "lookup", "mark_inplace",
           "mark_view", "register", "symbolic_call", "trace"]
