"""kiln under torch.distributed: `kiln.compile(DDP(model))`.

DDP's own forward is Python bookkeeping around one call of the module it wraps: `_pre_forward` (the
reducer's per-iteration state, buffer broadcast, logging), the call, `_post_forward` (preparing the
reducer for the backward, the `_DDPSink` that finalizes it). Captured, that code breaks the graph and the
frame runs natively anyway, and the wrapped module would run eagerly inside it. So `CompiledDDP` runs
DDP's forward eagerly, untouched, and compiles only the wrapped module's forward, whose graphs are cut at
DDP's gradient buckets (`kiln.backends.ddp`): DDP's reducer sees each parameter's gradient arrive through
its usual autograd hooks, bucket by bucket, while the rest of the backward runs. Gradients are DDP's own.

`DDP(kiln.compile(model))` needs nothing from here: DDP wraps a `CompiledModule` like any module (its
gradients all arrive at the end of the one compiled backward per graph, so nothing overlaps).

FSDP2 (`fully_shard`) works the same way, per sharded module: `CompiledFSDP` compiles the forward of every
module `fully_shard` wrapped, and calls run with those installed, so FSDP's hooks (all-gather before a
block, reshard after it, the gradients' reduce-scatter) run eagerly around each block's compiled graph.
Where a parent's code calls a sharded block, capture meets a module with hooks and breaks there (named by
kiln.explain); the block's own forward is a graph of its own.
"""
from __future__ import annotations

import sys
import types
from typing import Any, Callable

import torch

from .backends import compiler_for
from .backends.ddp import BucketSplitCompiler, SplitPlan
from .capture.cache import CompiledFunction, warn_once
from .graph.pipeline import CompileContext
from .wrapping import WrappedModule
from . import CAPTURE_PYTHONS

__all__ = ["CompiledDDP", "CompiledFSDP", "is_ddp", "is_fsdp"]

_MISSING = object()


def is_ddp(model: Any) -> bool:
    """`model` is a torch.nn.parallel.DistributedDataParallel (or a subclass)."""
    # a DDP instance exists only once its module is imported: never import it here (~0.5 s with its
    # torch.distributed dependencies, for every kiln.compile of a model that has nothing to do with it)
    module = sys.modules.get("torch.nn.parallel.distributed")
    ddp = getattr(module, "DistributedDataParallel", None)
    return ddp is not None and isinstance(model, ddp)


class CompiledDDP(WrappedModule):
    """`kiln.compile(ddp)`: calls run DDP's forward eagerly around the wrapped module's compiled forward.
    Parameters, state_dict, train()/eval(), no_sync() and other attributes are the DDP module's.
    `splits` lists how each captured graph was cut at the bucket boundaries."""

    def __init__(self, ddp: torch.nn.Module, backend: Any = "auto", fullgraph: bool = False,
                 dynamic: Any = None, mode: str | None = None, options: dict | None = None):
        super().__init__()
        self._wrap(ddp)
        name = backend if isinstance(backend, str) else None
        context = CompileContext.from_compile(mode=mode, dynamic=dynamic, fullgraph=fullgraph,
                                              options=options, backend=name)
        splitter = BucketSplitCompiler(compiler_for(backend, context), ddp)
        inner = ddp.module
        forward = type(inner).forward
        object.__setattr__(self, "_splitter", splitter)
        if sys.version_info[:2] not in CAPTURE_PYTHONS or not isinstance(forward, types.FunctionType):
            warn_once(f"ddp:{id(ddp)}", "kiln.compile(DDP(...)): the wrapped module's forward is not Python "
                      "code kiln captures here; it runs eagerly")
            object.__setattr__(self, "_compiled_forward", None)
        else:
            object.__setattr__(self, "_compiled_forward", CompiledFunction(
                forward, splitter, fullgraph=fullgraph, raise_on_error=context.raise_on_error,
                bound_self=inner))

    @property
    def splits(self) -> list[SplitPlan]:
        return self._splitter.splits

    def bucket_splitter(self, inner: Any) -> BucketSplitCompiler:
        """A bucket-splitting compiler over `inner` for this DDP module (kiln.explain uses one over eager)."""
        return BucketSplitCompiler(inner, self._orig_mod)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ddp = self._orig_mod
        if self._compiled_forward is None:
            return ddp(*args, **kwargs)
        inner = ddp.module
        saved = inner.__dict__.get("forward", _MISSING)
        inner.forward = self._compiled_forward  # DDP calls self.module(...): the hooks run, then this
        try:
            return ddp(*args, **kwargs)
        finally:
            if saved is _MISSING:
                del inner.forward
            else:
                inner.forward = saved

    forward = __call__


def is_fsdp(model: Any) -> bool:
    """`model` was wrapped by FSDP2's `fully_shard` (an FSDPModule)."""
    # as is_ddp: an FSDPModule exists only once torch.distributed.fsdp is imported (by fully_shard's user)
    module = sys.modules.get("torch.distributed.fsdp")
    fsdp = getattr(module, "FSDPModule", None)
    return fsdp is not None and isinstance(model, fsdp)


class CompiledFSDP(WrappedModule):
    """`kiln.compile(model)` for a model with modules `fully_shard` wrapped: the forward of each of them and
    of the model compiled (one graph per block at least), FSDP's hooks eager around them. Attributes are the
    model's own."""

    def __init__(self, model: torch.nn.Module, backend: Any = "auto", fullgraph: bool = False,
                 dynamic: Any = None, mode: str | None = None, options: dict | None = None):
        super().__init__()
        self._wrap(model)
        name = backend if isinstance(backend, str) else None
        context = CompileContext.from_compile(mode=mode, dynamic=dynamic, fullgraph=fullgraph,
                                              options=options, backend=name)
        compiler = compiler_for(backend, context)
        forwards = []
        if sys.version_info[:2] in CAPTURE_PYTHONS:
            for module in model.modules():  # the sharded modules, and the model itself
                forward = type(module).forward
                if (is_fsdp(module) or module is model) and isinstance(forward, types.FunctionType):
                    forwards.append((module, CompiledFunction(forward, compiler, fullgraph=fullgraph,
                                                              raise_on_error=context.raise_on_error,
                                                              bound_self=module)))
        else:
            warn_once(f"fsdp:{id(model)}", "kiln.compile(fully_shard(...)): kiln does not capture this "
                      "Python's bytecode; the model runs eagerly")
        object.__setattr__(self, "_compiled_forwards", forwards)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call_with(self._compiled_forwards, args, kwargs)

    def calling_with(self, make: Callable[[torch.nn.Module], Any]) -> Callable[..., Any]:
        """A call of the model with `make(module)` as the forward of each module this one compiles
        (kiln.explain passes fresh captures with the eager backend: FSDP's hooks run as they do here)."""
        forwards = [(module, make(module)) for module, _ in self._compiled_forwards]
        return lambda *args, **kwargs: self._call_with(forwards, args, kwargs)

    def _call_with(self, forwards: list, args: tuple, kwargs: dict) -> Any:
        saved = []
        for module, compiled in forwards:
            saved.append(module.__dict__.get("forward", _MISSING))
            module.forward = compiled  # nn.Module.__call__ runs FSDP's hooks, then this
        try:
            return self._orig_mod(*args, **kwargs)
        finally:
            for (module, _), before in zip(forwards, saved):
                if before is _MISSING:
                    del module.forward
                else:
                    module.forward = before

    forward = __call__
