"""Decompositions of elementwise torch ops: math, comparisons, bitwise and logical ops, where, casts."""
from __future__ import annotations

from typing import Any

import torch

from .. import prims
from .registry import register
from .utils import check, elementwise, is_tensor


def _scaled(b: Any, alpha: Any, op: str) -> Any:
    if alpha is None or alpha == 1:
        return b
    check(not isinstance(alpha, bool) or (is_tensor(b) and b.dtype == torch.bool),
          lambda: f"{op}: Boolean alpha only supported for Boolean results.")
    return elementwise(prims.mul, b, alpha)


@register(torch.add, torch.Tensor.add, torch.Tensor.__add__, torch.Tensor.__radd__)
def add(a: Any, b: Any, *, alpha: Any = None) -> Any:
    return elementwise(prims.add, a, _scaled(b, alpha, "add"))


@register(torch.sub, torch.subtract, torch.Tensor.sub, torch.Tensor.subtract, torch.Tensor.__sub__)
def sub(a: Any, b: Any, *, alpha: Any = None) -> Any:
    check(not (is_tensor(a) and a.dtype == torch.bool) or not (is_tensor(b) and b.dtype == torch.bool),
          lambda: "Subtraction, the `-` operator, with two bool tensors is not supported. "
                  "Use the `^` or `logical_xor()` operator instead.")
    return elementwise(prims.sub, a, _scaled(b, alpha, "sub"))


@register(torch.mul, torch.multiply, torch.Tensor.mul, torch.Tensor.multiply, torch.Tensor.__mul__,
          torch.Tensor.__rmul__)
def mul(a: Any, b: Any) -> Any:
    return elementwise(prims.mul, a, b)


@register(torch.exp, torch.Tensor.exp)
def exp(a: Any) -> Any:
    return elementwise(prims.exp, a, promotion="int_to_float")
