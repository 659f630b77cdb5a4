"""The torch surface: torch functions, Tensor methods, Python operators and torch.nn.functional,
each decomposed into prims with torch's type promotion, broadcasting and argument handling.

Importing this package registers every decomposition and installs the handler that records torch calls
on proxies.
"""
from .registry import (DECOMPOSITIONS, NoDecomposition, UnsupportedError, call, lookup, mark_inplace,
                       mark_view, register, symbolic_call)
from . import record  # noqa: F401  (installs the recording of a top-level torch call)
from .trace import trace

# Decomposition modules, imported here for their registrations; no module imports another to register it.
# inplace comes last: it derives the in-place twin of every functional op registered before it.
from . import elementwise, elementwise_binary, special_bessel, special_bessel_j  # noqa: E402,F401
from . import reductions  # noqa: E402,F401
from . import shape, getitem, shape_copies, view_updates  # noqa: E402,F401
from . import creation, indexing, linalg  # noqa: E402,F401
from . import nn, nn_loss, nn_pool  # noqa: E402,F401
from . import misc, selection  # noqa: E402,F401
from . import aten  # noqa: E402,F401
from . import collectives  # noqa: E402,F401
from . import inplace  # noqa: E402,F401

__all__ = ["DECOMPOSITIONS", "NoDecomposition", "UnsupportedError", "call", "lookup", "mark_inplace",
           "mark_view", "register", "symbolic_call", "trace"]
