"""view_update (kiln/ops/views.py) decomposed: the update of a view's region of its base as one index_put,
so an in-place op through a view (`x[:, 2] += 5`, `s.t().copy_(v)`) is a kernel, not a fallback."""
from __future__ import annotations

from typing import Any

import torch

from .. import prims
from ..graph import Proxy, torch_name
from .creation import arange
from .registry import NoDecomposition, call, register
from .views import ViewChain, view_update


# view ops whose element mapping depends on the storage (strides, offset or dtype), not on logical indices
_STORAGE_VIEWS = {"as_strided", "view_as_real", "view_as_complex", "set_"}


@register(view_update)
def view_update_decomposition(base: Any, value: Any, chain: ViewChain) -> Any:
    """The region a view chain selects is found by applying the chain to the base's logical element numbers
    (`arange(numel).reshape(shape)`): a view never reorders elements logically (view, reshape and
    contiguous keep row-major order whatever the strides; select, slice, transpose... are logical maps), so
    the numbers it selects are the base elements it aliases. The update is then one index_put."""
    if not isinstance(base, Proxy) or not isinstance(value, Proxy):
        raise NoDecomposition("view_update of a non-tensor")
    for func, _, _, _ in chain.steps:
        if getattr(func, "__name__", "") in _STORAGE_VIEWS:
            raise NoDecomposition(f"view_update through {torch_name(func)}")
    numbers = arange(base.numel(), device=base.device).reshape(tuple(base.shape))
    region = chain.apply(numbers, call)
    if not isinstance(region, Proxy) or region.dtype != torch.int64 or tuple(region.shape) != tuple(value.shape):
        raise NoDecomposition("view_update of a chain that changes dtype or shape")
    new = value if value.dtype == base.dtype else prims.convert_element_type(value, base.dtype)
    flat = prims.index_put(base.reshape(-1), [region.reshape(-1)], new.reshape(-1), False)
    return flat.reshape(tuple(base.shape))
