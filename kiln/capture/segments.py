"""Grad-mode changes inside a captured frame (`with torch.no_grad():`) split its graph into segments.

The interpreter records each change as a `torch._C._set_grad_enabled` node (it has no value, meta None).
No backend pass has to know about such nodes: before the graph goes to the backend it is cut at them,
each segment is compiled on its own, and a `SegmentedGraph` runs the segments in order, switching grad
mode between them in Python. Passes like cse then cannot merge an op computed under no_grad with the same
op computed with grad, nor move ops across a switch. Inputs updated in place are written back after the
last segment, as the single graph would have done.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ..graph import Graph, Node, TensorMeta, flatten
from ..graph.graph import map_structure
from ..graph.interpreter import write_back


def is_grad_switch(node: Node) -> bool:
    return node.op == "call_torch" and node.target is torch._C._set_grad_enabled


class SegmentedGraph:
    """Runs compiled segments in order with grad-mode switches between them; called like the graph."""

    def __init__(self, steps: list[tuple], placeholders: list[Node], outputs: list[Node],
                 writebacks: list[tuple[int, Node]]):
        self.steps = steps  # ("graph", fn, input nodes, output nodes) | ("grad", enabled)
        self.placeholders = placeholders
        self.outputs = outputs
        self.writebacks = writebacks  # (input position, node holding its final value)

    def __call__(self, *inputs: Any) -> tuple:
        env = {id(p): v for p, v in zip(self.placeholders, inputs)}
        start = torch.is_grad_enabled()
        try:
            for step in self.steps:
                if step[0] == "grad":
                    torch._C._set_grad_enabled(step[1])
                    continue
                _, fn, ins, outs = step
                results = fn(*[env[id(n)] for n in ins])
                for node, value in zip(outs, results):
                    env[id(node)] = value
        except BaseException:
            torch._C._set_grad_enabled(start)
            raise
        for position, node in self.writebacks:
            if env[id(node)] is not inputs[position]:
                write_back(inputs[position], env[id(node)])
        return tuple(env[id(n)] for n in self.outputs)


def compile_segmented(graph: Graph, example_inputs: list, compile_graph: Callable[..., Any]) -> Any:
    """compile_graph(graph, example_inputs), with the graph cut at grad-mode switches (see above)."""
    if not any(is_grad_switch(n) for n in graph.nodes):
        return compile_graph(graph, example_inputs)
    plan = _split(graph)
    if plan is None:  # a value kiln cannot pass between segments: keep the switches in one graph
        return compile_graph(graph, example_inputs)
    steps, outputs, writebacks = plan
    compiled: list[tuple] = []
    # each segment compiles in the grad mode it runs in (its backward is built when grad is on there): a
    # `with torch.enable_grad():` segment of a frame called under no_grad needs its backward
    grad = torch.is_grad_enabled()  # (the frame's guards hold the mode it was captured in)
    for step in steps:
        if step[0] == "grad":
            compiled.append(step)
            grad = step[1]
            continue
        _, sub, ins, outs = step
        examples = [_example(n.meta) for n in ins]
        with torch.set_grad_enabled(grad):
            compiled.append(("graph", compile_graph(sub, examples), ins, outs))
    return SegmentedGraph(compiled, graph.placeholders, outputs, writebacks)


def _example(meta: TensorMeta) -> torch.Tensor:
    t = torch.empty_strided(tuple(int(s) for s in meta.shape), tuple(int(s) for s in meta.strides),
                            dtype=meta.dtype, device=meta.device)
    return t.requires_grad_(meta.requires_grad) if meta.dtype.is_floating_point else t


def _split(graph: Graph) -> tuple | None:
    outputs = list(flatten(graph.output_value))
    if not all(isinstance(v, Node) for v in outputs):
        return None
    names = {p.name: i for i, p in enumerate(graph.placeholders)}
    writebacks = [(names[name], node) for name, node in graph.mutated_inputs.items()]
    groups: list[Any] = [[]]
    for node in graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if is_grad_switch(node):
            groups.append(("grad", node.args[0]))
            groups.append([])
        else:
            groups[-1].append(node)
    if not all(isinstance(g[1], bool) for g in groups if isinstance(g, tuple)):
        return None
    defined_in: dict[int, int] = {}
    for k, group in enumerate(groups):
        if isinstance(group, list):
            for node in group:
                defined_in[id(node)] = k
    needed_later: dict[int, set[int]] = {}  # group -> ids of its nodes read after it
    final = outputs + [node for _, node in writebacks]
    for node in final:
        if id(node) in defined_in:
            needed_later.setdefault(defined_in[id(node)], set()).add(id(node))
    inputs_of: dict[int, list[Node]] = {}
    for k, group in enumerate(groups):
        if not isinstance(group, list):
            continue
        seen: dict[int, Node] = {}
        for node in group:
            for inp in node.inputs():
                if defined_in.get(id(inp)) != k:
                    seen.setdefault(id(inp), inp)
                    if id(inp) in defined_in:
                        needed_later.setdefault(defined_in[id(inp)], set()).add(id(inp))
        inputs_of[k] = list(seen.values())
        if not all(isinstance(n.meta, TensorMeta) for n in inputs_of[k]):
            return None
    steps: list[tuple] = []
    for k, group in enumerate(groups):
        if isinstance(group, tuple):
            steps.append(group)
            continue
        if not group:
            continue
        outs = [n for n in group if id(n) in needed_later.get(k, ())]
        steps.append(("graph", _subgraph(graph, k, group, inputs_of[k], outs), inputs_of[k], outs))
    return steps, outputs, writebacks


def _subgraph(graph: Graph, k: int, nodes: list[Node], inputs: list[Node], outputs: list[Node]) -> Graph:
    sub = Graph(f"{graph.name}_{k // 2}", graph.origin)
    mapping: dict[int, Node] = {}
    for node in inputs:
        mapping[id(node)] = sub.placeholder(node.name, node.meta)

    def arg(v: Any) -> Any:
        return mapping[id(v)] if isinstance(v, Node) else v
    for node in nodes:
        args = map_structure(arg, node.args)
        kwargs = map_structure(arg, node.kwargs)
        if node.op == "call_torch":
            new = sub.call_torch(node.target, args, kwargs, node.meta, node.decomposition, node.origin)
        elif node.op == "call_prim":
            new = sub.call_prim(node.target, args, kwargs, node.meta, node.origin)
        elif node.op == "getitem":
            new = sub.getitem(args[0], args[1])
        elif node.op == "constant":
            new = sub.constant(node.target, node.name)
        else:
            raise ValueError(f"cannot copy node {node.name} ({node.op}) into a segment")
        mapping[id(node)] = new
    sub.output(tuple(mapping[id(n)] for n in outputs))
    return sub
