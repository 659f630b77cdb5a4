"""index_select, gather and advanced indexing (`a[idx]`) with an index tensor, as loads through the index.

An embedding looks up `weight.index_select(0, ids)`; a router gathers its top-k scores; `x[idx]` picks rows.
Run with torch, each is a fallback call that splits the kernels around it (the embedding's lookup, then the
position add and the first LayerNorm, in another kernel). Here the element at `i` loads the index at `i`,
checks it (`h.indirect`: inside the indexed dim; counted from the end for advanced indexing, as eager
does), and loads the source there: the lookup fuses into its readers and moves only the rows it reads.

A kernel never loads outside a buffer: an index outside its dim reads element 0 and raises the kernel's
error flag; the wrapper then finds the index in its buffer (each lookup's `IndexCheck`: its index is
realized, usually it is a graph input already) and raises eager's error (IndexError "index out of range in
self" for index_select, eager's message and exception for gather and advanced indexing). Eager checks
every index it is given, even where the program reads one element of the result, so the result is
computed whole (the lowering realizes it; fusion still puts it in its readers' kernel where the loops
match), and only where every index reaches an element of it: the indexed dims, and for index_select and
advanced indexing the other dims of the source, are provably not empty.

`loader(ctx, node, *args)` gives the loader of such a node and its checks, or None where it stays a torch
call.
"""
from __future__ import annotations

from typing import Any, Callable

from .. import prims
from ..graph import Node
from .ir import IndexCheck
from .sizes import known_le


def _indexable(size: Any) -> bool:
    return known_le(1, size)


def _box(value: Any) -> bool:
    return hasattr(value, "loader") and hasattr(value, "shape")


Found = tuple[Callable[..., Any], list[IndexCheck]]


def _held(ctx: Any, node: Node, box: Any, kind: str, size: Any, dim: int, wrap: bool = False) -> tuple[Any, IndexCheck]:
    """The index box read from a buffer (realized unless it is a view of one already), and its check."""
    if box.view is None:
        box = ctx.realized_box(box, node.meta, node)
    name, strides, offset = box.view
    return box, IndexCheck(kind, name, tuple(box.shape), tuple(strides), offset, size, dim, wrap)


def _select(ctx: Any, node: Node, a: Any, dim: int, index: Any) -> Found | None:
    if not (_box(a) and _box(index)) or not a.shape or len(index.shape) > 1:
        return None
    dim = dim % len(a.shape)
    if not all(_indexable(size) for size in a.shape):
        return None
    size = a.shape[dim]
    index, check = _held(ctx, node.args[2], index, "index_select", size, dim)
    source, positions = a.loader, index.loader
    vector = len(index.shape) == 1

    def load(h: Any, at: list) -> Any:
        row = h.indirect(positions(h, [at[dim]] if vector else []), size)
        moved = list(at)
        moved[dim] = row
        return source(h, moved)
    return load, [check]


def _gather(ctx: Any, node: Node, a: Any, dim: int, index: Any) -> Found | None:
    if not (_box(a) and _box(index)) or not a.shape or len(index.shape) != len(a.shape):
        return None
    dim = dim % len(a.shape)
    size = a.shape[dim]
    if not _indexable(size):
        return None
    index, check = _held(ctx, node.args[2], index, "gather", size, dim)
    source, positions = a.loader, index.loader

    def load(h: Any, at: list) -> Any:
        moved = list(at)
        moved[dim] = h.indirect(positions(h, list(at)), size)
        return source(h, moved)
    return load, [check]


def _index(ctx: Any, node: Node, a: Any, indices: Any) -> Found | None:
    """Advanced indexing: the index tensors (one shape: prims do not broadcast) at `positions` among a's
    dims; the result has the index shape where adjacent positions stand, else first (numpy's rule)."""
    if not _box(a) or not isinstance(indices, (list, tuple)):
        return None
    positions = [d for d, i in enumerate(indices) if i is not None]
    if not positions or not all(_box(indices[d]) for d in positions):
        return None
    if not all(_indexable(size) for size in a.shape):
        return None
    k = len(indices[positions[0]].shape)
    rest = [d for d in range(len(a.shape)) if d not in positions]
    at_ = positions[0] if positions == list(range(positions[0], positions[-1] + 1)) else 0
    source = a.loader
    loaders, checks = [], []
    for d in positions:
        box, check = _held(ctx, node.args[1][d], indices[d], "index", a.shape[d], d, wrap=True)
        loaders.append((d, box.loader, a.shape[d]))
        checks.append(check)

    def load(h: Any, at: list) -> Any:
        where = list(at[at_:at_ + k])
        moved: list[Any] = [None] * len(a.shape)
        for d, v in zip(rest, list(at[:at_]) + list(at[at_ + k:])):
            moved[d] = v
        for d, positions_of, size in loaders:
            moved[d] = h.indirect(positions_of(h, where), size, wrap=True)
        return source(h, moved)
    return load, checks


def loader(ctx: Any, node: Node, *args: Any, **kwargs: Any) -> Found | None:
    """The loader of an index_select, gather or index node through its index tensor (the lowering `ctx`
    realizes an index that is no buffer yet) and the checks its kernel makes, or None."""
    if node.target is prims.index_select:
        return _select(ctx, node, *args, **kwargs)
    if node.target is prims.gather:
        return _gather(ctx, node, *args, **kwargs)
    if node.target is prims.index:
        return _index(ctx, node, *args, **kwargs)
    return None
