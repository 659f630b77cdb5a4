"""The loop IR: buffers computed by (ranges, inner function) bodies, extern calls, and the graph holding them.

A `ComputedBuffer` is written by a `Pointwise` body (`fn(h, index)` gives one element) or a `Reduction`
body (`fn(h, index, rindex)` gives one element to fold into the output at `index`). An `ExternNode` runs a
torch callable on whole tensors (matmul, convolution, attention: `kind="extern"`; anything kiln cannot
lower: `kind="fallback"`). Graph inputs and constants are `InputBuffer`s. Views never appear as nodes:
they are folded into the index expressions of the bodies that read them; a graph output that is a view is an
`OutputView` (the wrapper makes it with `as_strided`, so it aliases exactly as eager's).

A concatenation whose inputs are written straight into its result is a `ConcatBuffer`: no node computes
it; its `parts` are computed buffers that each store into a window of its memory (`ComputedBuffer.storage`
names the buffer that memory belongs to). A concatenation of a run of another one's inputs (DenseNet's
growing feature lists) is a `ConcatBuffer` over that one's memory. Reading a concatenation waits for its
parts (`LoopGraph.sources`); memory is planned per `LoopGraph.storage_of`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import sympy
import torch

from ..graph.layout import numel, storage_size
from ..graph.meta import dtype_abbrev
from .index import index_var
from .ops import DepsHandler, PrintHandler
from .sizes import size_symbols


@dataclasses.dataclass
class Layout:
    """Where element `index` of a buffer lives: offset + sum(index * strides), in elements."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    def numel(self) -> int:
        return numel(self.shape)

    def storage_size(self) -> int:
        """Elements needed behind the data pointer (0 for an empty tensor)."""
        return storage_size(self.shape, self.strides, self.offset)


@dataclasses.dataclass
class Buffer:
    name: str
    dtype: torch.dtype
    layout: Layout

    @property
    def shape(self) -> tuple[int, ...]:
        return self.layout.shape

    def numel(self) -> int:
        return self.layout.numel()

    def nbytes(self) -> int:
        return self.layout.storage_size() * self.dtype.itemsize


@dataclasses.dataclass
class InputBuffer(Buffer):
    """A graph input (`position` among the placeholders) or a constant tensor (`constant`)."""

    position: int = -1
    constant: torch.Tensor | None = None


@dataclasses.dataclass
class Pointwise:
    ranges: tuple[int, ...]
    fn: Callable[..., Any]  # fn(h, index) -> value

    def body(self, h: Any) -> Any:
        return self.fn(h, [index_var("i", d) for d in range(len(self.ranges))])


@dataclasses.dataclass
class Reduction:
    ranges: tuple[int, ...]
    reduction_ranges: tuple[int, ...]
    reduction_type: str  # sum, prod, max, min, argmax, argmin, any, all
    fn: Callable[..., Any]  # fn(h, index, rindex) -> value

    def body(self, h: Any) -> Any:
        return self.fn(h, [index_var("i", d) for d in range(len(self.ranges))],
                       [index_var("r", d) for d in range(len(self.reduction_ranges))])


@dataclasses.dataclass
class Scan:
    """An inclusive scan (cumsum, cumprod) along `dim`: element i folds the elements 0..i of `fn`."""

    ranges: tuple[int, ...]
    dim: int
    scan_type: str  # sum, prod
    fn: Callable[..., Any]  # fn(h, index) -> value

    def body(self, h: Any) -> Any:
        return self.fn(h, [index_var("i", d) for d in range(len(self.ranges))])


@dataclasses.dataclass
class ComputedBuffer(Buffer):
    data: Pointwise | Reduction | Scan | None = None
    # the ConcatBuffer whose memory this buffer is a window of (its layout's offset counts from that
    # buffer's first element); None: memory of its own
    storage: str | None = None

    def nbytes(self) -> int:
        return _window_bytes(self) if self.storage is not None else super().nbytes()

    @property
    def is_reduction(self) -> bool:
        return isinstance(self.data, Reduction)

    def reads(self) -> list[tuple[str, sympy.Expr]]:
        """(buffer, index) of every load of the body (computed once: bodies never change after lowering)."""
        cached = self.__dict__.get("_reads")
        if cached is None:
            deps = DepsHandler()
            self.data.body(deps)
            cached = self.__dict__["_reads"] = deps.loads
            self.__dict__["_indirect"] = deps.__dict__.get("indirect_count", 0) > 0
        return list(cached)

    def loads_through_index(self) -> bool:
        """Whether the body loads through an index read from a tensor (`h.indirect`): its kernel checks the
        index and reports one outside its dim."""
        self.reads()
        return self.__dict__["_indirect"]

    def describe(self) -> str:
        """The body as a runnable Python function, `def bufN(ops, i0, ..., r0, ...)` returning the element at
        index `i` (a reduction: the value folded at `r`), headed by what the buffer is. The modules of
        `kiln.lower.printer` call it over the buffer's iteration space on `kiln.lower.reference`."""
        data = self.data
        index = [index_var("i", d) for d in range(len(data.ranges))]
        rindex = [index_var("r", d) for d in range(len(data.reduction_ranges))] if self.is_reduction else []
        ranges = dict(zip(index, data.ranges))
        handler = PrintHandler(ranges=ranges)
        if isinstance(data, Reduction):
            ranges.update(zip(rindex, data.reduction_ranges))
            value = data.fn(handler, index, rindex)
            what = f"Reduction {data.reduction_type} over {list(data.ranges)} x {list(data.reduction_ranges)}"
        elif isinstance(data, Scan):
            value = data.fn(handler, index)
            what = f"Scan {data.scan_type} along dim {data.dim} over {list(data.ranges)}"
        else:
            value = data.fn(handler, index)
            what = f"Pointwise over {list(data.ranges)}"
        layout = f"{dtype_abbrev(self.dtype)}[{', '.join(map(str, self.shape))}] " \
            f"strides={tuple(self.layout.strides)}"
        if self.layout.offset:
            layout += f" offset={self.layout.offset}"
        if self.storage is not None:
            layout += f" in the memory of {self.storage}"
        params = ", ".join(["ops"] + [v.name for v in index + rindex])
        return "\n".join([f"def {self.name}({params}):", f"    # {what} -> {layout}", *handler.lines,
                          f"    return {value}"])


@dataclasses.dataclass
class ConcatBuffer(Buffer):
    """A concatenation computed by its parts in place: `parts` are the ComputedBuffers (in order along the
    concatenated dim) that store into windows of `storage`'s memory, which this buffer is a window of (its
    own name when the memory is its own: then the memory plan allocates it before its first part runs)."""

    parts: list[str] = dataclasses.field(default_factory=list)
    storage: str = ""

    def nbytes(self) -> int:
        return _window_bytes(self)

    def describe(self) -> str:
        where = "" if self.storage == self.name else f" in the memory of {self.storage}"
        offset = f" offset={self.layout.offset}" if self.layout.offset else ""
        return (f"{self.name} = concat of [{', '.join(self.parts)}] written in place{where} -> "
                f"{dtype_abbrev(self.dtype)}[{', '.join(map(str, self.shape))}] "
                f"strides={tuple(self.layout.strides)}{offset}")


def _window_bytes(buf: Buffer) -> int:
    """Bytes of the elements a window of a concatenation's memory holds (the elements between them, and
    before its offset, are other windows'; a concatenation's own memory is dense)."""
    return buf.numel() * buf.dtype.itemsize


@dataclasses.dataclass
class ExternNode:
    """A torch callable run on whole tensors by the wrapper.

    `args`/`kwargs` hold `BufferRef`s where tensors go; `outputs` are the buffers it produces (their layout
    is what kernels reading them assume; the wrapper restrides a result that differs).
    """

    name: str
    kind: str  # "extern" or "fallback"
    target: Callable[..., Any]
    target_name: str
    args: tuple
    kwargs: dict
    outputs: list[Buffer]
    multi_output: bool
    # the prim's in-place reference (`rule("inplace_ref", prim)`): fn(a, ...) writes the result into its first
    # argument and returns it; the memory plan uses it where the result is that input's new value
    inplace_target: Callable[..., Any] | None = None

    def reads(self) -> list[str]:
        from ..graph import flatten
        return [v.name for v in flatten((self.args, self.kwargs)) if isinstance(v, (BufferRef, ViewRef))]

    def describe(self) -> str:
        outs = ", ".join(o.name for o in self.outputs)
        return f"{outs} = {self.kind}({self.target_name}, reads={self.reads()})"


@dataclasses.dataclass(frozen=True)
class BufferRef:
    name: str


@dataclasses.dataclass(frozen=True)
class ViewRef:
    """An extern's argument: a strided view of a buffer (no copy), made by the wrapper with as_strided."""

    name: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int


@dataclasses.dataclass(frozen=True)
class OutputView:
    """Output = as_strided(buffer, shape, strides, offset) (a view of an input or a computed buffer)."""

    name: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int


@dataclasses.dataclass(frozen=True)
class IndexCheck:
    """An index a lookup's kernel loads through (kiln.lower.indirect): where a kernel reports one outside its
    dim, the wrapper finds it in `index` (a view of that buffer) and raises eager's error for `kind`
    (index_select, gather or index) on dim `dim` of `size` (negative values counted from the end: `wrap`)."""

    kind: str
    index: str
    shape: tuple
    strides: tuple
    offset: Any
    size: Any
    dim: int
    wrap: bool


@dataclasses.dataclass
class LoopGraph:
    """The lowered graph: inputs, ordered nodes, the output structure and input mutations."""

    name: str
    inputs: list[InputBuffer]
    constants: list[InputBuffer]
    nodes: list[ComputedBuffer | ExternNode]
    output: Any  # structure of BufferRef / OutputView / Python constants
    mutations: list[tuple[int, Any]]  # (input position, BufferRef or OutputView of the final value)
    buffers: dict[str, Buffer] = dataclasses.field(default_factory=dict)
    # the lookups' index checks, by the buffer whose kernel makes them
    index_checks: dict[str, list[IndexCheck]] = dataclasses.field(default_factory=dict)

    def size_symbols(self) -> list:
        """The symbolic sizes the graph's layouts, views and extern arguments mention, sorted by name (what
        every kernel entry takes as int64 arguments, in this order); [] for a graph of static sizes."""
        from ..graph import flatten
        from ..graph.symbolic import SymInt
        found: set = set()
        for b in self.buffers.values():
            found |= size_symbols((b.layout.shape, b.layout.strides, b.layout.offset))
        for node in self.nodes:
            if isinstance(node, ExternNode):
                for v in flatten((node.args, node.kwargs)):
                    if isinstance(v, SymInt):
                        found |= size_symbols(v.expr)
                    elif isinstance(v, ViewRef):
                        found |= size_symbols((v.shape, v.strides, v.offset))
        for v in flatten(self.output):
            if isinstance(v, OutputView):
                found |= size_symbols((v.shape, v.strides, v.offset))
        return sorted(found, key=str)

    def storage_of(self, name: str) -> str:
        """The buffer whose memory `name` lives in (itself, unless it is a window of a ConcatBuffer)."""
        return getattr(self.buffers.get(name), "storage", None) or name

    def sources(self, name: str) -> list[str]:
        """The buffers whose writers a read of `name` waits for: a ConcatBuffer's parts, else `name`."""
        buf = self.buffers.get(name)
        return list(buf.parts) if isinstance(buf, ConcatBuffer) else [name]

    def kept_buffers(self) -> set[str]:
        """Buffers alive at the end: outputs, bases of output views, final values of mutated inputs."""
        from ..graph import flatten
        return {v.name for v in flatten((self.output, [m[1] for m in self.mutations]))
                if isinstance(v, (BufferRef, OutputView))}

    def describe(self, header: str = "") -> str:
        """The loop IR as Python: each computed buffer's body as the function `ComputedBuffer.describe`
        gives, inputs, externs and outputs as comments. `kiln.lower.printer.loop_python` prints the same
        functions inside a whole runnable module."""
        lines = [f"# {header}"] if header else []
        for b in self.inputs:
            lines.append(f"# input {b.name}: {dtype_abbrev(b.dtype)}{list(b.shape)} "
                         f"strides={b.layout.strides}")
        for b in self.constants:
            lines.append(f"# constant {b.name}: {dtype_abbrev(b.dtype)}{list(b.shape)} "
                         f"strides={b.layout.strides}")
        joined: dict[str, list[ConcatBuffer]] = {}  # last part -> the concatenations it completes
        for b in self.buffers.values():
            if isinstance(b, ConcatBuffer) and b.parts:
                joined.setdefault(b.parts[-1], []).append(b)
        for node in self.nodes:
            lines.append(node.describe() if isinstance(node, ComputedBuffer) else f"# {node.describe()}")
            for b in joined.get(node.name, ()):
                lines.append(f"# {b.describe()}")
        for position, value in self.mutations:
            lines.append(f"# input {self.inputs[position].name} receives {value}")
        lines.append(f"# returns {self.output}")
        return "\n".join(lines)
