"""In-place updates of views, made functional.

Eager PyTorch lets a program update a view in place (`y[:, 2] += 5`, `x.view(-1)[::3].zero_()`,
`y.t()[0].add_(1)`) and every alias of the same memory sees the change. A captured graph is functional,
so the registry records such an update as two steps:

    base' = view_update(base, view', chain)   # the base with the view's region replaced
    v_i   = chain_i(base')                    # every live view re-derived from the new base

`ViewChain` is the list of view ops that derived a view from its base (recorded as the views were made,
and only when eager's own result shares memory with its source, so a `reshape` that copies or an
advanced index is never taken for a view). The base of a graph input is then written back like any
mutated input.
"""
from __future__ import annotations

from typing import Any

import torch

from ..graph import torch_name


class ViewChain:
    """The view ops deriving a view from its base: (op, arguments after the tensor, kwargs, item), and the
    base's strides in eager (`base_strides`): whether `contiguous()` or `reshape` returns a view depends on
    them, and a compiled graph's value of the base may be laid out otherwise."""

    __slots__ = ("steps", "base_strides")

    def __init__(self, steps: tuple, base_strides: tuple | None = None):
        self.steps = steps
        self.base_strides = base_strides

    def then(self, func: Any, rest: tuple, kwargs: dict, index: int | None) -> "ViewChain":
        return ViewChain(self.steps + ((func, rest, kwargs, index),), self.base_strides)

    def sizes(self) -> tuple:
        """Every argument of the steps (where symbolic sizes may be: kiln.graph.symbolic looks here)."""
        return tuple((rest, kwargs) for _, rest, kwargs, _ in self.steps) + (self.base_strides,)

    def map_sizes(self, fn: Any) -> "ViewChain":
        """The chain with `fn` applied to each step's arguments and the base's strides (symbolic sizes
        replaced by numbers)."""
        return ViewChain(tuple((f, fn(rest), fn(kwargs), i) for f, rest, kwargs, i in self.steps),
                         fn(self.base_strides) if self.base_strides is not None else None)

    def apply(self, t: Any, invoke: Any = None) -> Any:
        """The view of `t`; `invoke(func, args, kwargs)` records each op when t is a proxy."""
        for func, rest, kwargs, index in self.steps:
            t = func(t, *rest, **kwargs) if invoke is None else invoke(func, (t, *rest), kwargs)
            if index is not None:
                t = t[index]
        return t

    def __repr__(self) -> str:
        parts = [torch_name(f) + ("" if i is None else f"[{i}]") for f, _, _, i in self.steps]
        return f"ViewChain({' -> '.join(parts)})"


def view_update(base: torch.Tensor, value: torch.Tensor, chain: ViewChain) -> torch.Tensor:
    """`base` with the region `chain` selects replaced by `value` (a new tensor; base is unchanged). The
    copy is laid out as eager's base, so the chain's steps are views here as they were there."""
    strides = chain.base_strides
    if strides is not None and len(strides) == base.ndim and tuple(base.stride()) != tuple(strides):
        out = torch.empty_strided(base.shape, strides, dtype=base.dtype, device=base.device)
        out.copy_(base)
    else:
        out = base.clone()
    chain.apply(out).copy_(value)
    return out


view_update.__module__ = "kiln.ops.views"

