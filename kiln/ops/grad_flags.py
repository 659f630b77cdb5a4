"""Autograd flags while tracing: what eager's `.requires_grad` says of a result, and the calls whose flags
the graph cannot reproduce (the registry raises UnsupportedError with the reason: the capture breaks the
graph there and eager runs the call on the real tensors)."""
from __future__ import annotations

from typing import Any

import torch

from ..graph import Proxy, flatten

_NO_GRAD_OUTPUT = frozenset(["detach", "detach_", "requires_grad_"])


def refusal(name: str, flag_op: str, args: tuple, kwargs: dict, updated_without_grad: Any) -> str | None:
    """Why a call's autograd flags belong to the real tensors (None: the graph reproduces them).
    `updated_without_grad`: the proxies
    of tensors that require grad, updated in place under no_grad earlier in the graph (see registry's
    _apply_inplace)."""
    if flag_op in ("requires_grad_", "detach_") and args and isinstance(args[0], Proxy):
        want = False if flag_op == "detach_" else (args[1] if len(args) > 1 else
                                                   kwargs.get("requires_grad", True))
        if bool(want) != args[0].meta.requires_grad:
            # the flag belongs to the real tensor (and later reads of it must see the change)
            return f"{name} changes requires_grad of a traced tensor"
    if not torch.is_grad_enabled():
        return None
    if kwargs.get("requires_grad") is True:
        # a leaf that requires grad, made inside the graph: what is computed from it needs autograd through
        # the graph, which kiln builds for its inputs only; as an input of the graph after the break it gets it
        return f"{name}(requires_grad=True) makes a leaf that requires grad inside the graph (with grad mode on)"
    for v in flatten((args, kwargs)):
        if isinstance(v, Proxy) and v in updated_without_grad:
            # eager differentiates with respect to the tensor itself (a leaf stays the leaf); the graph's
            # new value has no such identity
            return (f"{name} with grad mode on reads a tensor that requires grad, updated in place under "
                    "no_grad earlier in the graph")
    return None


def output_requires_grad(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether eager's result requires grad: grad mode on and a differentiable op of an input that
    requires grad (or a factory asked for it). Code that branches on `.requires_grad` sees eager's
    answer; dtypes without gradients are excluded by the caller."""
    if kwargs.get("requires_grad") is True:
        return True
    name = str(getattr(func, "__name__", "")).split(".")[0]  # (torch.ops.aten.detach.default: "detach")
    if not torch.is_grad_enabled() or name in _NO_GRAD_OUTPUT:
        return False
    if name.endswith("_like") or name.startswith("new_"):
        return False  # factories: zeros_like(x) of an x that requires grad does not
    for v in flatten((args, kwargs)):
        if isinstance(v, Proxy) and v.meta.requires_grad or isinstance(v, torch.Tensor) and v.requires_grad:
            return True
    return False
