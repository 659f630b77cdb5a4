"""Backend `triton`: prims → loop IR → fused kernels → Triton (one module per segment) → launches.

The same pass list as `cpp` up to the memory plan, over the Triton `Target`
(`kiln.codegen.triton.TRITON_TARGET`): the same lowering, fusion and plan, hence the same kernels. Then
`codegen` writes one `@triton.jit` kernel per fused group (`kiln.codegen.triton`) and `build` imports the
modules (`kiln.runtime.tritonlib`) and generates the Python wrapper, which allocates on the inputs' device
with the same memory plan and launches the kernels with the tensors themselves.

CUDA tensors compile for the GPU. CPU tensors run through Triton's interpreter when `TRITON_INTERPRET=1`
is set (correctness only: that is how the tests check this backend without a GPU); otherwise, or when
triton is not installed, the graph runs with torch, counted (`triton: graphs run with torch`) and
explained. `mode="max-autotune"` times each kernel's candidate launch configurations once and keeps the
fastest next to the kernel cache (`kiln.backends.triton_tune`).
"""
from __future__ import annotations

import time
from typing import Any, Callable

import torch

from .. import config
from ..codegen.triton import TRITON_TARGET, launch_config, segment_source
from ..codegen.wrapper import wrapper_source
from ..counters import counters
from ..graph import Graph, flatten, run, to_prims, verify
from ..graph.pipeline import CompileContext, CompileState, Pass, run_pipeline
from ..schedule.memory import Segment
from . import register_backend
from .cpp import PASSES as CPP_PASSES, CompiledGraph, _dump, log_code, log_schedule
from .cpp_passes import wrapper_text

log = config.channel("kernels")


def _device(example_inputs: list) -> torch.device:
    devices = {t.device for t in flatten(example_inputs) if isinstance(t, torch.Tensor)}
    if len(devices) > 1:
        raise NotImplementedError(f"triton backend: inputs on several devices {sorted(map(str, devices))}")
    return devices.pop() if devices else torch.device("cpu")


def _to_prims(state: CompileState, ctx: CompileContext) -> None:
    from ..runtime import tritonlib
    device = _device(state.example_inputs)
    if device.type == "cpu" and not tritonlib.interpreting():
        raise NotImplementedError("triton backend: CPU tensors run only under Triton's interpreter "
                                  "(TRITON_INTERPRET=1)")
    if device.type not in ("cpu", "cuda"):
        raise NotImplementedError(f"triton backend: inputs on {device}")
    state.device = device
    state.prim_graph = to_prims(state.graph)


def _mode(state: CompileState) -> str:
    return "interpret" if state.device.type == "cpu" else "device"


def _codegen(state: CompileState, ctx: CompileContext) -> None:
    loop, segments = state.loop, {}
    tile = ctx.flag("triton_tile")
    for step in state.plan.steps:
        if isinstance(step.node, Segment):
            seg = step.node
            segments[seg.name] = segment_source(f"kiln_{seg.name}", seg.groups, seg.args, loop.buffers,
                                                seg.aliases, _mode(state), tile)
    state.segments = segments
    state.cpp_source = "\n\n\n".join(s.source for s in segments.values())


def _build(state: CompileState, ctx: CompileContext) -> None:
    from ..runtime import tritonlib
    graph = state.graph
    entries = {}
    state.module_paths = []
    for step in state.plan.steps:
        if isinstance(step.node, Segment):
            seg = state.segments[step.node.name]
            module = tritonlib.load_module(seg.source)
            if ctx.mode in ("max-autotune", "max-autotune-no-cudagraphs"):
                from .triton_tune import tuned_source
                source = tuned_source(step.node, seg, module, state.loop, state.device, _mode(state))
                if source is not None:
                    module = tritonlib.load_module(source)
            entries[step.node.name] = getattr(module, seg.name)
            state.module_paths.append(module.__file__)

    def fallback(*inputs: Any) -> Any:
        counters["triton"]["input layout changed: ran the graph with torch"] += 1
        return run(graph, inputs, torch_level=True)
    state.wrapper_source, env = wrapper_source(state.loop, state.plan, entries, fallback, device=state.device,
                                               tensor_args=True, pool=ctx.flag("pool_buffers"))
    exec(compile(state.wrapper_source, f"<kiln triton wrapper {graph.name}>", "exec"), env)
    state.call = env["kiln_call"]


def _verify_prims(state: CompileState) -> None:
    verify(state.prim_graph, after="to_prims")


PASSES = [Pass("to_prims", _to_prims, CPP_PASSES[0].printer, _verify_prims)] + \
    [p for p in CPP_PASSES if p.name in ("dce", "cse", "lower", "fold_bias", "fuse", "order", "plan")] + \
    [Pass("codegen", _codegen), Pass("build", _build, wrapper_text)]


def compile_graph(graph: Graph, example_inputs: list, context: CompileContext | None = None,
                  passes: list[Pass] | None = None) -> CompiledGraph:
    """Compile a torch-level (or prim) graph to Triton kernels; raises on anything it cannot handle."""
    context = context or CompileContext()
    start = time.perf_counter()
    debug_dir = context.flag("debug_dir")
    state = run_pipeline(f"triton {graph.name}", passes or PASSES,
                         CompileState(graph, example_inputs, TRITON_TARGET), context, dump=bool(debug_dir))
    log_schedule("triton", graph.name, state.schedule, time.perf_counter() - start)
    dumped = None
    if debug_dir:
        files = {f"{i:02d}_{r.name}.py": r.dump for i, r in enumerate(state.records) if r.dump is not None}
        files["kernels_triton.py"] = state.cpp_source
        dumped = _dump(debug_dir, graph, files)
    log_code("triton", graph.name, state.module_paths, dumped, state.cpp_source, state.wrapper_source)
    counters["triton"]["graphs compiled"] += 1
    compiled = CompiledGraph(graph, state.loop, state.schedule, state.plan, state.cpp_source,
                             state.wrapper_source, state.call, state.records)
    compiled.segments = state.segments
    compiled.device = state.device
    return compiled


def interpreting() -> bool:
    """Triton runs kernels on its interpreter here (TRITON_INTERPRET=1)."""
    from ..runtime import tritonlib
    return tritonlib.interpreting()


def load_module(source: str) -> Any:
    from ..runtime import tritonlib
    return tritonlib.load_module(source)


def compile_check_in_subprocess(jobs: list[dict], arch: int = 90, timeout: float = 600) -> list[str]:
    """`kiln.runtime.tritonlib.compile_check_in_subprocess`: compile kernels for a GPU without one."""
    from ..runtime import tritonlib
    return tritonlib.compile_check_in_subprocess(jobs, arch, timeout)


def launch_configs(compiled: CompiledGraph) -> dict[str, dict]:
    """Each kernel's launch configuration (XBLOCK, RBLOCK, num_warps, grid) as the heuristic picks it."""
    mode = "interpret" if compiled.device.type == "cpu" else "device"
    return {k.name: launch_config(k, mode, config.get("triton_tile"))
            for seg in compiled.segments.values() for k in seg.kernels}


@register_backend("triton")
def triton(graph: Graph, example_inputs: list, context: CompileContext | None = None) -> Callable[..., Any]:
    """Compile the graph to Triton kernels; on failure run it with torch (or raise when the compile asks)."""
    from .aot import compile_or_run_with_torch

    def installed() -> None:
        try:
            import triton as _  # noqa: F401
        except ImportError:
            raise NotImplementedError("triton backend: triton is not installed") from None
    return compile_or_run_with_torch("triton", graph, example_inputs, context, compile_graph, log, installed)
