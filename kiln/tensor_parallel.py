"""kiln under tensor parallelism: `kiln.compile(model)` after `parallelize_module(model, mesh, plan)`.

`parallelize_module` with ColwiseParallel/RowwiseParallel replaces each planned Linear's parameters by
DTensors (a shard per rank) and installs hooks around its forward: the input becomes a DTensor
(`from_local`), the output is redistributed to the planned layout and made local again (`to_local`). kiln
captures neither DTensors nor module hooks, so eagerly each such Linear broke the graph (a 2-block SwiGLU MLP
ran in pieces between six hooked Linears).

`CompiledTP` compiles the model per rank over the local shards instead. Each parallelized Linear is, for one
call, written as what DTensor computes on this rank:

    ColwiseParallel (Replicate in, Shard(-1) out):  linear(grad_all_reduce(x), w_shard, b_shard)
    RowwiseParallel (Shard(-1) in, Replicate out):  all_reduce(linear(x, w_shard)) + b

with the hooks set aside and the DTensor parameters seen through "shard parameters": plain Parameters over
the same memory as each DTensor's local tensor (so optimizer steps on the DTensors are seen), whose
gradients go to the DTensor parameter's `.grad` with its placements as autograd accumulates them. The
collectives are `torch.ops.kiln_tp` operators (kiln.ops.collectives): nodes of the captured graph, run by
the compiled wrapper between kiln's kernels in the graph's order, the same on every rank; the backward
graph holds the gradients' all-reduces. What is not one of these layouts (another ParallelStyle, an
Embedding, SequenceParallel, a module with other hooks, a DTensor parameter outside the plan) keeps the
model on kiln's ordinary path, where a hooked module is a graph break named by kiln.explain (never a
computation in the wrong layout); `plan_of` says why.
"""
from __future__ import annotations

import functools
import sys
import types
import weakref
from collections import OrderedDict
from typing import Any, Callable

import torch
import torch.nn.functional as F

from .backends import compiler_for
from .capture.cache import CompiledFunction, warn_once
from .counters import counters
from .graph.pipeline import CompileContext
from .wrapping import WrappedModule
from . import CAPTURE_PYTHONS

__all__ = ["CompiledTP", "is_tp", "plan_of"]

_MISSING = object()
_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_forward_pre_hooks_with_kwargs",
               "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_backward_hooks",
               "_backward_pre_hooks")


def _dtensor_type() -> Any:
    # as kiln.distributed's checks: a DTensor exists only once its module is imported, never import it here
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


def is_tp(model: Any) -> bool:
    """`model` (an nn.Module) has DTensor parameters (parallelize_module, distribute_module)."""
    dtensor = _dtensor_type()
    return dtensor is not None and isinstance(model, torch.nn.Module) and \
        any(isinstance(p, dtensor) for p in model.parameters())


class ShardLinear:
    """One parallelized Linear as its rank computes it (`style` "colwise" or "rowwise"), over shard
    parameters that share memory with the module's DTensor parameters. `forward` replaces the module's for a
    call of the compiled model; capture inlines it."""

    def __init__(self, module: torch.nn.Linear, style: str, group_name: str):
        self.module = module
        self.style = style
        self.group_name = group_name
        self.weight = self.bias = None
        self._sources: dict[str, Any] = {}
        self.refresh()

    def _shard_parameter(self, name: str) -> Any:
        dtensor = self.module._parameters.get(name)
        if dtensor is None:
            return None
        local = dtensor._local_tensor
        shard = torch.nn.Parameter(local.detach(), requires_grad=dtensor.requires_grad)
        ref = weakref.ref(dtensor)
        mesh, placements = dtensor.device_mesh, dtensor.placements

        def to_dtensor_grad(param: torch.Tensor) -> None:
            # the shard's gradient is the DTensor's local gradient (eager TP computes the same one locally)
            grad, param.grad = param.grad, None
            owner = ref()
            if owner is None or grad is None:
                return
            sharded = type(owner).from_local(grad, mesh, placements, run_check=False,
                                             shape=owner.shape, stride=owner.stride())
            owner.grad = sharded if owner.grad is None else owner.grad + sharded
        shard.register_post_accumulate_grad_hook(to_dtensor_grad)
        self._sources[name] = (dtensor, local, local.data_ptr(), dtensor.requires_grad)
        return shard

    def current(self) -> bool:
        """The shard parameters still alias the module's DTensor parameters (none was replaced)."""
        for name, (dtensor, local, ptr, grad) in self._sources.items():
            now = self.module._parameters.get(name)
            if now is not dtensor or now._local_tensor is not local or local.data_ptr() != ptr or \
                    now.requires_grad != grad:
                return False
        return set(self._sources) == {k for k, v in self.module._parameters.items() if v is not None}

    def refresh(self) -> None:
        self._sources = {}
        self.weight = self._shard_parameter("weight")
        self.bias = self._shard_parameter("bias")

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # nn.Linear.forward's signature
        if self.style == "colwise":  # the replicated input's gradient is a partial sum on each rank
            replicated = torch.ops.kiln_tp.grad_all_reduce(input, self.group_name)
            return F.linear(replicated, self.weight, self.bias)
        y = torch.ops.kiln_tp.all_reduce(F.linear(input, self.weight), self.group_name)  # Partial -> Replicate
        return y if self.bias is None else y + self.bias


def _style_of(module: torch.nn.Module) -> tuple[str | None, str, Any]:
    """(style, why not, mesh) of a module parallelize_module prepared: its hooks' input/output functions."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    pre = list(module._forward_pre_hooks.values())
    post = list(module._forward_hooks.values())
    others = [name for name in _HOOK_DICTS[2:] if getattr(module, name, None)]
    if len(pre) != 1 or len(post) != 1 or others:
        return None, "it has hooks other than one input and one output function of parallelize_module", None
    found = []
    for hook, kind in ((pre[0], "input_fn"), (post[0], "output_fn")):
        code = getattr(hook, "__code__", None)
        if getattr(hook, "__qualname__", "") != "distribute_module.<locals>.<lambda>" or code is None:
            return None, f"hook {getattr(hook, '__qualname__', hook)!r} is not parallelize_module's", None
        cells = dict(zip(code.co_freevars, (c.cell_contents for c in hook.__closure__ or ())))
        fn, mesh = cells.get(kind), cells.get("device_mesh")
        if not isinstance(fn, functools.partial) or mesh is None:
            return None, f"its {kind} is not a ParallelStyle's", None
        found.append((fn.func, fn.args, mesh))
    (input_fn, input_args, mesh), (output_fn, output_args, _) = found
    if mesh.ndim != 1:
        return None, f"its device mesh has {mesh.ndim} dimensions (one is supported)", None
    if not isinstance(module, torch.nn.Linear) or type(module).forward is not torch.nn.Linear.forward:
        return None, f"it is a {type(module).__name__}, not an nn.Linear", None
    replicate, shard_last = (Replicate(),), (Shard(-1),)
    if input_fn is ColwiseParallel._prepare_input_fn and output_fn is ColwiseParallel._prepare_output_fn:
        if input_args == (replicate, replicate) and output_args == (shard_last, True):
            return "colwise", "", mesh
        return None, f"ColwiseParallel with layouts {input_args[0]} -> {output_args[0]} " \
                     f"(use_local_output={output_args[1]})", None
    if input_fn is RowwiseParallel._prepare_input_fn and output_fn is RowwiseParallel._prepare_output_fn:
        if input_args == (shard_last, shard_last) and output_args == (replicate, True):
            return "rowwise", "", mesh
        return None, f"RowwiseParallel with layouts {input_args[0]} -> {output_args[0]} " \
                     f"(use_local_output={output_args[1]})", None
    return None, f"its style ({getattr(input_fn, '__qualname__', input_fn)}) is not ColwiseParallel or " \
                 "RowwiseParallel", None


def _placements_match(module: torch.nn.Module, style: str) -> bool:
    from torch.distributed.tensor import Replicate, Shard
    want = {"weight": (Shard(0),) if style == "colwise" else (Shard(1),),
            "bias": (Shard(0),) if style == "colwise" else (Replicate(),)}
    dtensor = _dtensor_type()
    for name, param in module._parameters.items():
        if param is None:
            continue
        if not isinstance(param, dtensor) or name not in want or tuple(param.placements) != want[name]:
            return False
    return True


def plan_of(model: torch.nn.Module) -> tuple[list[tuple[torch.nn.Module, ShardLinear]], str]:
    """The parallelized Linears of `model` as ShardLinears, and "" — or [] and why kiln cannot compile the
    model over its shards (then it compiles as any module: a hooked module is a graph break)."""
    dtensor = _dtensor_type()
    plan = []
    for name, module in model.named_modules():
        if not any(isinstance(p, dtensor) for p in module._parameters.values()):
            continue  # (a module with hooks of its own and plain parameters: hooks run as kiln runs them)
        if module is model:
            return [], "the model itself is parallelized (only its submodules can be)"
        style, why, mesh = _style_of(module)
        if style is None:
            return [], f"module {name!r}: {why}"
        if not _placements_match(module, style):
            return [], f"module {name!r}: its parameters are not laid out as {style} parallel's"
        if any(isinstance(b, dtensor) for b in module._buffers.values()):
            return [], f"module {name!r} has DTensor buffers"
        plan.append((module, ShardLinear(module, style, mesh.get_group().group_name)))
    return plan, ""


class CompiledTP(WrappedModule):
    """`kiln.compile(model)` for a model parallelize_module prepared with ColwiseParallel/RowwiseParallel:
    the model's forward compiled per rank over the local shards, the layouts' collectives in the graphs.
    Attributes, parameters (the DTensors) and state_dict are the model's own."""

    def __init__(self, model: torch.nn.Module, plan: list, backend: Any = "auto", fullgraph: bool = False,
                 dynamic: Any = None, mode: str | None = None, options: dict | None = None):
        super().__init__()
        self._wrap(model)
        name = backend if isinstance(backend, str) else None
        context = CompileContext.from_compile(mode=mode, dynamic=dynamic, fullgraph=fullgraph,
                                              options=options, backend=name)
        object.__setattr__(self, "_plan", plan)
        object.__setattr__(self, "_empty_hooks", [{k: OrderedDict() for k in _HOOK_DICTS[:2]} for _ in plan])
        forward = type(model).forward
        compiled = None
        if sys.version_info[:2] in CAPTURE_PYTHONS and isinstance(forward, types.FunctionType):
            compiled = CompiledFunction(forward, compiler_for(backend, context), fullgraph=fullgraph,
                                        raise_on_error=context.raise_on_error, bound_self=model)
        else:
            warn_once(f"tp:{id(model)}", "kiln.compile(parallelized model): kiln does not capture this "
                      "Python's bytecode or this forward; the model runs eagerly")
        object.__setattr__(self, "_compiled_forward", compiled)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call_with(self._compiled_forward, args, kwargs)

    def calling_with(self, make: Callable[[torch.nn.Module], Any]) -> Callable[..., Any]:
        """A call of the model over its shards with `make(model)` as its forward (kiln.explain passes a fresh
        capture with the eager backend)."""
        forward = make(self._orig_mod)
        return lambda *args, **kwargs: self._call_with(forward, args, kwargs)

    def _call_with(self, forward: Any, args: tuple, kwargs: dict) -> Any:
        model = self._orig_mod
        dtensor = _dtensor_type()
        if forward is None or any(isinstance(a, dtensor) for a in list(args) + list(kwargs.values())):
            if forward is not None:  # DTensor inputs: the hooks' own layouts apply, eagerly
                counters["tensor_parallel"]["calls run eagerly: DTensor inputs"] += 1
            return model(*args, **kwargs)
        for _, shard in self._plan:
            if not shard.current():
                shard.refresh()  # a parameter was replaced (load_state_dict(assign=True)): new shard views
        saved = []
        for (module, shard), empty in zip(self._plan, self._empty_hooks):
            state = {k: module.__dict__[k] for k in empty}
            saved.append((state, module.__dict__.get("forward", _MISSING)))
            module.__dict__.update(empty)
            module.forward = shard.forward
        model_forward = model.__dict__.get("forward", _MISSING)
        model.forward = forward  # nn.Module.__call__ runs the model's own hooks, then this
        try:
            return model(*args, **kwargs)
        finally:
            _restore(model, model_forward)
            for (module, _), (state, before) in zip(self._plan, saved):
                module.__dict__.update(state)
                _restore(module, before)

    forward = __call__


def _restore(module: torch.nn.Module, forward: Any) -> None:
    if forward is _MISSING:
        del module.forward
    else:
        module.forward = forward
