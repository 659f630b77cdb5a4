"""Dynamic shapes at the capture boundary: marking dims, automatic dynamic, and graphs with symbolic sizes.

A dimension of an input becomes symbolic when the user marks it (`kiln.mark_dynamic(t, dim)`, or
`kiln.compile(..., dynamic=True)` for every dim), or automatically: when a cache miss is caused by an
input's size changing, the changed dims are symbolic in the next capture (Dynamo's automatic dynamic), so
one graph serves the sizes that follow. `dynamic=False` and `kiln.mark_static(t, dim)` keep dims exact.

A captured graph with symbolic sizes reaches the backend through `SymbolicGraph`: each call reads the
symbols' values from its inputs' shapes (every symbol is some input's size), and runs the backend's graph
compiled for those values — specialized on first use, kept per size. Capture, guards and the entry
function are built once for every size.
"""
from __future__ import annotations

import collections
import warnings
from typing import Any, Callable

import torch

from .. import config
from ..counters import counters
from ..graph import Graph, Node
from ..graph.specialize import size_bindings, specialize_graph
from ..graph.symbolic import FrozenShapeEnv, SymInt, has_symbols, symbols_of

log = config.channel("dynamic")


def mark_dynamic(t: torch.Tensor, dim: int | list[int] | tuple[int, ...]) -> None:
    """Capture `t`'s dimension `dim` (or each of a list) as a symbolic size: one graph for every size it
    takes (sizes 0 and 1 are still specialized; a dim automatic dynamic saw at 1 gets a symbol of 1 or
    more)."""
    _mark(t, dim, "_kiln_dynamic_dims", "kiln.mark_dynamic")


def mark_static(t: torch.Tensor, dim: int | list[int] | tuple[int, ...]) -> None:
    """Keep `t`'s dimension `dim` exact: a new size captures again, even after automatic dynamic."""
    _mark(t, dim, "_kiln_static_dims", "kiln.mark_static")


def _mark(t: torch.Tensor, dim: int | list[int] | tuple[int, ...], attr: str, who: str) -> None:
    dims = set(getattr(t, attr, ()))
    for d in ([dim] if isinstance(dim, int) else list(dim)):
        if not -t.dim() <= d < max(t.dim(), 1):
            raise IndexError(f"{who}: dimension {d} out of range for a {t.dim()}-d tensor")
        dims.add(d % t.dim())
    setattr(t, attr, frozenset(dims))


def changed_dims(inputs: list[tuple[Any, tuple]], read: Callable[[str], Any]) -> list[tuple[str, str, int, int, int]]:
    """The dims of an earlier capture's plain tensor inputs whose size differs in this call:
    (source expr, source name, dim, old size, new size). `inputs` holds (source, shape) pairs;
    `read(expr)` evaluates a source in this call."""
    out = []
    for source, shape in inputs:
        try:
            now = read(source.expr)
        except Exception:
            continue
        if not isinstance(now, torch.Tensor) or now.dim() != len(shape):
            continue
        for d, (old, new) in enumerate(zip(shape, now.shape)):
            if old != new and d not in getattr(now, "_kiln_static_dims", ()):
                out.append((source.expr, source.name, d, int(old), int(new)))
    return out


def changed_ints(inputs: list[tuple[Any, int]], read: Callable[[str], Any]) -> list[tuple[str, str, int, int, int]]:
    """Int arguments of an earlier capture whose value differs in this call (dim -1 marks an int)."""
    out = []
    for source, old in inputs:
        try:
            now = read(source.expr)
        except Exception:
            continue
        if type(now) is int and now != old:
            out.append((source.expr, source.name, -1, old, now))
    return out


def has_symbols_bound(node: Node, graph: Graph) -> bool:
    """Whether every symbol the node's arguments mention is some input dim (the printer binds those)."""
    bound = {size.expr for ph in graph.placeholders for size in getattr(ph.meta, "shape", ())
             if isinstance(size, SymInt) and size.expr.is_Symbol}
    return symbols_of((node.args, node.kwargs)) <= bound and not any(
        n.op == "call_torch" and n.target is torch._C._set_grad_enabled for n in [node])


def is_symbolic_graph(graph: Graph) -> bool:
    return any(has_symbols(n.meta) or has_symbols(n.args) or has_symbols(n.kwargs) for n in graph.nodes)


class SymbolicGraph:
    """Calls a graph with symbolic sizes at this call's sizes (read from the inputs' shapes).

    Where the backend compiles graphs with symbolic sizes (`compile_symbolic`: the cpp backend's kernels
    take the sizes as int64 arguments), the graph is compiled once, on its `dynamic_compile_after`-th call
    (any sizes), and that one compiled graph serves every size: counted in `dynamic_symbolic_compiles`.
    Calls before it run the graph with torch.

    Otherwise — the backend cannot, or the symbolic compile failed (counted in `dynamic_symbolic_failed`
    with the reason: a size question whose answer differs between sizes, an int argument used as a size,
    autograd) — sizes are tiered, as a JIT tiers code: the first calls at a size (`dynamic_compile_after` -
    1) run the captured graph, specialized to the size, with torch; the next one compiles the backend's
    graph for it, which serves every later call at that size. A loop where every call brings a new size
    (decoding with a growing cache) so pays no compile per call. After `dynamic_size_limit` compiled sizes,
    further sizes run with torch (counted, warned once). Every call at an uncompiled size is counted in
    `dynamic_torch_calls`."""

    def __init__(self, graph: Graph, compile_graph: Callable[[Graph, list], Any], name: str,
                 run_with_torch: Callable[[Graph, list], Any], loose: list | None = None,
                 compile_symbolic: Callable[[Graph, list], Any] | None = None):
        self.graph = graph
        self.compile_graph = compile_graph
        self.run_with_torch = run_with_torch
        self.name = name
        self.loose = list(loose or [])  # symbols passed as ints after the tensors, in this order
        self.seen: collections.Counter = collections.Counter()
        self.calls = 0
        self.warned = False
        self.torch_fns: dict[tuple, Any] = {}
        self.any_size: Any = None  # one torch function for every size, when the printer binds all symbols
        if not self.loose and all(has_symbols_bound(n, graph) for n in graph.nodes):
            self.any_size = run_with_torch(graph, [])
        self.bindings: list[tuple[Any, int, int]] = size_bindings(graph)  # (symbol, placeholder, dim)
        self.compiled: "collections.OrderedDict[tuple, Any]" = collections.OrderedDict()
        self.bindings += [(sym, -1, k) for k, sym in enumerate(self.loose)]
        self.compile_symbolic = compile_symbolic if not self.loose else None
        self.symbolic: Any = None  # the graph compiled once for every size
        self.symbolic_failed: str | None = None

    def __call__(self, *inputs: Any) -> Any:
        if self.symbolic is not None:
            return self.symbolic(*inputs)
        if self.loose:
            sizes, inputs = inputs[len(inputs) - len(self.loose):], inputs[:len(inputs) - len(self.loose)]
            key = tuple(inputs[i].shape[d] if i >= 0 else sizes[d] for _, i, d in self.bindings)
        else:
            key = tuple(inputs[i].shape[d] for _, i, d in self.bindings)
        fn = self.compiled.get(key)
        if fn is None:
            fn = self._tier(key, list(inputs))
        return fn(*inputs)

    def _try_symbolic(self, inputs: list) -> Any:
        """The graph compiled once for every size, or None (the reason counted and logged)."""
        try:
            fn = self.compile_symbolic(self.graph, inputs)
        except Exception as e:  # noqa: BLE001 - any failure falls back to compiling per size
            if config.get("raise_on_error") and not isinstance(e, (NotImplementedError, FrozenShapeEnv)):
                raise  # an internal error, not a graph the symbolic compile refuses
            self.compile_symbolic = None
            self.symbolic_failed = f"{type(e).__name__}: {e}"
            counters["dynamic_symbolic_failed"][f"{self.name}: {self.symbolic_failed}"[:300]] += 1
            log.info("%s: no symbolic compile (%s); compiling per size", self.name, self.symbolic_failed)
            return None
        counters["dynamic_symbolic_compiles"][self.name] += 1
        log.info("%s: compiled once for every size of %s", self.name,
                 ", ".join(str(s) for s, _, _ in self.bindings))
        self.symbolic = fn
        return fn

    def _tier(self, key: tuple, inputs: list) -> Any:
        self.seen[key] += 1
        self.calls += 1
        values = {sym: v for (sym, _, _), v in zip(self.bindings, key)}
        sizes = ", ".join(f"{s}={v}" for s, v in values.items())
        hot = config.get("dynamic_compile_after")
        if self.compile_symbolic is not None and self.calls >= hot and config.get("dynamic_symbolic"):
            fn = self._try_symbolic(inputs)
            if fn is not None:
                return fn
        full = len(self.compiled) >= config.get("dynamic_size_limit")
        if self.seen[key] < hot or full:
            counters["dynamic_torch_calls"][f"{self.name}: {'size limit reached' if full else 'size not hot yet'}"] += 1
            if full and not self.warned:
                self.warned = True
                limit = config.get("dynamic_size_limit")
                message = (f"kiln: {self.name} was compiled for {limit} sizes (dynamic_size_limit={limit}); "
                           f"calls at further sizes run with torch ({sizes})")
                warnings.warn(message, RuntimeWarning, stacklevel=4)
                log.warning(message)
            if self.any_size is not None:
                return self.any_size
            fn = self.torch_fns.get(key)
            if fn is None:
                fn = self.torch_fns[key] = self.run_with_torch(specialize_graph(self.graph, values), inputs)
            return fn
        graph = specialize_graph(self.graph, values)
        counters["dynamic_backend_compiles"][self.name] += 1
        log.info("%s: compiling the backend's graph for sizes %s", self.name, sizes)
        fn = self.compile_graph(graph, inputs)
        self.compiled[key] = fn
        return fn
