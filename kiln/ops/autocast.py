"""torch.autocast as explicit casts: the state, the per-op policy, and running torch under a given state.

Eager autocast is dispatcher state: while it is on for a device, ops with an autocast kernel for that
device cast their floating inputs first (matmuls and convolutions to the autocast dtype, numerically
sensitive ops to float32, a few to the widest input type) and run with autocast excluded below them.
kiln makes those casts part of the graph instead: `cast_inputs` records them, while tracing, in front of
each op of the policy, so kiln's kernels and externs compute what eager computes, and a compiled graph
runs with autocast off (`autocast_off`): its externs (torch.mm, ...) must not cast again what the graph
already decided. An op whose torch result under autocast is not what its decomposition gives (a
composite such as einsum, whose inner bmm autocast reaches) runs with torch as a fallback, under the
autocast state it was traced in (`UnderAutocast`).

Which ops have an autocast kernel is asked of the installed torch's dispatcher; which cast each one does is
the table below (from autocast's documented op lists). Where the two disagree the result is still right:
the trace compares every decomposition's result dtype with eager's and runs the op with torch when they
differ.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator

import torch

from ..graph import Proxy, flatten, map_structure, torch_name
from ..graph import torch_internals

DEVICES = ("cpu", "cuda")

# ops whose autocast kernel casts to the autocast dtype (lower_precision_fp) or to the widest input type
# (promote); the others with an autocast kernel cast to float32 (fp32, fp32_set_opt_dtype, append_dtype)
_LOWER = frozenset("""
    conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d conv_transpose3d convolution _convolution
    prelu addmm addmv addr matmul einsum mm mv linalg_vecdot linear addbmm baddbmm bmm chain_matmul
    linalg_multi_dot _addmm_activation _thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell gru_cell
    rnn_tanh_cell rnn_relu_cell mkldnn_rnn_layer scaled_dot_product_attention _native_multi_head_attention
    _scaled_dot_product_flash_attention _scaled_dot_product_efficient_attention
""".split())
_PROMOTE = frozenset("""
    stack cat index_copy addcdiv addcmul atan2 bilinear cross dot grid_sampler index_put tensordot
    scatter_add vdot
""".split())
# the CPU promotes only these (its grid_sampler casts to float32)
_PROMOTE_BY_DEVICE = {"cpu": frozenset(("stack", "cat", "index_copy")), "cuda": _PROMOTE}

# torch-level names whose aten op has another name
_ATEN_ALIASES = {"cross_entropy": "cross_entropy_loss", "__matmul__": "matmul", "__rmatmul__": "matmul",
                 "grid_sample": "grid_sampler", "concat": "cat", "concatenate": "cat"}


@functools.lru_cache(maxsize=None)
def _registered(device: str) -> frozenset:
    """Base names of the aten ops with an autocast kernel for `device` in the installed torch."""
    key = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}[device]
    names = torch_internals.autocast_registrations(key)
    return frozenset(n.removeprefix("aten::").split(".")[0] for n in names if n.startswith("aten::"))


@functools.lru_cache(maxsize=4096)
def _aten_base(func: Any) -> str:
    full = torch_name(func)
    name = full.rsplit(".", 1)[-1]
    name = _ATEN_ALIASES.get(name, name)
    module = getattr(func, "__module__", "") or ""
    if module.endswith("linalg") or ".linalg." in full:
        name = "linalg_" + name.removeprefix("linalg_")
    elif module.endswith("fft") or ".fft." in full:
        name = "fft_" + name.removeprefix("fft_")
    return name


# ---- the state ------------------------------------------------------------------------------------------

def state() -> tuple:
    """The autocast state that changes results: ((device, dtype), ...) for each device it is on for;
    () when it is off everywhere (the common case, one cheap check)."""
    if not torch_internals.any_autocast_enabled():
        return ()
    return tuple((d, torch.get_autocast_dtype(d)) for d in DEVICES if torch.is_autocast_enabled(d))


def _set(st: tuple, cache: bool) -> None:
    on = dict(st)
    for d in DEVICES:
        if d in on:
            torch.set_autocast_dtype(d, on[d])
        torch.set_autocast_enabled(d, d in on)
    torch.set_autocast_cache_enabled(cache)


def saved() -> tuple:
    """Everything `restore` puts back: per device on/off and dtype, and the cast cache flag."""
    return (tuple((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in DEVICES),
            torch.is_autocast_cache_enabled())


def restore(full: tuple) -> None:
    per_device, cache = full
    for d, enabled, dtype in per_device:
        torch.set_autocast_dtype(d, dtype)
        torch.set_autocast_enabled(d, enabled)
    torch.set_autocast_cache_enabled(cache)


@contextlib.contextmanager
def under(st: tuple) -> Iterator[None]:
    """Run with exactly this autocast state (its cast cache off: eager clears the cache when the outermost
    region exits, and a cache kept across calls would hold stale casts of updated weights)."""
    full = saved()
    _set(st, False)
    try:
        yield
    finally:
        restore(full)


def autocast_off() -> Any:
    """A context running with autocast off everywhere (a no-op context when it already is)."""
    return under(()) if torch_internals.any_autocast_enabled() else contextlib.nullcontext()


class UnderAutocast:
    """A torch op that runs under the autocast state it was traced in (a fallback node of an autocast
    region: its result depends on the state, and compiled graphs run with autocast off)."""

    def __init__(self, fn: Any, st: tuple):
        self.fn = fn
        self.state = st
        self.__name__ = getattr(fn, "__name__", "op")
        self.__qualname__ = f"under_autocast({torch_name(fn)}, {describe(st)})"
        self.__module__ = "kiln.ops.autocast"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with under(self.state):
            return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return self.__qualname__


class AutocastOff:
    """A compiled graph captured under autocast: it runs with autocast off (its casts are in the graph)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Any):
        self.fn = fn

    def __call__(self, *args: Any) -> Any:
        with under(()):
            return self.fn(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fn, name)


def describe(st: tuple) -> str:
    """`torch.autocast` state for guards and explain: 'off' or 'cpu: bfloat16, ...'."""
    return ", ".join(f"{d}: {str(dt).removeprefix('torch.')}" for d, dt in st) or "off"


# ---- the policy -----------------------------------------------------------------------------------------

def _device_of(args: tuple, kwargs: dict) -> str | None:
    for v in flatten((args, kwargs)):
        if isinstance(v, (Proxy, torch.Tensor)):
            return v.device.type
    return None


def policy_of(func: Any, args: tuple, kwargs: dict) -> tuple[str, torch.dtype, str] | None:
    """(policy, autocast dtype, device) eager's autocast applies to this call now, or None."""
    if not torch_internals.any_autocast_enabled():
        return None
    device = _device_of(args, kwargs)
    if device not in DEVICES or not torch.is_autocast_enabled(device):
        return None
    name = _aten_base(func)
    if name not in _registered(device):
        return None
    kind = "lower" if name in _LOWER else "promote" if name in _PROMOTE_BY_DEVICE[device] else "fp32"
    return kind, torch.get_autocast_dtype(device), device


def _eligible(v: Any, device: str) -> bool:
    return (isinstance(v, (Proxy, torch.Tensor)) and v.dtype.is_floating_point and v.dtype != torch.float64
            and v.device.type == device)


def _promote(low: torch.dtype, eligible: list) -> torch.dtype:
    """The widest input type, as eager's autocast picks it (at::autocast::prioritize, in argument order):
    float32 once an input is float32, the autocast dtype while all are; any other floating type met
    before a float32 (float16 under bfloat16, ...) is eager's error."""
    to = low
    for v in eligible:
        if to == torch.float32 or v.dtype == torch.float32:
            to = torch.float32
        elif v.dtype != low:
            raise RuntimeError("Unexpected floating ScalarType in at::autocast::prioritize")
    return to


def cast_inputs(func: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict, bool]:
    """The call's arguments with autocast's casts applied (recorded in the graph being traced, as
    `Tensor.to` nodes); the flag says whether a policy applied."""
    found = policy_of(func, args, kwargs)
    if found is None:
        return args, kwargs, False
    kind, low, device = found
    eligible = [v for v in flatten((args, kwargs)) if _eligible(v, device)]
    if kind == "lower":
        to = low
    elif kind == "fp32":
        to = torch.float32
    else:
        to = _promote(low, eligible)

    def cast(v: Any) -> Any:
        if _eligible(v, device) and v.dtype != to:
            return v.to(to)
        return v
    with under(()):  # the casts themselves are plain conversions
        return map_structure(cast, args), map_structure(cast, kwargs), True
