"""Ops that update tensor arguments in place besides a first `self`: F.batch_norm's running statistics.

A decomposition calls `update_argument(running_mean, new_value)` (kiln.ops.registry). The registry then
records the op as one node returning (its result, the new values...) and rebinds the caller's tensors to
those values, written back at the end of the graph when they are graph inputs: the functional form of
any in-place op. Run by torch (the eager backend, or a fallback), the node's target is `UpdatesArguments`:
the op on copies of the updated arguments, returned after its result, so the torch-level graph is
functional too, and running the op on examples while tracing changes no user tensor.
"""
from __future__ import annotations

import dataclasses
import itertools
import weakref
from typing import Any, Callable

import torch

from ..graph import Graph, Proxy, flatten, map_structure, torch_name

# sub-graph of the op being decomposed -> [(argument placeholder proxy, its new value)]
_PENDING: weakref.WeakKeyDictionary[Graph, list[tuple[Proxy, Proxy]]] = weakref.WeakKeyDictionary()


def begin(sub: Graph) -> None:
    """The registry starts decomposing an op into `sub`: its argument updates are collected."""
    _PENDING[sub] = []


def record(tracer: Any, target: Any, value: Any) -> str | None:
    """Collect an update of argument `target` to `value` made while `tracer` decomposes an op; else why
    not (the registry's NoDecomposition: the op runs as a fallback)."""
    pending = _PENDING.get(tracer.graph) if tracer is not None else None
    if pending is None or not isinstance(target, Proxy) or target.node.op != "placeholder" or \
            not isinstance(value, Proxy):
        return "an in-place update of an argument outside of its own op"
    if any(t is target for t, _ in pending):
        return "two in-place updates of one argument"
    if tuple(value.shape) != tuple(target.shape) or value.dtype != target.dtype:
        return f"an in-place update of {target.meta.short()} with {value.meta.short()}"
    pending.append((target, value))
    return None


def end(sub: Graph, result: Any, sub_inputs: list[Proxy], outer: list[Proxy]) -> tuple[Any, list[int] | None]:
    """(the decomposition's result, the positions among `outer` of the arguments it updates), the result
    followed by their new values when there are any. None for the positions when the op must run as a
    fallback: it updates a tensor the graph holds as a constant (the torch op updates it itself) or a
    tensor passed twice (eager's order of reads and writes decides)."""
    pending = _PENDING.pop(sub, None) or []
    if not pending:
        return result, []
    updated = [next(i for i, p in enumerate(sub_inputs) if p is t) for t, _ in pending]
    if any(outer[i].node.op == "constant" or sum(o is outer[i] for o in outer) > 1 for i in updated):
        return result, None
    return (result, *[v for _, v in pending]), updated



def wrap(func: Callable[..., Any], args: tuple, kwargs: dict, targets: list[Proxy]) -> Any:
    """The torch-level target of an op updating `targets` (among its arguments): `func` if none."""
    if not targets:
        return func
    leaves = list(flatten((args, kwargs)))
    return UpdatesArguments(func, tuple(next(i for i, v in enumerate(leaves) if v is t) for t in targets))


def own_requires_grad(metas: tuple, targets: list[Proxy]) -> tuple:
    """The node's metas with each updated argument's requires_grad its own (eager updates running
    statistics outside autograd)."""
    if not targets:
        return metas
    return metas[:1] + tuple(dataclasses.replace(m, requires_grad=t.meta.requires_grad)
                             for m, t in zip(metas[1:], targets))


class UpdatesArguments:
    """Runs a torch op that updates some of its tensor arguments in place on copies of them, and returns
    (its result, the updated copies...); `positions` are leaf indices of the flattened (args, kwargs)."""

    def __init__(self, fn: Any, positions: tuple[int, ...]):
        self.fn = fn
        self.positions = positions
        self.__name__ = getattr(fn, "__name__", "op")
        self.__qualname__ = f"updates_arguments({torch_name(fn)})"
        self.__module__ = "kiln.ops.updates"

    def __call__(self, *args: Any, **kwargs: Any) -> tuple:
        counter = itertools.count()
        copies: dict[int, torch.Tensor] = {}

        def copy(v: Any) -> Any:
            i = next(counter)
            if i in self.positions and isinstance(v, torch.Tensor):
                v = copies[i] = v.clone()
            return v
        args, kwargs = map_structure(copy, (args, kwargs))
        out = self.fn(*args, **kwargs)
        return (out, *[copies[i] for i in self.positions])

    def __repr__(self) -> str:
        return self.__qualname__
