"""Running a traced torch call with torch itself, on stand-ins of its proxies: their examples (real values,
when the trace runs on example inputs), meta tensors, or zero-filled CPU tensors. The registry does this to
learn an op's output metadata, to check a decomposition against eager, and to raise eager's exception for
bad input. A run must leave the user's tensors and generators as they were."""
from __future__ import annotations

from typing import Any

import torch

from ..counters import counters
from ..graph import Deferred, Proxy, TensorMeta, dense_strides, flatten, layout, map_structure, torch_name
from ..graph.graph import is_random_target
from ..graph.symbolic import hint_of
from .kinds import is_inplace
from .overlap import borrow, borrowed, storage_key


def meta_value(v: Any) -> Any:
    if isinstance(v, Proxy):
        return hint_of(v.meta).empty()
    return hint_of(v)  # a symbolic size runs the example at the size the capture saw (deciding nothing)


def example_value(v: Any) -> Any:
    if isinstance(v, Proxy):
        if v.example is None:
            raise LookupError
        return v.example
    return hint_of(v)


class CannotCheck(Exception):
    """Eager cannot be run on zero-filled stand-ins of these arguments (symbolic or too large)."""


def zeros_value(v: Any) -> Any:
    if isinstance(v, Proxy):
        meta = hint_of(v.meta)
        if meta.device.type != "cpu" or not all(isinstance(s, int) for s in meta.shape):
            raise CannotCheck
        size = layout.storage_size(meta.shape, meta.strides)
        if size > 1 << 16:
            raise CannotCheck
        return torch.zeros(size, dtype=meta.dtype).as_strided(meta.shape, meta.strides)  # (eager's layout)
    return hint_of(v)


def run_on(func: Any, args: tuple, kwargs: dict, on: str, protect: bool = True,
           stand_ins: list | None = None) -> Any:
    """Run the torch op on the arguments' examples, meta tensors, or zero-filled CPU tensors (`on`).
    Examples that are a user's own tensors (borrowed: kiln.ops.overlap) are copied first when `protect`:
    the op may write arguments kiln does not know of. Without `protect` (a decomposed op, whose writes kiln
    knows: its first argument when in place, copied below, and `update_argument`'s, which the op's
    UpdatesArguments target copies), a borrowed tensor the run writes anyway raises: never corruption."""
    if on != "meta":
        generators = [g for g in flatten((args, kwargs)) if isinstance(g, torch.Generator)]
        if generators or is_random_target(func):
            # Running the op on examples must not advance the user's generators: the compiled graph draws
            # the numbers when it runs, and the state after the call must equal eager's.
            states = [(g, g.get_state()) for g in generators]
            cpu_state = torch.get_rng_state()
            try:
                return _run(func, args, kwargs, on, protect, stand_ins)
            finally:
                torch.set_rng_state(cpu_state)
                for g, state in states:
                    g.set_state(state)
    return _run(func, args, kwargs, on, protect, stand_ins)


def _run(func: Any, args: tuple, kwargs: dict, on: str, protect: bool = True,
         stand_ins: list | None = None) -> Any:
    """`stand_ins`: a list that gets the tensor each proxy argument ran as, in flatten order."""
    convert = {"meta": meta_value, "example": example_value, "zeros": zeros_value}[on]
    if stand_ins is not None:
        made = convert

        def convert(v: Any) -> Any:
            t = made(v)
            if isinstance(v, Proxy):
                stand_ins.append(t)
            return t
    with torch._C.DisableTorchFunction():  # (stand-ins made while tracing are not factories of the graph)
        args, kwargs = map_structure(convert, args), map_structure(convert, kwargs)
    inplace = bool(args) and isinstance(args[0], torch.Tensor) and is_inplace(func, kwargs)
    if inplace and on != "meta":
        # an in-place op must not mutate the example (a user's tensor); the copy keeps its strides
        args = (strided_copy(args[0]), *args[1:])
    if on == "example" and protect:
        args, kwargs = map_structure(lambda v: strided_copy(v) if borrowed(v) else v, (args, kwargs))
    lent = [(v, _version(v)) for v in flatten((args, kwargs)) if borrowed(v)] if on == "example" else []
    out = func(*args, **kwargs)
    for v, version in lent:
        if _version(v) != version:
            raise AssertionError(f"kiln bug: running {torch_name(func)} on the examples while tracing wrote a "
                                 f"user's tensor ({TensorMeta.of(v).short()}) that it was not to write")
    if lent:  # a result sharing a borrowed tensor's memory (a view of a weight) is borrowed too
        memory = {storage_key(v) for v, _ in lent} - {None}
        for t in flatten(out):
            if isinstance(t, torch.Tensor) and storage_key(t) in memory:
                borrow(t)
    if inplace and out is None:
        return args[0]  # Tensor.__setitem__: the value is the updated tensor (as OnCopy returns it)
    return out


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # an inference tensor has no version counter (and eager refuses to write it)
        return None


def strided_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy with t's own strides (clone() makes a non-dense tensor contiguous), so the examples ops run on
    have eager's layouts, and `.stride()` read while tracing is eager's."""
    if t.is_contiguous() or dense_strides(t.shape, t.stride()):
        return t.clone()
    try:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)
    except RuntimeError:  # overlapping elements (an expanded tensor): copy_ refuses, clone() it is
        return t.clone()


class LazyRun:
    """A traced op's run on the examples, deferred: capture records an op from its metas, and the examples
    of its results are computed only when something asks for one (an alias or overlap eager's memory
    decides, a fallback run on real values, an update reading memory it writes). The arguments' examples
    are taken as they are at recording (an in-place update later gives its target a new one). Only ops
    recorded outside autocast regions are deferred (inside one they run as they are recorded), so the run
    needs no autocast state. A run that fails gives no example (None)."""

    __slots__ = ("func", "args", "kwargs", "protect", "done", "leaves", "__weakref__")

    def __init__(self, func: Any, args: tuple, kwargs: dict, protect: bool):
        def freeze(v: Any) -> Any:
            return Proxy(v.node, v._example) if isinstance(v, Proxy) else v
        self.func = func
        self.args, self.kwargs = map_structure(freeze, args), map_structure(freeze, kwargs)
        self.protect = protect
        self.done = False
        self.leaves: list[torch.Tensor] | None = None

    def leaf(self, index: int) -> "LazyLeaf":
        return LazyLeaf(self, index)

    def _pending(self) -> list["LazyRun"]:
        return [v._example.run for v in flatten((self.args, self.kwargs))
                if isinstance(v, Proxy) and isinstance(v._example, LazyLeaf) and not v._example.run.done]

    def compute(self) -> None:
        """Compute this run's results, the runs it reads first (in order, without recursion: a chain of
        thousands of deferred ops resolves in one loop)."""
        order: list[LazyRun] = []
        stack: list[tuple[LazyRun, bool]] = [(self, False)]
        seen: set[int] = set()
        while stack:
            run, expanded = stack.pop()
            if run.done:
                continue
            if expanded:
                order.append(run)
                continue
            if id(run) in seen:
                continue
            seen.add(id(run))
            stack.append((run, True))
            stack.extend((dep, False) for dep in run._pending())
        for run in order:
            run._run_once()

    def _run_once(self) -> None:
        if self.done:
            return
        self.done = True
        try:
            with torch.no_grad():
                out = run_on(self.func, self.args, self.kwargs, "example", protect=self.protect)
        except Exception:  # (LookupError: an argument has no example; or the op fails on these values)
            counters["capture"]["deferred example runs that failed"] += 1
            return
        self.leaves = [t for t in flatten(out) if isinstance(t, torch.Tensor)]
        self.func = self.args = self.kwargs = None  # (what it read may be freed)
        counters["capture"]["deferred example runs"] += 1


class LazyLeaf(Deferred):
    """Tensor `index` (in flatten order) of a LazyRun's result."""

    __slots__ = ("run", "index")

    def __init__(self, run: LazyRun, index: int):
        self.run = run
        self.index = index

    @property  # type: ignore[override]
    def done(self) -> bool:
        return self.run.done

    @property  # type: ignore[override]
    def value(self) -> torch.Tensor | None:
        leaves = self.run.leaves
        return leaves[self.index] if leaves is not None and self.index < len(leaves) else None

    def resolve(self) -> torch.Tensor | None:
        if not self.run.done:
            self.run.compute()
        return self.value


def aliasing(out: Any, stand_ins: list) -> list[int | None]:
    """Per tensor of `out`, the position in `stand_ins` of the argument whose memory it shares (a view of
    it, or itself), or None."""
    with torch._C.DisableTorchFunction():  # (called while tracing: these are not ops of the graph)
        owners: dict[int, int] = {}
        for i, t in enumerate(stand_ins):
            if isinstance(t, torch.Tensor):
                owners.setdefault(t.untyped_storage()._cdata, i)
        return [owners.get(t.untyped_storage()._cdata) for t in flatten(out) if isinstance(t, torch.Tensor)]
