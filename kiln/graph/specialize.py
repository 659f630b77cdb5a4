"""A graph with symbolic sizes at given sizes: where each symbol is read from, and the graph specialized."""
from __future__ import annotations

from typing import Any

from .graph import Graph
from .node import Node, map_structure
from .symbolic import SymInt, substitute, symbols_of


def specialize_graph(graph: Graph, values: dict) -> Graph:
    """A copy of `graph` (and its decompositions) with every symbolic size replaced by its value."""
    done: dict[int, Graph] = {}

    def copy(g: Graph) -> Graph:
        if id(g) in done:
            return done[id(g)]
        new = Graph(g.name)
        done[id(g)] = new
        mapping: dict[int, Node] = {}

        def arg(v: Any) -> Any:
            if isinstance(v, Node):
                return mapping[id(v)]
            return substitute(v, values)
        for node in g.nodes:
            dec = copy(node.decomposition) if node.decomposition is not None else None
            n = Node(new, node.name, node.op, node.target, map_structure(arg, node.args),
                     map_structure(arg, node.kwargs), substitute(node.meta, values), dec, node.origin)
            new.nodes.append(n)
            new._names.add(node.name)
            mapping[id(node)] = n
        new._counter = g._counter
        new.mutated_inputs = {k: mapping[id(v)] for k, v in g.mutated_inputs.items()}
        return new
    return copy(graph)


def size_bindings(graph: Graph) -> list[tuple[Any, int, int]]:
    """(symbol, placeholder index, dim) for each symbol that is some input's size, at its first place."""
    out, seen = [], set()
    for i, ph in enumerate(graph.placeholders):
        for d, size in enumerate(getattr(ph.meta, "shape", ())):
            if isinstance(size, SymInt) and size.expr.is_Symbol and size.expr not in seen:
                seen.add(size.expr)
                out.append((size.expr, i, d))
    return out


def unbound_symbols(graph: Graph) -> list:
    """Symbols the graph mentions that are no input's dim (int arguments made symbolic), sorted by name."""
    bound = {size.expr for ph in graph.placeholders for size in getattr(ph.meta, "shape", ())
             if isinstance(size, SymInt) and size.expr.is_Symbol}
    used: set = set()
    for n in graph.nodes:
        used |= symbols_of((n.args, n.kwargs))
        for m in (n.meta if isinstance(n.meta, tuple) else (n.meta,)):
            if hasattr(m, "shape"):
                used |= symbols_of((tuple(m.shape), tuple(m.strides), m.storage_offset))
    return sorted(used - bound, key=str)
