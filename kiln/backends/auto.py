"""Backend `auto`: the best backend available for the graph's tensors.

CPU tensors go to `cpp` (which itself runs the graph with torch when it cannot compile it: no compiler, an
unsupported dtype, an internal error); anything else runs with `eager` until the triton backend lands.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ..graph import Graph, flatten
from ..graph.pipeline import CompileContext
from . import eager, lookup_backend, register_backend


@register_backend("auto")
def auto(graph: Graph, example_inputs: list, context: CompileContext | None = None) -> Callable[..., Any]:
    tensors = [t for t in flatten(example_inputs) if isinstance(t, torch.Tensor)]
    if all(t.device.type == "cpu" for t in tensors):
        return lookup_backend("cpp")(graph, example_inputs, context)
    return eager(graph, example_inputs, context)
