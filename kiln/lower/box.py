"""`Box`: what lowering holds for each prim node's value (kiln.lower.lowering): a shape, a dtype and a loader
`loader(h, index)` computing one element with scalar ops, plus the strided view of a buffer it reads when it
is one (then it can be passed on without a copy)."""
from __future__ import annotations

from typing import Any, Callable

import sympy
import torch

from .index import linear_index
from .ops import CountHandler
from .sizes import dims


class Box:
    """A lowered value: shape, dtype, loader(h, index); `view` = (buffer, strides, offset) when it reads a
    buffer through a strided view (then it can be passed on without a copy)."""

    __slots__ = ("shape", "dtype", "loader", "view", "_cost", "realized")

    def __init__(self, shape: tuple, dtype: torch.dtype, loader: Callable[..., Any],
                 view: tuple[str, tuple, int] | None = None):
        self.shape = dims(shape)
        self.dtype = dtype
        self.loader = loader
        self.view = view
        self._cost: int | None = None
        self.realized: str | None = None  # the buffer holding this value, once materialized

    def cost(self) -> int:
        if self._cost is None:
            counter = CountHandler()
            self.loader(counter, [sympy.Integer(0)] * len(self.shape))
            self._cost = counter.ops
        return self._cost


def buffer_box(name: str, dtype: torch.dtype, shape: tuple, strides: tuple, offset: Any = 0) -> Box:
    """The value a buffer holds at (shape, strides, offset): loads of it, and the view passed on."""
    def load(h: Any, index: list) -> Any:
        return h.load(name, linear_index(index, strides, offset))
    return Box(shape, dtype, load, view=(name, tuple(strides), offset))
