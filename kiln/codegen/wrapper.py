"""The Python wrapper of a compiled graph: check inputs, allocate, call kernels and externs, return outputs.

It is generated as source (dumped to KILN_DEBUG_DIR) so a graph's per-call work is a straight line of
Python: one stride/shape check per input, one `torch.empty_strided` per fresh buffer (`_fresh` for large
ones: huge-page advice before the first touch), one ctypes call
per segment of kernels, one torch call per extern node.

Each wrapper keeps the fresh buffers of `pool_min_bytes` (128 KiB) or more it freed in a `BufferPool` and
reuses them on its next call (no page faults on fresh memory; what torch allocates, an extern's result, is
`kiln.runtime.malloc`'s concern); all pools together keep at most `pool_max_bytes`, and `release_pools()`
(called by `kiln.reset()`) empties them. Training's forward and backward graphs do not pool (flag `pool_buffers`):
a pool would keep the forward's freed buffers through the backward, which eager's allocator reuses.
"""
from __future__ import annotations

import ctypes
import dataclasses
import time
from typing import Any, Callable

import sympy
import torch

from .. import config
from ..graph import flatten, map_structure
from ..graph.layout import contiguous_strides
from ..graph.symbolic import SymInt, has_symbols, python_expr
from ..lower.ir import BufferRef, ExternNode, IndexCheck, InputBuffer, LoopGraph, OutputView, ViewRef
from ..lower.printer import layout_text
from ..lower.sizes import SizeDecision, hint, size_symbols
from ..schedule.memory import Plan, Segment
# the run-time half (kiln.codegen.wrapper_runtime), still importable from here
from .cpp_native import step_allocs
from .wrapper_runtime import (HELPER_NAMES, HUGE_BYTES, SLOT, ExternCall, StructureBuilder,  # noqa: F401
                              helper_globals, load_entry, pooled_bytes, release_pools)

class WrapperTimings:
    """What a profiling wrapper (kiln.profile) measured since the last `take()`, summed over its calls.

    Per plan step: nanoseconds of the step as the wrapper saw it (a segment's ctypes call, an extern's torch
    call with its restride); per kernel of a segment: the seconds its C++ measured around its loop nest
    (written into `arrays[step]` by the entry, one double per kernel); and the whole call's nanoseconds.
    """

    def __init__(self, plan: Plan, native: set[str] = frozenset()):
        self.arrays: dict[int, Any] = {}
        for i, step in enumerate(plan.steps):
            if isinstance(step.node, Segment):
                self.arrays[i] = (ctypes.c_double * max(1, len(step.node.groups)))()
            elif step.node.name in native:  # a product computed inside a run: its own seconds
                self.arrays[i] = (ctypes.c_double * 1)()
        self.n_steps = len(plan.steps)
        self._clear()

    def _clear(self) -> None:
        self.calls = 0
        self.total_ns = 0
        self.step_ns = [0] * self.n_steps
        self.kernel_s = {i: [0.0] * len(a) for i, a in self.arrays.items()}

    def address(self, step: int) -> int:
        return ctypes.addressof(self.arrays[step])

    def segment(self, step: int, ns: int) -> None:
        self.step_ns[step] += ns
        times, array = self.kernel_s[step], self.arrays[step]
        for k in range(len(times)):
            times[k] += array[k]

    def run(self, steps: list[int], ns: int) -> None:
        """A run's call (`ns`) over its steps: each step is the time its C++ measured; the rest of the call
        counts as the wrapper's own time."""
        for step in steps:
            self.step_ns[step] += int(sum(self.arrays[step]) * 1e9)
            times, array = self.kernel_s[step], self.arrays[step]
            for k in range(len(times)):
                times[k] += array[k]

    def step(self, step: int, ns: int) -> None:
        self.step_ns[step] += ns

    def finish(self, ns: int) -> None:
        self.total_ns += ns
        self.calls += 1

    def take(self) -> dict[str, Any]:
        """The sums since the last take (calls, total_ns, step_ns, kernel_s), and start again from zero."""
        sample = {"calls": self.calls, "total_ns": self.total_ns, "step_ns": list(self.step_ns),
                  "kernel_s": {i: list(t) for i, t in self.kernel_s.items()}}
        self._clear()
        return sample


class _Source:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.globals: dict[str, Any] = helper_globals()
        self.count = 0
        # buffer -> the input it was copied back into: outputs of that value are the input (or its views),
        # as in eager, where `x.add_(1); return x[1]` returns a view of x itself
        self.written_back: dict[str, str] = {}
        self.names: dict = {}  # symbolic size -> the wrapper's local holding its value in this call
        self.layouts: dict[str, tuple] = {}  # buffer -> (shape, strides, offset) it is declared with
        # buffers this wrapper allocated (or carved from one it allocated): their storage offset is 0, so a
        # view of one is a plain as_strided (no `_view` call reading the offset)
        self.zero_offset: set[str] = set()

    def size(self, value: Any) -> str:
        """Python text of a size: an int literal, or an expression of the call's symbolic sizes."""
        if isinstance(value, sympy.Basic) and not value.is_Integer:
            return python_expr(value, self.names)
        return str(int(value))

    def sizes(self, values: Any) -> str:
        items = [self.size(v) for v in values]
        return f"({', '.join(items)}{',' if len(items) == 1 else ''})"

    def const(self, value: Any, hint: str = "c") -> str:
        self.count += 1
        name = f"{hint}{self.count}"
        self.globals[name] = value
        return name


def _view_text(src: _Source, name: str, shape: tuple, strides: tuple, offset: Any, same: bool = True) -> str:
    """Python text of the strided view (shape, strides, offset) of buffer `name`. With `same`, a view that
    is the buffer as declared is the buffer itself (an extern's argument: same values, no view object;
    a size-1 dim's stride, which no address uses, may differ). A view of a buffer this wrapper allocated is
    one `as_strided` (its storage offset is 0); a row-major reshape of a row-major buffer is `.view`; any
    other view is `_view`, which counts the offset from the tensor's first element (an input may itself
    be a view). Each saves a Python call and a storage_offset() read per view per call."""
    layout = src.layouts.get(name)
    if same and layout is not None and layout == (tuple(shape), tuple(strides), 0) and offset == 0:
        return name
    if name in src.zero_offset:
        at = "" if offset == 0 else f", {src.size(offset)}"
        return f"{name}.as_strided({src.sizes(shape)}, {src.sizes(strides)}{at})"
    if layout is not None and offset == 0 and layout[2] == 0 and \
            layout[1] == tuple(contiguous_strides(layout[0])) and tuple(strides) == tuple(contiguous_strides(shape)) \
            and sympy.expand(sympy.Mul(*layout[0]) - sympy.Mul(*shape)) == 0:
        return f"{name}.view({src.sizes(shape)})"  # a row-major reshape of a row-major buffer
    return f"_view({name}, {src.sizes(shape)}, {src.sizes(strides)}, {src.size(offset)})"


def _render(src: _Source, value: Any) -> str:
    """Python text building the output structure."""
    if isinstance(value, BufferRef):
        return src.written_back.get(value.name, value.name)
    if isinstance(value, OutputView):  # always a new tensor object, as eager's view is
        base = src.written_back.get(value.name, value.name)
        return _view_text(src, base, value.shape, value.strides, value.offset, same=False)
    if isinstance(value, tuple) and type(value) is tuple:
        inner = ", ".join(_render(src, v) for v in value)
        return f"({inner},)" if value else "()"
    if isinstance(value, list):
        return "[" + ", ".join(_render(src, v) for v in value) + "]"
    if value is None or isinstance(value, (bool, int)):
        return repr(value)
    if isinstance(value, (tuple, dict)):
        refs = []
        map_structure(lambda v: refs.append(v) if isinstance(v, (BufferRef, OutputView)) else None, value)
        leaves = src.const(_slotted(value, (BufferRef, OutputView)), "out")
        fn = src.const(StructureBuilder(), "build")
        return f"{fn}({leaves}, [{', '.join(_render(src, r) for r in refs)}])"
    return src.const(value)


def _slotted(template: Any, kinds: tuple) -> Any:
    """The template with each buffer or view (of `kinds`) a SLOT the wrapper's call fills in order."""
    return map_structure(lambda v: SLOT if isinstance(v, kinds) else v, template)


def _stride_check(src: Any, b: Any) -> str:
    """The strides part of an input's layout check: only dims whose size is not 1 (with the shape checked too,
    a size-1 dim's stride moves no index, and eager gives such dims any stride: a gradient of a [2, 64, 1, 1]
    output came strided (64, 1, 1, 1) where the compile's was (64, 1, 0, 0), and the graph ran with torch)."""
    kept = [d for d, n in enumerate(b.shape) if not (isinstance(n, int) and n == 1)]
    strides = tuple(b.layout.strides)
    if len(kept) == len(strides):
        return f"{b.name}.stride() != {src.sizes(strides)} or "
    if not kept:
        return ""
    want = src.sizes(tuple(strides[d] for d in kept))
    if kept == list(range(len(kept))):  # (size-1 dims last: a pooled [N, C, 1, 1])
        return f"{b.name}.stride()[:{len(kept)}] != {want} or "
    return f"({''.join(f'{b.name}.stride({d}), ' for d in kept)}) != {want} or "


def _check_text(src: _Source, check: IndexCheck) -> str:
    index = _view_text(src, check.index, check.shape, check.strides, check.offset)
    return f"({check.kind!r}, {index}, {src.size(check.size)}, {check.dim}, {check.wrap})"


def wrapper_source(graph: LoopGraph, plan: Plan, entries: dict[str, Any], fallback: Callable[..., Any],
                   device: torch.device | None = None, tensor_args: bool = False,
                   timings: WrapperTimings | None = None, pool: bool = True, runs: list | None = None,
                   gemms: dict | None = None) -> tuple[str, dict[str, Any]]:
    """Source of `kiln_call(*inputs)` and its globals (`entries`: segment name → ctypes function, or with
    `tensor_args` a Python launcher taking the tensors themselves). Buffers are allocated on `device` (the
    CPU when None); an input on another device runs on the fallback. With `timings` (kiln.profile's
    compile: the entries take a times array last) every step and the whole call are timed into it;
    without it the wrapper has no timing code. With `pool`, buffers of `pool_min_bytes` or more are kept for
    the next call (see the module docstring). `runs` (kiln.codegen.cpp_native.Run) are consecutive steps
    called as one entry (`entries[run.name]`), and `gemms` the extern steps computed inside runs."""
    src = _Source()
    gemms = gemms or {}
    run_at = {run.steps[0]: run for run in runs or ()}
    # a product computed by a run writes into a buffer the wrapper allocates (torch allocated an extern's)
    native_allocs = {i: step_allocs(step, gemms)[len(step.allocs):] for i, step in enumerate(plan.steps)
                     if isinstance(step.node, ExternNode) and step.node.name in gemms}
    if timings is not None:
        # names no parameter takes (inputs are named after the user's arguments)
        src.globals["_kiln_now"] = time.perf_counter_ns
        src.globals["_kiln_timing"] = timings
    on_cpu = device is None or torch.device(device).type == "cpu"
    device_name = None if device is None else src.const(torch.device(device), "device")
    dev = "" if device_name is None else f", device={device_name}"
    src.globals["_fallback"] = fallback
    params = [b.name for b in graph.inputs]
    lines = src.lines
    lines.append(f"# wrapper of graph {graph.name}: check inputs, allocate, call kernels and externs, return")
    for b in graph.inputs:
        lines.append(f"# input {b.name}: {layout_text(b)}")
    for b in graph.constants:
        lines.append(f"# constant {b.name}: {layout_text(b)}")
    lines.append(f"def kiln_call({', '.join(params)}):")
    if timings is not None:
        lines.append("    _kiln_t0 = _kiln_now()")
    symbols = graph.size_symbols()
    if symbols:
        _bind_sizes(src, graph, symbols, params)
    checks = []
    for b in graph.inputs:
        dt = src.const(b.dtype, "dtype")
        checks.append(f"{_stride_check(src, b)}{b.name}.shape != "
                      f"{src.sizes(b.shape)} or {b.name}.dtype != {dt}" +
                      (f" or {b.name}.device != {device_name}" if device_name else ""))
    if checks:
        lines.append(f"    if {' or '.join(f'({c})' for c in checks)}:")
        lines.append(f"        return _fallback({', '.join(params)})")
    for b in graph.constants:
        src.globals[b.name] = b.constant
    for name, buf in graph.buffers.items():
        src.layouts[name] = (tuple(buf.layout.shape), tuple(buf.layout.strides), buf.layout.offset)
    # buffers allocated fresh (not carved from another freed one, none carved from them) recycle across calls
    pooled = {r for s in plan.steps for _, r in s.allocs if r is not None}
    recyclable = {name for i, s in enumerate(plan.steps) for name, r in s.allocs + native_allocs.get(i, [])
                  if pool and r is None and name not in pooled
                  and not size_symbols(graph.buffers[name].layout.shape)  # a symbolic size varies by call
                  and graph.buffers[name].nbytes() >= config.get("pool_min_bytes")}
    # windows of a concatenation's memory that a torch call or the outputs see: views of it, made once it
    # is allocated (kernels reach them through its pointer)
    windows: dict[str, list[str]] = {}
    seen = [node.reads() for node in graph.nodes if isinstance(node, ExternNode)]
    seen.append([v.name for v in flatten((graph.output, [m[1] for m in graph.mutations]))
                 if isinstance(v, (BufferRef, OutputView))])
    for name in dict.fromkeys(n for names in seen for n in names):
        if graph.storage_of(name) != name:
            windows.setdefault(graph.storage_of(name), []).append(name)
    emit = _Emit(src, graph, plan, entries, windows, recyclable, pooled, native_allocs, tensor_args, timings,
                 symbols, dev, on_cpu)
    steps = plan.steps
    index = 0
    while index < len(steps):
        run = run_at.get(index)
        indices = run.steps if run is not None else [index]
        parts = [_StepLines() for _ in indices]
        arena = run.arena if run is not None else {}
        for i, part in zip(indices, parts):
            _step_lines(emit, i, part, arena)
        if run is None:
            lines.extend(parts[0].allocs + parts[0].dels + parts[0].pre + parts[0].call + parts[0].frees)
        else:  # every buffer of the run's steps allocated before its one call, freed after it
            for part in parts:
                lines.extend(part.allocs)
            for part in parts:
                lines.extend(part.pre)
            arena_name = f"kiln_arena_{run.name}"
            if run.arena:  # (one block of bytes for the buffers born and dead inside the run)
                size = src.size(run.arena_bytes)
                lines.append(f"    {arena_name} = _arena(_pool, {run.name!r}, {size})" if pool else
                             f"    {arena_name} = torch.empty(({size},), dtype=torch.uint8)")
            lines.extend(_run_call(emit, run, arena_name))
            if run.arena and pool:
                lines.append(f"    _keep_arena(_pool, {run.name!r}, {arena_name})")
            for part in parts:
                lines.extend(part.dels + part.frees)
        index = indices[-1] + 1
    for position, value in graph.mutations:
        lines.append(f"    _write_back({params[position]}, {_render(src, value)})")
        if isinstance(value, BufferRef) and value.name not in src.written_back:
            src.written_back[value.name] = params[position]
    for name in sorted(recyclable & plan.kept):
        lines.append(f"    _keep(_pool, {name!r}, {name}, {graph.buffers[name].nbytes()})")
    if timings is not None:
        lines.append(f"    _kiln_out = {_render(src, graph.output)}")
        lines.append("    _kiln_timing.finish(_kiln_now() - _kiln_t0)")
        lines.append("    return _kiln_out")
    else:
        lines.append(f"    return {_render(src, graph.output)}")
    return "\n".join(lines) + "\n", src.globals


@dataclasses.dataclass
class _StepLines:
    """One plan step's wrapper lines: its allocations, the `del`s of the freed buffers they took (after a
    run's call: an earlier step of the run still reads them), what precedes its call, the call, its frees."""

    allocs: list[str] = dataclasses.field(default_factory=list)
    dels: list[str] = dataclasses.field(default_factory=list)
    pre: list[str] = dataclasses.field(default_factory=list)
    call: list[str] = dataclasses.field(default_factory=list)
    frees: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Emit:
    """What writing one wrapper's steps reads (wrapper_source sets it up)."""

    src: _Source
    graph: LoopGraph
    plan: Plan
    entries: dict[str, Any]
    windows: dict[str, list[str]]  # a concatenation's memory -> the windows of it made as views
    recyclable: set[str]  # buffers kept in the pool across calls
    pooled: set[str]  # freed buffers whose memory a later buffer takes over
    native_allocs: dict[int, list]  # step -> the results of a product computed by a run, allocated here
    tensor_args: bool
    timings: WrapperTimings | None
    symbols: list
    dev: str  # `, device=...` of an allocation ("" on the CPU by default)
    on_cpu: bool


def _step_lines(emit: _Emit, step_index: int, out: _StepLines, arena: dict) -> None:
    src, graph, plan, windows = emit.src, emit.graph, emit.plan, emit.windows
    recyclable, pooled, native_allocs, timings = emit.recyclable, emit.pooled, emit.native_allocs, emit.timings
    symbols, dev, on_cpu = emit.symbols, emit.dev, emit.on_cpu
    step = plan.steps[step_index]
    node = step.node
    for name, reuse in step.allocs + native_allocs.get(step_index, []):
        if name in arena:  # (its memory is the run's arena: no tensor)
            continue
        buf = graph.buffers[name]
        meta = f"  # {layout_text(buf)}"
        if reuse is None or reuse in src.zero_offset:  # (as_strided keeps its base's storage offset)
            src.zero_offset.add(name)
        if reuse is not None and graph.buffers[reuse].dtype == buf.dtype and \
                src.layouts.get(reuse) == src.layouts[name]:
            # the freed buffer as it is: the same tensor object, no view (an as_strided call per call)
            out.allocs.append(f"    {name} = {reuse}{meta}")
            if name not in step.inplace:
                out.dels.append(f"    del {reuse}")
        elif reuse is not None:
            out.allocs.append(f"    {name} = {reuse}.as_strided({src.sizes(buf.shape)}, "
                              f"{src.sizes(buf.layout.strides)}){meta}")
            if name not in step.inplace:  # (written in place: `reuse` is still passed, freed after)
                out.dels.append(f"    del {reuse}")
        else:
            dt = src.const(buf.dtype, "dtype")
            shape, strides = src.sizes(buf.shape), src.sizes(buf.layout.strides)
            alloc = f"torch.empty_strided({shape}, {strides}, dtype={dt}{dev})"
            if on_cpu and hint(buf.layout.storage_size()) * buf.dtype.itemsize >= HUGE_BYTES:
                alloc = f"_fresh({shape}, {strides}, {dt})"
            if name in recyclable:
                out.allocs.append(f"    {name} = _recycle(_pool, {name!r}, {buf.nbytes()}){meta}")
                out.allocs.append(f"    if {name} is None:")
                out.allocs.append(f"        {name} = {alloc}{meta}")
            else:
                out.allocs.append(f"    {name} = {alloc}{meta}")
        if windows.get(name) and name not in src.zero_offset:  # (never: the pool holds kiln's own buffers)
            raise NotImplementedError(f"wrapper: the memory of concatenation {name} has a storage offset")
        for window in windows.get(name, ()):
            w = graph.buffers[window]
            view = f"{src.sizes(w.shape)}, {src.sizes(w.layout.strides)}, {src.size(w.layout.offset)}"
            out.allocs.append(f"    {window} = {name}.as_strided({view})  # {layout_text(w)}")
            src.zero_offset.add(window)  # (its offset counts from its storage's first element)
    # (a fallback run in place moves the version itself: its torch op is in place)
    for source in step.inplace.values() if isinstance(node, Segment) else ():
        if isinstance(graph.buffers[source], InputBuffer):
            # the kernel writes into an input's memory: its version moves as eager's in-place op moves
            # it (and a graph that raises after this is never re-run on the half-updated input)
            out.pre.append(f"    _bump_version({source})")
    lines = out.call
    if timings is not None:
        lines.append("    _kiln_t = _kiln_now()")
    if isinstance(node, Segment):
        fn = src.const(emit.entries[node.name], node.name + "_")
        ptrs = [a if emit.tensor_args else f"{a}.data_ptr()" for a in node.args]
        if timings is not None:
            ptrs.append(src.const(timings.address(step_index), "times"))
        ptrs += [src.names[s] for s in symbols]
        kernels = ", ".join(g.name for g in node.groups)
        writes = ", ".join(f"{w} {layout_text(graph.buffers[w])}" for w in node.writes)
        call, comment = f"{fn}({', '.join(ptrs)})", f"  # {kernels} -> {writes or 'nothing'}"
        lines += _checked_call(src, call, comment, _segment_checks(graph, node))
        if timings is not None:
            lines.append(f"    _kiln_timing.segment({step_index}, _kiln_now() - _kiln_t)")
    elif step_index not in native_allocs:
        if step.inplace:  # the fallback's in-place reference writes the input (kiln.schedule.memory)
            lines.append(f"    # in place of {', '.join(step.inplace.values())}")
            node = dataclasses.replace(node, target=node.inplace_target)
        lines.extend(_extern_lines(src, node))
        if timings is not None:
            lines.append(f"    _kiln_timing.step({step_index}, _kiln_now() - _kiln_t)")
    for name in step.frees:
        if name in arena:
            continue
        if name in recyclable:
            nbytes = graph.buffers[name].nbytes()
            out.frees.append(f"    _keep(_pool, {name!r}, {name}, {nbytes}); del {name}")
        elif name not in pooled or name in step.inplace.values():
            out.frees.append(f"    del {name}")


def _segment_checks(graph: LoopGraph, node: Segment) -> list | None:
    """The index checks of a segment whose kernels load through an index (None where none does)."""
    if not node.loads_through_index():
        return None
    return [c for g in node.groups for m in g.members for c in graph.index_checks.get(m.buffer.name, ())]


def _checked_call(src: _Source, call: str, comment: str, checks: list | None) -> list[str]:
    """The line calling an entry; with `checks` (its kernels load through an index), a nonzero result raises
    eager's error, found in the index values (the index buffers are alive: the entry reads them)."""
    if checks is None:
        return [f"    {call}{comment}"]
    return [f"    if {call}:{comment}",
            f"        _index_error(({''.join(_check_text(src, c) + ', ' for c in checks)}))"]


def _run_call(emit: _Emit, run: Any, arena_name: str) -> list[str]:
    """The one call of a run's entry (kiln.codegen.cpp_native): its pointers, its arena's, then each step's
    times array when profiling, then the sizes; a bad loaded index raises eager's error from the run's
    checks."""
    src, graph, plan, timings = emit.src, emit.graph, emit.plan, emit.timings
    fn = src.const(emit.entries[run.name], run.name + "_")
    ptrs = (["_sgemm"] if run.gemm else []) + [f"{a}.data_ptr()" for a in run.args]
    if run.arena:
        ptrs.append(f"{arena_name}.data_ptr()")
    if timings is not None:
        ptrs += [src.const(timings.address(i), "times") for i in run.steps]
    ptrs += [src.names[s] for s in emit.symbols]
    what = ", ".join(plan.steps[i].node.name for i in run.steps)
    call, comment = f"{fn}({', '.join(ptrs)})", f"  # {what}"
    lines = ["    _kiln_t = _kiln_now()"] if timings is not None else []
    flagged = [_segment_checks(graph, plan.steps[i].node) for i in run.steps
               if isinstance(plan.steps[i].node, Segment)]
    checks = [c for found in flagged if found is not None for c in found]
    lines += _checked_call(src, call, comment, checks if any(f is not None for f in flagged) else None)
    if timings is not None:
        lines.append(f"    _kiln_timing.run({run.steps}, _kiln_now() - _kiln_t)")
    return lines


def _bind_sizes(src: _Source, graph: LoopGraph, symbols: list, params: list[str]) -> None:
    """Read each symbolic size from the first input dim that is exactly it (`kiln_s0 = x.shape[1]`)."""
    where: dict = {}
    for b in graph.inputs:
        for d, size in enumerate(b.shape):
            if isinstance(size, sympy.Symbol) and size not in where:
                where[size] = (b.name, d)
    missing = [s for s in symbols if s not in where]
    if missing:
        raise SizeDecision(f"symbolic sizes {missing} are no input's dim: the wrapper cannot read them")
    src.names = {s: f"kiln_{s.name}" for s in symbols}
    src.lines.append("    try:")
    for s in symbols:
        name, d = where[s]
        src.lines.append(f"        {src.names[s]} = {name}.shape[{d}]")
    src.lines.append("    except IndexError:")
    src.lines.append(f"        return _fallback({', '.join(params)})")


def _inline_text(src: _Source, v: Any, top: bool = True) -> str | None:
    """Python text of one extern argument for a straight call, or None where the closure must rebuild it:
    a buffer or view, a size (symbolic ones as expressions of the call's sizes), a list or tuple of sizes,
    buffers, views and Nones (an index's tensors), or any other constant (held as a global, so it is passed
    as the very object)."""
    if isinstance(v, BufferRef):
        return v.name
    if isinstance(v, ViewRef):
        return _view_text(src, v.name, v.shape, v.strides, v.offset)
    if isinstance(v, SymInt):
        return src.size(v.expr)
    if isinstance(v, sympy.Basic):
        return src.size(v) if v.is_Integer or size_symbols(v) else None
    if type(v) in (int, bool) or v is None:
        return repr(v)
    if type(v) in (list, tuple) and top:
        items = [_inline_text(src, e, False) for e in v]
        if any(t is None for t in items) or not all(
                type(e) in (int, bool) or e is None or isinstance(e, (SymInt, sympy.Basic, BufferRef, ViewRef))
                for e in v):
            return None
        return "[" + ", ".join(items) + "]" if type(v) is list else f"({''.join(t + ', ' for t in items)})"
    if isinstance(v, (list, tuple, dict)):
        return None
    return src.const(v, "arg")


def _transposed(src: _Source, ref: Any) -> str | None:
    """The buffer `ref` is the transpose of (a [k, n] view of a row-major [n, k] buffer), or None."""
    if not isinstance(ref, ViewRef) or len(ref.shape) != 2 or ref.offset != 0:
        return None
    k, n = ref.shape
    if src.layouts.get(ref.name) == ((n, k), (k, 1), 0) and tuple(ref.strides) == (1, k):
        return ref.name
    return None


def _flattened(src: _Source, ref: Any) -> tuple[str, tuple] | None:
    """(name, shape) of the row-major 3-d buffer `ref` flattens to [m, k], or None."""
    if not isinstance(ref, ViewRef) or len(ref.shape) != 2 or ref.offset != 0:
        return None
    layout = src.layouts.get(ref.name)
    if layout is None or len(layout[0]) != 3 or layout[2] != 0 or \
            layout[1] != tuple(contiguous_strides(layout[0])):
        return None
    shape = layout[0]
    if tuple(ref.strides) == (ref.shape[1], 1) and ref.shape[1] == shape[2] and \
            sympy.expand(ref.shape[0] - shape[0] * shape[1]) == 0:
        return ref.name, shape
    return None


def _product_call(src: _Source, node: ExternNode) -> str | None:
    """A matrix product as the torch call eager's `F.linear` makes, without the wrapper building views.

    mm(a, w.t()) is `F.linear(a, w)` (which runs that very mm); addmm(bias, a, w.t()) (the prim, or
    lower.patterns' torch.addmm) is `F.linear(a, w, bias)` (that very addmm), and where `a` flattens a
    row-major 3-d buffer, `F.linear` of the buffer itself (torch flattens it into the same addmm and returns
    the 3-d result the graph reshapes to). Any other product is a direct torch.mm / torch.addmm call."""
    if node.multi_output:
        return None
    if node.target_name == "prims.mm" and len(node.args) == 2 and not node.kwargs:
        a, b = node.args
        bias = None
    elif node.target_name == "torch.addmm" and len(node.args) == 3 and set(node.kwargs) == {"shape"}:
        bias, a, b = node.args
    elif node.target_name == "prims.addmm" and len(node.args) == 3 and not node.kwargs:
        bias, a, b = node.args  # (its result is the 2-d product itself)
    else:
        return None
    a_text, b_text = _inline_text(src, a), _inline_text(src, b)
    bias_text = None if bias is None else _inline_text(src, bias)
    shape = node.kwargs.get("shape", node.outputs[0].shape)
    shape_text = _inline_text(src, tuple(shape)) if bias is not None else None
    if a_text is None or b_text is None or (bias is not None and (bias_text is None or shape_text is None)):
        return None
    weight = _transposed(src, b)
    if weight is None:
        if bias is None:
            return f"{src.const(torch.mm, 'mm')}({a_text}, {b_text})"
        return f"{src.const(torch.addmm, 'addmm')}({bias_text}, {a_text}, {b_text}).view({shape_text})"
    if bias is None:
        return f"_linear({a_text}, {weight})"
    if "shape" not in node.kwargs:  # prims.addmm: F.linear of the 2-d rows gives the 2-d result
        return f"_linear({a_text}, {weight}, {bias_text})"
    flat = _flattened(src, a)
    out_shape = tuple(shape)
    if flat is not None and len(out_shape) == 3 and \
            all(sympy.expand(x - y) == 0 for x, y in zip(flat[1][:2], out_shape[:2])):
        return f"_linear({flat[0]}, {weight}, {bias_text})"
    return f"_linear({a_text}, {weight}, {bias_text}).view({shape_text})"


def _inline_call(src: _Source, node: ExternNode) -> str | None:
    """`target(a, b, key=c)` as text, when every argument has an inline text."""
    product = _product_call(src, node)
    if product is not None:  # its result is a fresh tensor (a view of none): its storage offset is 0
        src.zero_offset.update(o.name for o in node.outputs)
        return product
    args = [_inline_text(src, a) for a in node.args]
    kwargs = {k: _inline_text(src, v) for k, v in node.kwargs.items()}
    if any(t is None for t in args) or any(t is None for t in kwargs.values()) or \
            not all(isinstance(k, str) and k.isidentifier() for k in kwargs):
        return None
    fn = src.const(node.target, f"{node.kind}_")
    return f"{fn}({', '.join(args + [f'{k}={t}' for k, t in kwargs.items()])})"


def _extern_lines(src: _Source, node: ExternNode) -> list[str]:
    refs: list[str] = []

    def ref(v: Any) -> None:
        if isinstance(v, BufferRef):
            refs.append(v.name)
        elif isinstance(v, ViewRef):
            refs.append(_view_text(src, v.name, v.shape, v.strides, v.offset))
    map_structure(ref, (node.args, node.kwargs))
    template = (node.args, node.kwargs)
    target = node.target
    inline = _inline_call(src, node)
    if inline is not None:  # a straight call in the wrapper: no per-call rebuilding of the arguments
        refs, call_text = [], inline
    symbolic = has_symbols(template) or bool(size_symbols(
        [v for v in flatten(template) if isinstance(v, sympy.Basic)]))
    if inline is None:
        symbols = list(src.names)
        if symbolic:
            refs.insert(0, "(" + "".join(f"{src.names[s]}, " for s in symbols) + ")")
        call = ExternCall(target, _slotted(template, (BufferRef, ViewRef)), symbolic, symbols)
        call_text = f"{src.const(call, f'{node.kind}_')}({', '.join(refs)})"
    lines = [f"    # {node.describe()}"]
    outs = [o.name for o in node.outputs]
    meta = f"  # {', '.join(layout_text(o) for o in node.outputs)}"
    if node.multi_output:
        lines.append(f"    {', '.join(outs)}, = {call_text}{meta}")
    else:
        lines.append(f"    {outs[0]} = {call_text}{meta}")
    for o in node.outputs:
        strides = src.sizes(o.layout.strides)
        lines.append(f"    if {o.name}.stride() != {strides}: {o.name} = _restride({o.name}, {strides})")
    return lines
