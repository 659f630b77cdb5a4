"""Modules constructed inside compiled code (`ACT2FN["silu"]`, `nn.Softmax(dim=-1)(x)`, `nn.MaxPool1d(k)`).

TorchDynamo inlines `nn.Module.__init__`. kiln constructs the module natively while tracing when that
cannot differ from constructing it on every call: the arguments are constants, every `__init__` it runs is
library code (torch, transformers: the libraries whose attributes capture already treats as fixed), the
construction draws no random numbers, and the module has no parameters or buffers (a fresh module with
weights would hold new values on every eager call). The module is then a local object of the capture:
calling it is traced like any module's call, and returning or storing it (it would outlive the call) breaks
the graph, as for other objects kiln cannot rebuild. Anything else is a graph break with the reason.
"""
from __future__ import annotations

import sys
from typing import Any

import torch

from ..graph import flatten
from .errors import HINTS, GraphBreak
from .guards import is_constant
from .state import trusted_module

_IN_INIT = "create the module in __init__ and call it in forward"


def _user_init(cls: type) -> type | None:
    """The first class in cls's MRO whose own __init__ is not library code, or None."""
    for klass in cls.__mro__:
        if "__init__" in klass.__dict__:
            module = sys.modules.get(klass.__module__)
            if module is None or not trusted_module(module):
                return klass
    return None


def construct_module(cap: Any, cls: type, args: list, kwargs: dict) -> torch.nn.Module:
    """A parameter-free module made natively from constant arguments, as a local object of `cap`."""
    name = cls.__name__
    if not all(is_constant(v) or isinstance(v, (torch.dtype, torch.device)) for v in flatten((args, kwargs))):
        raise GraphBreak(f"creating module {name} inside compiled code from non-constant arguments",
                         HINTS["call"])
    user = _user_init(cls)
    if user is not None:
        raise GraphBreak(f"creating module {name} inside compiled code (its __init__ in {user.__qualname__} "
                         "is user code)", _IN_INIT)
    rng = torch.random.get_rng_state()
    try:
        module = cls(*args, **kwargs)
    except Exception as e:
        raise GraphBreak(f"creating module {name} inside compiled code raised {type(e).__name__}: {e}",
                         HINTS["call"]) from None
    drew = not torch.equal(rng, torch.random.get_rng_state())
    if drew:  # tracing leaves the world as it was: the code that runs instead draws the numbers
        torch.random.set_rng_state(rng)
    if any(True for _ in module.parameters()) or any(True for _ in module.buffers()):
        raise GraphBreak(f"creating module {name} with parameters or buffers inside compiled code (eager "
                         "makes new ones on every call)", _IN_INIT)
    if drew:
        raise GraphBreak(f"creating module {name} inside compiled code draws random numbers", HINTS["call"])
    for made in module.modules():
        cap.new_local(made)
    return module
