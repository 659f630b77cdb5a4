"""Backends: a backend is `fn(graph, example_inputs, context)`.

`graph` is the torch-level Graph from capture (each node holding its prim decomposition, or a fallback);
`example_inputs` are tensors (one per placeholder); `context` is the `CompileContext` of the kiln.compile
call (its options: `raise_on_error`, `mode`, `dynamic`, per-compile flag values). The callable returned
takes the same inputs and returns the graph's output structure. A user's backend may take only
`(graph, example_inputs)`, as torch.compile's do. Built in: `eager` (torch-level nodes with torch),
`prims` (the decomposed graph on the reference interpreter), and — from their own modules — `cpp`,
`triton`, `auto`. The compiled backends (`cpp`, `triton`) are each a declared list of passes
(`kiln.graph.pipeline`) over a `Target`.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

from ..graph import Graph, run, to_prims, torch_callable
from ..graph.pipeline import CompileContext

Backend = Callable[..., Callable[..., Any]]
_BACKENDS: dict[str, Backend] = {}
_LAZY = {"cpp": "kiln.backends.cpp", "triton": "kiln.backends.triton", "auto": "kiln.backends.auto"}


def register_backend(name: str | None = None, fn: Backend | None = None) -> Any:
    """Register a backend: `@register_backend("mine")`, `@register_backend` or `register_backend("n", fn)`."""
    if callable(name) and fn is None:
        backend = name
        _BACKENDS[backend.__name__] = backend
        return backend

    def register(f: Backend) -> Backend:
        _BACKENDS[name or f.__name__] = f
        return f
    return register(fn) if fn is not None else register


def lookup_backend(name_or_fn: str | Backend) -> Backend:
    if callable(name_or_fn):
        return name_or_fn
    if name_or_fn not in _BACKENDS and name_or_fn in _LAZY:
        importlib.import_module(_LAZY[name_or_fn])
    try:
        return _BACKENDS[name_or_fn]
    except KeyError:
        raise ValueError(f"unknown kiln backend {name_or_fn!r}; available: {available()}") from None


def available() -> list[str]:
    names = set(_BACKENDS)
    for name, module in _LAZY.items():
        try:
            importlib.import_module(module)
            names.add(name)
        except ImportError:
            pass
    return sorted(names)


def takes_context(fn: Callable[..., Any]) -> bool:
    """The backend accepts a third argument (the compile context)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    if any(p.kind is p.VAR_POSITIONAL for p in params) or any(p.name == "context" for p in params):
        return True
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params) >= 3


class GraphCompiler:
    """A backend bound to one compile context: what capture calls as `compiler(graph, example_inputs)`.

    `compiler_for` returns one object per (backend, context values), so compiled functions made by equal
    kiln.compile calls share their resume functions and callees. `keeps_views`: the backend returns a
    graph output that is a view as a view (capture then need not refuse views that live past a break).
    """

    def __init__(self, backend: Backend, context: CompileContext):
        self.backend = backend
        self.context = context
        self.with_context = takes_context(backend)
        self.keeps_views = bool(getattr(backend, "keeps_views", False))

    def __call__(self, graph: Graph, example_inputs: list) -> Callable[..., Any]:
        if self.with_context:
            return self.backend(graph, example_inputs, self.context)
        return self.backend(graph, example_inputs)

    @property
    def compile_symbolic(self) -> Callable[[Graph, list], Callable[..., Any]] | None:
        """`fn(graph, example_inputs)` compiling a graph with symbolic sizes once for every size, when the
        backend can (its `symbolic` attribute); None when it compiles per size."""
        symbolic = getattr(self.backend, "symbolic", None)
        if symbolic is None:
            return None
        return lambda graph, example_inputs: symbolic(graph, example_inputs, self.context)

    def __repr__(self) -> str:
        return f"GraphCompiler({getattr(self.backend, '__name__', self.backend)!r}, {self.context})"


_COMPILERS: dict[tuple, GraphCompiler] = {}


def compiler_for(backend: str | Backend, context: CompileContext | None = None) -> GraphCompiler:
    context = context or CompileContext()
    fn = lookup_backend(backend)
    try:
        key = (id(fn), context.key())
    except TypeError:  # an unhashable option value: a compiler of its own
        return GraphCompiler(fn, context)
    compiler = _COMPILERS.get(key)
    if compiler is None or compiler.backend is not fn:
        compiler = _COMPILERS[key] = GraphCompiler(fn, context)
    return compiler


@register_backend("eager")
def eager(graph: Graph, example_inputs: list, context: CompileContext | None = None) -> Callable[..., Any]:
    """Run the captured torch-level graph with torch: as its printed Python (one generated function, the
    same torch calls as the node-by-node interpreter with less per-call overhead), or on the interpreter
    when the printer cannot spell the graph."""
    return torch_callable(graph)


eager.keeps_views = True  # type: ignore[attr-defined]  # outputs that are views stay views


@register_backend("prims")
def prims(graph: Graph, example_inputs: list, context: CompileContext | None = None) -> Callable[..., Any]:
    """Run the graph decomposed into prims on the reference interpreter."""
    prim_graph = to_prims(graph)

    def run_prims(*inputs: Any) -> Any:
        return run(prim_graph, inputs)
    return run_prims


prims.keeps_views = True  # type: ignore[attr-defined]  # runs torch's own view ops
