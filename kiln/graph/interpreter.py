"""The reference interpreter: run a graph node by node on torch eager.

Prims run their reference implementation; fallback torch nodes call the torch op; decomposed torch-level
nodes run their decomposition (or, with `torch_level=True`, the torch op itself — the `eager` backend).
An exception keeps its type and gains a note naming the node that raised it.
"""
from __future__ import annotations

from typing import Any, Sequence

from .graph import Graph, Node, map_structure
from .node import dead_values
from .node import write_back  # noqa: F401  (kiln.graph.interpreter.write_back, as before)


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
    dead = dead_values(graph)  # (freed as they die: the interpreter holds what eager would)
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
        for gone in dead.get(id(node), ()):
            del env[id(gone)]
    for name, node in graph.mutated_inputs.items():
        target = next(v for ph, v in zip(placeholders, inputs) if ph.name == name)
        write_back(target, env[id(node)])
    return result


def torch_callable(graph: Graph) -> Any:
    """The captured torch-level graph as one Python function of torch calls (its printed source), or on
    the interpreter when the printer cannot spell the graph."""
    from .printer import compile_python  # (the printer imports nothing of the interpreter)
    try:
        return compile_python(graph)
    except Exception:
        def run_eager(*inputs: Any) -> Any:
            return run(graph, inputs, torch_level=True)
        return run_eager
