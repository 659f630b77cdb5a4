"""kiln.profile(fn, *args, **kwargs): where a compiled call's time goes, kernel by kernel, against the roofs.

`fn` is captured as kiln.compile would capture it (a private cache: every frame afresh, graph breaks
allowed) and every graph is compiled by the cpp backend in its profiling mode (the compile-context option
`profile`, `kiln.backends.cpp.profiling`): each C++ kernel stores its own wall time around its loop nest,
and the generated wrapper times each extern and fallback call and the whole call with perf_counter_ns.
Those compiles are separate cache entries (their source differs); the normal compile has no timing code.
A graph the backend hands to torch is timed as one row of its own.

The call runs for real: once to compile (its result is `report.result`), `warmup` more times, then `repeat`
timed times; every figure is the median over the timed calls of the function (a graph called twice per
call counts twice). Per row:

- time; bytes moved: the distinct buffers a kernel reads (not written by the kernel itself, not kept in
  registers) and writes, each at its size (numel x itemsize over its storage span), the same for an extern;
- FLOPs: matmul 2·n·k·m (bmm per batch, addmm + n·m), convolution 2 x output elements x the kernel's
  input-channel window (+ bias), sdpa its two products (their backwards likewise, run as extern or
  fallback); a fused kernel counts one FLOP per scalar arithmetic or math op (exp and erf count 1 like an
  add; loads, stores, casts, constants, index arithmetic and `where` count 0) times the sizes of the loop
  variables the op's value depends on (an op on per-channel values counts once per channel, as the
  compiler hoists it), a reduction one more per reduced element; other fallbacks and graphs run with
  torch: unknown (None);
- GB/s and GFLOP/s, and their share of this machine's copy bandwidth and matmul peak (measured once — a
  128 MB copy, a 1024² torch.mm, at the current thread count — and cached in `cache_dir`);
- a label: overhead-bound when it takes under OVERHEAD_US, or when the roofline time (bytes ÷ bandwidth,
  FLOPs ÷ peak, the larger) is under a tenth of its time and it takes under a millisecond (small work far
  below both roofs); else memory-bound or compute-bound by which roof is the higher cost;
- the user source lines whose ops it computes (the nodes' origins, credited to the buffers they were
  lowered into).

Also per graph the generated wrapper's own time (input checks, allocation, the ctypes calls around the
kernels) and for the whole call the time outside every row: wrapper, guards, Python between graphs.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import time
from typing import Any

import sympy
import torch

from . import config, tracing
from .counters import counters
from .api import _python_code
from .backends import GraphCompiler
from .backends.aot import compile_or_run_with_torch
from .bench import machine
from .backends.cpp import PASSES, CompiledGraph, compile_graph
from .capture.cache import CompiledFunction
from .graph import Graph, flatten
from .graph.pipeline import CompileContext, Pass
from .lower.ir import BufferRef, ComputedBuffer, ExternNode, LoopGraph, Reduction, Scan, ViewRef
from .lower.index import index_var
from .lower.ops import Handler
from .numerics import _OriginLowering, _with_source
from . import prims
from .schedule.fusion import FusedGroup
from .schedule.memory import Segment

log = config.channel("kernels")

LABELS = ("memory-bound", "compute-bound", "overhead-bound")
OVERHEAD_US = 5.0  # below this a kernel's time is launch and loop overhead, whatever it computes

# ---- the machine's roofs: measured and cached by kiln.bench.machine (with the load they were measured
# under and their spread; a set measured on a busy machine is measured again)
machine_peaks = machine.machine_peaks
measure_peaks = machine.measure_peaks
PEAKS_FILE = machine.PEAKS_FILE


# ---- bytes and FLOPs ------------------------------------------------------------------------------------

class _FlopCounter(Handler):
    """Counts a body's scalar arithmetic (the FLOP rule of the module docstring) where each op runs once per
    distinct value of the loop variables it depends on: a value computed from per-channel loads only
    (batch norm's rsqrt(var + eps)) counts once per channel, as the compiler hoists it out of the loops.
    Each value is the set of loop variables it depends on."""

    FREE = frozenset({"where"})

    def __init__(self, sizes: dict[sympy.Symbol, int]):
        self.sizes = sizes
        self.flops = 0

    def _vars(self, expr: Any) -> frozenset:
        return frozenset(v for v in sympy.sympify(expr).free_symbols if v in self.sizes)

    def op(self, name: str, *args: Any) -> frozenset:
        deps = frozenset().union(*(a for a in args if isinstance(a, frozenset)))
        if name not in self.FREE:
            self.flops += math.prod(self.sizes[v] for v in deps)
        return deps

    def load(self, name: str, index: sympy.Expr) -> frozenset:
        return self._vars(index)

    def constant(self, value: Any, dtype: Any) -> frozenset:
        return frozenset()

    def index_expr(self, expr: sympy.Expr, dtype: Any) -> frozenset:
        return self._vars(expr)

    def to_dtype(self, x: Any, dtype: Any) -> Any:
        return x

    def masked(self, cond: Any, body: Any, other: Any, dtype: Any) -> frozenset:
        parts = [cond, body(), other() if callable(other) else other]
        return frozenset().union(*(p for p in parts if isinstance(p, frozenset)))


def buffer_flops(buf: ComputedBuffer) -> int:
    """FLOPs to compute one computed buffer: its ops, each over the loop variables it depends on, and a
    reduction's or scan's combine once per element."""
    data = buf.data
    sizes = {index_var("i", d): n for d, n in enumerate(data.ranges)}
    elements = math.prod(data.ranges)
    if isinstance(data, Reduction):
        sizes.update({index_var("r", d): n for d, n in enumerate(data.reduction_ranges)})
        elements *= math.prod(data.reduction_ranges)
    counter = _FlopCounter(sizes)
    data.body(counter)
    return counter.flops + (elements if isinstance(data, (Reduction, Scan)) else 0)


def kernel_bytes(group: FusedGroup, loop: LoopGraph) -> int:
    """Bytes a kernel moves: each distinct buffer it reads from memory and each it writes, at its size."""
    own = {m.buffer.name for m in group.members}
    reads = {name for m in group.members for name, _ in m.buffer.reads()
             if name not in own and name not in group.local}
    writes = {name for name in own if name not in group.local}
    return sum(loop.buffers[name].nbytes() for name in reads | writes)


def _operand_shape(v: Any, loop: LoopGraph) -> tuple | None:
    if isinstance(v, ViewRef):
        return tuple(v.shape)
    if isinstance(v, BufferRef):
        return tuple(loop.buffers[v.name].shape)
    return None


def extern_bytes(node: ExternNode, loop: LoopGraph) -> int:
    total, seen = 0, set()
    for v in flatten((node.args, node.kwargs)):
        if isinstance(v, BufferRef) and v.name not in seen:
            seen.add(v.name)
            total += loop.buffers[v.name].nbytes()
        elif isinstance(v, ViewRef):
            dtype = loop.buffers[v.name].dtype
            span = 1 + sum((s - 1) * abs(st) for s, st in zip(v.shape, v.strides)) if all(v.shape) else 0
            total += span * dtype.itemsize
    return total + sum(o.nbytes() for o in node.outputs)


def extern_flops(node: ExternNode, loop: LoopGraph) -> int | None:
    """FLOPs of a library call from its operand shapes (None: an op this rule does not know)."""
    shapes = [_operand_shape(a, loop) for a in node.args]
    name = node.target_name.rsplit(".", 1)[-1]
    out = node.outputs[0].shape if node.outputs else ()
    try:
        if name in ("mm", "bmm"):
            a, b = shapes[0], shapes[1]
            return 2 * math.prod(a) * b[-1]
        if name == "addmm":
            a, b = shapes[1], shapes[2]
            return 2 * math.prod(a) * b[-1] + math.prod(out)
        if name == "convolution":
            w = shapes[1]
            params = prims.convolution.params(node)
            transposed = bool(params["transposed"])
            window = w[1] * math.prod(w[2:])
            elements = math.prod(shapes[0]) if transposed else math.prod(out)
            bias = math.prod(out) if params["bias"] is not None else 0
            return 2 * elements * window + bias
        if name in ("sdpa", "sdpa_flash"):
            q, k, v = shapes[0], shapes[1], shapes[2]
            batch = math.prod(q[:-2])
            return 2 * batch * q[-2] * k[-2] * (q[-1] + v[-1])
        if name in ("sdpa_backward", "sdpa_flash_backward"):  # the scores again, then dV, dP, dQ and dK
            q, k, v = shapes[1], shapes[2], shapes[3]
            batch = math.prod(q[:-2])
            return 2 * batch * q[-2] * k[-2] * (3 * q[-1] + 2 * v[-1])
        if name == "convolution_backward":  # the gradients output_mask selects: input, weight, bias
            g, x, w = shapes[0], shapes[1], shapes[2]
            params = prims.convolution_backward.params(node)
            transposed, mask = bool(params["transposed"]), params["output_mask"]
            forward = 2 * (math.prod(x) if transposed else math.prod(g)) * w[1] * math.prod(w[2:])
            return forward * (bool(mask[0]) + bool(mask[1])) + (math.prod(g) if mask[2] else 0)
    except (TypeError, IndexError):
        return None
    return None


# ---- the report -----------------------------------------------------------------------------------------

@dataclasses.dataclass
class ProfileRow:
    """One kernel, extern call, fallback node or graph run with torch: medians per call of the function."""

    graph: str
    kind: str  # "kernel", "extern", "fallback" or "torch graph"
    name: str  # kernel0, buf3, the graph's name
    op: str  # what it runs: the kernel's members, the torch callable
    time_us: float
    bytes: int | None
    flops: int | None
    gbps: float | None = None
    gflops: float | None = None
    pct_bandwidth: float | None = None
    pct_peak: float | None = None
    label: str = "overhead-bound"
    origins: list[str] = dataclasses.field(default_factory=list)  # "file:line: source"

    def judge(self, peaks: dict[str, Any]) -> None:
        """Achieved rates, their share of the roofs, and the label."""
        seconds = self.time_us * 1e-6
        bw, peak = peaks["copy_gbps"] * 1e9, peaks["matmul_gflops"] * 1e9
        if seconds > 0 and self.bytes is not None:
            self.gbps = self.bytes / seconds / 1e9
            self.pct_bandwidth = 100 * self.gbps * 1e9 / bw
        if seconds > 0 and self.flops is not None:
            self.gflops = self.flops / seconds / 1e9
            self.pct_peak = 100 * self.gflops * 1e9 / peak
        memory_s = (self.bytes or 0) / bw
        compute_s = (self.flops or 0) / peak
        roof_s = max(memory_s, compute_s)
        if self.time_us < OVERHEAD_US or (roof_s < 0.1 * seconds and seconds < 1e-3):
            self.label = "overhead-bound"
        else:
            self.label = "compute-bound" if compute_s > memory_s else "memory-bound"


@dataclasses.dataclass
class GraphProfile:
    """One compiled graph's totals, medians per call of the function."""

    name: str
    calls: float  # calls of the graph per call of the function
    total_us: float  # the wrapper's whole call (all its calls)
    rows_us: float  # its kernels, externs and fallbacks
    wrapper_us: float  # the rest: input checks, allocation, ctypes calls, Python in the wrapper
    kernel_calls_us: float  # of which: the ctypes calls around the kernels (call time minus kernel time)
    note: str = ""


class ProfileReport:
    """What kiln.profile measured: one row per kernel, extern and fallback, per graph, and the totals."""

    def __init__(self, function: str, rows: list[ProfileRow], graphs: list[GraphProfile], wall_us: float,
                 peaks: dict[str, Any], repeat: int, result: Any = None):
        self.function = function
        self.rows = rows
        self.graphs = graphs
        self.wall_us = wall_us
        self.peaks = peaks
        self.repeat = repeat
        self.result = result  # what the first (compiling) call returned
        self.compiled_graphs: list[CompiledGraph] = []  # the profiling compiles (not in the JSON)

    @property
    def rows_us(self) -> float:
        return sum(r.time_us for r in self.rows)

    @property
    def wrapper_us(self) -> float:
        return sum(g.wrapper_us for g in self.graphs)

    @property
    def outside_kernels_us(self) -> float:
        """Wall time in none of the rows: generated wrappers, guards, Python between graphs."""
        return max(0.0, self.wall_us - self.rows_us)

    @property
    def outside_kernels_share(self) -> float:
        return self.outside_kernels_us / self.wall_us if self.wall_us > 0 else 0.0

    def kind_us(self, kind: str) -> float:
        return sum(r.time_us for r in self.rows if r.kind == kind)

    # -- JSON ------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"function": self.function, "wall_us": self.wall_us, "repeat": self.repeat,
                "peaks": self.peaks, "rows_us": self.rows_us, "wrapper_us": self.wrapper_us,
                "outside_kernels_us": self.outside_kernels_us,
                "outside_kernels_share": self.outside_kernels_share,
                "graphs": [dataclasses.asdict(g) for g in self.graphs],
                "rows": [dataclasses.asdict(r) for r in self.rows]}

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def save_json(self, path: str) -> str:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            f.write(self.to_json())
        return path

    @classmethod
    def from_json(cls, text: str) -> "ProfileReport":
        data = json.loads(text)
        return cls(data["function"], [ProfileRow(**r) for r in data["rows"]],
                   [GraphProfile(**g) for g in data["graphs"]], data["wall_us"], data["peaks"],
                   data["repeat"])

    # -- the terminal table ---------------------------------------------------------------------------
    def __str__(self) -> str:
        p = self.peaks
        kinds = {k: sum(r.kind == k for r in self.rows)
                 for k in ("kernel", "extern", "fallback", "torch graph")}
        lines = [f"kiln.profile {self.function}: {len(self.graphs)} graph(s), {kinds['kernel']} kernel(s), "
                 f"{kinds['extern']} extern(s), {kinds['fallback']} fallback(s), {kinds['torch graph']} "
                 f"graph(s) run with torch; median of {self.repeat} calls",
                 f"roofs: copy {p['copy_gbps']:.1f} GB/s, matmul {p['matmul_gflops']:.1f} GFLOP/s "
                 f"({p['threads']} threads; {'cached' if p.get('cached') else 'measured'} {p['measured']}"
                 + (f"; BUSY machine, load {p['load']:g} on {p['cpus']} CPUs: measured again next time)"
                    if p.get("busy") else ")")]
        header = ("graph", "kind", "name (what)", "time us", "bytes", "MFLOP", "GB/s", "%bw", "GFLOP/s",
                  "%peak", "label", "source")
        table = [header]
        continuation: dict[int, list[str]] = {}
        for r in self.rows:
            table.append((r.graph, r.kind, f"{r.name} {_short_op(r)}", f"{r.time_us:.1f}", _size(r.bytes),
                          "-" if r.flops is None else f"{r.flops / 1e6:.2f}", _num(r.gbps),
                          _pct(r.pct_bandwidth), _num(r.gflops), _pct(r.pct_peak), r.label,
                          _relative(r.origins[0]) if r.origins else r.op))
            continuation[len(table) - 1] = [_relative(o) for o in r.origins[1:]]
        widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
        right = {3, 4, 5, 6, 7, 8, 9}
        for i, row in enumerate(table):
            cells = [c.rjust(w) if j in right else c.ljust(w) for j, (c, w) in enumerate(zip(row, widths))]
            lines.append("  ".join(cells + [row[-1]]).rstrip())
            if i == 0:
                lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 6)
            for origin in continuation.get(i, ()):
                lines.append(" " * (sum(widths) + 2 * len(widths)) + origin)
        wall = self.wall_us or 1.0
        lines.append("")
        lines.append(f"wall {self.wall_us:.1f} us per call: kernels {self.kind_us('kernel'):.1f} "
                     f"({100 * self.kind_us('kernel') / wall:.0f}%), externs {self.kind_us('extern'):.1f} "
                     f"({100 * self.kind_us('extern') / wall:.0f}%), fallbacks "
                     f"{self.kind_us('fallback'):.1f}, "
                     f"graphs run with torch {self.kind_us('torch graph'):.1f}")
        calls = sum(g.kernel_calls_us for g in self.graphs)
        lines.append(f"generated wrappers' own time {self.wrapper_us:.1f} us "
                     f"({100 * self.wrapper_us / wall:.0f}%; "
                     f"of which ctypes calls around kernels {calls:.1f}); outside every kernel, extern and "
                     f"fallback: {self.outside_kernels_us:.1f} us = "
                     f"{100 * self.outside_kernels_share:.0f}% of "
                     f"wall (wrappers, guards, Python between graphs)")
        if any(_above_roofs(r) for r in self.rows):
            lines.append("note: a row runs well above a roof: the cached roofs look low (measured on a busy "
                         "machine?); kiln.profiler.machine_peaks(remeasure=True) measures them again")
        for g in self.graphs:
            if g.note:
                lines.append(f"graph {g.name}: {g.note}")
        return "\n".join(lines)

    __repr__ = __str__

    # -- the roofline plot ---------------------------------------------------------------------------
    def plot(self, path: str) -> str:
        """A roofline PNG: each row at (FLOP per byte, GFLOP/s) under the two measured roofs."""
        from .profile_plot import roofline
        return roofline(self, path)


def _above_roofs(row: ProfileRow) -> bool:
    """A long row well above a roof: the roofs were mismeasured (a small kernel whose buffers sit in cache
    may beat the copy roof; that says nothing)."""
    if row.time_us < 20 * OVERHEAD_US:
        return False
    return (row.pct_peak or 0) > 120 or ((row.pct_bandwidth or 0) > 120 and (row.bytes or 0) > 64 << 20)


def _relative(origin: str) -> str:
    """An origin with its file relative to the working directory when it lies below it (the table only)."""
    here = os.getcwd() + os.sep
    return origin[len(here):] if origin.startswith(here) else origin


def _short_op(row: ProfileRow) -> str:
    """What a row runs, in a word: the callable's name, or the kinds of loop a kernel fuses."""
    if row.kind == "kernel":
        roles = {role for part in row.op.split(", ") for role in part.split(":")[1:]}
        kinds = [k for k, rs in (("pointwise", {"inner", "outer"}), ("reduction", {"reduction"}),
                                 ("scan", {"scan"})) if roles & rs]
        return "+".join(kinds) or "-"
    if row.kind == "torch graph":
        return ""
    return row.op.rsplit(".", 1)[-1]


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}" if x < 10 else f"{x:.1f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}%" if x >= 1 else f"{x:.1f}%"


# ---- profiling a call ------------------------------------------------------------------------------------

class _Entry:
    """One graph capture handed to the backend: its compiled graphs (forward, backward) or its torch run."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.compiled: list[CompiledGraph] = []
        self.origins: dict[int, dict[str, list[str]]] = {}
        self.torch_ns = 0
        self.torch_calls = 0
        self.note = ""


def _origin_passes(origins: dict[int, dict[str, list[str]]]) -> list[Pass]:
    def lower(state: Any, context: CompileContext) -> None:
        lowering = _OriginLowering(state.prim_graph, state.target)
        state.loop = lowering.run()
        state.origins = origins[id(state.loop)] = lowering.origins
    return [dataclasses.replace(p, run=lower) if p.name == "lower" else p for p in PASSES]


def _profiling_compiler(entries: list[_Entry]) -> GraphCompiler:
    def profiling_backend(graph: Graph, example_inputs: list, context: CompileContext | None = None) -> Any:
        entry = _Entry(graph)
        entries.append(entry)
        passes = _origin_passes(entry.origins)

        def compile_profiled(g: Graph, inputs: list, ctx: CompileContext) -> Any:
            compiled = compile_graph(g, inputs, ctx, passes=passes)
            entry.compiled.append(compiled)
            return compiled
        before = dict(counters["cpp"])
        call = compile_or_run_with_torch("cpp", graph, example_inputs, context, compile_profiled, log)
        if entry.compiled:
            return call
        reasons = [k for k, v in counters["cpp"].items()
                   if k.startswith("ran with torch") and v > before.get(k, 0)]
        entry.note = f"handed to torch: {reasons[0] if reasons else 'see kiln.counters'}"

        def timed_torch_run(*inputs: Any) -> Any:
            start = time.perf_counter_ns()
            try:
                return call(*inputs)
            finally:
                entry.torch_ns += time.perf_counter_ns() - start
                entry.torch_calls += 1
        return timed_torch_run
    return GraphCompiler(profiling_backend, CompileContext(options={"profile": True}))


def _take(entries: list[_Entry]) -> list[dict[str, Any]]:
    """One sample per entry (what each measured since the last take), then every counter from zero."""
    samples = []
    for entry in entries:
        samples.append({"torch_ns": entry.torch_ns, "torch_calls": entry.torch_calls,
                        "compiled": [c.timings.take() if c.timings is not None else None
                                     for c in entry.compiled]})
        entry.torch_ns = entry.torch_calls = 0
    return samples


def profile(fn: Any, *args: Any, repeat: int = 10, warmup: int = 2, **kwargs: Any) -> ProfileReport:
    """Profile `fn(*args, **kwargs)` compiled by kiln (cpp backend): per kernel, extern and fallback, time,
    bytes, FLOPs, rates against the machine's roofs, a label and the user lines (see the module docstring).

    `fn` is called 1 + warmup + repeat times (`repeat` and `warmup` are kiln.profile's own keywords: pass
    arguments of those names to `fn` with functools.partial). Returns a `ProfileReport`: print it for the
    table; `.to_json()`, `.save_json(path)`, `.plot(path)` (matplotlib); `.result` is the first call's."""
    if repeat < 1:
        raise ValueError(f"kiln.profile: repeat must be at least 1, got {repeat}")
    code, bound_self = _python_code(fn, "kiln.profile")
    entries: list[_Entry] = []
    compiled_fn = CompiledFunction(code, _profiling_compiler(entries), bound_self=bound_self, family=object())
    result = compiled_fn(*args, **kwargs)
    for _ in range(warmup):
        compiled_fn(*args, **kwargs)
    _take(entries)
    walls, runs = [], []
    for _ in range(repeat):
        start = time.perf_counter_ns()
        compiled_fn(*args, **kwargs)
        walls.append(time.perf_counter_ns() - start)
        runs.append(_take(entries))
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    report = _report(name, entries, runs, statistics.median(walls) / 1e3, machine_peaks(), repeat)
    report.result = result
    tracing.note_profile(report)  # (the compile report's profile section)
    report.compiled_graphs = [c for entry in entries for c in entry.compiled]
    return report


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _report(function: str, entries: list[_Entry], runs: list[list[dict[str, Any]]], wall_us: float,
            peaks: dict[str, Any], repeat: int) -> ProfileReport:
    rows: list[ProfileRow] = []
    graphs: list[GraphProfile] = []
    for e, entry in enumerate(entries):
        samples = [run[e] for run in runs if e < len(run)]  # runs before a recompile lack its entry
        if not entry.compiled:
            us = _median([s["torch_ns"] / 1e3 for s in samples])
            row = ProfileRow(entry.graph.name, "torch graph", entry.graph.name, "the whole graph with torch",
                             us, None, None)
            row.judge(peaks)
            rows.append(row)
            graphs.append(GraphProfile(entry.graph.name, _median([s["torch_calls"] for s in samples]), us, us,
                                       0.0, 0.0, entry.note))
            continue
        for c, compiled in enumerate(entry.compiled):
            timings = [s["compiled"][c] for s in samples if c < len(s["compiled"])]
            name = entry.graph.name if c == 0 else f"{entry.graph.name}.backward"  # compiled on .backward()
            origins = entry.origins.get(id(compiled.loop), {})
            graph_rows, per_run_rows = _graph_rows(name, compiled, timings, origins)
            for row in graph_rows:
                row.judge(peaks)
            rows.extend(graph_rows)
            total = _median([t["total_ns"] / 1e3 for t in timings])
            rows_us = sum(r.time_us for r in graph_rows)
            calls_overhead = _median([_call_overhead_us(compiled, t) for t in timings])
            wrapper = _median([t["total_ns"] / 1e3 - per_run_rows[i] for i, t in enumerate(timings)])
            graphs.append(GraphProfile(name, _median([t["calls"] for t in timings]), total, rows_us,
                                       max(0.0, wrapper), max(0.0, calls_overhead)))
    return ProfileReport(function, rows, graphs, wall_us, peaks, repeat)


def _call_overhead_us(compiled: CompiledGraph, timing: dict[str, Any]) -> float:
    """The ctypes calls' time around their kernels in one run: segment call time minus its kernels' time."""
    total = 0.0
    for i, step in enumerate(compiled.plan.steps):
        if isinstance(step.node, Segment):
            total += timing["step_ns"][i] / 1e3 - 1e6 * sum(timing["kernel_s"][i])
    return total


def _graph_rows(graph_name: str, compiled: CompiledGraph, timings: list[dict[str, Any]],
                origins: dict[str, list[str]]) -> tuple[list[ProfileRow], list[float]]:
    """The rows of one compiled graph in plan order, and per run the sum of its rows' times (us)."""
    loop = compiled.loop
    rows: list[ProfileRow] = []
    per_run = [0.0] * len(timings)
    for i, step in enumerate(compiled.plan.steps):
        node = step.node
        if isinstance(node, Segment):
            for k, group in enumerate(node.groups):
                times = [1e6 * t["kernel_s"][i][k] for t in timings]
                for r, us in enumerate(times):
                    per_run[r] += us
                members = [m.buffer for m in group.members]
                lines = list(dict.fromkeys(o for b in members for o in origins.get(b.name, ())))
                op = ", ".join(f"{b.name}:{m.role}" for b, m in zip(members, group.members))
                rows.append(ProfileRow(graph_name, "kernel", group.name, op, _median(times),
                                       kernel_bytes(group, loop), sum(buffer_flops(b) for b in members),
                                       origins=[_with_source(o) for o in lines]))
        else:
            times = [t["step_ns"][i] / 1e3 for t in timings]
            for r, us in enumerate(times):
                per_run[r] += us
            lines = list(dict.fromkeys(o for out in node.outputs for o in origins.get(out.name, ())))
            flops = extern_flops(node, loop)  # a fallback too, where it is a library op it knows
            rows.append(ProfileRow(graph_name, node.kind, node.outputs[0].name if node.outputs else node.name,
                                   node.target_name, _median(times), extern_bytes(node, loop), flops,
                                   origins=[_with_source(o) for o in lines]))
    return rows, per_run


__all__ = ["profile", "ProfileReport", "ProfileRow", "GraphProfile", "machine_peaks", "LABELS"]
