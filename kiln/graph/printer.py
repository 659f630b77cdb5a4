"""Print a Graph as a runnable Python function, with shapes and dtypes in comments.

Graph.python_code calls into this module, so it reads a graph through its attributes (nodes, placeholders,
mutated_inputs, output_value) and does not import kiln.graph.graph.
"""
from __future__ import annotations

import linecache
import math
import re
import types
from typing import Any

import torch

from .node import Node, dead_values, meta_text, nan_safe_repr, torch_name, write_back
from .symbolic import SymInt, python_expr

_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.memory_format, torch.layout)


def _resolves(dotted: str, obj: Any) -> bool:
    parts = dotted.split(".")
    if parts[0] != "torch":
        return False
    current: Any = torch
    for part in parts[1:]:
        current = getattr(current, part, None)
        if current is None:
            return False
    return current is obj


class _Emitter:
    def __init__(self) -> None:
        self.globals: dict[str, Any] = {"torch": torch, "inf": math.inf, "nan": math.nan,
                                        "device": torch.device}
        self.prims: dict[str, Any] = {}
        self._objects: dict[int, str] = {}
        self.symbols: set[Any] = set()  # symbolic sizes bound to input shapes at the function's top

    def hold(self, obj: Any, hint: str) -> str:
        """Name an object the source cannot spell; it goes into the globals."""
        key = id(obj)
        if key not in self._objects:
            name = f"_{hint}_{len(self._objects)}"
            self._objects[key] = name
            self.globals[name] = obj
        return self._objects[key]

    def value(self, v: Any) -> str:
        if isinstance(v, Node):
            return v.name
        if isinstance(v, SymInt):
            if v.expr.free_symbols <= self.symbols:  # computed from the inputs' shapes bound on top
                return python_expr(v.expr, {s: str(s) for s in self.symbols})
            return self.hold(v, "size")
        if isinstance(v, float):
            return nan_safe_repr(v)
        if isinstance(v, _PLAIN):
            return repr(v)
        if isinstance(v, torch.device):
            return f"device({str(v)!r})"
        if isinstance(v, torch.Size):
            return repr(tuple(v))
        if isinstance(v, slice):
            return f"slice({self.value(v.start)}, {self.value(v.stop)}, {self.value(v.step)})"
        if v is Ellipsis:
            return "Ellipsis"
        if isinstance(v, tuple) and not hasattr(v, "_fields"):
            inner = ", ".join(self.value(x) for x in v)
            return f"({inner},)" if len(v) == 1 else f"({inner})"
        if isinstance(v, list):
            return "[" + ", ".join(self.value(x) for x in v) + "]"
        if isinstance(v, dict) and all(isinstance(k, str) for k in v):
            return "{" + ", ".join(f"{k!r}: {self.value(x)}" for k, x in v.items()) + "}"
        if isinstance(v, complex):
            return repr(v)
        return self.hold(v, "obj")

    def target(self, node: Node) -> str:
        if node.op == "call_prim":
            self.prims[node.target.name] = node.target
            return f"prims.{node.target.name}"
        name = torch_name(node.target)
        if _resolves(name, node.target):
            return name
        return self.hold(node.target, "fn")


_LOCATION = re.compile(r"(.+):(\d+)$")


def _source_line(origin: str) -> str | None:
    """`# file:line: text` for a node made at a user's file:line, else None."""
    found = _LOCATION.match(origin)
    text = linecache.getline(found[1], int(found[2])).strip() if found else ""
    return f"# {origin}: {text}" if text else None


def python_code(graph: Any, header: str | None = None, source_lines: bool = False,
                free: bool = False) -> tuple[str, dict[str, Any]]:
    """The graph as the source of one Python function, and the globals it needs. `free`: a `del` after
    each value's last use, so that the function holds what eager would (run, the function is the eager
    backend; printed, the graph reads better without them)."""
    em = _Emitter()
    dead_after = dead_values(graph) if free else {}
    lines: list[str] = []
    if header:
        lines.append(f"# {header}")
    params = []
    for node in graph.placeholders:
        params.append(node.name)
    lines.append(f"def {graph.name}({', '.join(params)}):")
    for node in graph.placeholders:
        lines.append(f"    # {node.name}: {meta_text(node.meta)}")
    for node in graph.placeholders:  # each symbolic size, from the first input dim it is
        for d, size in enumerate(getattr(node.meta, "shape", ())):
            if isinstance(size, SymInt) and size.expr.is_Symbol and size.expr not in em.symbols:
                em.symbols.add(size.expr)
                lines.append(f"    {size.expr} = {node.name}.shape[{d}]")
    body = 0
    last_line = None
    for node in graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        body += 1
        if source_lines and node.origin and node.origin != last_line:
            last_line = node.origin
            line = _source_line(node.origin)
            if line is not None:
                lines.append(f"    {line}")
        comment = f"  # {meta_text(node.meta)}"
        if node.is_fallback:
            comment += "  (fallback)"
        if node.origin:
            comment += f"  from {node.origin}"
        if node.op == "constant":
            rhs = em.hold(node.target, "const")
        elif node.op == "getitem":
            rhs = f"{node.args[0].name}[{node.args[1]}]"
        else:
            args = [em.value(a) for a in node.args]
            args += [f"{k}={em.value(v)}" for k, v in node.kwargs.items()]
            rhs = f"{em.target(node)}({', '.join(args)})"
        lines.append(f"    {node.name} = {rhs}{comment}")
        dead = dead_after.get(id(node))
        if dead:
            lines.append(f"    del {', '.join(n.name for n in dead)}")
    for name, node in graph.mutated_inputs.items():
        lines.append(f"    if {node.name} is not {name}:"
                     f"  # input {name} is mutated (unless updated in place)")
        lines.append(f"        _write_back({name}, {node.name})")
        em.globals["_write_back"] = write_back
    if graph.nodes and graph.nodes[-1].op == "output":
        lines.append(f"    return {em.value(graph.output_value)}")
    elif body == 0:
        lines.append("    pass")
    if em.prims:
        em.globals["prims"] = types.SimpleNamespace(**em.prims)
    return "\n".join(lines) + "\n", em.globals


def compile_python(graph: Any) -> Any:
    """The graph's printed source, executed: a Python function computing the graph."""
    source, env = python_code(graph, free=True)
    code = compile(source, f"<kiln graph {graph.name}>", "exec")
    exec(code, env)
    return env[graph.name]


def count_ops(graph: Any) -> dict[str, int]:
    """How many nodes call each target, by printed name."""
    counts: dict[str, int] = {}
    for node in graph.nodes:
        if node.op in ("call_prim", "call_torch"):
            name = node.target_name()
            counts[name] = counts.get(name, 0) + 1
    return counts

