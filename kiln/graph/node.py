"""Nodes of the graph IR and the helpers they need: walking nested argument structures (flatten,
map_structure), naming torch callables, and the text of metas and constants.

A leaf of kiln.graph: the printer and the Graph both stand on it, so it imports neither.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from .meta import TensorMeta

NODE_OPS = ("placeholder", "constant", "call_prim", "call_torch", "getitem", "output")


def named_inplace(name: Any) -> bool:
    """torch's naming rule for in-place ops: `name_` updates its first argument (`Tensor.add_`,
    `nn.init.uniform_`); dunders (`__iadd__`) are not named so."""
    return isinstance(name, str) and name.endswith("_") and not name.endswith("__")


def is_custom_op(target: Any) -> bool:
    """Whether `target` is an operator registered with torch.library outside aten and prims."""
    return isinstance(target, torch._ops.OpOverload) and target.namespace not in ("aten", "prims", "prim")


class Node:
    """One operation of a Graph. Create nodes with the Graph's methods, not directly."""

    __slots__ = ("graph", "name", "op", "target", "args", "kwargs", "meta", "decomposition", "origin",
                 "__weakref__")

    # graph and decomposition are Graphs (kiln.graph.graph, which imports this module)
    def __init__(self, graph: Any, name: str, op: str, target: Any, args: tuple, kwargs: dict,
                 meta: Any, decomposition: Any = None, origin: str | None = None):
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

    @property
    def is_custom_op(self) -> bool:
        """A torch.library operator outside aten (a library's own kernel: transformers' grouped_mm,
        flash-attention, torchao): kiln cannot see into it by design, so it is an extern of the graph (its
        metas from its fake kernel), counted under "custom_op", not a fallback kiln should have lowered."""
        return self.op == "call_torch" and is_custom_op(self.target)

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


def meta_text(meta: Any) -> str:
    if isinstance(meta, TensorMeta):
        return meta.short()
    if isinstance(meta, tuple):
        return "(" + ", ".join(meta_text(m) for m in meta) + ")"
    if meta is None:
        return "None"
    return getattr(meta, "__name__", str(meta))


# ---- pytree-lite: flatten and rebuild nested argument structures -------------------------------------------

_NESTED = (tuple, list, dict)


def flatten(value: Any) -> list[Any]:
    """Leaves of nested tuples, lists and dicts (dict values in insertion order).

    A list, not a generator: capture flattens every recorded op's arguments several times, and a
    generator frame per nesting level cost more than the walk itself."""
    if not isinstance(value, _NESTED):
        return [value]
    leaves: list[Any] = []
    _flatten_into(value, leaves)
    return leaves


def _flatten_into(value: Any, leaves: list[Any]) -> None:
    for item in value.values() if isinstance(value, dict) else value:
        if isinstance(item, _NESTED):
            _flatten_into(item, leaves)
        else:
            leaves.append(item)


def map_structure(fn: Callable[[Any], Any], value: Any) -> Any:
    """Apply fn to each leaf, keeping the tuple/list/dict structure (and namedtuple types)."""
    if not isinstance(value, _NESTED):
        return fn(value)
    if isinstance(value, dict):
        return {k: map_structure(fn, v) if isinstance(v, _NESTED) else fn(v) for k, v in value.items()}
    mapped = [map_structure(fn, v) if isinstance(v, _NESTED) else fn(v) for v in value]
    if type(value) is tuple:
        return tuple(mapped)
    if isinstance(value, list):
        return mapped
    if hasattr(value, "_fields"):  # namedtuple
        return type(value)(*mapped)
    if hasattr(value, "n_fields"):  # structseq, e.g. torch.return_types.max
        return type(value)(mapped)
    return tuple(mapped)


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


def nan_safe_repr(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
    return repr(value)


# ---- writing a graph's new value of an input back into it ---------------------------------------------

def dead_values(graph: Any) -> dict[int, list[Node]]:
    """id(node) -> the values computed in the graph's body that are dead once `node` has run: read last
    there, or (the node itself) never read. Not the inputs, the outputs, nor the new values of mutated
    inputs, which the end of the graph reads."""
    last: dict[int, Node] = {}
    values: dict[int, Node] = {}
    for node in graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        last[id(node)], values[id(node)] = node, node
        for a in node.inputs():
            if a.op != "placeholder":
                last[id(a)] = node
    ends = graph.nodes[-1].args[0] if graph.nodes and graph.nodes[-1].op == "output" else ()
    for v in [*flatten(ends), *graph.mutated_inputs.values()]:
        if isinstance(v, Node):
            last.pop(id(v), None)
    dead: dict[int, list[Node]] = {}
    for key, node in last.items():
        dead.setdefault(id(node), []).append(values[key])
    return dead


def write_back(target: Any, value: Any) -> None:
    """`target.copy_(value)`; an expanded target (a stride-0 dim) gets the last value written to each of
    its elements in order, as eager's own in-place op leaves it (copy_ refuses overlapping destinations)."""
    if value is target:
        return  # the graph updated the input itself (an in-place op the eager backend ran on it)
    if isinstance(value, torch.Tensor) and value.data_ptr() == target.data_ptr() and \
            value.shape == target.shape and value.stride() == target.stride() and value.dtype == target.dtype:
        return  # a compiled kernel wrote the new value into the input's own memory
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
