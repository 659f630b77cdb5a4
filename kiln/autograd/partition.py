"""The partitioner: which forward values the forward saves for the backward, and which the backward recomputes.

A minimum cut (kiln.autograd.mincut) over the forward values the backward reads and their ancestors. Each value is an
edge v_in -> v_out whose capacity is its size in bytes (saving it costs that much memory until the
backward); data dependencies are infinite edges; what the backward reads is tied to the sink. Values that
must not be recomputed are tied to the source: matmul, convolution, attention and the other extern prims
(their cost), random prims (the backward must see the forward's draws: they are saved, so a dropout mask
is exactly the forward's), fallback torch ops, gathers and scatters (the indexing prims: each is a call
of its own, ~10-20 us for an embedding lookup, never a fused load), nodes with side effects, multi-output
nodes and their results. Graph inputs are free to save (the caller holds them anyway). Everything else — pointwise ops,
views, reductions — is recomputed in the backward when that saves bytes, where it fuses into the backward's
kernels. Recomputing is not free, though: each recomputable value also has an edge from the source whose
capacity is its recompute cost in the same unit (`recompute_cost`: a small fraction of the bytes it writes,
more for a reduction, which reads all of its input; nothing for a view), cut exactly when the value is
recomputed. So the cut recomputes only where that saves more bytes than it costs, and of two cuts that save
the same bytes (a softmax's input or its output) it takes the one that recomputes less.
"""
from __future__ import annotations

import math
from typing import Any

from ..counters import counters
from ..graph import Graph, Node, TensorMeta, inline, map_structure
from ..graph.symbolic import hint_of
from .joint import Joint, _copy_nodes
from .mincut import FlowGraph, Unbounded

INF = float("inf")


def nbytes(meta: Any) -> float:
    if not isinstance(meta, TensorMeta):
        return INF
    return math.prod(hint_of(meta.shape)) * meta.dtype.itemsize  # (symbolic sizes: at the capture's hints)


def _banned(node: Node) -> bool:
    if node.op == "placeholder":
        return False
    if node.op == "constant":
        return False
    if node.op == "call_torch" or isinstance(node.meta, tuple):
        return True
    if node.op == "getitem":
        return True  # of a multi-output node, which is never recomputed
    prim = node.target
    return "extern" in prim.tags or "indexing" in prim.tags or prim.random or prim.side_effects


POINTWISE_COST = 1 / 32   # of the bytes written: fused into a backward kernel, a recomputed value is cheap
REDUCTION_COST = 1 / 8    # of the bytes read: a reduction reads its whole input again


def recompute_cost(node: Node) -> float:
    """What recomputing `node` in the backward costs, in bytes-equivalent (see the module docstring)."""
    if node.op != "call_prim" or not isinstance(node.meta, TensorMeta):
        return 0.0
    tags = node.target.tags
    if "view" in tags or ("creation" in tags and not node.target.random):
        return 0.0
    if "reduction" in tags:
        return REDUCTION_COST * sum(nbytes(i.meta) for i in node.inputs() if isinstance(i.meta, TensorMeta))
    return POINTWISE_COST * nbytes(node.meta)


def _ancestors(saved: list[Node]) -> list[Node]:
    seen: dict[Node, None] = {}
    todo = list(saved)
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen[n] = None
        todo.extend(n.inputs())
    return list(seen)


def _updated_inputs(forward: Graph) -> set[Node]:
    """Inputs the forward updates in place (a buffer's `add_`), and views of them: their memory holds the
    new values once the forward has written them back, so the backward can neither read them nor recompute
    from them (a gradient silently used the updated buffer). The values computed from them are saved instead.
    A saved value that is one of them stays as the joint chose it: autograd's version check then raises, as
    eager's does for a tensor it saved and the program updated."""
    updated = {p for p in forward.placeholders if p.name in forward.mutated_inputs}
    for node in forward.nodes:
        if node.op == "call_prim" and "view" in node.target.tags and node.args and node.args[0] in updated:
            updated.add(node)
    return updated


def min_cut_saved(forward: Graph, saved: list[Node]) -> tuple[list[Node], list[Node]]:
    """(the forward values to save, the ones the backward recomputes from them), both in forward order:
    what recomputes `saved` in the fewest bytes saved."""
    region = set(_ancestors(saved))
    updated = _updated_inputs(forward)
    g = FlowGraph()
    for node in region:
        if node.op == "constant":
            continue
        cost = 0.0 if node.op == "placeholder" else nbytes(node.meta)
        if node in updated:
            cost = INF  # the backward would read it after the forward's write-back (see _updated_inputs)
        g.add_edge((node, "in"), (node, "out"), capacity=cost)
        if node.op == "placeholder" or _banned(node) or node in updated:
            g.add_edge("source", (node, "in"), capacity=INF)
        elif recompute_cost(node) > 0:
            g.add_edge("source", (node, "in"), capacity=recompute_cost(node))
        for inp in node.inputs():
            if inp in region and inp.op != "constant":
                g.add_edge((inp, "out"), (node, "in"), capacity=INF)
    for node in saved:
        if node.op != "constant":
            g.add_edge((node, "out"), "sink", capacity=INF)
    if "sink" not in g or "source" not in g:
        return [n for n in saved if n.op != "constant"], []
    try:
        _, reachable = g.min_cut("source", "sink")
    except Unbounded:   # a saved value only unsavable values recompute: keep the joint's own choice
        counters["autograd"]["partition: no finite cut, saved as traced"] += 1
        return [n for n in saved if n.op != "constant"], []
    order = {n: i for i, n in enumerate(forward.nodes)}
    cut = {n for n in region if n.op != "constant" and (n, "in") in reachable and (n, "out") not in reachable}
    # only what recomputing `saved` reaches (a free input cut off behind a saved value is not needed)
    needed: set[Node] = set()
    todo = list(saved)
    visited: set[Node] = set()
    while todo:
        n = todo.pop()
        if n in visited or n.op == "constant":
            continue
        visited.add(n)
        if n in cut:
            needed.add(n)
            continue
        todo.extend(n.inputs())
    recompute = visited - needed
    return sorted(needed, key=order.__getitem__), sorted(recompute, key=order.__getitem__)


def partition(joint: Joint) -> Joint:
    """The joint with its saved values chosen by `min_cut_saved`; the backward recomputes the others."""
    forward = joint.forward
    n_user = joint.user_leaves
    out_values = list(forward.output_value)
    old_saved: list[Node] = out_values[n_user:]
    if not old_saved:
        return joint
    new_saved, recompute = min_cut_saved(forward, old_saved)
    if set(new_saved) == set(old_saved):
        counters["autograd"]["bytes saved for backward"] += int(sum(nbytes(n.meta) for n in old_saved
                                                                    if n.op != "placeholder"))
        return joint
    backward = joint.backward
    b_placeholders = backward.placeholders
    new = Graph(backward.name)
    mapping: dict[Node, Node] = {}  # forward node -> its value in the new backward
    inputs: list[tuple[str, int]] = []
    for k, node in enumerate(new_saved):
        mapping[node] = new.placeholder(f"saved_{node.name}", node.meta)
        inputs.append(("saved", k))
    grad_placeholders = {}
    for (kind, what), ph in zip(joint.backward_inputs, b_placeholders):
        if kind == "grad":
            grad_placeholders[ph] = new.placeholder(ph.name, ph.meta)
            inputs.append(("grad", what))

    def fsub(v: Any) -> Any:
        if isinstance(v, Node) and v.op == "constant" and v not in mapping:
            mapping[v] = new.constant(v.target, v.name)
        return mapping[v] if isinstance(v, Node) else v
    for node in recompute:
        if node.op == "constant":
            mapping[node] = new.constant(node.target, node.name)
            continue
        mapping[node] = new.call_prim(node.target, map_structure(fsub, node.args), map_structure(fsub, node.kwargs),
                                      node.meta, "recomputed for the backward")
    bound = [grad_placeholders[ph] if kind == "grad" else mapping[old_saved[what]]
             for (kind, what), ph in zip(joint.backward_inputs, b_placeholders)]
    new.output(inline(new, backward, bound))
    forward_out = Graph(forward.name)
    fmap: dict[Node, Node] = {}
    _copy_nodes(forward, forward_out, fmap)
    forward_out.output(tuple(fmap[v] if isinstance(v, Node) else v for v in out_values[:n_user]) +
                       tuple(fmap[n] for n in new_saved))
    forward_out.mutated_inputs = {k: fmap[v] for k, v in forward.mutated_inputs.items()}
    before = sum(nbytes(n.meta) for n in old_saved if n.op != "placeholder")
    after = sum(nbytes(n.meta) for n in new_saved if n.op != "placeholder")
    counters["autograd"]["bytes saved for backward"] += int(after)
    counters["autograd"]["bytes the backward recomputes instead of saving"] += int(max(before - after, 0))
    return Joint(forward_out, new, n_user, inputs, joint.differentiable, joint.output_template, joint.opaque)
