"""Backend `auto`: the best backend available for the graph's tensors.

CPU tensors go to `cpp` (which itself runs the graph with torch when it cannot compile it: no compiler, an
unsupported dtype, an internal error); CUDA tensors go to `triton` (likewise); anything else runs with
`eager`, counted.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ..counters import counters
from ..graph import Graph, flatten
from ..graph.pipeline import CompileContext
from . import eager, lookup_backend, register_backend


@register_backend("auto")
def auto(graph: Graph, example_inputs: list, context: CompileContext | None = None) -> Callable[..., Any]:
    tensors = [t for t in flatten(example_inputs) if isinstance(t, torch.Tensor)]
    if all(t.device.type == "cpu" for t in tensors):
        return lookup_backend("cpp")(graph, example_inputs, context)
    if all(t.device.type == "cuda" for t in tensors):
        try:
            backend = lookup_backend("triton")
        except (ImportError, ValueError):
            backend = None
        if backend is not None:
            return backend(graph, example_inputs, context)
    counters["auto"][f"graphs on {sorted({t.device.type for t in tensors})} run with torch"] += 1
    return eager(graph, example_inputs, context)


def _symbolic(graph: Graph, example_inputs: list, context: CompileContext | None = None) -> Callable[..., Any]:
    """A graph with symbolic sizes compiled once for every size: by `cpp` for CPU tensors (the only backend
    whose kernels take sizes as arguments today); anything else raises, and compiles per size."""
    tensors = [t for t in flatten(example_inputs) if isinstance(t, torch.Tensor)]
    symbolic = getattr(lookup_backend("cpp"), "symbolic", None)
    if symbolic is None or not all(t.device.type == "cpu" for t in tensors):
        raise NotImplementedError("only the cpp backend compiles symbolic sizes once for every size")
    return symbolic(graph, example_inputs, context)


auto.symbolic = _symbolic
