"""What kind of op a torch callable is, as the registry and the aten layer need to know: whether its
outputs alias its first input (views), and whether it updates its first argument in place (by table, by an
`inplace=True` flag, or by torch's `name_` naming rule)."""
from __future__ import annotations

from typing import Any

from ..graph.node import named_inplace

VIEW_OPS: set[Any] = set()  # torch callables whose (tensor) outputs alias their first input
INPLACE_OPS: set[Any] = set()  # torch callables that update their first argument in place


def mark_view(*targets: Any) -> None:
    VIEW_OPS.update(t for t in targets if t is not None)


def mark_inplace(*targets: Any) -> None:
    INPLACE_OPS.update(t for t in targets if t is not None)


INPLACE_FLAG_OPS: set[Any] = set()  # torch callables that update their first argument when inplace=True


def mark_inplace_flag(*targets: Any) -> None:
    """Ops (F.relu, F.dropout, ...) that update their first argument in place when passed inplace=True."""
    INPLACE_FLAG_OPS.update(t for t in targets if t is not None)


# Trailing-underscore names that change only a tensor's autograd or sharing state, not its values.
_METADATA_ONLY = frozenset(["requires_grad_", "share_memory_", "detach_", "pin_memory_"])
# in-place ops that restride or reshape their tensor (a functional copy would move its values instead)
_RESTRIDE_INPLACE = frozenset(["t_", "transpose_", "swapdims_", "swapaxes_", "as_strided_", "squeeze_",
                               "unsqueeze_", "resize_", "resize_as_", "set_"])


def _named_inplace(func: Any) -> bool:
    """torch's naming rule: `name_` updates its first argument (`Tensor.cauchy_`, `nn.init.uniform_`)."""
    name = getattr(func, "__name__", "")
    return named_inplace(name) and not name.startswith("_") and name not in _METADATA_ONLY


def is_inplace(func: Any, kwargs: dict) -> bool:
    return func in INPLACE_OPS or (func in INPLACE_FLAG_OPS and kwargs.get("inplace") is True) or \
        _named_inplace(func)
