"""The loop IR as a runnable Python module (the loop graph before fusion).

`loop_python(loop)` prints one function per computed buffer (`ComputedBuffer.describe`: the body over
`ops`), and `run(inputs..., *, constants=None)`, which binds the inputs, allocates each buffer with exactly
its IR layout, evaluates every node in order on the reference handler (`kiln.lower.reference`), calls the
extern and fallback targets on whole tensors, writes the final values of mutated inputs back, and returns
the output structure (output views made with `as_strided`, as the wrapper makes them). The module imports
only torch, functools and `kiln.lower.reference`; `exec` it, then call `run`:

    namespace = {}
    exec(loop_python(loop), namespace)
    outputs = namespace["run"](*inputs, constants=constants_of(loop))

`ModuleWriter` holds what the fused schedule's printer (`kiln.schedule.printer`) shares with this one.
"""
from __future__ import annotations

import copyreg
import functools
import importlib
import keyword
import re
import types
from typing import Any

import torch

from ..graph.meta import dtype_abbrev
from ..graph.node import torch_name
from .index import index_var, linear_index
from .ir import Buffer, BufferRef, ComputedBuffer, ExternNode, LoopGraph, OutputView, Reduction, Scan, ViewRef
from .ops import PrintHandler

_IMPORTS = ["import functools", "", "import torch", "",
            "from kiln.lower.reference import (Reference, floordiv, modular_indexing, rebuild,  # noqa: F401",
            "                                  resolve, unprintable)"]
# names the printed module defines or imports, and the loop variables and temporaries of its bodies
_TAKEN = {"ops", "constants", "torch", "functools", "Reference", "floordiv", "modular_indexing", "rebuild",
          "resolve", "unprintable", "run"}
_LOCAL = re.compile(r"^([irxt]\d+|masked\d+|other\d+|buf\d+|kernel\d+)$")


def constants_of(loop: LoopGraph) -> dict[str, torch.Tensor]:
    """The `constants` argument of a printed module's `run`: each constant buffer's tensor by name."""
    return {b.name: b.constant for b in loop.constants}


def layout_text(buf: Buffer) -> str:
    """`f32[4, 8] strides=(8, 1)` (and the offset when there is one)."""
    text = f"{dtype_abbrev(buf.dtype)}[{', '.join(map(str, buf.shape))}] strides={tuple(buf.layout.strides)}"
    return text + (f" offset={buf.layout.offset}" if buf.layout.offset else "")


def _resolves(path: str, obj: Any) -> bool:
    try:
        if ":" in path:
            module, qualname = path.split(":", 1)
            current: Any = importlib.import_module(module)
            parts = qualname.split(".")
        else:
            current, parts = torch, path.split(".")[1:]
        for part in parts:
            current = getattr(current, part)
    except (ImportError, AttributeError, ValueError):
        return False
    return current is obj


def spell(obj: Any, prim_name: str | None = None, depth: int = 0) -> str:
    """Python text naming a callable (or class) through what the printed module imports."""
    if prim_name is not None and prim_name.startswith("prims."):
        from ..prims.registry import PRIMS
        prim = PRIMS.get(prim_name[len("prims."):])
        if prim is not None and prim.ref is obj:
            return f"resolve({prim_name!r})"
    if isinstance(obj, functools.partial):
        args = [spell(obj.func, depth=depth + 1)] + [literal(a, depth=depth + 1) for a in obj.args]
        args += [f"{k}={literal(v, depth=depth + 1)}" for k, v in obj.keywords.items()]
        return f"functools.partial({', '.join(args)})"
    name = torch_name(obj)
    if name.startswith("torch.") and _resolves(name, obj):
        return name
    path = _path(obj)
    if path is not None:
        return f"resolve({path!r})"
    rebuilt = _rebuilt(obj, depth)
    return rebuilt if rebuilt is not None else f"unprintable({repr(obj)!r})"


def _path(obj: Any) -> str | None:
    """`module:qualname` naming `obj` itself, when importing it gives it back."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and "<" not in qualname:
        path = f"{module}:{qualname}"
        if _resolves(path, obj):
            return path
    return None


def _rebuilt(obj: Any, depth: int) -> str | None:
    """`rebuild(cls, state)` for an instance of an importable class whose attributes can be spelled (a
    callable object such as kiln.ops.targets.OnCopy), through the pickle protocol's plain-object form."""
    cls_path = _path(type(obj))
    if cls_path is None or depth > 4:
        return None
    try:
        reduced = obj.__reduce_ex__(4)
    except Exception:
        return None
    if not (isinstance(reduced, tuple) and len(reduced) >= 3 and reduced[0] is copyreg.__newobj__
            and reduced[1] == (type(obj),)) or any(item is not None for item in reduced[3:]):
        return None
    state, slots = reduced[2], None
    if isinstance(state, tuple) and len(state) == 2:  # (__dict__ or None, __slots__ values)
        state, slots = state
    if not isinstance(state, (dict, type(None))) or not isinstance(slots, (dict, type(None))):
        return None
    text = f"rebuild(resolve({cls_path!r}), {literal(state or {}, depth=depth + 1)}"
    text += f", {literal(slots, depth=depth + 1)})" if slots else ")"
    return None if "unprintable(" in text else text


def literal(value: Any, ref: Any = None, depth: int = 0) -> str:
    """Python text of an argument or output structure; `ref(v)` spells buffer references (else None)."""
    if ref is not None:
        text = ref(value)
        if text is not None:
            return text
    if value is None or type(value) in (bool, int, str, complex):
        return repr(value)
    if isinstance(value, float):
        return PrintHandler.value_text(float(value))
    if isinstance(value, (int, str)):  # an enum member or another subclass: its plain value
        return repr(int(value) if isinstance(value, int) else str(value))
    if isinstance(value, (torch.dtype, torch.memory_format, torch.layout)):
        return str(value)
    if isinstance(value, torch.device):
        return f"torch.device({str(value)!r})"
    if isinstance(value, torch.Size):
        return literal(tuple(value))
    if isinstance(value, slice):
        return f"slice({literal(value.start)}, {literal(value.stop)}, {literal(value.step)})"
    if value is Ellipsis:
        return "..."
    if depth > 8:
        return f"unprintable({repr(value)!r})"
    if isinstance(value, tuple):
        items = [literal(v, ref, depth + 1) for v in value]
        plain = f"({', '.join(items)},)" if len(items) == 1 else f"({', '.join(items)})"
        if type(value) is tuple:
            return plain
        cls = spell(type(value))
        if hasattr(value, "n_fields"):  # a structseq (torch.return_types.max) takes one sequence
            return f"{cls}({plain})"
        return f"{cls}(*{plain})"
    if isinstance(value, list):
        return f"[{', '.join(literal(v, ref, depth + 1) for v in value)}]"
    if isinstance(value, dict):
        items = [f"{literal(k)}: {literal(v, ref, depth + 1)}" for k, v in value.items()]
        return "{" + ", ".join(items) + "}"
    if callable(value) or isinstance(value, (type, types.ModuleType)):
        return spell(value, depth=depth)
    rebuilt = _rebuilt(value, depth)
    return rebuilt if rebuilt is not None else f"unprintable({repr(value)!r})"


def grid_line(variables: list, ranges: tuple, reduction_ranges: tuple | None = None) -> str:
    """`i0, r0 = ops.grid((4,), (8,))` (no assignment when the space has no dims)."""
    args = literal(tuple(ranges))
    if reduction_ranges is not None:
        args += f", {literal(tuple(reduction_ranges))}"
    names = ", ".join(str(v) for v in variables)
    if not variables:
        return f"ops.grid({args})"
    return f"{names}{',' if len(variables) == 1 else ''} = ops.grid({args})"


class ModuleWriter:
    """A printed module: header, imports, definitions, and `run` (inputs, node calls, mutations, outputs)."""

    def __init__(self, loop: LoopGraph, header: str, what: str):
        self.loop = loop
        self.definitions: list[str] = []
        self.body: list[str] = []  # statements of `run`, unindented
        self.head = [f"# {line}" if line else "#" for line in header.splitlines()] if header else []
        self.head.append(f"# {what} of graph {loop.name}: run() computes it with torch "
                         "(kiln.lower.reference)")
        for b in loop.inputs:
            self.head.append(f"# input {b.name}: {layout_text(b)}")
        for b in loop.constants:
            self.head.append(f"# constant {b.name}: {layout_text(b)}")
        self.params: dict[str, str] = {}  # input buffer -> parameter of run
        for b in loop.inputs:
            name = b.name
            while not name.isidentifier() or keyword.iskeyword(name) or name in _TAKEN or _LOCAL.match(name) \
                    or name in self.params.values():
                name = f"{name}_" if name.isidentifier() else f"input{b.position}"
            self.params[b.name] = name
        self.written_back: dict[str, str] = {}  # buffer -> the input it was copied into
        self.allocated: set[str] = set()  # concatenation memory allocated so far

    def define(self, text: str) -> None:
        self.definitions.append(text)

    def statement(self, text: str) -> None:
        self.body.append(text)

    def allocate(self, buf: Buffer) -> None:
        storage = self.loop.storage_of(buf.name)
        if storage != buf.name:  # a window of a concatenation's memory: that memory, and all its windows
            if storage not in self.allocated:
                self.allocated.add(storage)
                self.allocate(self.loop.buffers[storage])
                for b in self.loop.buffers.values():
                    if b.name != storage and self.loop.storage_of(b.name) == storage:
                        self.statement(f"ops.window({b.name!r}, {storage!r}, {literal(tuple(b.shape))}, "
                                       f"{literal(tuple(b.layout.strides))}, {b.layout.offset})  "
                                       f"# {layout_text(b)}")
            return
        layout = buf.layout
        offset = f", {layout.offset}" if layout.offset else ""
        self.statement(f"ops.allocate({buf.name!r}, {literal(tuple(buf.shape))}, "
                       f"{literal(tuple(layout.strides))}, {buf.dtype}{offset})  # {layout_text(buf)}")

    def _ref(self, value: Any) -> str | None:
        if isinstance(value, BufferRef):
            return f"ops.tensor({self.written_back.get(value.name, value.name)!r})"
        if isinstance(value, (ViewRef, OutputView)):
            base = self.written_back.get(value.name, value.name)
            return (f"ops.view({base!r}, {literal(tuple(value.shape))}, {literal(tuple(value.strides))}, "
                    f"{value.offset})")
        return None

    def extern(self, node: ExternNode) -> None:
        outputs = ", ".join(f"({o.name!r}, {literal(tuple(o.shape))}, {literal(tuple(o.layout.strides))}, "
                            f"{o.dtype})" for o in node.outputs)
        args = literal(tuple(node.args), self._ref)
        kwargs = literal(dict(node.kwargs), self._ref)
        multi = ", multi_output=True" if node.multi_output else ""
        shapes = ", ".join(layout_text(o) for o in node.outputs)
        self.statement(f"# {node.describe()}")
        target = spell(node.target, node.target_name)
        self.statement(f"ops.extern([{outputs}], {target}, {args}, {kwargs}{multi})  # {shapes}")

    def source(self) -> str:
        loop = self.loop
        params = [self.params[b.name] for b in loop.inputs]
        signature = ", ".join(params + ["*", "constants=None"])
        run = [f"def run({signature}):",
               f'    """Graph {loop.name}\'s outputs; constants: {{name: tensor}} '
               '(kiln.lower.printer.constants_of)."""',
               "    ops = Reference()"]
        for b in loop.inputs:
            run.append(f"    ops.input({b.name!r}, {self.params[b.name]}, {literal(tuple(b.shape))}, "
                       f"{literal(tuple(b.layout.strides))}, {b.dtype})")
        for b in loop.constants:
            run.append(f"    ops.input({b.name!r}, constants[{b.name!r}], {literal(tuple(b.shape))}, "
                       f"{literal(tuple(b.layout.strides))}, {b.dtype})")
        run += [f"    {line}" for line in self.body]
        self.written_back = {}
        for position, value in loop.mutations:
            name = loop.inputs[position].name
            run.append(f"    ops.write_back(ops.tensor({name!r}), {literal(value, self._ref)})")
            if isinstance(value, BufferRef) and value.name not in self.written_back:
                self.written_back[value.name] = name
        run.append(f"    return {literal(loop.output, self._ref)}")
        parts = ["\n".join(self.head + [""] + _IMPORTS)] + self.definitions + ["\n".join(run)]
        return "\n\n\n".join(parts) + "\n"


def compute_lines(buf: ComputedBuffer) -> list[str]:
    """The statements of `run` computing a buffer from its body function over its whole iteration space."""
    data = buf.data
    index = [f"i{d}" for d in range(len(data.ranges))]
    variables = [index_var("i", d) for d in range(len(index))]
    store = PrintHandler.index_text(linear_index(variables, buf.layout.strides, buf.layout.offset))
    if isinstance(data, Reduction):
        rindex = [f"r{d}" for d in range(len(data.reduction_ranges))]
        call = f"{buf.name}({', '.join(['ops'] + index + rindex)})"
        value = f"ops.reduce({data.reduction_type!r}, {call}, {buf.dtype})"
        return [grid_line(index + rindex, data.ranges, data.reduction_ranges),
                f"ops.store({buf.name!r}, {store}, {value})"]
    call = f"{buf.name}({', '.join(['ops'] + index)})"
    if isinstance(data, Scan):
        call = f"ops.scan({data.scan_type!r}, {call}, {data.dim}, {buf.dtype})"
    return [grid_line(index, data.ranges), f"ops.store({buf.name!r}, {store}, {call})"]


def loop_python(loop: LoopGraph, header: str = "") -> str:
    """The loop graph (before fusion) as a runnable Python module; see the module docstring."""
    writer = ModuleWriter(loop, header, "loop IR")
    for node in loop.nodes:
        if isinstance(node, ExternNode):
            writer.extern(node)
            continue
        writer.define(node.describe())
        writer.allocate(node)
        for line in compute_lines(node):
            writer.statement(line)
    return writer.source()


__all__ = ["ModuleWriter", "compute_lines", "constants_of", "grid_line", "layout_text", "literal",
           "loop_python", "spell"]
