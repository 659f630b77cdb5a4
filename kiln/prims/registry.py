"""The primitive-op registry.

A prim is a strict operation — no implicit type promotion, no implicit broadcasting — with
  meta  a rule computing the output TensorMeta (or a tuple of them) from the inputs' metadata; it raises
        the exception eager PyTorch raises for bad input, naming the op and the shapes;
  ref   a reference implementation on torch eager, the meaning of the prim.
Other rules (vjp, lowering, ...) are registered beside the prim with `@rule("vjp", prim)`.

Calling a prim on real tensors runs `ref`; calling it on proxies (or while a graph is being traced)
records a `call_prim` node, its meta computed by `meta`.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable

import torch

from ..graph import Proxy, TensorMeta, current_tracer, flatten, map_structure
from ..graph.graph import Node

PRIMS: dict[str, "Prim"] = {}


class Prim:
    """A primitive operation; call it like a function."""

    __slots__ = ("name", "meta", "ref", "tags", "rules", "doc", "_signature")

    def __init__(self, name: str, meta: Callable[..., Any], ref: Callable[..., Any],
                 tags: Iterable[str] = (), doc: str = ""):
        self.name = name
        self.meta = meta
        self.ref = ref
        self.tags = frozenset(tags)
        self.rules: dict[str, Callable[..., Any]] = {}
        self.doc = doc
        self._signature: inspect.Signature | None = None

    @property
    def signature(self) -> inspect.Signature:
        """The prim's parameters: its reference implementation's signature (every prim names each one)."""
        if self._signature is None:
            self._signature = inspect.signature(self.ref)
        return self._signature

    def params(self, node: Any) -> dict[str, Any]:
        """The arguments of a call of this prim (a graph node, or a loop IR extern node) by name, defaults
        filled in: `prims.convolution.params(node)["groups"]`. Consumers read parameters this way, never by
        position."""
        bound = self.signature.bind(*node.args, **node.kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    @property
    def side_effects(self) -> bool:
        return "side_effects" in self.tags

    @property
    def random(self) -> bool:
        return "random" in self.tags

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        proxies = [a for a in flatten((args, kwargs)) if isinstance(a, Proxy)]
        tracer = current_tracer()
        if not proxies and tracer is None:
            return self.ref(*args, **kwargs)
        graph = tracer.graph if tracer is not None else proxies[0].node.graph
        for p in proxies:
            if p.node.graph is not graph:
                raise RuntimeError(
                    f"prims.{self.name}: argument {p.node.name} belongs to graph {p.node.graph.name}, "
                    f"not to the graph being traced ({graph.name})")
        meta = self.meta(*args, **kwargs)
        if self.name != "stop_gradient" and torch.is_grad_enabled() and any(
                p.meta.requires_grad for p in proxies if isinstance(p.meta, TensorMeta)):
            # a prim of a value that requires grad (inside a decomposition too, whose torch calls run as
            # prims): a float result does, so a rule that routes gradients as eager (relu at 0) sees it
            meta = _requiring_grad(meta)

        def to_node(v: Any) -> Any:
            if isinstance(v, Proxy):
                return v.node
            if isinstance(v, torch.Tensor):
                return graph.constant(v)
            return v
        node = graph.call_prim(self, map_structure(to_node, args), map_structure(to_node, kwargs), meta,
                               origin=tracer.origin if tracer is not None else None)
        if isinstance(meta, tuple):
            return tuple(Proxy(graph.getitem(node, i)) for i in range(len(meta)))
        return Proxy(node)

    def __repr__(self) -> str:
        return f"prims.{self.name}"

    def __reduce__(self) -> Any:
        return (_lookup, (self.name,))


def _requiring_grad(meta: Any) -> Any:
    if isinstance(meta, tuple):
        return tuple(_requiring_grad(m) for m in meta)
    if isinstance(meta, TensorMeta) and (meta.dtype.is_floating_point or meta.dtype.is_complex):
        return meta.with_(requires_grad=True)
    return meta


def _lookup(name: str) -> Prim:
    return PRIMS[name]


def prim(name: str, meta: Callable[..., Any], ref: Callable[..., Any], tags: Iterable[str] = (),
         doc: str = "") -> Prim:
    """Define and register a prim."""
    if name in PRIMS:
        raise ValueError(f"prim {name!r} is defined twice")
    p = Prim(name, meta, ref, tags, doc)
    PRIMS[name] = p
    return p


def rule(kind: str, p: Prim) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a rule of some kind (vjp, lowering, ...) for a prim: `@rule("vjp", prims.exp)`."""
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        p.rules[kind] = fn
        return fn
    return register


# ---- helpers for meta rules ------------------------------------------------------------------------------

def check(cond: bool, message: Callable[[], str], exc: type[Exception] = RuntimeError) -> None:
    """Raise `exc(message())` when cond is false; the message is built only on failure."""
    if not cond:
        raise exc(message())


def is_tensor(v: Any) -> bool:
    return isinstance(v, (Proxy, torch.Tensor, TensorMeta))


def meta_of(v: Any) -> TensorMeta:
    if isinstance(v, TensorMeta):
        return v
    if isinstance(v, Proxy):
        return v.meta
    if isinstance(v, torch.Tensor):
        return TensorMeta.of(v)
    if isinstance(v, Node):
        return v.meta
    raise TypeError(f"expected a tensor, got {type(v).__name__}")


def shape_text(v: Any) -> str:
    return f"[{', '.join(str(s) for s in meta_of(v).shape)}]" if is_tensor(v) else repr(v)


def wrap_dim(dim: int, ndim: int, op: str = "") -> int:
    size = max(ndim, 1)
    if not isinstance(dim, int):
        raise TypeError(f"{op}: dim must be an int, got {type(dim).__name__}")
    if not -size <= dim < size:
        raise IndexError(f"{op}: Dimension out of range (expected to be in range of [{-size}, {size - 1}], "
                         f"but got {dim})")
    return dim % size
