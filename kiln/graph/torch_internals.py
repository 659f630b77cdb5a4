"""Every read of torch's private surface that kiln's behaviour depends on, in one place.

kiln is tested on torch 2.13.0, 2.14.1 and 2.15.0 (`TESTED`). The reads below are not public API and may
change between releases; each one that fails raises `TorchInternalsError`, naming the installed torch, what
was read and what kiln needs it for, instead of quietly doing something else. (A compile that meets one
records it as a capture error: the frame runs eagerly and `kiln.explain` shows the message.)
tests/graph/test_torch_internals.py runs each read against the installed torch.

Stable private names kiln uses only as identities (`torch._C._nn` functions, `torch._C._set_grad_enabled`,
`torch._C.DisableTorchFunction`, `torch._ops.OpOverload`) are read where they are used.
"""
from __future__ import annotations

from typing import Any

import torch

TESTED = ("2.13.0", "2.14.1", "2.15.0")


class TorchInternalsError(RuntimeError):
    """A private part of torch that kiln reads is missing or changed in the installed torch."""


def _fail(what: str, why: str, error: BaseException) -> TorchInternalsError:
    tested = ", ".join(TESTED)
    return TorchInternalsError(
        f"kiln reads {what} (for {why}), which failed on torch {torch.__version__} "
        f"({type(error).__name__}: {error}); kiln is tested on torch {tested}")


def autocast_registrations(dispatch_key: str) -> list[str]:
    """The operator names with a kernel under `dispatch_key` (AutocastCPU, AutocastCUDA)."""
    try:
        return list(torch._C._dispatch_get_registrations_for_dispatch_key(dispatch_key))
    except (AttributeError, RuntimeError, TypeError) as e:
        raise _fail("torch._C._dispatch_get_registrations_for_dispatch_key",
                    "the ops autocast casts", e) from None


# whether autocast is on for any device: the one check an entry makes when it is off (a builtin, called
# directly by generated guards); read at import, so a torch without it fails as kiln loads
try:
    any_autocast_enabled = torch._C._is_any_autocast_enabled
except AttributeError as _e:
    raise _fail("torch._C._is_any_autocast_enabled", "the autocast guard", _e) from None

# forward-mode AD's level (torch.autograd.forward_ad: -1 outside every dual_level): graphs carry no tangents,
# so a frame called inside one runs eagerly
import torch.autograd.forward_ad as _forward_ad  # noqa: E402

if not isinstance(getattr(_forward_ad, "_current_level", None), int):
    raise _fail("torch.autograd.forward_ad._current_level", "the forward-mode AD guard",
                AttributeError("no int _current_level")) from None


def forward_ad_active() -> bool:
    """Whether a torch.autograd.forward_ad.dual_level is open (dual tensors may carry tangents)."""
    return _forward_ad._current_level >= 0


def resolve_overload(packet: Any, args: tuple, kwargs: dict) -> str:
    """The overload name torch's dispatcher picks for `packet` on these (meta) arguments; raises
    RuntimeError when no overload takes them (torch's own error)."""
    resolve = getattr(torch._C, "_jit_resolve_packet", None)
    if resolve is None:
        raise _fail("torch._C._jit_resolve_packet", "the overload of a torch.ops call",
                    AttributeError("no such function"))
    return resolve(packet._qualified_op_name, *args, **kwargs)


def fused_sdp_choice(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, is_causal: bool,
                     scale: float | None, enable_gqa: bool) -> int:
    """The kernel eager's scaled_dot_product_attention picks for these operands (an SDPBackend value);
    raises RuntimeError/TypeError/ValueError for operands torch refuses."""
    op = getattr(torch.ops.aten, "_fused_sdp_choice", None)
    if op is None:
        raise _fail("torch.ops.aten._fused_sdp_choice", "which attention kernel eager runs",
                    AttributeError("no such op"))
    return op(q, k, v, mask, 0.0, is_causal, scale=scale, enable_gqa=enable_gqa)


FLASH_ATTENTION = int(torch.nn.attention.SDPBackend.FLASH_ATTENTION)
