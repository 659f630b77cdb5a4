"""Backend `auto`: the best backend available for the graph's tensors (eager until codegen lands)."""
from __future__ import annotations

from typing import Any, Callable

from ..graph import Graph
from . import eager, register_backend


@register_backend("auto")
def auto(graph: Graph, example_inputs: list) -> Callable[..., Any]:
    return eager(graph, example_inputs)
