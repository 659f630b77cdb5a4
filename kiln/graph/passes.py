"""Graph passes: verify, dead-code elimination, common-subexpression elimination, inlining decompositions.

Each pass takes a Graph and returns a Graph (possibly the same object, changed in place); `graph_pass`
makes one a step of a pipeline (`kiln.graph.pipeline`), and `run_passes` runs a list of them with the
pipeline's runner (verified between passes when `config.verify` is on).
"""
from __future__ import annotations

import logging
import struct
from typing import Any, Callable, Sequence

import torch

from .. import config
from .graph import Graph, Node, flatten, is_random_target, map_structure
from .node import named_inplace
from .pipeline import FUEL, CompileContext, CompileState, Pass, run_pipeline
from .symbolic import SymInt

log = config.channel("graph")
prims_log = config.channel("prims")


class GraphVerifyError(AssertionError):
    pass


def verify(graph: Graph, after: str | None = None) -> None:
    """Check structural invariants; raise GraphVerifyError saying what is wrong and where."""
    where = f" after pass {after}" if after else ""

    def fail(node: Node | None, msg: str) -> None:
        at = f" at node {node.name}" if node is not None else ""
        raise GraphVerifyError(f"graph {graph.name}{where}{at}: {msg}")

    defined: set[int] = set()
    names: set[str] = set()
    seen_output = False
    for node in graph.nodes:
        if seen_output:
            fail(node, "node after the output node")
        if node.graph is not graph:
            fail(node, "node belongs to another graph")
        if node.name in names:
            fail(node, "duplicate node name")
        names.add(node.name)
        for inp in node.inputs():
            if id(inp) not in defined:
                fail(node, f"reads {inp.name}, which is not defined before it (or belongs to another graph)")
        if node.op == "output":
            seen_output = True
        elif node.op == "getitem":
            src, index = node.args
            if not isinstance(src.meta, tuple) or not 0 <= index < len(src.meta):
                fail(node, f"getitem {index} of {src.name}, which has meta {src.meta}")
        elif node.op == "call_prim":
            if not hasattr(node.target, "meta"):
                fail(node, f"call_prim target {node.target!r} is not a prim")
        elif node.op == "call_torch" and node.decomposition is not None:
            dec = node.decomposition
            if len(dec.placeholders) != len(node.tensor_args()):
                fail(node, f"decomposition has {len(dec.placeholders)} inputs, node has "
                           f"{len(node.tensor_args())} tensor arguments")
        if node.op in ("call_prim", "call_torch", "placeholder", "constant", "getitem"):
            if node.meta is None and node.op != "placeholder":
                fail(node, "missing meta")
        defined.add(id(node))
    if not seen_output:
        fail(None, "no output node")
    for name, node in graph.mutated_inputs.items():
        if not any(p.name == name for p in graph.placeholders):
            fail(node, f"mutates {name}, which is not an input")


def _has_side_effects(node: Node) -> bool:
    if node.op == "call_prim":
        # a random prim advances the generator even when its value is unused, as in eager
        return bool(getattr(node.target, "side_effects", False) or getattr(node.target, "random", False))
    if node.op == "call_torch":
        if is_random_target(node.target):
            return True
        # A node without a value (e.g. a grad-mode switch) is there for its effect; fallback torch ops may
        # mutate, so keep an op when its name says in-place.
        if node.meta is None:
            return True
        return named_inplace(getattr(node.target, "__name__", ""))
    return False


def dce(graph: Graph) -> Graph:
    """Remove nodes whose values nobody reads (inputs, outputs and side effects stay)."""
    live: set[int] = set()
    mutated = {id(n) for n in graph.mutated_inputs.values()}
    for node in reversed(graph.nodes):  # (capture runs this on every op's decomposition: kept lean)
        keep = (node.op in ("output", "placeholder") or id(node) in live or _has_side_effects(node)
                or id(node) in mutated)
        if keep:
            live.add(id(node))
            for value in flatten((node.args, node.kwargs)):
                if isinstance(value, Node):
                    live.add(id(value))
    before = len(graph.nodes)
    graph.nodes = [n for n in graph.nodes if id(n) in live]
    if len(graph.nodes) != before:
        log.debug("dce removed %d nodes from %s", before - len(graph.nodes), graph.name)
    return graph


def _key(value: Any) -> Any:
    """A hashable identity for an argument structure (nodes by identity, constants by value and type;
    a float by its bits, so 0.0 and -0.0 stay apart)."""
    if isinstance(value, Node):
        return ("node", id(value))
    if isinstance(value, float):
        return ("float", struct.pack("<d", value))
    if isinstance(value, torch.Tensor):
        return ("tensor", id(value))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _key(v)) for k, v in value.items()))
    if isinstance(value, slice):
        return ("slice", _key(value.start), _key(value.stop), _key(value.step))
    if isinstance(value, SymInt):  # by its expression (hashing a SymInt specializes it)
        return ("symint", value.expr)
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return (type(value).__name__, value)


def _replace_inputs(node: Node, mapping: dict[int, Node]) -> None:
    def sub(v: Any) -> Any:
        return mapping.get(id(v), v) if isinstance(v, Node) else v
    node.args = map_structure(sub, node.args)
    node.kwargs = map_structure(sub, node.kwargs)


def cse(graph: Graph, only: Callable[[Node], bool] | None = None) -> Graph:
    """Merge nodes that compute the same pure op on the same arguments (with `only`: the nodes it accepts)."""
    seen: dict[Any, Node] = {}
    replaced: dict[int, Node] = {}
    kept: list[Node] = []
    # a graph output stays its own node: eager returns distinct tensors (two equal views are two objects)
    returned = {id(v) for v in flatten(graph.output_value) if isinstance(v, Node)}
    for node in graph.nodes:
        _replace_inputs(node, replaced)
        pure = id(node) not in returned and (node.op == "getitem"
                or (node.op == "call_prim" and not getattr(node.target, "side_effects", False)
                    and not getattr(node.target, "random", False))
                or (node.op == "call_torch" and node.decomposition is not None
                    and not getattr(node.decomposition, "impure", False)))
        if pure and (only is None or only(node)):
            key = (node.op, id(node.target), _key(node.args), _key(node.kwargs))
            if key in seen and FUEL.take("cse", lambda: f"{node.name} is {seen[key].name}"):
                replaced[id(node)] = seen[key]
                continue
            seen[key] = node
        kept.append(node)
    graph.mutated_inputs = {k: replaced.get(id(v), v) for k, v in graph.mutated_inputs.items()}
    graph.nodes = kept
    return graph


def to_prims(graph: Graph) -> Graph:
    """A new graph where every decomposed torch-level node is replaced by its prim graph (inlined).

    Fallback nodes stay torch-level `call_torch` nodes with no decomposition.
    """
    out = Graph(graph.name, graph.origin)
    mapping: dict[int, Any] = {}

    def sub(v: Any) -> Any:
        return mapping[id(v)] if isinstance(v, Node) else v

    for node in graph.nodes:
        if node.op == "placeholder":
            mapping[id(node)] = out.placeholder(node.name, node.meta)
        elif node.op == "constant":
            mapping[id(node)] = out.constant(node.target, node.name)
        elif node.op == "output":
            out.output(map_structure(sub, node.args[0]))
        elif node.op == "getitem":
            src = mapping[id(node.args[0])]
            mapping[id(node)] = src[node.args[1]] if isinstance(src, tuple) else out.getitem(src, node.args[1])
        elif node.op == "call_prim":
            mapping[id(node)] = out.call_prim(node.target, map_structure(sub, node.args),
                                              map_structure(sub, node.kwargs), node.meta, node.origin)
        elif node.decomposition is None:
            mapping[id(node)] = out.call_torch(node.target, map_structure(sub, node.args),
                                               map_structure(sub, node.kwargs), node.meta, None, node.origin)
        else:
            inputs = [sub(a) for a in node.tensor_args()]
            mapping[id(node)] = inline(out, node.decomposition, inputs, origin=node.origin or node.target_name())
    out.mutated_inputs = {k: mapping[id(v)] for k, v in graph.mutated_inputs.items()}
    if prims_log.isEnabledFor(logging.INFO):  # (printing a large graph takes ms)
        code = out.python_code(f"{graph.name} decomposed into prims")[0]
        prims_log.info("%s in prims:\n%s", graph.name, code)
    return out


def inline(into: Graph, sub: Graph, inputs: Sequence[Any], origin: str | None = None) -> Any:
    """Copy `sub`'s nodes into `into`, its placeholders bound to `inputs`; return its output structure.

    A multi-output result comes back as a tuple of nodes.
    """
    mapping: dict[int, Any] = {}
    for ph, value in zip(sub.placeholders, inputs, strict=True):
        mapping[id(ph)] = value

    def s(v: Any) -> Any:
        return mapping[id(v)] if isinstance(v, Node) else v

    for node in sub.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "output":
            return map_structure(s, node.args[0])
        if node.op == "constant":
            mapping[id(node)] = into.constant(node.target, node.name)
        elif node.op == "getitem":
            src = mapping[id(node.args[0])]
            mapping[id(node)] = src[node.args[1]] if isinstance(src, tuple) else into.getitem(src, node.args[1])
        elif node.op == "call_prim":
            mapping[id(node)] = into.call_prim(node.target, map_structure(s, node.args),
                                               map_structure(s, node.kwargs), node.meta, origin)
        elif node.decomposition is None:
            mapping[id(node)] = into.call_torch(node.target, map_structure(s, node.args),
                                                map_structure(s, node.kwargs), node.meta, None, origin)
        else:
            mapping[id(node)] = inline(into, node.decomposition, [s(a) for a in node.tensor_args()], origin)
    raise ValueError(f"graph {sub.name} has no output node")


def graph_pass(fn: Callable[[Graph], Graph], field: str = "graph") -> Pass:
    """A Graph -> Graph function as a pipeline pass over `state.<field>`, printed and verified as a graph."""
    def run_it(state: CompileState, context: CompileContext) -> None:
        setattr(state, field, fn(getattr(state, field)))

    def text(state: CompileState) -> str:
        return getattr(state, field).python_code(f"after {fn.__name__}")[0]
    return Pass(fn.__name__, run_it, text, lambda state: verify(getattr(state, field), after=fn.__name__))


def run_passes(graph: Graph, passes: Sequence[Callable[[Graph], Graph]],
               context: CompileContext | None = None) -> Graph:
    """Run Graph -> Graph passes with the pipeline runner (timed; verified between passes with verify on)."""
    state = run_pipeline(graph.name, [graph_pass(p) for p in passes], CompileState(graph, []),
                         context or CompileContext())
    return state.graph
