"""index_select, gather and advanced indexing (`a[idx]`) with an index tensor, as loads through the index.

An embedding looks up `weight.index_select(0, ids)`; a router gathers its top-k scores; `x[idx]` picks rows.
Run with torch, each is a fallback call that splits the kernels around it (the embedding's lookup, then the
position add and the first LayerNorm, in another kernel). Here the element at `i` loads the index at `i`,
checks it (`h.indirect`: inside the indexed dim; counted from the end for advanced indexing, as eager
does), and loads the source there: the lookup fuses into its readers and moves only the rows it reads.

A kernel never loads outside a buffer: an index outside its dim reads element 0 and raises the kernel's
error flag, and the wrapper then runs the graph with torch, which raises eager's error (IndexError
"index out of range in self" for index_select, eager's message for gather and advanced indexing). Only a
dim that is provably not empty is indexed this way (every index of an empty dim is out of range).

`loader(node, *args)` gives the loader of such a node, or None where it stays a torch call.
"""
from __future__ import annotations

from typing import Any, Callable

from .. import prims
from ..graph import Node
from .sizes import known_le


def _indexable(size: Any) -> bool:
    return known_le(1, size)


def _box(value: Any) -> bool:
    return hasattr(value, "loader") and hasattr(value, "shape")


def _select(a: Any, dim: int, index: Any) -> Callable[..., Any] | None:
    if not (_box(a) and _box(index)) or not a.shape or len(index.shape) > 1:
        return None
    dim = dim % len(a.shape)
    size = a.shape[dim]
    if not _indexable(size):
        return None
    source, positions = a.loader, index.loader
    vector = len(index.shape) == 1

    def load(h: Any, at: list) -> Any:
        row = h.indirect(positions(h, [at[dim]] if vector else []), size)
        moved = list(at)
        moved[dim] = row
        return source(h, moved)
    return load


def _gather(a: Any, dim: int, index: Any) -> Callable[..., Any] | None:
    if not (_box(a) and _box(index)) or not a.shape or len(index.shape) != len(a.shape):
        return None
    dim = dim % len(a.shape)
    size = a.shape[dim]
    if not _indexable(size):
        return None
    source, positions = a.loader, index.loader

    def load(h: Any, at: list) -> Any:
        moved = list(at)
        moved[dim] = h.indirect(positions(h, list(at)), size)
        return source(h, moved)
    return load


def _index(a: Any, indices: Any) -> Callable[..., Any] | None:
    """Advanced indexing: the index tensors (one shape: prims do not broadcast) at `positions` among a's
    dims; the result has the index shape where adjacent positions stand, else first (numpy's rule)."""
    if not _box(a) or not isinstance(indices, (list, tuple)):
        return None
    positions = [d for d, i in enumerate(indices) if i is not None]
    if not positions or not all(_box(indices[d]) for d in positions):
        return None
    if not all(_indexable(a.shape[d]) for d in positions):
        return None
    k = len(indices[positions[0]].shape)
    rest = [d for d in range(len(a.shape)) if d not in positions]
    at_ = positions[0] if positions == list(range(positions[0], positions[-1] + 1)) else 0
    source = a.loader
    loaders = [(d, indices[d].loader, a.shape[d]) for d in positions]

    def load(h: Any, at: list) -> Any:
        where = list(at[at_:at_ + k])
        moved: list[Any] = [None] * len(a.shape)
        for d, v in zip(rest, list(at[:at_]) + list(at[at_ + k:])):
            moved[d] = v
        for d, positions_of, size in loaders:
            moved[d] = h.indirect(positions_of(h, where), size, wrap=True)
        return source(h, moved)
    return load


def loader(node: Node, *args: Any, **kwargs: Any) -> Callable[..., Any] | None:
    """The loader of an index_select, gather or index node through its index tensor, or None."""
    if node.target is prims.index_select:
        return _select(*args, **kwargs)
    if node.target is prims.gather:
        return _gather(*args, **kwargs)
    if node.target is prims.index:
        return _index(*args, **kwargs)
    return None
