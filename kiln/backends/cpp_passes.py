"""The cpp backend's passes (kiln.backends.cpp): prims, lowering, fusion, ordering, planning, C++ and the
wrapper. Apart from the backend's entry because they import the loop IR, sympy and the C++ generator,
which a graph-cache hit (kiln.backends.graph_cache) never needs.
"""
from __future__ import annotations

import torch

from ..codegen.cpp import segment_source
from ..codegen.cpp_native import native_gemms, plan_runs, run_source
from ..codegen.header import header_for
from ..codegen.wrapper import WrapperTimings, wrapper_source
from ..codegen.wrapper_runtime import HELPER_NAMES, blas_sgemm, load_entry
from ..graph import cse, dce, flatten, to_prims, verify
from ..graph.pipeline import CompileContext, CompileState, Pass
from ..lower import lower
from ..lower.ir import ExternNode
from ..lower.patterns import fold_bias_into_mm
from ..lower.verify import verify_loop
from ..runtime import build, find_compiler, rng
from ..runtime.build import cache_key
from ..schedule.fusion import fuse
from ..schedule.memory import Segment, plan
from ..schedule.order import order
from ..schedule.verify import verify_plan, verify_schedule
from .. import config
from ..counters import counters
from .dumps import cpp_wrapper_module, graph_module
from .graph_cache import torch_fallback


# ---- the passes ------------------------------------------------------------------------------------------

def _graph_text(state: CompileState) -> str:
    return graph_module(state.prim_graph, f"prim graph of {state.graph.name}")


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
    if ctx.flag("trace_dir"):  # a compile report: it names the user lines lowered into each kernel
        from ..lower.origins import OriginLowering
        lowering = OriginLowering(state.prim_graph, state.target)
        state.loop = lowering.run()
        state.origins = lowering.origins
    else:
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
    state.schedule = state.plan.schedule()  # the same kernels, each with the buffers it keeps inside


def _codegen(state: CompileState, ctx: CompileContext) -> None:
    loop, parts = state.loop, []
    sizes = loop.size_symbols()
    timing = profiling(ctx)
    for step in state.plan.steps:
        if isinstance(step.node, Segment):
            parts.append(segment_source(f"kiln_{step.node.name}", step.node.groups, step.node.args,
                                        loop.buffers, step.node.aliases, state.target,
                                        timing=timing, sizes=sizes))
    # products through BLAS and consecutive steps as one entry (kiln.codegen.cpp_native)
    state.gemms = native_gemms(loop, state.plan) if ctx.flag("native_runs") and blas_sgemm() else {}
    state.runs = plan_runs(loop, state.plan, state.gemms, ctx.flag("native_run_max_bytes")) \
        if ctx.flag("native_runs") else []
    flagged = {step.node.name for step in state.plan.steps
               if isinstance(step.node, Segment) and step.node.loads_through_index()}
    for run in state.runs:
        parts.append(run_source(run, state.plan, loop, state.gemms, flagged, timing, sizes))
    if state.gemms:
        counters["cpp"]["float32 products called through BLAS from a run"] += len(state.gemms)
    state.cpp_source = "\n".join([header_for("\n".join(parts))] + parts) + "\n" if parts else ""


def _build(state: CompileState, ctx: CompileContext) -> None:
    """Compile and load the shared object (or take it from the disk cache), then the Python wrapper."""
    graph = state.graph
    lib = build(state.cpp_source) if state.cpp_source else None
    timed = profiling(ctx)
    entries, specs = {}, {}
    nsizes = len(state.loop.size_symbols())
    for step in state.plan.steps:
        if isinstance(step.node, Segment):
            specs[step.node.name] = (f"kiln_{step.node.name}", len(step.node.args) + timed, nsizes)
            entries[step.node.name] = load_entry(lib, *specs[step.node.name])
    for run in state.runs:
        nargs = run.gemm + len(run.args) + bool(run.arena) + (len(run.steps) if timed else 0)
        specs[run.name] = (f"kiln_{run.name}", nargs, nsizes)
        entries[run.name] = load_entry(lib, *specs[run.name])
    fallback = torch_fallback(graph, bool(nsizes))
    state.timings = WrapperTimings(state.plan, set(state.gemms)) if timed else None
    state.wrapper_source, env = wrapper_source(state.loop, state.plan, entries, fallback,
                                               timings=state.timings, pool=ctx.flag("pool_buffers"),
                                               runs=state.runs, gemms=state.gemms)
    state.library_key = lib_key(state.cpp_source) if lib is not None else None
    # what the graph cache stores: the wrapper's own constants, and which globals are segment entries
    by_entry = {id(fn): name for name, fn in entries.items()}
    state.entry_specs = [(g, *specs[by_entry[id(v)]]) for g, v in env.items() if id(v) in by_entry]
    state.constants = {g: v for g, v in env.items() if g not in HELPER_NAMES and id(v) not in by_entry}
    state.wrapper_code = compile(state.wrapper_source, f"<kiln cpp wrapper {graph.name}>", "exec")
    exec(state.wrapper_code, env)
    state.call = env["kiln_call"]


def lib_key(source: str) -> str:
    return cache_key(source, find_compiler(config.get("cxx")))


def profiling(ctx: CompileContext) -> bool:
    """The compile is kiln.profile's: kernels time themselves and the wrapper times its steps.

    A compile-context option (`options["profile"]`, set only by kiln.profile's own compiler, never a
    process-wide flag); the normal compile emits no timing code at all."""
    return bool(ctx.options.get("profile", False))


def wrapper_text(state: CompileState) -> str:
    """The wrapper as generated (the Triton backend's dump: its launchers are not rebuilt by the dump)."""
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
    Pass("build", _build, cpp_wrapper_module),
]


