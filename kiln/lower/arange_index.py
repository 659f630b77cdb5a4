"""index_select and index_put whose index is an arange the graph computes itself, as index arithmetic.

A position embedding looks up `wpe(torch.arange(t))`: an index_select whose index is known at compile time
to be start + step * k. Run with torch, that is a fallback call in the forward and an accumulating
index_put (its gradient) in the backward, each splitting the kernels around it. Here the select becomes a
strided read of its input (a slice, fused into the reader; still a value, never an alias), and the
index_put (unit step: distinct positions, so accumulating or not is the same sum) a masked read that adds
the values over the covered range, like a pad.

`loader(node, *args)` gives the loader of such a node, or None when its index is not a static arange or its
range is not provably inside the indexed dim (then it runs with torch, which raises as eager does).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .. import prims
from ..graph import Node
from ..graph.layout import is_contiguous
from .sizes import is_static

_INT_TYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _arg(node: Node, name: str) -> Any:
    return node.target.params(node)[name]


def static_arange(node: Any) -> tuple[int, int, int] | None:
    """(start, step, length) when `node`'s values in flat order are start + step * k for k < length: a
    prims.iota with int start and step, seen through views that keep flat order (expand_dims, squeeze,
    view of a contiguous value), conversions between integer types that keep every value, and adding,
    subtracting or multiplying an int."""
    while isinstance(node, Node) and node.op == "call_prim":
        target = node.target
        if target is prims.iota:
            length, start, step = _arg(node, "length"), _arg(node, "start"), _arg(node, "step")
            values = (length, start, step)
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in values) or \
                    node.meta.dtype not in _INT_TYPES:
                return None
            return start, step, length
        if target in (prims.add, prims.sub, prims.mul) and len(node.args) == 2:
            return _affine(target, *node.args)
        source = node.args[0] if node.args else None
        if not isinstance(source, Node) or not hasattr(source.meta, "dtype"):
            return None
        if target is prims.convert_element_type:
            if source.meta.dtype not in _INT_TYPES or node.meta.dtype not in _INT_TYPES:
                return None
            found = static_arange(source)
            if found is None:
                return None
            start, step, length = found
            info = torch.iinfo(node.meta.dtype)
            last = start + step * (length - 1)
            if length > 0 and not (info.min <= min(start, last) and max(start, last) <= info.max):
                return None
            return found
        if target in (prims.expand_dims, prims.squeeze) or \
                (target is prims.view and is_contiguous(source.meta.shape, source.meta.strides)):
            node = source
            continue
        return None
    return None


def _affine(target: Any, a: Any, b: Any) -> tuple[int, int, int] | None:
    """An arange plus, minus or times an int (Hugging Face's `torch.arange(t) + past_length`). The values are
    computed exactly here; where the integer type would wrap, they are out of every dim's range, and the
    caller's bounds check sends the op to torch."""
    reversed_ = isinstance(b, Node)  # c op arange
    node, c = (b, a) if reversed_ else (a, b)
    if not isinstance(c, int) or isinstance(c, bool):
        return None
    found = static_arange(node)
    if found is None:
        return None
    start, step, length = found
    if target is prims.add:
        return start + c, step, length
    if target is prims.mul:
        return (start * c, step * c, length) if c != 0 else None
    return (c - start, -step, length) if reversed_ else (start - c, step, length)


def _static_int(value: Any) -> int | None:
    return int(value) if is_static(value) else None  # (None: a symbolic size)


def _select(node: Node, a: Any, dim: int, index: Any) -> Callable[..., Any] | None:
    found = static_arange(_arg(node, "index"))
    if found is None or not a.shape:
        return None
    start, step, length = found
    dim = dim % len(a.shape)
    size = _static_int(a.shape[dim])
    last = start + step * (length - 1)
    if size is None or length < 1 or min(start, last) < 0 or max(start, last) >= size:
        return None
    loader = a.loader

    def load(h: Any, index: list) -> Any:
        shifted = list(index)
        shifted[dim] = start + step * index[dim]
        return loader(h, shifted)
    return load


def _put(node: Node, a: Any, indices: Any, values: Any, accumulate: bool = False) -> Callable[..., Any] | None:
    indices = list(indices)
    placed = [d for d, i in enumerate(indices) if i is not None]
    if len(placed) != 1 or a.dtype == torch.bool or not hasattr(values, "loader"):
        return None
    dim = placed[0]
    index_node = _arg(node, "indices")[dim]
    found = static_arange(index_node)
    if found is None or index_node.meta.ndim != 1:
        return None
    start, step, length = found
    size = _static_int(a.shape[dim])
    expected = tuple(a.shape[:dim]) + (length,) + tuple(a.shape[dim + 1:])
    if step != 1 or size is None or start < 0 or start + length > size or length < 1 or \
            tuple(values.shape) != expected:
        return None
    base, value = a.loader, values.loader
    whole = start == 0 and length == size

    def load(h: Any, index: list) -> Any:
        shifted = list(index)
        shifted[dim] = index[dim] - start

        def covered() -> Any:
            return h.op("add", base(h, index), value(h, shifted)) if accumulate else value(h, shifted)
        if whole:
            return covered()
        pos = h.index_expr(index[dim], torch.int64)
        inside = h.op("logical_and", h.op("ge", pos, h.constant(start, torch.int64)),
                      h.op("lt", pos, h.constant(start + length, torch.int64)))
        return h.masked(inside, covered, lambda: base(h, index), a.dtype)
    return load


def loader(node: Node, *args: Any, **kwargs: Any) -> Callable[..., Any] | None:
    """The loader of an index_select or index_put node with a static arange index, or None."""
    if node.target is prims.index_select:
        return _select(node, *args, **kwargs)
    if node.target is prims.index_put:
        return _put(node, *args, **kwargs)
    return None
