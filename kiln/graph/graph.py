"""The graph IR: a Graph is an ordered list of Nodes; each node names one operation and its arguments.

Node kinds (`Node.op`):
  placeholder  a graph input (`target` is its name)
  constant     a tensor held by the graph (`target` is the tensor)
  call_prim    a primitive op (`target` is a `kiln.prims.Prim`)
  call_torch   a torch-level op (`target` is the torch callable); `decomposition` holds its prim graph,
               or None when the op has no decomposition and runs as a fallback
  getitem      element `args[1]` of the multi-output node `args[0]`
  output       the graph's result (`args[0]` is a structure of nodes and constants)

Arguments are nested tuples/lists/dicts of Nodes and Python constants. Every tensor-valued node has a
`TensorMeta`; a multi-output node has a tuple of them.
"""
from __future__ import annotations

import itertools
from typing import Any, Iterator

import torch

from .meta import TensorMeta
# Node and the structure helpers live in .node (the printer needs them without the Graph); they stay
# importable from here.
from .node import Node, flatten, map_structure, torch_name  # noqa: F401  (re-exported)
from .printer import python_code

_RANDOM_WORDS = ("rand", "bernoulli", "normal", "dropout", "multinomial", "poisson", "uniform", "exponential",
                 "geometric", "cauchy", "rrelu", "random_")


def is_random_target(fn: Any) -> bool:
    """Whether a torch callable draws from a random generator (judged by its name)."""
    name = getattr(fn, "__name__", "") or str(fn)
    return any(word in name for word in _RANDOM_WORDS)


# ---- the graph ------------------------------------------------------------------------------------------

class Graph:
    """An ordered list of nodes with one output node at the end."""

    def __init__(self, name: str = "forward", origin: str = ""):
        self.name = name
        self.origin = origin  # the frame captured into it and its file:line (debug dumps' index), if any
        self.nodes: list[Node] = []
        self._names: set[str] = set()
        self._counter = itertools.count()
        self.mutated_inputs: dict[str, Node] = {}  # placeholder name -> node holding its final value

    # -- construction --
    def _fresh(self, hint: str) -> str:
        if hint != "t":  # (every op's node is named from "t")
            hint = "".join(c if c.isalnum() or c == "_" else "_" for c in hint) or "t"
            if hint[0].isdigit():
                hint = "_" + hint
        name = f"t{next(self._counter)}" if hint == "t" else hint
        while name in self._names or name in _RESERVED:
            name = f"{hint}_{next(self._counter)}"
        self._names.add(name)
        return name

    def _add(self, node: Node) -> Node:
        if self.nodes and self.nodes[-1].op == "output":
            raise ValueError(f"graph {self.name} already has an output node")
        self.nodes.append(node)
        return node

    def placeholder(self, name: str, meta: Any) -> Node:
        fresh = self._fresh(name)
        return self._add(Node(self, fresh, "placeholder", fresh, (), {}, meta))

    def constant(self, value: torch.Tensor, name: str = "const") -> Node:
        meta = TensorMeta.of(value) if isinstance(value, torch.Tensor) else type(value)
        return self._add(Node(self, self._fresh(name), "constant", value, (), {}, meta))

    def call_prim(self, prim: Any, args: tuple, kwargs: dict, meta: Any, origin: str | None = None) -> Node:
        return self._add(Node(self, self._fresh("t"), "call_prim", prim, args, kwargs, meta, origin=origin))

    def call_torch(self, fn: Any, args: tuple, kwargs: dict, meta: Any,
                   decomposition: "Graph | None" = None, origin: str | None = None) -> Node:
        return self._add(Node(self, self._fresh("t"), "call_torch", fn, args, kwargs, meta,
                              decomposition=decomposition, origin=origin))

    def getitem(self, node: Node, index: int) -> Node:
        meta = node.meta[index]
        return self._add(Node(self, self._fresh(f"{node.name}_{index}"), "getitem", None, (node, index), {},
                              meta))

    def output(self, value: Any) -> Node:
        return self._add(Node(self, "output", "output", None, (value,), {}, None))

    # -- reading --
    @property
    def placeholders(self) -> list[Node]:
        return [n for n in self.nodes if n.op == "placeholder"]

    @property
    def output_node(self) -> Node:
        if not self.nodes or self.nodes[-1].op != "output":
            raise ValueError(f"graph {self.name} has no output node")
        return self.nodes[-1]

    @property
    def output_value(self) -> Any:
        return self.output_node.args[0]

    def users(self) -> dict[Node, list[Node]]:
        """For each node, the nodes that read it."""
        result: dict[Node, list[Node]] = {n: [] for n in self.nodes}
        for node in self.nodes:
            for inp in node.inputs():
                result[inp].append(node)
        for name, node in self.mutated_inputs.items():
            result[node].append(self.output_node)
        return result

    def fallbacks(self) -> list[Node]:
        """Torch-level nodes without a decomposition (they run the torch op)."""
        return [n for n in self.nodes if n.is_fallback]

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    # -- printing --
    def python_code(self, header: str | None = None,
                    source_lines: bool = False) -> tuple[str, dict[str, Any]]:
        """Source of a runnable Python function computing this graph, and the globals it needs; with
        `source_lines`, each user source line is a comment above the nodes it made."""
        return python_code(self, header, source_lines)

    def __str__(self) -> str:
        return self.python_code()[0]

    def print(self, header: str | None = None) -> None:
        print(self.python_code(header)[0])


# Names the printed code uses for itself; graph values never take them.
_RESERVED = {"torch", "prims", "inf", "nan", "device", "output", "forward", "math", "operator"}


