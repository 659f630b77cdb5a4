"""Backend `cpp`: prims → loop IR → fused kernels → C++ (OpenMP, SIMD) → one shared object per graph.

`compile_graph(graph, example_inputs)` returns a `CompiledGraph` (its loop IR, schedule, plan, C++ and
wrapper source are kept for tests and dumps). The registered backend falls back to running the graph with
torch when the graph cannot be compiled (no compiler, an unsupported dtype, an internal error) — with a
warning, or raising when `raise_on_error` is set. Inputs whose strides, shapes or dtypes differ from the
examples run on the fallback too: the kernels bake the examples' layouts into their index arithmetic.
"""
from __future__ import annotations

import hashlib
import logging
import os
import time
import warnings
from typing import Any, Callable

import torch

from .. import config
from ..counters import counters
from ..graph import Graph, flatten, run, to_prims
from ..lower import lower
from ..lower.ir import LoopGraph
from ..lower.patterns import fold_bias_into_mm
from ..schedule.fusion import FusedGroup, fuse
from ..schedule.memory import Plan, Segment, plan
from ..schedule.order import order
from . import register_backend

log = config.channel("kernels")
fusion_log = config.channel("fusion")


class CompiledGraph:
    """A graph compiled by the cpp backend; call it with the graph's inputs."""

    def __init__(self, graph: Graph, loop: LoopGraph, schedule: list, memory: Plan, cpp_source: str,
                 wrapper: str, call: Callable[..., Any]):
        self.graph = graph
        self.loop = loop
        self.schedule = schedule
        self.plan = memory
        self.cpp_source = cpp_source
        self.wrapper_source = wrapper
        self.call = call

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


def compile_graph(graph: Graph, example_inputs: list) -> CompiledGraph:
    """Compile a torch-level (or prim) graph for CPU tensors; raises on anything it cannot handle."""
    from ..codegen.cpp import segment_source
    from ..codegen.header import header_for
    from ..codegen.wrapper import load_entry, wrapper_source
    from ..runtime import build

    start = time.perf_counter()
    for t in flatten(example_inputs):
        if isinstance(t, torch.Tensor) and t.device.type != "cpu":
            raise NotImplementedError(f"cpp backend: input on {t.device}")
    prim_graph = to_prims(graph)
    loop = lower(prim_graph)
    fold_bias_into_mm(loop)
    # Printing loop IR is slow (sympy): only for a debug dump or the fusion log.
    dump = bool(config.get("debug_dir"))
    explain = fusion_log.isEnabledFor(logging.DEBUG)
    before = loop.describe(f"loop IR of {graph.name} before fusion") if dump else ""
    schedule = order(loop, fuse(loop))
    memory = plan(loop, schedule)
    parts = []
    for step in memory.steps:
        if isinstance(step.node, Segment):
            parts.append(segment_source(f"kiln_{step.node.name}", step.node.groups, step.node.args,
                                        loop.buffers, step.node.aliases))
    source = "\n".join([header_for("\n".join(parts))] + parts) + "\n"
    lib = build(source) if parts else None
    entries = {}
    for step in memory.steps:
        if isinstance(step.node, Segment):
            entries[step.node.name] = load_entry(lib, f"kiln_{step.node.name}", len(step.node.args))

    def fallback(*inputs: Any) -> Any:
        counters["cpp"]["input layout changed: ran the graph with torch"] += 1
        return run(graph, inputs, torch_level=True)
    wrapper, env = wrapper_source(loop, memory, entries, fallback)
    code = compile(wrapper, f"<kiln cpp wrapper {graph.name}>", "exec")
    exec(code, env)
    call = env["kiln_call"]
    if dump or explain:
        after = "\n".join([f"# loop IR of {graph.name} after fusion"] +
                          [s.describe() for s in schedule])
        fusion_log.debug("%s: %d kernels, %d externs/fallbacks\n%s", graph.name,
                         sum(isinstance(s, FusedGroup) for s in schedule),
                         sum(not isinstance(s, FusedGroup) for s in schedule), after)
    log.debug("compiled %s in %.3f s", graph.name, time.perf_counter() - start)
    if dump:
        _dump(graph, {"loop_ir_before_fusion.py": before, "loop_ir_after_fusion.py": after + "\n\n" +
                      loop.describe(), "kernels.cpp": source, "wrapper.py": wrapper})
    counters["cpp"]["graphs compiled"] += 1
    return CompiledGraph(graph, loop, schedule, memory, source, wrapper, call)


def _dump(graph: Graph, files: dict[str, str]) -> None:
    directory = config.get("debug_dir")
    if not directory:
        return
    digest = hashlib.sha256(files["kernels.cpp"].encode() + files["wrapper.py"].encode()).hexdigest()[:10]
    path = os.path.join(directory, f"{graph.name}_{digest}")
    os.makedirs(path, exist_ok=True)
    for name, text in files.items():
        with open(os.path.join(path, name), "w") as f:
            f.write(text)


@register_backend("cpp")
def cpp(graph: Graph, example_inputs: list) -> Callable[..., Any]:
    """Compile the graph to C++ kernels; on failure run it with torch (or raise with `raise_on_error`)."""
    needs_grad = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in flatten(example_inputs))
    try:
        if needs_grad:
            raise NotImplementedError("cpp backend: inputs require grad (no autograd through kernels)")
        return compile_graph(graph, example_inputs)
    except Exception as e:
        # NotImplementedError: a graph the backend does not handle (a dtype, a device): not an error
        if config.get("raise_on_error") and not isinstance(e, NotImplementedError):
            raise
        counters["cpp"]["graphs run with torch"] += 1
        if not isinstance(e, NotImplementedError):
            warnings.warn(f"kiln cpp backend could not compile graph {graph.name}, running it with torch: "
                          f"{type(e).__name__}: {e}", stacklevel=2)
        else:
            log.debug("graph %s runs with torch: %s", graph.name, e)

        def run_eager(*inputs: Any) -> Any:
            return run(graph, inputs, torch_level=True)
        return run_eager
