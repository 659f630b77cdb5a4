"""Lowering of prims.cat, two ways; neither is ever a fallback.

Inline (`inline_cat`): each element loads from the input its index falls in (a chain of `h.masked`), so a
concatenation read by one kernel is computed inside that kernel and never stored. Right for a few inputs
and one reader (rotary embeddings' `cat([-x2, x1])` feeding a multiply).

In place (`plan_concats`, `lower_in_place`): the result is a buffer (`ConcatBuffer`) and each input is
stored straight into its window of it — a value computed by kiln (not yet in a buffer) by its own body, in
the kernel that would have computed it anyway; a value already in a buffer (a convolution's result, a
graph input) by a copy kernel, since a torch call cannot store into a strided window (torch's `out=` of a
convolution copies its result as well). A concatenation of a run of another one's inputs is a window of
that one's buffer and moves no bytes at all: a DenseNet block concatenates its features so far before
each layer and all of them at its end, and every one of those is a window of the last. Chosen for a cat
that shares its buffer so, has more than INLINE_MAX_INPUTS inputs (each element would test them all), is
stored anyway (an output, an extern's operand, read by several nodes), on a target that supports it
(`Target.concat_in_place`) and at static sizes.

The buffer is laid out channels-last where kiln.lower.conv_layout chose that for the cat or a cat sharing
its buffer, else row-major (the prim's layout, and eager's for a cat that is an output).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import sympy
import torch

from .. import prims
from ..graph import Graph, Node, TensorMeta
from ..graph.layout import contiguous_strides
from .box import Box, buffer_box
from .conv_layout import channels_last_strides, eligible_shape
from .ir import ComputedBuffer, ConcatBuffer, Layout, Pointwise
from .sizes import dims, is_static

# An inline concatenation tests, per element, which input its index falls in: beyond this many inputs it is
# computed in place instead (the test chain costs more than storing the result once).
INLINE_MAX_INPUTS = 4


@dataclasses.dataclass
class CatPlace:
    """Where a cat lowered in place lives: a window of `root`'s buffer, from its input `start` on. Unless
    `required` (its buffer is shared, or it has many inputs), only where an input is computed by kiln: a
    concatenation of values already in buffers is as cheap inline as copied."""

    root: Node
    start: int
    required: bool = True


@dataclasses.dataclass
class _Root:
    """A root cat's buffer while lowering: its name, strides, where each input starts along the dim, and
    the part written for each input so far."""

    buffer: ConcatBuffer
    dim: int
    starts: list[int]
    written: dict[int, str] = dataclasses.field(default_factory=dict)


def _cat_inputs(node: Node) -> list:
    tensors = prims.cat.params(node)["tensors"]
    return list(tensors) if isinstance(tensors, (list, tuple)) else []


def _cat_dim(node: Node) -> Any:
    return prims.cat.params(node)["dim"]


def _static_cat(node: Node) -> bool:
    inputs = _cat_inputs(node)
    metas = [node.meta] + [getattr(t, "meta", None) for t in inputs]
    return bool(inputs) and isinstance(_cat_dim(node), int) and \
        all(isinstance(t, Node) for t in inputs) and \
        all(isinstance(m, TensorMeta) and is_static(dims(m.shape)) for m in metas)


def _run_start(root: Node, cat: Node) -> int | None:
    """Where `cat`'s inputs sit as a run of `root`'s inputs (the same nodes, in order, along the same dim)."""
    outer, inner = _cat_inputs(root), _cat_inputs(cat)
    if _cat_dim(root) != _cat_dim(cat) or len(inner) > len(outer):
        return None
    for start in range(len(outer) - len(inner) + 1):
        if all(a is b for a, b in zip(outer[start:start + len(inner)], inner)):
            return start
    return None


def plan_concats(graph: Graph, users: dict, aliased_by_output: set[int]) -> dict[int, CatPlace]:
    """Which cats of `graph` are lowered in place, and where (cat id -> CatPlace); see the module doc.

    The cats with the most inputs become roots first; a cat whose inputs are a run of a root's is a window
    of that root's buffer, unless an output reaches it (an output keeps eager's strides, its own)."""
    cats = [n for n in graph.nodes if n.op == "call_prim" and n.target is prims.cat and _static_cat(n)]
    roots: list[Node] = []
    places: dict[int, CatPlace] = {}
    for cat in sorted(cats, key=lambda n: -len(_cat_inputs(n))):
        if id(cat) not in aliased_by_output:
            for root in roots:
                start = _run_start(root, cat)
                if start is not None:
                    places[id(cat)] = CatPlace(root, start)
                    break
        if id(cat) not in places:
            roots.append(cat)
            places[id(cat)] = CatPlace(cat, 0)
    shared: dict[int, int] = {}
    for place in places.values():
        shared[id(place.root)] = shared.get(id(place.root), 0) + 1
    chosen = {}
    for key, place in places.items():
        place.required = shared[id(place.root)] > 1 or len(_cat_inputs(place.root)) > INLINE_MAX_INPUTS
        if place.required or id(place.root) in aliased_by_output or len(users.get(place.root, ())) > 1:
            chosen[key] = place
    return chosen


def homed_values(places: dict[int, CatPlace], users: dict) -> set[int]:
    """Ids of the nodes every reader of which is a cat of one shared buffer: computed straight into it,
    never into a buffer of their own first (however many such cats read them)."""
    cats: dict[int, Node] = {}
    for place in places.values():
        if place.required:
            cats.setdefault(id(place.root), place.root)
    homed: set[int] = set()
    for root in cats.values():
        for value in _cat_inputs(root):
            readers = users.get(value, ())
            if readers and all(id(r) in places and places[id(r)].root is root for r in readers):
                homed.add(id(value))
    return homed


def _root_strides(ctx: Any, root: Node) -> tuple:
    shape = dims(root.meta.shape)
    group = [key for key, place in ctx.concat_places.items() if place.root is root]
    if id(root) not in ctx.aliased_by_output and eligible_shape(shape) and \
            any(key in ctx.channels_last for key in group):
        return channels_last_strides(shape)
    return contiguous_strides(shape)


def _root(ctx: Any, root: Node) -> _Root:
    state = ctx.concat_roots.get(id(root))
    if state is None:
        shape, d = dims(root.meta.shape), _cat_dim(root)
        name = ctx.new_name()
        buffer = ConcatBuffer(name, root.meta.dtype, Layout(shape, _root_strides(ctx, root)), storage=name)
        ctx.loop.buffers[name] = buffer
        starts, at = [], 0
        for t in _cat_inputs(root):
            starts.append(at)
            at += int(t.meta.shape[d])
        state = ctx.concat_roots[id(root)] = _Root(buffer, d, starts)
    return state


def _write_part(ctx: Any, state: _Root, position: int, value: Node, box: Box) -> str:
    """Store input `position` of the root into its window: computed there when it is a value kiln computes
    and holds in no buffer yet (later readers then read the window), else copied from its buffer. A value an
    output or a torch call sees as a whole keeps a buffer of its own, at eager's strides."""
    buffer = state.buffer
    strides = buffer.layout.strides
    offset = state.starts[position] * strides[state.dim]
    computed = box.view is None and box.realized is None
    if computed and id(value) in ctx.aliased_by_output:
        computed, box = False, ctx.realized_box(box, value.meta, value)
    source = box if computed or box.view is not None else ctx.realized_box(box)
    loader = source.loader
    name = ctx.new_name()
    part = ComputedBuffer(name, buffer.dtype, Layout(box.shape, strides, offset),
                          Pointwise(box.shape, lambda h, index: loader(h, index)), storage=buffer.name)
    ctx.add_node(part)
    buffer.parts.append(name)
    if computed:
        box.realized = name
        ctx.env[id(value)] = buffer_box(name, buffer.dtype, box.shape, strides, offset)
    return name


def computes_in_place(place: CatPlace, tensors: list) -> bool:
    """Whether the cat is lowered in place (else inline): see CatPlace."""
    return place.required or any(box.view is None and box.realized is None for box in tensors)


def lower_in_place(ctx: Any, node: Node, tensors: list, place: CatPlace) -> Box:
    """The cat as a window of its root's buffer, after storing each of its inputs not stored there yet."""
    state = _root(ctx, place.root)
    for k, (value, box) in enumerate(zip(_cat_inputs(node), tensors)):
        position = place.start + k
        if position not in state.written and box.shape[state.dim] != 0:
            state.written[position] = _write_part(ctx, state, position, value, box)
    buffer = state.buffer
    shape, strides = dims(node.meta.shape), buffer.layout.strides
    if place.root is node:
        return buffer_box(buffer.name, buffer.dtype, shape, strides, 0)
    count = len(_cat_inputs(node))
    offset = state.starts[place.start] * strides[state.dim]
    parts = [state.written[p] for p in range(place.start, place.start + count) if p in state.written]
    name = ctx.new_name()
    ctx.loop.buffers[name] = ConcatBuffer(name, buffer.dtype, Layout(shape, strides, offset), parts,
                                          storage=buffer.name)
    return buffer_box(name, buffer.dtype, shape, strides, offset)


def inline_cat(node: Node, tensors: list, dim: int) -> Box:
    """Each element comes from the part its index falls in; `masked` keeps the other parts' loads (out of
    their bounds) from running."""
    dtype = node.meta.dtype
    parts, start = [], 0
    for t in tensors:
        parts.append((start, t))
        start += t.shape[dim]

    def load(h: Any, index: list) -> Any:
        return _select_part(h, index, parts, dim, dtype)
    return Box(node.meta.shape, dtype, load)


def _select_part(h: Any, index: list, parts: list, dim: int, dtype: torch.dtype) -> Any:
    # h.masked(cond, fn, other) evaluates fn only where cond holds (no out-of-bounds loads).
    pos = index[dim]
    live = [(b, t) for b, t in parts if t.shape[dim] != 0]
    if not live:
        return h.constant(0, dtype)
    begin, t = live[-1]
    shifted = list(index)
    shifted[dim] = pos - begin
    if len(live) == 1:
        return t.loader(h, shifted)
    first = h.constant(begin, torch.int64) if is_static(begin) else h.index_expr(sympy.sympify(begin),
                                                                                   torch.int64)
    cond = h.op("ge", h.index_expr(pos, torch.int64), first)
    return h.masked(cond, lambda: t.loader(h, shifted),
                    lambda: _select_part(h, index, live[:-1], dim, dtype), dtype)
