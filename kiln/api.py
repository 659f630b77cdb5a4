"""The public API: kiln.compile, kiln.explain, kiln.check, kiln.reset, kiln.register_backend,
kiln.GraphBreakError.

    model = kiln.compile(model)                 # an nn.Module: a wrapper whose forward is compiled
    fn = kiln.compile(fn, backend="eager")      # a function or bound method
    @kiln.compile                               # a decorator, with or without arguments
    print(kiln.explain(fn, *args))              # graphs, breaks with reasons and lines, guards
    report = kiln.check(fn, *args)              # each compiled kernel against the fp64 reference
"""
from __future__ import annotations

import sys
import types
from typing import Any

import torch

from .backends import compiler_for, register_backend
from .backends.ddp import BucketSplitCompiler
from .capture import cache as _cache
from .capture.cache import CompiledFunction, recording, warn_once
from .capture.dynamic import mark_dynamic, mark_static  # noqa: F401  (kiln.mark_dynamic, kiln.mark_static)
from .capture.entry import NO_SELF
from .optim import CompiledOptimizerStep, is_optimizer_step
from .runtime import code_cache  # noqa: F401  (installs the capture's disk memo, kiln.graph.memo)
from .wrapping import _ABSENT, ForwardRoute, RoutedMethod, WrappedModule
from .capture.errors import GraphBreakError
from .capture.guards import hooks_present, listed
from .capture.disabled import disable, disabled_by, module_disabled_by  # noqa: F401  (kiln.disable)
from .counters import counters
from .distributed import CompiledDDP, CompiledFSDP, is_ddp, is_fsdp
from .tensor_parallel import CompiledTP, is_tp, plan_of
from .counters import reset as _reset_counters
from .graph.pipeline import FUEL, CompileContext
from . import tracing

if tracing.trace_directory() is not None:  # KILN_TRACE_DIR: the compile report is written at exit
    tracing.write_at_exit()

__all__ = ["compile", "explain", "check", "report", "reset", "register_backend", "GraphBreakError", "CompiledModule",
           "ExplainReport"]

_SUPPORTED_PYTHONS = ((3, 11), (3, 12), (3, 13), (3, 14))  # (kiln.CAPTURE_PYTHONS)


def compile(model: Any = None, *, backend: Any = "auto", fullgraph: bool = False, dynamic: Any = None,
            mode: str | None = None, options: dict | None = None, disable: bool = False) -> Any:
    """Compile a function, bound method or nn.Module (torch.compile's signature and conventions).

    Returns a callable computing the same results: graphs of torch operations are captured from the
    bytecode, guarded, and run by `backend` ("auto", "eager", "prims", or any callable
    `(graph, example_inputs) -> callable`). Without `model` it returns a decorator.
    """
    if model is None:
        def decorate(fn: Any) -> Any:
            return compile(fn, backend=backend, fullgraph=fullgraph, dynamic=dynamic, mode=mode,
                           options=options, disable=disable)
        return decorate
    if is_ddp(model):
        # DDP's forward runs eagerly around its module's compiled forward, cut at the gradient buckets
        if disable:
            return model
        return CompiledDDP(model, backend=backend, fullgraph=fullgraph, dynamic=dynamic, mode=mode,
                           options=options)
    if isinstance(model, torch.nn.Module) and any(is_fsdp(m) for m in model.modules()):
        # FSDP2: each sharded module's forward compiled, FSDP's hooks eager around it
        if disable:
            return model
        return CompiledFSDP(model, backend=backend, fullgraph=fullgraph, dynamic=dynamic, mode=mode,
                            options=options)
    if is_tp(model) and not disable:
        # tensor parallel: the model compiled over this rank's shards, the layouts' collectives in the graph
        plan, why = plan_of(model)
        if plan:
            return CompiledTP(model, plan, backend=backend, fullgraph=fullgraph, dynamic=dynamic, mode=mode,
                              options=options)
        warn_once(f"tp-plan:{id(model)}", f"kiln.compile: this parallelized model compiles as a plain module "
                  f"(its parallelized modules' hooks break the graph): {why}")
    if isinstance(model, torch.nn.Module):
        if disable or module_disabled_by(model) is not None:
            return model
        return CompiledModule(model, backend=backend, fullgraph=fullgraph, dynamic=dynamic, mode=mode,
                              options=options)
    if not callable(model):
        raise TypeError(f"kiln.compile expects a function, method or nn.Module, got a "
                        f"{type(model).__name__} ({model!r:.60})")
    if disable or disabled_by(model) is not None:  # (kiln.disable, torch.compiler.disable: runs as it is)
        return model
    if sys.version_info[:2] not in _SUPPORTED_PYTHONS:
        versions = ", ".join(f"{a}.{b}" for a, b in _SUPPORTED_PYTHONS)
        warn_once("python", f"kiln captures CPython {versions} bytecode; "
                  f"on Python {sys.version_info[0]}.{sys.version_info[1]} compiled code runs eagerly")
        return model
    if is_optimizer_step(model):  # opt.step of SGD/Adam/AdamW: one fused update (kiln.optim)
        return CompiledOptimizerStep(model, lambda f: compile(f, backend=backend, fullgraph=fullgraph,
                                                              dynamic=dynamic, mode=mode, options=options))
    context = CompileContext.from_compile(mode=mode, dynamic=dynamic, fullgraph=fullgraph, options=options,
                                          backend=backend if isinstance(backend, str) else None)
    compiler = compiler_for(backend, context)
    fn, bound_self = _unwrap(model)
    if fn is None:
        warn_once(f"c:{id(model)}", f"kiln.compile: {getattr(model, '__qualname__', model)!r} is not Python "
                  "code kiln can capture (a C function or builtin); it runs eagerly")
        return model
    flags = fn.__code__.co_flags
    if flags & (0x20 | 0x80 | 0x100 | 0x200):
        kind = "a generator" if flags & 0x20 else "a coroutine or async generator"
        warn_once(f"gen:{id(fn)}", f"kiln.compile: {fn.__qualname__} is {kind} function; it runs eagerly")
        return model
    return CompiledFunction(fn, compiler, fullgraph=fullgraph, raise_on_error=context.raise_on_error,
                            bound_self=bound_self, dynamic=dynamic)


def _unwrap(model: Any) -> tuple[types.FunctionType | None, Any]:
    if isinstance(model, CompiledFunction):
        return model.fn, model.bound_self
    if isinstance(model, types.FunctionType):
        return model, NO_SELF
    if isinstance(model, types.MethodType) and isinstance(model.__func__, types.FunctionType):
        return model.__func__, model.__self__
    if isinstance(model, type):
        return None, NO_SELF
    call = getattr(type(model), "__call__", None)
    if isinstance(call, types.FunctionType):
        return call, model
    return None, NO_SELF


class CompiledModule(WrappedModule):
    """Wraps an nn.Module: calls run the original module's hooks and a compiled `forward`; parameters,
    buffers, state_dict, train()/eval() and attribute access are the original module's.

    The module's own methods read through the wrapper call the compiled forward: `compiled.generate(...)`
    runs Hugging Face's generate with its prefill and decode steps compiled (`RoutedMethod`), while
    `module.generate(...)` and `module(...)` on the original stay eager."""

    def __init__(self, module: torch.nn.Module, backend: Any = "auto", fullgraph: bool = False,
                 dynamic: Any = None, mode: str | None = None, options: dict | None = None):
        super().__init__()
        self._wrap(module)
        object.__setattr__(self, "_settings", dict(backend=backend, fullgraph=fullgraph, dynamic=dynamic,
                                                   mode=mode, options=options))
        self._compile_forward()

    def _compile_forward(self) -> None:
        """Compile the module's forward as it is now: its class's, or one assigned to the instance."""
        mod = self._orig_mod
        object.__setattr__(self, "_forward_source", vars(mod).get("forward", _ABSENT))
        object.__setattr__(self, "_compiled_forward", compile(mod.forward, **self._settings))
        object.__setattr__(self, "_route", ForwardRoute(mod, self._compiled_forward))

    def _check_forward(self) -> None:
        """`module.forward = fn` after compiling (a patch, a wrapper) replaces what calls run, as in eager."""
        own = vars(self._orig_mod).get("forward", _ABSENT)
        if own is not self._forward_source and own is not self._compiled_forward:  # (routed: the compiled)
            self._compile_forward()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        mod = self._orig_mod
        self._check_forward()
        if not hooks_present(mod):  # (checked on every call: nothing to guard)
            return self._compiled_forward(*args, **kwargs)
        with self._route:  # the hooks run eagerly around the compiled forward
            return mod(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        mod = object.__getattribute__(self, "_orig_mod")
        value = getattr(mod, name)
        if isinstance(value, types.MethodType) and value.__self__ is mod:
            return RoutedMethod(value, self._route, self, _method_defaults(mod, name))
        return value

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._check_forward()
        return self._compiled_forward(*args, **kwargs)


def _method_defaults(module: torch.nn.Module, name: str) -> dict:
    """Keyword arguments a routed method gets unless its caller passes them. Hugging Face's generate
    torch.compiles the decode step by itself on GPUs when the cache is static; kiln compiles that forward
    already, and torch.compile over kiln's compiled function would trace kiln's own Python, so it is off
    (`disable_compile=True`) unless the caller passes `disable_compile`."""
    if name == "generate" and hasattr(getattr(module, "generation_config", None), "disable_compile"):
        return {"disable_compile": True}
    return {}


def report(path: str | None = None) -> str:
    """Write the compile report: one static HTML page of what this process captured and compiled since
    kiln was imported (or since kiln.reset()) — captures, graphs with their source lines, graph breaks with
    reasons and hints, recompiles and guards, each compile's passes with their times, kernels, profiles.
    Returns its path: `path`, else KILN_TRACE_DIR/kiln_report_<pid>.html, else ./kiln_report_<pid>.html.
    Kernels name the user lines fused into them when the process runs with KILN_TRACE_DIR set (or the
    `trace_dir` flag is set while compiling: `kiln.config.patch(trace_dir=dir)`)."""
    return tracing.write_report(path)


def reset() -> None:
    """Forget every captured graph and the counters, and free the buffers compiled graphs keep across calls;
    compiled functions capture again when called."""
    from .codegen.wrapper_runtime import release_pools
    _cache.reset()
    _reset_counters()
    tracing.TRACE.clear()
    FUEL.reset()
    release_pools()


class ExplainReport:
    """What kiln.explain found: graphs, breaks (reason, file:line, source line, hint), ops, guards.

    `repr(report)` is a short summary (what a REPL shows); `str(report)` / `print(report)` is the full
    text with each capture's guards folded to a count; `report.format(guards=True)` lists them,
    `report.guards_text()` only them."""

    def __init__(self, graphs: list, breaks: list, guards: list[list[str]], ops: list[dict[str, int]],
                 fallbacks: list[dict[str, int]]):
        self.graphs = graphs
        self.breaks = breaks
        self.guards = guards
        self.ops_per_graph = ops
        self.fallbacks = fallbacks
        self.capture_errors: list = []   # internal errors that made a frame run eagerly (CaptureErrorRecord)
        self.capture_names: list[str] = []  # the frame each capture (and its guards) belongs to
        self.recompiles: list[str] = []  # "name: the guard that failed", in the explain call

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def graph_break_count(self) -> int:
        return len(self.breaks)

    @property
    def frames_run_natively(self) -> list[str]:
        """Frames that run natively (a break kiln could not resume); their callees are still captured."""
        return [b.native_frame for b in self.breaks if getattr(b, "native_frame", None)]

    def _headline(self) -> str:
        errors = getattr(self, "capture_errors", ())
        return (f"kiln.explain: {self.graph_count} graph(s), {self.graph_break_count} graph break(s)"
                + (f", {len(errors)} capture error(s)" if errors else ""))

    def __repr__(self) -> str:
        natively = len(self.frames_run_natively) + len(getattr(self, "native_callees", ()))
        counts = (f"{natively} frame(s) run natively, {len(getattr(self, 'capture_errors', ()))} capture "
                  f"error(s), {len(getattr(self, 'recompiles', ()))} recompile(s), "
                  f"{sum(len(g) for g in self.guards)} guard(s)")
        return (f"<{self._headline()}\n  {counts}\n  print(report) for the breaks, ops and guard counts; "
                f"report.format(guards=True) lists the guards>")

    def __str__(self) -> str:
        return self.format()

    def guards_text(self) -> str:
        """Every capture's guards, one per line, headed by the capture's frame."""
        lines: list[str] = []
        for i, guards in enumerate(self.guards):
            lines.append(f"guards of capture {i + 1}{self._capture_name(i)}:")
            lines.extend(f"  {g}" for g in guards)
        return "\n".join(lines)

    def _capture_name(self, i: int) -> str:
        names = getattr(self, "capture_names", ())
        return f" ({names[i]})" if i < len(names) else ""

    def format(self, guards: bool = False) -> str:
        """The full report; `guards=True` lists every guard instead of a count per capture."""
        errors = getattr(self, "capture_errors", ())
        lines = [self._headline()]
        for i, error in enumerate(errors):
            # an internal error of kiln: the frame (and every frame it calls) runs eagerly
            lines.append(f"  capture error {i + 1}: {error.frame} runs eagerly, its capture failed with "
                         f"{error.error}")
            if error.lineno:
                lines.append(f"      at {error.location}: {error.source_line}")
            lines.append("      (an internal error of kiln: please report it; "
                         "options={'raise_on_error': True} raises it)")
        for i, brk in enumerate(self.breaks):
            lines.append(f"  break {i + 1}: {brk.location}: {brk.reason}")
            if brk.source_line:
                lines.append(f"      {brk.source_line}")
            if brk.hint:
                lines.append(f"      hint: {brk.hint}")
        for frame in self.frames_run_natively:
            lines.append(f"  frame run natively (its calls are still captured): {frame}")
        for callee in getattr(self, "native_callees", ()):
            lines.append(f"  callee run natively: {callee}")
        for recompile in getattr(self, "recompiles", ()):
            lines.append(f"  recompiled {recompile}")
        for i, ops in enumerate(self.ops_per_graph):
            total = sum(ops.values())
            detail = ", ".join(f"{k} x{v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:8])
            lines.append(f"  graph {i + 1}: {total} ops ({detail})")
            collectives = [f"{k} x{v}" for k, v in ops.items() if k.startswith("torch.ops.kiln_tp.")]
            if collectives:  # communication inside the graph: always named (tensor parallel's all-reduces)
                lines.append(f"    collectives in graph {i + 1}: {', '.join(collectives)}")
        if guards:
            lines.extend("  " + line for line in self.guards_text().splitlines())
        else:
            for i, listed in enumerate(self.guards):
                lines.append(f"  guards of capture {i + 1}{self._capture_name(i)}: {len(listed)}"
                             + (" (report.format(guards=True) lists them)" if i == 0 else ""))
        for i, symbols in enumerate(getattr(self, "symbols", ())):
            if symbols:
                lines.append(f"  symbolic sizes of capture {i + 1} (symbol = where it is read, then the facts "
                             "guarded):")
                lines.extend(f"    {s}" for s in symbols)
                lines.append("    (the cpp backend compiles the graph once for every size, on its second call, "
                             "kernels taking the sizes as arguments: kiln.counters['dynamic_symbolic_compiles']; "
                             "where it cannot, the reason is in ['dynamic_symbolic_failed'] and sizes compile "
                             "one by one: a size's first call runs with torch, its next compiles it, up to "
                             "KILN_DYNAMIC_SIZE_LIMIT sizes, counted in ['dynamic_torch_calls'] and "
                             "['dynamic_backend_compiles'])")
        for split in getattr(self, "ddp_splits", ()):
            lines.append(f"  {split}")
        return "\n".join(lines)


def _python_code(fn_or_module: Any, caller: str) -> tuple[types.FunctionType, Any]:
    """The Python function to capture afresh, and its bound self, behind a module or compiled function."""
    if isinstance(fn_or_module, CompiledDDP) or is_ddp(fn_or_module):
        fn_or_module = fn_or_module.module  # DDP's own forward runs eagerly: the module it wraps
    if isinstance(fn_or_module, (CompiledFSDP, CompiledTP)):
        fn_or_module = fn_or_module._orig_mod
    target = fn_or_module._orig_mod if isinstance(fn_or_module, CompiledModule) else fn_or_module
    if isinstance(target, CompiledFunction):
        target = target.fn if target.bound_self is NO_SELF else types.MethodType(target.fn,
                                                                                 target.bound_self)
    callee = target.forward if isinstance(target, torch.nn.Module) else target
    fn, bound_self = _unwrap(callee)
    if fn is None:
        raise TypeError(f"{caller} expects Python code, got {fn_or_module!r:.60}")
    return fn, bound_self


def check(fn_or_module: Any, *args: Any, tol: float | None = None, **kwargs: Any) -> Any:
    """Numerics report: call `fn_or_module(*args, **kwargs)` once, captured afresh and compiled by the cpp
    backend, and check each compiled kernel on its own inputs against the float64 reference by the accuracy
    rule (`kiln.numerics`). Returns a `NumericsReport`; `report.first_bad` is the first kernel outside the
    rule (None when all are within it), printed with the user lines lowered into it."""
    from .numerics import check_function
    from .testing.tolerance import MODEL_TOL
    fn, bound_self = _python_code(fn_or_module, "kiln.check")
    return check_function(fn, bound_self, args, kwargs, MODEL_TOL if tol is None else tol)


def explain(fn_or_module: Any, *args: Any, **kwargs: Any) -> ExplainReport:
    """Run `fn_or_module(*args, **kwargs)` once under capture with the eager backend, and return a report
    of every frame it captured: the top frame, its resume functions after each graph break, and callees
    captured as their own frames (graphs, breaks with reason, file:line, source line and hint, ops per
    graph, guards). The call runs for real, side effects included. It prints nothing: a REPL shows the
    report's short repr, `print(report)` the full text (guards counted), `report.format(guards=True)` the
    guards too. A method of a compiled module (`kiln.explain(compiled.generate, ids)`) runs as it is,
    and the report shows what its calls of the module's forward captured."""
    routed = fn_or_module if isinstance(fn_or_module, RoutedMethod) else None
    if routed is not None:
        fn_or_module = routed.owner
    if is_tp(fn_or_module) and not isinstance(fn_or_module, WrappedModule):
        # a parallelized model: explained as kiln.compile runs it, over its shards
        plan, _ = plan_of(fn_or_module)
        fn_or_module = CompiledTP(fn_or_module, plan, backend="eager") if plan else fn_or_module
    fn, bound_self = _python_code(fn_or_module, "kiln.explain")
    # a DDP module: its module's graphs cut at the gradient buckets, as kiln.compile(ddp) cuts them
    splitter = (BucketSplitCompiler(compiler_for("eager"), getattr(fn_or_module, "_orig_mod", fn_or_module))
                if isinstance(fn_or_module, CompiledDDP) or is_ddp(fn_or_module) else None)
    # a private cache (family) so that the report sees fresh captures of every frame; a compiled function's
    # dynamic setting and the dims automatic dynamic made symbolic carry over
    original = fn_or_module._compiled_forward if isinstance(fn_or_module, CompiledModule) else fn_or_module
    dynamic = original.dynamic if isinstance(original, CompiledFunction) else None
    compiled = CompiledFunction(fn, splitter or compiler_for("eager"), bound_self=bound_self, family=object(),
                                dynamic=dynamic)
    if isinstance(original, CompiledFunction):
        compiled.cache.dynamic_dims |= original.cache.dynamic_dims
    before = dict(counters["callees_run_natively"])
    recompiles_before = dict(counters["recompiles"])
    # through the model: FSDP's hooks around each forward; a TP model over its shards, as it runs compiled
    if isinstance(fn_or_module, (CompiledFSDP, CompiledTP)):
        compiled = fn_or_module.calling_with(lambda m: CompiledFunction(type(m).forward, compiler_for("eager"),
                                                                        bound_self=m, family=object()))
    if routed is not None:  # the method itself, its forward calls routed to the fresh capture
        compiled = RoutedMethod(routed.__wrapped__, ForwardRoute(routed.__self__, compiled), routed.owner,
                                routed.defaults)
    with recording() as recorded:
        compiled(*args, **kwargs)
    native_callees = [k for k, v in counters["callees_run_natively"].items() if v > before.get(k, 0)]
    recompiles = [key for key, count in counters["recompiles"].items()
                  for _ in range(count - recompiles_before.get(key, 0))]
    graphs, breaks, guards, ops, fallbacks, symbols, custom_ops = [], [], [], [], [], [], []
    names = []
    for entry in recorded.entries:
        guards.append(listed(entry.guards))
        names.append(entry.name)
        symbols.append(entry.symbols)
        if entry.brk is not None:
            breaks.append(entry.brk)
        if entry.graph is not None and entry.ops:
            graphs.append(entry.graph)
            ops.append(entry.ops)
            fallbacks.append({n.target_name(): 1 for n in entry.graph.fallbacks()
                              if n.target is not torch._C._set_grad_enabled and not n.is_custom_op})
            custom_ops.append({n.target_name(): 1 for n in entry.graph.fallbacks() if n.is_custom_op})
    report = ExplainReport(graphs, breaks, guards, ops, fallbacks)
    report.custom_ops = custom_ops   # per graph: torch.library operators run as externs (not fallbacks)
    report.symbols = symbols
    report.native_callees = native_callees
    report.ddp_splits = splitter.splits if splitter is not None else []
    report.capture_errors = recorded.errors
    report.capture_names = names
    report.recompiles = recompiles
    return report
