"""The reference interpreter: run a graph node by node on torch eager.

Prims run their reference implementation; fallback torch nodes call the torch op; decomposed torch-level
nodes run their decomposition (or, with `torch_level=True`, the torch op itself — the `eager` backend).
An exception keeps its type and gains a note naming the node that raised it.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from .graph import Graph, Node, map_structure


def run(graph: Graph, inputs: Sequence[Any], torch_level: bool = False) -> Any:
    """Compute the graph's output for `inputs` (one value per placeholder)."""
    placeholders = graph.placeholders
    if len(inputs) != len(placeholders):
        raise TypeError(f"graph {graph.name} takes {len(placeholders)} inputs, got {len(inputs)}")
    env: dict[int, Any] = {}
    for ph, value in zip(placeholders, inputs):
        env[id(ph)] = value

    def load(v: Any) -> Any:
        return env[id(v)] if isinstance(v, Node) else v

    result = None
    for node in graph.nodes:
        if node.op == "placeholder":
            continue
        try:
            if node.op == "output":
                result = map_structure(load, node.args[0])
                break
            if node.op == "constant":
                value = node.target
            elif node.op == "getitem":
                value = env[id(node.args[0])][node.args[1]]
            elif node.op == "call_prim":
                value = node.target.ref(*map_structure(load, node.args), **map_structure(load, node.kwargs))
            elif node.decomposition is None or torch_level:
                value = node.target(*map_structure(load, node.args), **map_structure(load, node.kwargs))
            else:
                value = run(node.decomposition, [load(a) for a in node.tensor_args()])
        except Exception as e:
            if not getattr(e, "_kiln_noted", False):
                origin = f" (from {node.origin})" if node.origin else ""
                e.add_note(f"while kiln ran node {node.name} = {node.target_name()}{origin} "
                           f"of graph {graph.name}")
                try:
                    e._kiln_noted = True  # type: ignore[attr-defined]
                except AttributeError:
                    pass
            raise
        env[id(node)] = value
    for name, node in graph.mutated_inputs.items():
        target = next(v for ph, v in zip(placeholders, inputs) if ph.name == name)
        write_back(target, env[id(node)])
    return result


def write_back(target: Any, value: Any) -> None:
    """`target.copy_(value)`; an expanded target (a stride-0 dim) gets the last value written to each of
    its elements in order, as eager's own in-place op leaves it (copy_ refuses overlapping destinations)."""
    if value is target:
        return  # the graph updated the input itself (an in-place op the eager backend ran on it)
    if target.requires_grad and torch.is_grad_enabled():
        # a tensor that requires grad is updated in place only under no_grad (capture refuses it with
        # grad on), so its write-back runs under no_grad too, wherever the graph's grad mode ended
        with torch.no_grad():
            write_back(target, value)
        return
    overlap = [d for d, (size, stride) in enumerate(zip(target.shape, target.stride()))
               if stride == 0 and size > 1]
    if not overlap:
        target.copy_(value)
        return
    for d in overlap:
        target = target.narrow(d, target.shape[d] - 1, 1)
        value = value.narrow(d, value.shape[d] - 1, 1)
    target.copy_(value)


def torch_callable(graph: Graph) -> Any:
    """The captured torch-level graph as one Python function of torch calls (its printed source), or on
    the interpreter when the printer cannot spell the graph."""
    from .printer import compile_python
    try:
        return compile_python(graph)
    except Exception:
        def run_eager(*inputs: Any) -> Any:
            return run(graph, inputs, torch_level=True)
        return run_eager
