"""Gradients in the layout of the inputs they belong to.

Eager autograd accumulates a gradient into `.grad` in its parameter's layout: a gradient with other strides
is copied into that layout first (AccumulateGrad's layout contract). The VJP rules give a linear layer's
weight gradient as the transpose of a product — y = x @ W^T gives grad W = (x^T @ g)^T, a transposed view —
so every weight gradient would cost a copy in eager's engine after kiln's backward. `in_input_layout`
recomputes such a gradient as the product of the transposed operands, (A @ B)^T = B^T @ A^T (eager's own
formula, grad W = g^T @ x): the extern matmul reads its transposed operands in place and writes the
gradient contiguous, as the parameter is.
"""
from __future__ import annotations

from typing import Any

from .. import prims
from ..graph import Node, Proxy, TensorMeta, contiguous_strides


def _swap_last(ndim: int) -> tuple[int, ...]:
    return tuple(range(ndim - 2)) + (ndim - 1, ndim - 2)


def _is_permute(node: Any, dims: tuple[int, ...]) -> bool:
    return (isinstance(node, Node) and node.op == "call_prim" and node.target is prims.permute
            and not node.kwargs and tuple(node.args[1]) == dims)


def _transposed(node: Node, dims: tuple[int, ...]) -> Proxy:
    """node^T, without a permute of a permute."""
    if _is_permute(node, dims) and isinstance(node.args[0], Node):
        return Proxy(node.args[0])
    return prims.permute(Proxy(node), dims)


def in_input_layout(grad: Any, meta: TensorMeta) -> Any:
    """`grad` (traced in the backward graph being built) for an input of layout `meta`: a transposed matrix
    product (mm, bmm) recomputed as the product of the transposed operands when the input is contiguous;
    otherwise `grad` itself. Call it while tracing the backward."""
    if not isinstance(grad, Proxy) or not isinstance(meta, TensorMeta) or len(meta.shape) not in (2, 3):
        return grad
    if tuple(meta.strides) != tuple(contiguous_strides(meta.shape)):
        return grad
    dims = _swap_last(len(meta.shape))
    node = grad.node
    if not _is_permute(node, dims):
        return grad
    product = node.args[0]
    if not (isinstance(product, Node) and product.op == "call_prim" and not product.kwargs and
            (product.target, len(meta.shape)) in ((prims.mm, 2), (prims.bmm, 3))):
        return grad
    a, b = product.args
    if not (isinstance(a, Node) and isinstance(b, Node)):
        return grad
    return product.target(_transposed(b, dims), _transposed(a, dims))
