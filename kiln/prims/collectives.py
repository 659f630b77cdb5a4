"""Collective prims: torch.distributed communication inside a graph, as torch's functional collectives.

all_reduce(a, group_name)       the sum of `a` over the ranks of the process group `group_name` (every rank
                                gets it): torch's functional all_reduce, waited for; a new contiguous tensor.
                                Its vjp is the gradient itself: tensor parallelism's convention, where the
                                loss after a replicated value is computed alike on every rank (a row-parallel
                                Linear's output, DTensor's Partial -> Replicate, whose backward passes the
                                replicated gradient through)
grad_all_reduce(a, group_name)  `a` itself; its vjp is all_reduce of the gradient (a column-parallel
                                Linear's replicated input, DTensor's from_local(Replicate): each rank's
                                gradient of it is a partial sum). Not a view: lowered, it reads a.

Both are extern to every backend's kernels (the graph's wrapper calls all_reduce between the kernels, in the
graph's order, which is the same on every rank: each rank compiles the same program). They are never
recomputed by the backward (extern).
"""
from __future__ import annotations

from typing import Any

import torch

from ..graph import TensorMeta
from .common_vjp import vjp
from .registry import check, is_tensor, meta_of, prim


def _tensor(name: str, a: Any, group_name: Any) -> TensorMeta:
    check(is_tensor(a), lambda: f"prims.{name}: expected a tensor, got {type(a).__name__}", TypeError)
    check(isinstance(group_name, str), lambda: f"prims.{name}: expected a process group's name (a str), "
          f"got {type(group_name).__name__}", TypeError)
    return meta_of(a)


def _all_reduce_meta(a: Any, group_name: str) -> TensorMeta:
    m = _tensor("all_reduce", a, group_name)
    return TensorMeta(m.shape, m.dtype, m.device, requires_grad=m.requires_grad)


def _all_reduce_ref(a: torch.Tensor, group_name: str) -> torch.Tensor:
    functional = torch.ops._c10d_functional
    return functional.wait_tensor(functional.all_reduce(a, "sum", group_name))


all_reduce = prim("all_reduce", _all_reduce_meta, _all_reduce_ref, tags=("extern", "collective"),
                  doc=__doc__.split("\n")[2])


def _grad_all_reduce_meta(a: Any, group_name: str) -> TensorMeta:
    return _tensor("grad_all_reduce", a, group_name)


grad_all_reduce = prim("grad_all_reduce", _grad_all_reduce_meta, lambda a, group_name: a,
                       tags=("collective",), doc="grad_all_reduce(a, group_name): a; its gradient is summed "
                                                 "over the group's ranks")


@vjp(all_reduce)
def _all_reduce_vjp(grads: tuple, outputs: tuple, a: Any, group_name: str) -> tuple:
    return (grads[0], None)


@vjp(grad_all_reduce)
def _grad_all_reduce_vjp(grads: tuple, outputs: tuple, a: Any, group_name: str) -> tuple:
    return (all_reduce(grads[0], group_name), None)
