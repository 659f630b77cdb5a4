"""Backends: a backend is `fn(graph, example_inputs) -> callable`.

`graph` is the torch-level Graph from capture (each node holding its prim decomposition, or a fallback);
`example_inputs` are tensors (one per placeholder); the callable takes the same inputs and returns the
graph's output structure. Built in: `eager` (torch-level nodes with torch), `prims` (the decomposed graph on
the reference interpreter), and — from their own modules — `cpp`, `triton`, `auto`.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

from ..graph import Graph, run, to_prims

Backend = Callable[[Graph, list], Callable[..., Any]]
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


@register_backend("eager")
def eager(graph: Graph, example_inputs: list) -> Callable[..., Any]:
    """Run the captured torch-level graph op by op with torch (capture alone)."""
    def run_eager(*inputs: Any) -> Any:
        return run(graph, inputs, torch_level=True)
    return run_eager


@register_backend("prims")
def prims(graph: Graph, example_inputs: list) -> Callable[..., Any]:
    """Run the graph decomposed into prims on the reference interpreter."""
    prim_graph = to_prims(graph)

    def run_prims(*inputs: Any) -> Any:
        return run(prim_graph, inputs)
    return run_prims
