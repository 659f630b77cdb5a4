"""Checks on tensor values that eager makes at run time (e.g. "cov(): weights cannot be negative").

A graph cannot raise while it is being built, because the values are not known yet; the check runs when the
graph runs. `check_values(value, valid, message)` returns `value` unchanged when every element of the bool
tensor `valid` is true, and raises `RuntimeError(message)` otherwise. It is a side effect: passes never drop
it, merge it or move work ahead of it, and backends run its reference (a synchronising check, as eager's).
"""
from __future__ import annotations

from typing import Any

import torch

from ..graph import TensorMeta
from .common_vjp import vjp
from .registry import check, is_tensor, meta_of, prim


def _check_values_meta(value: Any, valid: Any, message: str) -> TensorMeta:
    check(is_tensor(value) and is_tensor(valid), lambda: "prims.check_values: expected tensors", TypeError)
    check(meta_of(valid).dtype == torch.bool, lambda: "prims.check_values: the condition must be bool",
          TypeError)
    check(isinstance(message, str), lambda: "prims.check_values: the message must be a str", TypeError)
    m = meta_of(value)
    return TensorMeta(m.shape, m.dtype, m.device, m.strides)


def _check_values_ref(value: torch.Tensor, valid: torch.Tensor, message: str) -> torch.Tensor:
    if not bool(valid.all()):
        raise RuntimeError(message)
    return value


check_values = prim("check_values", _check_values_meta, _check_values_ref, tags=("side_effects",))


@vjp(check_values)
def _check_values_vjp(grads: Any, outputs: Any, value: Any, valid: Any, message: str) -> tuple:
    # the check returns `value` unchanged: its gradient passes through (the condition and message get none)
    (g,) = grads
    return (g, None, None)
