"""Running a traced torch call with torch itself, on stand-ins of its proxies: their examples (real values,
when the trace runs on example inputs), meta tensors, or zero-filled CPU tensors. The registry does this to
learn an op's output metadata, to check a decomposition against eager, and to raise eager's exception for
bad input. A run must leave the user's tensors and generators as they were."""
from __future__ import annotations

from typing import Any

import torch

from ..graph import Proxy, TensorMeta, dense_strides, flatten, map_structure, torch_name
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
        if (meta.device.type != "cpu" or not all(isinstance(s, int) for s in meta.shape)
                or meta.numel() > 1 << 16):
            raise CannotCheck
        return torch.zeros(meta.shape, dtype=meta.dtype)
    return hint_of(v)


def run_on(func: Any, args: tuple, kwargs: dict, on: str, protect: bool = True) -> Any:
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
                return _run(func, args, kwargs, on, protect)
            finally:
                torch.set_rng_state(cpu_state)
                for g, state in states:
                    g.set_state(state)
    return _run(func, args, kwargs, on, protect)


def _run(func: Any, args: tuple, kwargs: dict, on: str, protect: bool = True) -> Any:
    convert = {"meta": meta_value, "example": example_value, "zeros": zeros_value}[on]
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
