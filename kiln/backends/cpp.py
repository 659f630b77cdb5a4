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
import logging
import marshal
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Callable

import torch

from .. import config
from ..codegen.wrapper_runtime import helper_globals, load_entry
from ..counters import counters
from ..graph import Graph, TensorMeta
from ..graph.pipeline import CompileContext, CompileState, run_pipeline
from ..graph.symbolic import SymInt
from ..runtime import malloc
from ..runtime.build import load_built
from . import graph_cache, register_backend

if TYPE_CHECKING:
    from ..codegen.wrapper import WrapperTimings
    from ..lower.ir import LoopGraph
    from ..lower.target import Target
    from ..schedule.memory import Plan

log = config.channel("kernels")
fusion_log = config.channel("fusion")
passes_log = config.channel("passes")
code_log = config.channel("output_code")
cache_log = config.channel("cache")


def __getattr__(name: str) -> Any:
    # the pass list and the C++ target import the loop IR and sympy: loaded when a compile first needs them
    if name == "PASSES":
        from .cpp_passes import PASSES
        return PASSES
    if name == "CPP_TARGET":
        from ..codegen.cpp_target import CPP_TARGET
        return CPP_TARGET
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class CompiledGraph:
    """A graph compiled by the cpp backend; call it with the graph's inputs."""

    def __init__(self, graph: Graph, loop: LoopGraph | None, schedule: list | None, memory: Plan | None,
                 cpp_source: str | None, wrapper: str, call: Callable[..., Any], records: list | None = None,
                 timings: WrapperTimings | None = None, recompute: Callable[[], CompileState] | None = None):
        self.graph = graph
        self._state = None if recompute is not None else (loop, schedule, memory, cpp_source)
        self._recompute = recompute  # a graph-cache hit: the IR is rebuilt only if someone asks for it
        self.wrapper_source = wrapper
        self.call = call
        self.records = records or []  # each pass: name, ms (and its IR dump with a debug dir)
        self.timings = timings  # a profiling compile's per-step and per-kernel times (else None)
        self.library_key: str | None = None  # the kernel cache entry of its shared object (None: no kernels)

    @property
    def from_cache(self) -> bool:
        """Loaded from the graph cache (kiln.backends.graph_cache): its IR is rebuilt if read."""
        return self._recompute is not None

    def _ir(self, i: int) -> Any:
        if self._state is None:
            state = self._recompute()
            self._state = (state.loop, state.schedule, state.plan, state.cpp_source)
        return self._state[i]

    @property
    def loop(self) -> LoopGraph:
        return self._ir(0)

    @property
    def schedule(self) -> list:
        return self._ir(1)

    @property
    def plan(self) -> Plan:
        return self._ir(2)

    @property
    def cpp_source(self) -> str:
        return self._ir(3)

    @property
    def kernels(self) -> list:
        from ..schedule.fusion import FusedGroup
        return [s for s in self.schedule if isinstance(s, FusedGroup)]

    @property
    def kernel_count(self) -> int:
        return len(self.kernels)

    @property
    def externs(self) -> list:
        from ..schedule.fusion import FusedGroup
        return [s for s in self.schedule if not isinstance(s, FusedGroup)]

    @property
    def allocations(self) -> int:
        return self.plan.allocations()

    def __call__(self, *inputs: Any) -> Any:
        return self.call(*inputs)


def compile_graph(graph: Graph, example_inputs: list, context: CompileContext | None = None,
                  target: Target | None = None, passes: list | None = None) -> CompiledGraph:
    """Compile a torch-level (or prim) graph for CPU tensors (on `target`, the C++ one by default); raises
    on anything it cannot handle. A graph the graph cache holds is loaded from it (kiln.backends.graph_cache);
    a custom pass list, a debug dump, kiln.profile's compile and optimization fuel always run the passes."""
    context = context or CompileContext()
    start = time.perf_counter()
    malloc.settle()  # (once per process: glibc's thresholds, where its externs' results are allocated)
    target = target if target is not None else _cpp_target()
    # the module's PASSES, when set (a test replaces a pass there), is the pass list; else cpp_passes'
    # (imported only when the passes run: with it come the loop IR and sympy, which a hit never needs)
    passes = passes if passes is not None else globals().get("PASSES")
    key = None
    if passes is None and graph_cache.enabled(context):
        try:
            key = graph_cache.graph_key(graph, example_inputs, context, target)
        except graph_cache.Uncacheable as e:
            counters["cache"][f"graphs not cached: {e}"] += 1
            cache_log.info("graph %s is not cached: %s", graph.name, e)
        else:
            hit = _from_graph_cache(key, graph, example_inputs, context, target)
            if hit is not None:
                seconds = time.perf_counter() - start
                passes_log.info("cpp %s: loaded from the graph cache (%s): passes skipped", graph.name, key)
                fusion_log.info("cpp %s: loaded from the graph cache (%s): fusion skipped, its kernels are "
                                "those of the compile that wrote the entry", graph.name, key)
                log.info("compiled %s from the graph cache in %.3f s", graph.name, seconds)
                log_code("cpp", graph.name, _library_path(hit.library_key), None, None, hit.wrapper_source)
                return hit
    from ..lower.sizes import size_hints
    if passes is None:
        from .cpp_passes import PASSES as passes
    debug_dir = context.flag("debug_dir")
    before = graph_cache.counter_snapshot() if key is not None else None
    with size_hints(_hints_of(graph)):
        state = run_pipeline(f"cpp {graph.name}", passes, CompileState(graph, example_inputs, target),
                             context, dump=bool(debug_dir))
    if key is not None:
        entry = graph_cache.Entry(state.wrapper_source, state.constants, state.entry_specs, state.library_key,
                                  graph_cache.counted_since(before), marshal.dumps(state.wrapper_code))
        refused = graph_cache.store(key, entry)
        if refused is not None:
            counters["cache"][f"graphs not cached: {refused}"] += 1
            cache_log.info("graph %s is not cached: %s", graph.name, refused)
    log_schedule("cpp", graph.name, state.schedule, time.perf_counter() - start)
    dumped = None
    if debug_dir:
        files = {f"{i:02d}_{r.name}.py": r.dump for i, r in enumerate(state.records) if r.dump is not None}
        files["kernels.cpp"] = state.cpp_source
        dumped = _dump(debug_dir, graph, files)
    counters["cpp"]["graphs compiled"] += 1
    compiled = CompiledGraph(graph, state.loop, state.schedule, state.plan, state.cpp_source,
                             state.wrapper_source, state.call, state.records, getattr(state, "timings", None))
    compiled.library_key = state.library_key
    log_code("cpp", graph.name, _library_path(state.library_key), dumped, state.cpp_source,
             state.wrapper_source)
    return _trimming_first_call(compiled)


def log_schedule(backend: str, name: str, schedule: list, seconds: float) -> None:
    """The `fusion` log's kernels of a compiled graph and the `kernels` log's line for it."""
    from ..schedule.fusion import FusedGroup
    kernels = sum(isinstance(s, FusedGroup) for s in schedule)
    if fusion_log.isEnabledFor(logging.INFO):
        fusion_log.info("%s %s: %d kernels, %d externs/fallbacks\n%s", backend, name, kernels,
                        len(schedule) - kernels, "\n".join(s.describe() for s in schedule))
    log.info("compiled %s for %s in %.3f s: %d kernels, %d externs/fallbacks", name, backend, seconds,
             kernels, len(schedule) - kernels)


def _library_path(key: str | None) -> str | None:
    from ..runtime import cache
    return cache.entry_path(cache.directory(), key) if key is not None else None


def log_code(backend: str, name: str, where: str | list[str] | None, dumped: str | None, source: str | None,
             wrapper: str) -> None:
    """The `output_code` log: where the graph's generated code is (and, with +output_code, the code; a
    graph-cache hit has only its wrapper, the kernels' source is not generated again)."""
    if not code_log.isEnabledFor(logging.INFO):
        return
    paths = [where] if isinstance(where, str) else list(where or [])
    kernels = f"kernels in {', '.join(paths)}" if paths else "no kernels (externs and fallbacks only)"
    if backend != "cpp":  # (Triton's kernels are Python modules: their source is the files named)
        kept = f"; IR dumps in {dumped}" if dumped is not None else ""
    elif dumped is not None:
        kept = f"; C++ source and IR dumps in {dumped}"
    else:
        kept = "; the C++ source is not kept on disk (KILN_DEBUG_DIR keeps it, +output_code prints it)"
    code_log.info("%s %s: %s%s", backend, name, kernels, kept)
    if code_log.isEnabledFor(logging.DEBUG):
        language = "C++" if backend == "cpp" else "Triton"
        if source is None:
            source = "(loaded from the graph cache: the kernels' source is not generated again)"
        code_log.debug("%s %s: the generated %s source:\n%s\n%s %s: the Python wrapper:\n%s", backend, name,
                       language, source or "(none: no kernels)", backend, name, wrapper)


def _from_graph_cache(key: str, graph: Graph, example_inputs: list, context: CompileContext,
                      target: Target) -> CompiledGraph | None:
    """The compiled graph from its graph-cache entry (kernels loaded, wrapper run), or None on a miss."""
    entry = graph_cache.load(key)
    if entry is None:
        counters["cache"]["graph misses"] += 1
        return None
    lib = load_built(entry.library_key) if entry.library_key is not None else None
    if entry.library_key is not None and lib is None:
        counters["cache"]["graph misses: its kernels were evicted"] += 1
        cache_log.info("graph cache entry %s: its kernels were evicted; compiling afresh", key)
        return None
    env = helper_globals()
    env.update(entry.constants)
    env["_fallback"] = graph_cache.torch_fallback(graph, False)
    for name, symbol, nargs, nsizes in entry.entries:
        env[name] = load_entry(lib, symbol, nargs, nsizes)
    if entry.wrapper_code is not None:
        code = marshal.loads(entry.wrapper_code)
    else:
        code = compile(entry.wrapper_source, f"<kiln cpp wrapper {graph.name}>", "exec")
    exec(code, env)
    for category, added in entry.counted.items():
        counters[category].update(added)
    counters["cache"]["graph hits"] += 1
    counters["cpp"]["graphs compiled"] += 1

    # not the example tensors (they can be activation-sized): the placeholders' metas describe them
    plain = [None if isinstance(x, torch.Tensor) else x for x in example_inputs]

    def recompute() -> CompileState:  # the IR, for the few who read it (tests, dumps): the passes again
        from ..lower.sizes import size_hints
        from .cpp_passes import PASSES
        counted = graph_cache.counter_snapshot()  # (which count nothing new: the hit counted the compile)
        stand_ins = [p.meta.empty(p.meta.device) if x is None and isinstance(p.meta, TensorMeta) else x
                     for p, x in zip(graph.placeholders, plain)]  # (the passes read layouts, never values)
        try:
            with size_hints(_hints_of(graph)):
                return run_pipeline(f"cpp {graph.name}", PASSES[:-1],
                                    CompileState(graph, stand_ins, target), context)
        finally:
            counters.clear()
            counters.update(counted)
    compiled = CompiledGraph(graph, None, None, None, None, entry.wrapper_source, env["kiln_call"],
                             recompute=recompute)
    compiled.library_key = entry.library_key
    return _trimming_first_call(compiled)


def _trimming_first_call(compiled: CompiledGraph) -> CompiledGraph:
    call = compiled.call

    def first_call(*inputs: Any) -> Any:
        # the compile's garbage (sympy, the passes' IR) is gone once capture has returned: give glibc's
        # freed memory back to the OS, or a compiled model's RSS stays tens of MB above eager's
        compiled.call = call
        _return_freed_memory()
        return call(*inputs)
    compiled.call = first_call
    return compiled


def _cpp_target() -> Target:
    from ..codegen.cpp_target import CPP_TARGET
    return CPP_TARGET


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


def _dump(directory: str, graph: Graph, files: dict[str, str]) -> str:
    from ..runtime.debug_dump import dump_graph
    return dump_graph(directory, graph.name, graph.origin, files)


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
