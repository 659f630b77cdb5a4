"""Backend `cpp`: prims → loop IR → fused kernels → C++ (OpenMP, SIMD) → one shared object per graph.

The backend is its pass list, `PASSES`, run by `kiln.graph.pipeline.run_pipeline` over the C++ `Target`
(`kiln.codegen.cpp.CPP_TARGET`). `compile_graph(graph, example_inputs, context)` returns a
`CompiledGraph` (its loop IR, schedule, plan, C++ and wrapper source and each pass's time are kept for
tests and dumps). The registered backend falls back to running the graph with torch when the graph cannot
be compiled (no compiler, an unsupported dtype, an internal error) — with a warning, or raising when the
compile asked for it (`options={"raise_on_error": True}`, `fullgraph=True`, or the flag). Inputs whose
strides, shapes or dtypes differ from the examples run on the fallback too: the kernels bake the examples'
layouts into their index arithmetic.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import sys
import time
from typing import Any, Callable

import torch

from .. import config
from ..codegen.cpp import CPP_TARGET, segment_source
from ..codegen.header import header_for
from ..codegen.wrapper import WrapperTimings, load_entry, wrapper_source
from ..counters import counters
from ..graph import Graph, cse, dce, flatten, run, to_prims, verify
from ..graph.pipeline import CompileContext, CompileState, Pass, run_pipeline
from ..lower import lower
from ..graph.specialize import size_bindings, specialize_graph
from ..graph.symbolic import SymInt
from ..lower.ir import ExternNode, LoopGraph
from ..lower.patterns import fold_bias_into_mm
from ..lower.sizes import size_hints
from ..lower.target import Target
from ..lower.verify import verify_loop
from ..runtime import build, rng
from ..schedule.fusion import FusedGroup, fuse
from ..schedule.memory import Plan, Segment, plan
from ..schedule.order import order
from ..schedule.verify import verify_plan, verify_schedule
from . import register_backend

log = config.channel("kernels")
fusion_log = config.channel("fusion")


class CompiledGraph:
    """A graph compiled by the cpp backend; call it with the graph's inputs."""

    def __init__(self, graph: Graph, loop: LoopGraph, schedule: list, memory: Plan, cpp_source: str,
                 wrapper: str, call: Callable[..., Any], records: list | None = None,
                 timings: WrapperTimings | None = None):
        self.graph = graph
        self.loop = loop
        self.schedule = schedule
        self.plan = memory
        self.cpp_source = cpp_source
        self.wrapper_source = wrapper
        self.call = call
        self.records = records or []  # each pass: name, ms (and its IR dump with a debug dir)
        self.timings = timings  # a profiling compile's per-step and per-kernel times (else None)

    @property
    def kernels(self) -> list[FusedGroup]:
        return [s for s in self.schedule if isinstance(s, FusedGroup)]

    @property
    def kernel_count(self) -> int:
        return len(self.kernels)

    @property
    def externs(self) -> list:
        return [s for s in self.schedule if not isinstance(s, FusedGroup)]

    @property
    def allocations(self) -> int:
        return self.plan.allocations()

    def __call__(self, *inputs: Any) -> Any:
        return self.call(*inputs)


# ---- the passes ------------------------------------------------------------------------------------------

def _graph_text(state: CompileState) -> str:
    return state.prim_graph.python_code(f"prim graph of {state.graph.name}")[0]


def _loop_text(state: CompileState) -> str:
    from ..lower.printer import loop_python
    return loop_python(state.loop)


def _schedule_text(state: CompileState) -> str:
    from ..schedule.printer import schedule_python
    return schedule_python(state.loop, state.schedule)


def _plan_text(state: CompileState) -> str:
    lines = [f"# memory plan of {state.loop.name}: {state.plan.allocations()} allocations, peak "
             f"{state.plan.peak_bytes(state.loop)} bytes"]
    for step in state.plan.steps:
        node = step.node
        what = node.name if isinstance(node, Segment) else f"{node.kind} {node.target_name}"
        allocs = ", ".join(n if r is None else f"{n}<-{r}" for n, r in step.allocs)
        lines.append(f"# {what}: alloc [{allocs}] free [{', '.join(step.frees)}]")
    return "\n".join(lines)


def _to_prims(state: CompileState, ctx: CompileContext) -> None:
    for t in flatten(state.example_inputs):
        if isinstance(t, torch.Tensor) and t.device.type != "cpu":
            raise NotImplementedError(f"cpp backend: input on {t.device}")
    state.prim_graph = to_prims(state.graph)


def _dce(state: CompileState, ctx: CompileContext) -> None:
    state.prim_graph = dce(state.prim_graph)


def _cse(state: CompileState, ctx: CompileContext) -> None:
    state.prim_graph = cse(state.prim_graph)


def _lower(state: CompileState, ctx: CompileContext) -> None:
    state.loop = lower(state.prim_graph, state.target)
    for node in state.loop.nodes:
        if isinstance(node, ExternNode) and node.target_name == "prims.bernoulli":
            node.target = rng.bernoulli  # eager's draws, natively (kiln.runtime.rng)


def _fold_bias(state: CompileState, ctx: CompileContext) -> None:
    fold_bias_into_mm(state.loop)


def _fuse(state: CompileState, ctx: CompileContext) -> None:
    state.schedule = fuse(state.loop, state.target)


def _order(state: CompileState, ctx: CompileContext) -> None:
    state.schedule = order(state.loop, state.schedule, state.target, enabled=ctx.flag("memory_order"))


def _plan(state: CompileState, ctx: CompileContext) -> None:
    state.plan = plan(state.loop, state.schedule, state.target, in_place=ctx.flag("cpp_in_place"))


def _codegen(state: CompileState, ctx: CompileContext) -> None:
    loop, parts = state.loop, []
    sizes = loop.size_symbols()
    for step in state.plan.steps:
        if isinstance(step.node, Segment):
            parts.append(segment_source(f"kiln_{step.node.name}", step.node.groups, step.node.args,
                                        loop.buffers, step.node.aliases, state.target,
                                        timing=profiling(ctx), sizes=sizes))
    state.cpp_source = "\n".join([header_for("\n".join(parts))] + parts) + "\n" if parts else ""


def _build(state: CompileState, ctx: CompileContext) -> None:
    """Compile and load the shared object (or take it from the disk cache), then the Python wrapper."""
    graph = state.graph
    lib = build(state.cpp_source) if state.cpp_source else None
    timed = profiling(ctx)
    entries = {}
    nsizes = len(state.loop.size_symbols())
    for step in state.plan.steps:
        if isinstance(step.node, Segment):
            entries[step.node.name] = load_entry(lib, f"kiln_{step.node.name}", len(step.node.args) + timed,
                                                 nsizes)
    bindings = size_bindings(graph) if nsizes else []

    def fallback(*inputs: Any) -> Any:
        counters["cpp"]["input layout changed: ran the graph with torch"] += 1
        if bindings:  # a graph compiled for every size: run with torch at this call's sizes
            values = {sym: inputs[i].shape[d] for sym, i, d in bindings}
            return run(specialize_graph(graph, values), inputs, torch_level=True)
        return run(graph, inputs, torch_level=True)
    state.timings = WrapperTimings(state.plan) if timed else None
    state.wrapper_source, env = wrapper_source(state.loop, state.plan, entries, fallback,
                                               timings=state.timings)
    exec(compile(state.wrapper_source, f"<kiln cpp wrapper {graph.name}>", "exec"), env)
    state.call = env["kiln_call"]


def profiling(ctx: CompileContext) -> bool:
    """The compile is kiln.profile's: kernels time themselves and the wrapper times its steps.

    A compile-context option (`options["profile"]`, set only by kiln.profile's own compiler, never a
    process-wide flag); the normal compile emits no timing code at all."""
    return bool(ctx.options.get("profile", False))


def _wrapper_text(state: CompileState) -> str:
    return state.wrapper_source


PASSES = [
    Pass("to_prims", _to_prims, _graph_text, lambda s: verify(s.prim_graph, after="to_prims")),
    Pass("dce", _dce, _graph_text, lambda s: verify(s.prim_graph, after="dce")),
    Pass("cse", _cse, _graph_text, lambda s: verify(s.prim_graph, after="cse")),
    Pass("lower", _lower, _loop_text, lambda s: verify_loop(s.loop)),
    Pass("fold_bias", _fold_bias, _loop_text, lambda s: verify_loop(s.loop)),
    Pass("fuse", _fuse, _schedule_text, lambda s: verify_schedule(s.loop, s.schedule)),
    Pass("order", _order, _schedule_text, lambda s: verify_schedule(s.loop, s.schedule)),
    Pass("plan", _plan, _plan_text, lambda s: verify_plan(s.loop, s.plan)),
    Pass("codegen", _codegen),
    Pass("build", _build, _wrapper_text),
]


def compile_graph(graph: Graph, example_inputs: list, context: CompileContext | None = None,
                  target: Target = CPP_TARGET, passes: list[Pass] | None = None) -> CompiledGraph:
    """Compile a torch-level (or prim) graph for CPU tensors; raises on anything it cannot handle."""
    context = context or CompileContext()
    start = time.perf_counter()
    debug_dir = context.flag("debug_dir")
    with size_hints(_hints_of(graph)):
        state = run_pipeline(f"cpp {graph.name}", passes or PASSES, CompileState(graph, example_inputs, target),
                             context, dump=bool(debug_dir))
    if fusion_log.isEnabledFor(logging.DEBUG):
        fusion_log.debug("%s: %d kernels, %d externs/fallbacks\n%s", graph.name,
                         sum(isinstance(s, FusedGroup) for s in state.schedule),
                         sum(not isinstance(s, FusedGroup) for s in state.schedule),
                         "\n".join(s.describe() for s in state.schedule))
    log.debug("compiled %s in %.3f s", graph.name, time.perf_counter() - start)
    if debug_dir:
        files = {f"{i:02d}_{r.name}.py": r.dump for i, r in enumerate(state.records) if r.dump is not None}
        files["kernels.cpp"] = state.cpp_source
        _dump(debug_dir, graph, files)
    counters["cpp"]["graphs compiled"] += 1
    compiled = CompiledGraph(graph, state.loop, state.schedule, state.plan, state.cpp_source,
                             state.wrapper_source, state.call, state.records, getattr(state, "timings", None))
    call = state.call

    def first_call(*inputs: Any) -> Any:
        # the compile's garbage (sympy, the passes' IR) is gone once capture has returned: give glibc's
        # freed memory back to the OS, or a compiled model's RSS stays tens of MB above eager's
        compiled.call = call
        _return_freed_memory()
        return call(*inputs)
    compiled.call = first_call
    return compiled


def _hints_of(graph: Graph) -> dict:
    """The hints of a graph's symbolic sizes (the sizes its capture saw); {} for static sizes."""
    for ph in graph.placeholders:
        for size in getattr(ph.meta, "shape", ()):
            if isinstance(size, SymInt):
                return dict(size.env.hints)
    return {}


@functools.lru_cache(maxsize=None)
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def _return_freed_memory() -> None:
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _dump(directory: str, graph: Graph, files: dict[str, str]) -> None:
    digest = hashlib.sha256("".join(files.values()).encode()).hexdigest()[:10]
    path = os.path.join(directory, f"{graph.name}_{digest}")
    os.makedirs(path, exist_ok=True)
    for name, text in files.items():
        with open(os.path.join(path, name), "w") as f:
            f.write(text)


@register_backend("cpp")
def cpp(graph: Graph, example_inputs: list, context: CompileContext | None = None) -> Callable[..., Any]:
    """Compile the graph to C++ kernels; on failure run it with torch (or raise when the compile asks to)."""
    from .aot import compile_or_run_with_torch
    return compile_or_run_with_torch("cpp", graph, example_inputs, context, compile_graph, log)


def compile_symbolic(graph: Graph, example_inputs: list, context: CompileContext | None = None) -> CompiledGraph:
    """Compile a graph with symbolic sizes once for every size: kernels take the sizes as int64 arguments,
    the wrapper reads them from the inputs' shapes and sizes buffers from expressions of them; with
    autograd the forward and (on the first backward) the backward. Raises (never falls back) where it
    cannot: grad-mode switches inside the graph, a size question whose answer differs between sizes
    (`SizeDecision`, or a question the frozen guards never settled)."""
    if any(n.op == "call_torch" and n.target is torch._C._set_grad_enabled for n in graph.nodes):
        raise NotImplementedError("grad-mode switches inside the graph: its segments compile per size")
    from .aot import compile_with_autograd, needs_autograd
    if needs_autograd(example_inputs):
        return compile_with_autograd(graph, example_inputs, context or CompileContext(), compile_graph)
    return compile_graph(graph, example_inputs, context)


cpp.symbolic = compile_symbolic
