"""Tensor parallelism's two collectives as torch operators kiln traces: `torch.ops.kiln_tp.*`.

    torch.ops.kiln_tp.all_reduce(x, group_name)        sum over the group; the gradient passes through
    torch.ops.kiln_tp.grad_all_reduce(x, group_name)   x; the gradient is summed over the group

They are Megatron's g and f, and what DTensor does around a row-parallel and a column-parallel Linear
(`kiln.tensor_parallel` writes a parallelized module's layers with them). Eagerly (kiln's eager backend, a
graph run op by op) each is a torch.autograd.Function over torch's functional collectives; traced, each
decomposes to its prim (`kiln.prims.collectives`), so compiled graphs hold the collective as a node between
kiln's kernels, and the backward graph its gradient's all-reduce.
"""
from __future__ import annotations

import torch

from .. import prims
from .registry import register

_LIBRARY = torch.library.Library("kiln_tp", "DEF")
_LIBRARY.define("all_reduce(Tensor x, str group_name) -> Tensor")
_LIBRARY.define("grad_all_reduce(Tensor x, str group_name) -> Tensor")


def _summed(x: torch.Tensor, group_name: str) -> torch.Tensor:
    functional = torch.ops._c10d_functional
    return functional.wait_tensor(functional.all_reduce(x.contiguous(), "sum", group_name))


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group_name: str) -> torch.Tensor:  # type: ignore[override]
        return _summed(x, group_name)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple:  # type: ignore[override]
        return grad, None


class _GradAllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group_name: str) -> torch.Tensor:  # type: ignore[override]
        ctx.group_name = group_name
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple:  # type: ignore[override]
        return _summed(grad, ctx.group_name), None


# CompositeImplicitAutograd: the Python functions run above autograd, so their Functions record the backward
_LIBRARY.impl("all_reduce", _AllReduce.apply, "CompositeImplicitAutograd")
_LIBRARY.impl("grad_all_reduce", _GradAllReduce.apply, "CompositeImplicitAutograd")

all_reduce = torch.ops.kiln_tp.all_reduce
grad_all_reduce = torch.ops.kiln_tp.grad_all_reduce


@register(all_reduce, all_reduce.default)
def _all_reduce(x, group_name):
    return prims.all_reduce(x, group_name)


@register(grad_all_reduce, grad_all_reduce.default)
def _grad_all_reduce(x, group_name):
    return prims.grad_all_reduce(x, group_name)
