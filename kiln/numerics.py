"""kiln.check(fn, *args): a numerics report — every compiled kernel against the float64 reference.

`fn` is captured as kiln.compile would capture it (a private cache: every frame afresh) and each graph is
compiled by the cpp backend; the call runs once, under torch.no_grad(). On that call each graph's schedule
is run a second time, kernel by kernel on the call's own inputs: each kernel built as an entry of its own
(the C++ the backend generates for it, without the in-place writes that would overwrite its inputs), each
extern by torch, every buffer kept. Then each kernel is judged on the inputs the compiled program gave it,
so an error upstream does not spread downstream: its outputs against the meaning of its loop IR
(`kiln.lower.reference`) run in float64 on float64 copies of those inputs, by the accuracy rule
(`kiln.testing.tolerance.accuracy_rule`, clause 1 against the same reference run in the kernel's own
dtypes, as eager would compute it). The report names the first kernel outside the rule, with the user
lines lowered into it (from the nodes' `origin`; approximate: a line is credited to the buffer whose
lowering it ran in). A wrong kernel is a codegen or fusion bug; a lowering bug agrees with its own loop IR
and shows only in the graph's outputs, which the report compares with eager too.

This module joins capture to the whole backend chain (as kiln.api does), so it sits at the top, beside api.
"""
from __future__ import annotations

import dataclasses
import linecache
import math
import re
from typing import Any

import torch

from .backends import compiler_for
from .backends.cpp import PASSES, compile_graph
from .capture.cache import CompiledFunction
from .codegen.cpp import CPP_TARGET, segment_source
from .codegen.header import header_for
from .codegen.wrapper import load_entry
from .graph import Graph, flatten, map_structure, run
from .graph.pipeline import CompileContext, Pass
from .lower.ir import BufferRef, ComputedBuffer, ExternNode, InputBuffer, LoopGraph, ViewRef
from .lower.origins import OriginLowering as _OriginLowering
from .lower.reference import Reference, storage_size
from .runtime import build
from .schedule.fusion import FusedGroup
from .testing.tolerance import MODEL_TOL, accuracy_rule

_PROMOTED = {torch.float16: torch.float64, torch.bfloat16: torch.float64, torch.float32: torch.float64,
             torch.complex32: torch.complex128, torch.complex64: torch.complex128}


def _wide(dtype: Any) -> Any:
    return _PROMOTED.get(dtype, dtype)


class Float64Reference(Reference):
    """The reference handler with every floating dtype computed in float64 (complex in complex128)."""

    def allocate(self, name: str, shape: tuple, strides: tuple, dtype: torch.dtype, offset: int = 0) -> None:
        super().allocate(name, shape, strides, _wide(dtype), offset)

    def constant(self, value: Any, dtype: torch.dtype) -> torch.Tensor:
        return super().constant(value, _wide(dtype))

    def index_expr(self, expr: Any, dtype: torch.dtype) -> torch.Tensor:
        return super().index_expr(expr, _wide(dtype))

    def to_dtype(self, x: Any, dtype: torch.dtype) -> torch.Tensor:
        return super().to_dtype(x, _wide(dtype))

    def masked(self, cond: Any, body: Any, other: Any, dtype: torch.dtype) -> Any:
        return super().masked(cond, body, other, _wide(dtype))

    def reduce(self, rtype: str, value: Any, dtype: torch.dtype) -> torch.Tensor:
        return super().reduce(rtype, value, _wide(dtype))

    def scan(self, scan_type: str, value: Any, dim: int, dtype: torch.dtype) -> torch.Tensor:
        return super().scan(scan_type, value, dim, _wide(dtype))


# ---- the report ------------------------------------------------------------------------------------------

@dataclasses.dataclass
class KernelCheck:
    """One kernel judged on its own inputs: its worst output by the accuracy rule."""

    graph: str
    kernel: str
    members: list[str]
    outputs: list[str]  # the members it writes to memory (the ones checked)
    passed: bool | None  # None: not checked (the reference could not run it)
    reason: str = ""
    max_error: float = 0.0  # max |kernel - fp64 reference| over its outputs
    rmse: float = 0.0  # RMSE(kernel, fp64), worst output
    rmse_reference: float = 0.0  # RMSE(reference in the kernel's dtypes, fp64), same output
    origins: list[str] = dataclasses.field(default_factory=list)  # "file:line: source"

    def line(self) -> str:
        verdict = "ok" if self.passed else "NOT CHECKED" if self.passed is None else "WRONG"
        figures = f"max |err| {self.max_error:.2e}, rmse {self.rmse:.2e} (reference in its dtypes " \
                  f"{self.rmse_reference:.2e})" if self.passed is not None else self.reason
        return f"{self.kernel} [{', '.join(self.members)}]: {verdict}: {figures}"


@dataclasses.dataclass
class GraphCheck:
    name: str
    kernels: list[KernelCheck] = dataclasses.field(default_factory=list)
    outputs_passed: bool | None = None  # the graph's outputs against eager (None: not compared)
    outputs_reason: str = ""
    note: str = ""  # why the graph's kernels were not checked


class NumericsReport:
    """What kiln.check found: per graph, each kernel against the fp64 reference; the first wrong one."""

    def __init__(self, graphs: list[GraphCheck], tol: float):
        self.graphs = graphs
        self.tol = tol

    @property
    def kernels(self) -> list[KernelCheck]:
        return [k for g in self.graphs for k in g.kernels]

    @property
    def first_bad(self) -> KernelCheck | None:
        """The first kernel (in run order) whose error exceeds the accuracy rule."""
        return next((k for k in self.kernels if k.passed is False), None)

    @property
    def passed(self) -> bool:
        return self.first_bad is None and all(g.outputs_passed is not False for g in self.graphs)

    def __str__(self) -> str:
        kernels = self.kernels
        lines = [f"kiln.check: {len(self.graphs)} graph(s), {len(kernels)} kernel(s), accuracy rule at tol "
                 f"{self.tol:g}"]
        bad = self.first_bad
        if bad is None:
            lines.append("every kernel is within the accuracy rule of the fp64 reference")
        else:
            lines.append(f"first kernel outside the accuracy rule: graph {bad.graph}, {bad.kernel}: "
                         f"{bad.reason}")
            lines.extend(f"    from {origin}" for origin in bad.origins)
        for g in self.graphs:
            outputs = "" if g.outputs_passed is None else \
                f"; outputs vs eager: {'ok' if g.outputs_passed else 'WRONG: ' + g.outputs_reason}"
            note = f"; {g.note}" if g.note else ""
            lines.append(f"  graph {g.name}: {len(g.kernels)} kernel(s){outputs}{note}")
            lines.extend(f"    {k.line()}" for k in g.kernels)
        return "\n".join(lines)

    __repr__ = __str__


# ---- origins: the user lines lowered into each buffer ----------------------------------------------------

_LOCATION = re.compile(r"^(.*):(\d+)$")


def _with_source(origin: str) -> str:
    match = _LOCATION.match(origin)
    if match is None:
        return origin
    text = linecache.getline(match.group(1), int(match.group(2))).strip()
    return f"{origin}: {text}" if text else origin


def _passes(origins: dict[int, dict[str, list[str]]]) -> list[Pass]:
    """The cpp backend's passes, lowering through `_OriginLowering` (its origins kept by loop graph)."""
    def lower(state: Any, context: CompileContext) -> None:
        lowering = _OriginLowering(state.prim_graph, state.target)
        state.loop = lowering.run()
        state.origins = origins[id(state.loop)] = lowering.origins
    return [dataclasses.replace(p, run=lower) if p.name == "lower" else p for p in PASSES]


# ---- running a graph kernel by kernel --------------------------------------------------------------------

def _group_args(group: FusedGroup) -> list[str]:
    """Pointer parameters of a kernel built alone: what it reads from memory, then what it writes."""
    names: dict[str, None] = {}
    for member in group.members:
        for name, _ in member.buffer.reads():
            names.setdefault(name, None)
    for member in group.members:
        names.setdefault(member.buffer.name, None)
    return [n for n in names if n not in group.local]


def _restrided(t: torch.Tensor, strides: tuple) -> torch.Tensor:
    if t.numel() <= 1 or tuple(t.stride()) == tuple(strides):
        return t
    out = torch.empty_strided(t.shape, strides, dtype=t.dtype)
    out.copy_(t)
    return out


def _run_extern(node: ExternNode, env: dict[str, torch.Tensor], loop: LoopGraph) -> None:
    def value(v: Any) -> Any:
        if isinstance(v, BufferRef) and loop.storage_of(v.name) == v.name:
            return env[v.name]
        if isinstance(v, (BufferRef, ViewRef)):  # (a window's offset counts from its storage's start)
            view = v if isinstance(v, ViewRef) else loop.buffers[v.name].layout
            base = env[loop.storage_of(v.name)]
            return base.as_strided(view.shape, view.strides, base.storage_offset() + view.offset)
        return v
    args, kwargs = map_structure(value, (node.args, node.kwargs))
    result = node.target(*args, **kwargs)
    for out, t in zip(node.outputs, list(result) if node.multi_output else [result]):
        env[out.name] = _restrided(t, tuple(out.layout.strides))


def run_kernels(loop: LoopGraph, schedule: list, inputs: list) -> dict[str, torch.Tensor]:
    """Every buffer of the schedule run on `inputs`, each kernel as its own C++ entry."""
    groups = [item for item in schedule if isinstance(item, FusedGroup)]
    storage = loop.storage_of  # a window of a concatenation's memory is reached through that memory
    names = {g.name: _group_args(g) for g in groups}
    args = {g: list(dict.fromkeys(storage(n) for n in ns)) for g, ns in names.items()}
    parts = [segment_source(f"kiln_check_{g.name}", [g], args[g.name], loop.buffers,
                            {n: storage(n) for n in names[g.name] if storage(n) != n}, CPP_TARGET)
             for g in groups]
    lib = build("\n".join([header_for("\n".join(parts))] + parts) + "\n") if parts else None
    env: dict[str, torch.Tensor] = {}
    for b in loop.inputs:
        env[b.name] = inputs[b.position]
    for b in loop.constants:
        env[b.name] = b.constant
    for item in schedule:
        if isinstance(item, ExternNode):
            _run_extern(item, env, loop)
            continue
        entry = load_entry(lib, f"kiln_check_{item.name}", len(args[item.name]))
        for member in item.members:
            buf = member.buffer
            root = storage(buf.name)
            if root != buf.name:
                if root not in env:
                    memory = loop.buffers[root]
                    env[root] = torch.empty_strided(memory.shape, memory.layout.strides, dtype=memory.dtype)
                env[buf.name] = env[root].as_strided(buf.shape, buf.layout.strides, buf.layout.offset)
            elif buf.name not in item.local:
                env[buf.name] = torch.empty_strided(buf.shape, buf.layout.strides, dtype=buf.dtype)
        entry(*[env[name].data_ptr() for name in args[item.name]])
    return env


def _bind(handler: Reference, name: str, t: torch.Tensor, dtype: Any) -> None:
    """Bind a buffer the kernel reads, converted to `dtype` (its layout and offset kept)."""
    size = storage_size(tuple(t.shape), tuple(t.stride()))
    flat = t.as_strided((size,), (1,), t.storage_offset()).to(dtype)
    handler.flat[name] = flat
    handler.tensors[name] = flat.as_strided(t.shape, t.stride(), 0)


def _judge(actual: torch.Tensor, same: torch.Tensor, wide: torch.Tensor,
           tol: float) -> tuple[bool, str, tuple[float, float, float]]:
    """(passed, why not, (max |error|, RMSE, the reference-in-its-dtypes' RMSE)) of one output."""
    if not (actual.is_floating_point() or actual.is_complex()):
        wrong = int((actual != same).sum())
        return wrong == 0, f"{wrong} of {actual.numel()} elements differ from the loop IR's meaning", \
            (0.0, 0.0, 0.0)
    result = accuracy_rule(actual, same, wide, tol=tol)
    a, w, s = actual.detach().double(), wide.double(), same.double()
    finite = torch.isfinite(a) & torch.isfinite(w)
    max_error = float((a - w)[finite].abs().max()) if finite.any() else 0.0
    rmse = math.sqrt(float(((a - w)[finite] ** 2).mean())) if finite.any() else 0.0
    rmse_same = math.sqrt(float(((s - w)[finite] ** 2).mean())) if finite.any() else 0.0
    return result.passed, result.reason, (max_error, rmse, rmse_same)


def check_kernel(graph: str, group: FusedGroup, env: dict[str, torch.Tensor], tol: float,
                 origins: dict[str, list[str]], storage: Any = None) -> KernelCheck:
    """One kernel's outputs in `env` against its loop IR run on the same inputs, in float64 and as is.
    `storage(name)`: the buffer whose memory a read indexes from (a window of a concatenation's: that
    memory's, `LoopGraph.storage_of`)."""
    storage = storage or (lambda name: name)
    members = [m.buffer for m in group.members]
    own = {b.name for b in members}
    outputs = [b.name for b in members if b.name not in group.local]
    lines = list(dict.fromkeys(o for b in members for o in origins.get(b.name, ())))
    check = KernelCheck(graph, group.name, [b.name for b in members], outputs, True,
                        origins=[_with_source(o) for o in lines])
    wide, same = Float64Reference(), Reference()
    try:
        for name in dict.fromkeys(n for b in members for n, _ in b.reads()):
            if name not in own:
                memory = env[storage(name)]
                _bind(wide, name, memory, _wide(memory.dtype))
                _bind(same, name, memory, memory.dtype)
        for b in members:
            wide.compute(b)
            same.compute(b)
    except Exception as e:  # an op the reference cannot run: the kernel is reported, not judged
        check.passed, check.reason = None, f"not checked: the reference failed: {type(e).__name__}: {e}"
        return check
    for name in outputs:
        passed, reason, figures = _judge(env[name], same.tensor(name), wide.tensor(name), tol)
        max_error, rmse, rmse_same = figures
        if rmse >= check.rmse:
            check.rmse, check.rmse_reference = rmse, rmse_same
        check.max_error = max(check.max_error, max_error)
        if not passed and check.passed:
            check.passed, check.reason = False, f"{name}: {reason}"
    return check


def _outputs_against_eager(actual: Any, eager: Any, tol: float) -> tuple[bool, str]:
    """The graph's outputs against eager's (clause 1 of the rule, or an RMSE within tol / 10)."""
    for i, (a, e) in enumerate(zip(flatten(actual), flatten(eager))):
        if not (isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor)):
            continue
        if a.is_floating_point() or a.is_complex():
            result = accuracy_rule(a, e, e.double() if a.is_floating_point() else e, tol=tol)
            if not result.passed:
                return False, f"output {i}: {result.reason}"
        elif not torch.equal(a, e):
            return False, f"output {i}: integer or boolean values differ from eager's"
    return True, ""


def check_graph(compiled: Any, inputs: list, origins: dict[str, list[str]], tol: float) -> GraphCheck:
    """Each kernel of a compiled graph (`kiln.backends.cpp.CompiledGraph`) on these inputs."""
    result = GraphCheck(compiled.graph.name)
    loop = compiled.loop
    moved = [b.name for b in loop.inputs if not isinstance(inputs[b.position], torch.Tensor) or
             tuple(inputs[b.position].stride()) != tuple(b.layout.strides) or
             tuple(inputs[b.position].shape) != tuple(b.shape)]
    if moved:
        result.note = f"inputs {', '.join(moved)} changed layout since the compile: the graph ran with torch"
        return result
    env = run_kernels(loop, compiled.schedule, list(inputs))
    for item in compiled.schedule:
        if isinstance(item, FusedGroup):
            result.kernels.append(check_kernel(result.name, item, env, tol, origins, loop.storage_of))
    return result


def check_function(fn: Any, bound_self: Any, args: tuple, kwargs: dict,
                   tol: float = MODEL_TOL) -> NumericsReport:
    """Capture `fn` afresh, compile its graphs with the cpp backend, call it once and check every kernel."""
    graphs: list[GraphCheck] = []
    origins: dict[int, dict[str, list[str]]] = {}
    passes = _passes(origins)

    def checking_backend(graph: Graph, example_inputs: list, context: CompileContext | None = None) -> Any:
        try:
            compiled = compile_graph(graph, example_inputs, context, passes=passes)
        except Exception as e:
            graphs.append(GraphCheck(graph.name, note=f"not compiled (runs with torch): "
                                                      f"{type(e).__name__}: {e}"))
            return lambda *inputs: run(graph, inputs, torch_level=True)

        def call(*inputs: Any) -> Any:
            checked = check_graph(compiled, list(inputs), origins.get(id(compiled.loop), {}), tol)
            copies = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]  # eager may mutate
            eager = run(graph, copies, torch_level=True)
            out = compiled(*inputs)
            if not checked.note:
                checked.outputs_passed, checked.outputs_reason = _outputs_against_eager(out, eager, tol)
            graphs.append(checked)
            return out
        return call

    compiled_fn = CompiledFunction(fn, compiler_for(checking_backend), bound_self=bound_self, family=object())
    with torch.no_grad():
        compiled_fn(*args, **kwargs)
    return NumericsReport(graphs, tol)
