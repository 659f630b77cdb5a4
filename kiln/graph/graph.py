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
import math
from typing import Any, Callable, Iterable, Iterator

import torch

from .meta import TensorMeta

NODE_OPS = ("placeholder", "constant", "call_prim", "call_torch", "getitem", "output")


class Node:
    """One operation of a Graph. Create nodes with the Graph's methods, not directly."""

    __slots__ = ("graph", "name", "op", "target", "args", "kwargs", "meta", "decomposition", "origin",
                 "__weakref__")

    def __init__(self, graph: "Graph", name: str, op: str, target: Any, args: tuple, kwargs: dict,
                 meta: Any, decomposition: "Graph | None" = None, origin: str | None = None):
        assert op in NODE_OPS, op
        self.graph = graph
        self.name = name
        self.op = op
        self.target = target
        self.args = tuple(args)
        self.kwargs = dict(kwargs)
        self.meta = meta
        self.decomposition = decomposition
        self.origin = origin

    @property
    def is_fallback(self) -> bool:
        return self.op == "call_torch" and self.decomposition is None

    def inputs(self) -> list["Node"]:
        """The nodes this node reads, in argument order, each once."""
        seen: dict[int, Node] = {}
        for value in flatten((self.args, self.kwargs)):
            if isinstance(value, Node):
                seen.setdefault(id(value), value)
        return list(seen.values())

    def tensor_args(self) -> list["Node"]:
        """Every node argument in flattening order (repeats kept): the inputs of a decomposition."""
        return [v for v in flatten((self.args, self.kwargs)) if isinstance(v, Node)]

    def target_name(self) -> str:
        if self.op == "call_prim":
            return f"prims.{self.target.name}"
        if self.op == "call_torch":
            return torch_name(self.target)
        return str(self.target) if self.op == "placeholder" else self.op

    def __repr__(self) -> str:
        return f"Node({self.name} = {self.target_name()}, {meta_text(self.meta)})"


_RANDOM_WORDS = ("rand", "bernoulli", "normal", "dropout", "multinomial", "poisson", "uniform", "exponential",
                 "geometric", "cauchy", "rrelu", "random_")


def is_random_target(fn: Any) -> bool:
    """Whether a torch callable draws from a random generator (judged by its name)."""
    name = getattr(fn, "__name__", "") or str(fn)
    return any(word in name for word in _RANDOM_WORDS)


def meta_text(meta: Any) -> str:
    if isinstance(meta, TensorMeta):
        return meta.short()
    if isinstance(meta, tuple):
        return "(" + ", ".join(meta_text(m) for m in meta) + ")"
    if meta is None:
        return "None"
    return getattr(meta, "__name__", str(meta))


# ---- pytree-lite: flatten and rebuild nested argument structures -------------------------------------------

def flatten(value: Any) -> Iterator[Any]:
    """Leaves of nested tuples, lists and dicts (dict values in insertion order)."""
    if isinstance(value, (tuple, list)):
        for item in value:
            yield from flatten(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from flatten(item)
    else:
        yield value


def map_structure(fn: Callable[[Any], Any], value: Any) -> Any:
    """Apply fn to each leaf, keeping the tuple/list/dict structure (and namedtuple types)."""
    if isinstance(value, tuple):
        mapped = [map_structure(fn, v) for v in value]
        if hasattr(value, "_fields"):  # namedtuple
            return type(value)(*mapped)
        if hasattr(value, "n_fields"):  # structseq, e.g. torch.return_types.max
            return type(value)(mapped)
        return tuple(mapped)
    if isinstance(value, list):
        return [map_structure(fn, v) for v in value]
    if isinstance(value, dict):
        return {k: map_structure(fn, v) for k, v in value.items()}
    return fn(value)


# ---- names of torch callables, for printing runnable Python ----------------------------------------------

_TORCH_NAMES: dict[int, str] | None = None


def _build_torch_names() -> dict[int, str]:
    names: dict[int, str] = {}
    spaces = [("torch.nn.functional", torch.nn.functional), ("torch.linalg", torch.linalg),
              ("torch.fft", torch.fft), ("torch.special", torch.special), ("torch", torch),
              ("torch.ops.aten", None)]
    for prefix, module in spaces:
        if module is None:
            continue
        for attr in dir(module):
            if attr.startswith("__"):
                continue
            try:
                obj = getattr(module, attr)
            except Exception:
                continue
            if callable(obj) and not isinstance(obj, type):
                names.setdefault(id(obj), f"{prefix}.{attr}")
    for attr in dir(torch.Tensor):
        try:
            obj = getattr(torch.Tensor, attr)
        except Exception:
            continue
        if callable(obj):
            names[id(obj)] = f"torch.Tensor.{attr}"
    return names


def torch_name(fn: Any) -> str:
    """A runnable dotted name for a torch callable (`torch.nn.functional.gelu`), or a stable fallback."""
    global _TORCH_NAMES
    if _TORCH_NAMES is None:
        _TORCH_NAMES = _build_torch_names()
    name = _TORCH_NAMES.get(id(fn))
    if name is not None:
        return name
    if isinstance(fn, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        return "torch.ops." + str(fn).replace("::", ".")
    qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    module = getattr(fn, "__module__", None)
    return f"{module}.{qual}" if module else qual


# ---- the graph ------------------------------------------------------------------------------------------

class Graph:
    """An ordered list of nodes with one output node at the end."""

    def __init__(self, name: str = "forward"):
        self.name = name
        self.nodes: list[Node] = []
        self._names: set[str] = set()
        self._counter = itertools.count()
        self.mutated_inputs: dict[str, Node] = {}  # placeholder name -> node holding its final value

    # -- construction --
    def _fresh(self, hint: str) -> str:
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
    def python_code(self, header: str | None = None) -> tuple[str, dict[str, Any]]:
        """Source of a runnable Python function computing this graph, and the globals it needs."""
        from .printer import python_code
        return python_code(self, header)

    def __str__(self) -> str:
        return self.python_code()[0]

    def print(self, header: str | None = None) -> None:
        print(self.python_code(header)[0])


# Names the printed code uses for itself; graph values never take them.
_RESERVED = {"torch", "prims", "inf", "nan", "device", "output", "forward", "math", "operator"}


def iter_prims(graph: Graph) -> Iterable[Any]:
    for node in graph.nodes:
        if node.op == "call_prim":
            yield node.target


def nan_safe_repr(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
    return repr(value)
