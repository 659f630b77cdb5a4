"""Callable wrappers a `call_torch` node's target may be: the torch op with its result reshaped to what the
graph expects (a flat tuple of tensors, an in-place op applied to a copy)."""
from __future__ import annotations

from typing import Any

import torch

from ..graph import flatten, torch_name


class TensorLeaves:
    """Calls a torch op whose result nests tensors and returns its tensors as one flat tuple."""

    def __init__(self, fn: Any):
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "op")
        self.__qualname__ = f"tensor_leaves({torch_name(fn)})"
        self.__module__ = "kiln.ops.targets"

    def __call__(self, *args: Any, **kwargs: Any) -> tuple:
        return tuple(v for v in flatten(self.fn(*args, **kwargs)) if isinstance(v, torch.Tensor))

    def __repr__(self) -> str:
        return self.__qualname__


class OnCopy:
    """Runs an in-place torch op on a copy of its first argument and returns the updated copy (also when
    the op returns None, like Tensor.__setitem__)."""

    def __init__(self, fn: Any):
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "op")
        self.__qualname__ = f"on_copy({torch_name(fn)})"
        self.__module__ = "kiln.ops.targets"

    def __call__(self, target: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        copy = target.clone()
        out = self.fn(copy, *args, **kwargs)
        return copy if out is None or out is target else out  # None: Tensor.__setitem__

    def __repr__(self) -> str:
        return self.__qualname__
