"""Symbolic tensor values that record into a Graph.

A `Proxy` stands for a tensor while a graph is being built. It answers metadata questions (shape, dtype,
strides, ...) from its node's TensorMeta, and every torch operation on it — `torch.add(p, 1)`, `p.sum(-1)`,
`p + 1`, `F.gelu(p)` — goes to the torch-call handler that `kiln.ops` installs, which records the op with
its decomposition into prims. Prims called on proxies record `call_prim` nodes directly.

`tracing(graph)` makes a graph current, so that ops with no tensor arguments (factories like `torch.zeros`)
know where to record.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

from .. import config
from .graph import Graph, Node
from .meta import TensorMeta


class Deferred:
    """An example value not computed yet (kiln.ops.standins.LazyRun): `resolve()` computes it once, or
    gives None when it cannot be computed. `done` and `value` say whether and what it was."""

    done: bool = False
    value: torch.Tensor | None = None

    def resolve(self) -> torch.Tensor | None:
        raise NotImplementedError


class DataDependentError(RuntimeError):
    """Python needed a concrete tensor value (a branch on a tensor, .item(), ...) while tracing."""


class Tracer:
    """Where recording goes: a graph, and whether torch calls are being decomposed inline.

    `inline=False` (top level): a torch call becomes one `call_torch` node holding its decomposition.
    `inline=True` (inside a decomposition): a torch call records its prims directly.
    `options`: the config flags this compile set (`kiln.compile(options=)`), which decompositions read with
    `traced_flag` (a tracer made for a decomposition inherits them).
    `sourced`: the trace reads every tensor through a source it guards (bytecode capture sets it), so a
    parameter or a tensor requiring grad that reaches an op otherwise (through code torch ran) is refused
    rather than made a constant; kiln.ops.trace runs the function itself and lifts them.
    """

    def __init__(self, graph: Graph, inline: bool = False, options: dict[str, Any] | None = None):
        self.graph = graph
        self.inline = inline
        self.origin: str | None = None  # user source location to stamp on new nodes
        self.options: dict[str, Any] = dict(options or {})
        self.sourced = False

    def flag(self, name: str) -> Any:
        """This trace's value of a config flag: the compile's option when it set one, else the flag."""
        if name in self.options:
            return self.options[name]
        return config.get(name)

    def __repr__(self) -> str:
        return f"Tracer({self.graph.name}, inline={self.inline})"


_STACK: list[Tracer] = []


@contextlib.contextmanager
def tracing(graph_or_tracer: Graph | Tracer, inline: bool = False) -> Iterator[Tracer]:
    tracer = graph_or_tracer if isinstance(graph_or_tracer, Tracer) else Tracer(graph_or_tracer, inline)
    _STACK.append(tracer)
    try:
        yield tracer
    finally:
        _STACK.pop()


def current_tracer() -> Tracer | None:
    return _STACK[-1] if _STACK else None


def traced_flag(name: str) -> Any:
    """A config flag as the graph being traced sees it: its compile's option, else the process-wide flag."""
    tracer = current_tracer()
    return tracer.flag(name) if tracer is not None else config.get(name)


TorchCallHandler = Callable[[Any, tuple, dict], Any]
_handler: TorchCallHandler | None = None


def set_torch_call_handler(handler: TorchCallHandler) -> None:
    """Install the function that records torch calls on proxies (kiln.ops does this on import)."""
    global _handler
    _handler = handler


def torch_call(func: Any, args: tuple, kwargs: dict | None = None) -> Any:
    if _handler is None:
        raise RuntimeError("kiln.ops is not imported, so torch calls on proxies cannot be recorded")
    return _handler(func, tuple(args), dict(kwargs or {}))


def _method(name: str) -> Callable[..., Any]:
    target = getattr(torch.Tensor, name)

    def method(self: "Proxy", *args: Any, **kwargs: Any) -> Any:
        return torch_call(target, (self, *args), kwargs)
    method.__name__ = name
    return method


class Proxy:
    """A symbolic tensor: a node of the graph being built."""

    __slots__ = ("node", "_example", "__weakref__")

    def __init__(self, node: Node, example: "torch.Tensor | Deferred | None" = None):
        self.node = node
        self._example = example  # a real value, or how to compute one, when the trace has example inputs

    # -- example values --
    @property
    def example(self) -> torch.Tensor | None:
        """The value this tensor has for the trace's example inputs, computed on first use (`Deferred`):
        capture records ops from their metas and runs them only where a real value is asked for."""
        value = self._example
        if isinstance(value, Deferred):
            return value.resolve()
        return value

    @example.setter
    def example(self, value: "torch.Tensor | Deferred | None") -> None:
        self._example = value

    def has_example(self) -> bool:
        """Whether an example value exists or can be computed (without computing it)."""
        return self._example is not None

    def example_at_hand(self) -> torch.Tensor | None:
        """The example value when it is already computed; None when it would have to be computed."""
        value = self._example
        if isinstance(value, Deferred):
            return value.value if value.done else None
        return value

    def take_example_of(self, other: "Proxy") -> None:
        """Stand for `other`'s example from now on, without computing it."""
        self._example = other._example

    # -- metadata --
    @property
    def meta(self) -> TensorMeta:
        meta = self.node.meta
        if not isinstance(meta, TensorMeta):
            raise TypeError(f"{self.node.name} is not a tensor (meta {meta!r})")
        return meta

    @property
    def shape(self) -> torch.Size | tuple:
        shape = self.meta.shape
        return torch.Size(shape) if all(isinstance(s, int) for s in shape) else tuple(shape)

    def size(self, dim: int | None = None) -> Any:
        if dim is None:
            return self.shape
        return self.meta.shape[_wrap_dim(dim, self.meta.ndim)]

    def stride(self, dim: int | None = None) -> Any:
        if dim is None:
            return tuple(self.meta.strides)
        return self.meta.strides[_wrap_dim(dim, self.meta.ndim)]

    @property
    def dtype(self) -> torch.dtype:
        return self.meta.dtype

    @property
    def device(self) -> torch.device:
        return self.meta.device

    @property
    def ndim(self) -> int:
        return self.meta.ndim

    def dim(self) -> int:
        return self.meta.ndim

    def ndimension(self) -> int:
        return self.meta.ndim

    def numel(self) -> Any:
        return self.meta.numel()

    def nelement(self) -> Any:
        return self.meta.numel()

    def element_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def requires_grad(self) -> bool:
        return self.meta.requires_grad

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def is_cpu(self) -> bool:
        return self.device.type == "cpu"

    @property
    def layout(self) -> torch.layout:
        return torch.strided

    @property
    def is_sparse(self) -> bool:
        return False

    @property
    def is_quantized(self) -> bool:
        return False

    @property
    def is_nested(self) -> bool:
        return False  # (capture refuses nested inputs)

    @property
    def is_meta(self) -> bool:
        return False

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point

    def is_complex(self) -> bool:
        return self.dtype.is_complex

    def is_contiguous(self, memory_format: torch.memory_format = torch.contiguous_format) -> bool:
        if memory_format != torch.contiguous_format:
            raise DataDependentError("kiln traces only contiguous_format checks")
        return self.meta.is_contiguous()

    def get_device(self) -> int:
        return -1 if self.device.type == "cpu" else (self.device.index or 0)

    # -- refusing concrete values --
    def _concrete(self, what: str) -> Any:
        raise DataDependentError(
            f"{what} needs the value of tensor {self.node.name} ({self.meta.short()}), which is not known "
            f"while tracing; compute it outside the traced function or keep it a tensor")

    def __bool__(self) -> bool:
        return self._concrete("bool(tensor)")

    def item(self) -> Any:
        return self._concrete(".item()")

    def tolist(self) -> Any:
        return self._concrete(".tolist()")

    def __int__(self) -> int:
        return self._concrete("int(tensor)")

    def __float__(self) -> float:
        return self._concrete("float(tensor)")

    def __index__(self) -> int:
        return self._concrete("using a tensor as an index")

    def numpy(self) -> Any:
        return self._concrete(".numpy()")

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.meta.shape[0]

    def __iter__(self) -> Iterator[Any]:
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return iter(torch_call(torch.Tensor.unbind, (self, 0), {}))

    __hash__ = object.__hash__

    # -- torch operations --
    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return torch_call(func, args, kwargs or {})

    def __getattr__(self, name: str) -> Any:
        target = getattr(torch.Tensor, name, None)
        if target is None or name.startswith("_"):
            raise AttributeError(f"'Tensor' object has no attribute {name!r}")
        if isinstance(target, property) or type(target).__name__ == "getset_descriptor":
            return torch_call(target.__get__, (self,), {})
        return _bound(target, self)

    def __repr__(self) -> str:
        return f"Proxy({self.node.name}: {self.node.meta})"

    def __setitem__(self, index: Any, value: Any) -> None:
        torch_call(torch.Tensor.__setitem__, (self, index, value), {})


def _bound(target: Any, proxy: Proxy) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        return torch_call(target, (proxy, *args), kwargs)
    return call


_DUNDERS = [
    "__add__", "__radd__", "__iadd__", "__sub__", "__rsub__", "__isub__", "__mul__", "__rmul__", "__imul__",
    "__truediv__", "__rtruediv__", "__itruediv__", "__floordiv__", "__rfloordiv__", "__ifloordiv__",
    "__mod__", "__rmod__", "__imod__", "__pow__", "__rpow__", "__ipow__", "__matmul__", "__rmatmul__",
    "__and__", "__rand__", "__iand__", "__or__", "__ror__", "__ior__", "__xor__", "__rxor__", "__ixor__",
    "__lshift__", "__rlshift__", "__ilshift__", "__rshift__", "__rrshift__", "__irshift__",
    "__neg__", "__pos__", "__abs__", "__invert__",
    "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__getitem__",
]
for _name in _DUNDERS:
    if hasattr(torch.Tensor, _name):
        setattr(Proxy, _name, _method(_name))
Proxy.__hash__ = object.__hash__  # __eq__ above would otherwise make proxies unhashable


def _wrap_dim(dim: int, ndim: int) -> int:
    size = max(ndim, 1)
    if not -size <= dim < size:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-size}, {size - 1}], "
                         f"but got {dim})")
    return dim % size
