"""In-place variants (`x.add_(y)`, `x += y`, `torch.relu_(x)`) derived from the functional decompositions.

For every registered functional op whose in-place twin exists (`torch.Tensor.add` -> `torch.Tensor.add_`,
`torch.Tensor.__add__` -> `torch.Tensor.__iadd__`, `torch.exp` -> `torch.exp_`), the twin is registered as:
run the functional decomposition, check that its result broadcasts to self's shape and can be cast to
self's dtype (eager's errors otherwise), convert and broadcast it to self, and mark the op in-place, so
the registry rebinds the proxy and records the mutation of a graph input.

This module is imported last (see `kiln/ops/__init__.py`), so it covers every module registered before it;
`install()` can be called again after registering more decompositions.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .. import prims
from ..graph import Proxy
from ..prims.shape import is_non_overlapping_and_dense
from .registry import DECOMPOSITIONS, VIEW_OPS, NoDecomposition, lookup, mark_inplace, register
from .utils import broadcast_shapes, can_cast, preserve_layout

# In-place twins whose meaning differs from "functional result written back": they change self's shape or
# metadata, or draw random numbers with different arguments than their functional namesakes.
_NOT_DERIVED = {
    "squeeze_", "unsqueeze_", "transpose_", "t_", "swapdims_", "swapaxes_", "as_strided_", "resize_",
    "resize_as_", "detach_", "set_", "requires_grad_", "share_memory_", "bernoulli_", "exponential_",
    "geometric_", "cauchy_", "log_normal_", "normal_", "uniform_", "random_", "map_", "apply_",
    "fill_diagonal_", "copy_", "zero_", "fill_", "retain_grad_",
}

# in-place ops whose result dtype must equal self's dtype exactly (eager refuses even a same-kind cast)
_EXACT_DTYPE = {"float_power_"}

_DUNDERS = {
    "__iadd__": "__add__", "__isub__": "__sub__", "__imul__": "__mul__", "__itruediv__": "__truediv__",
    "__ifloordiv__": "__floordiv__", "__imod__": "__mod__", "__ipow__": "__pow__", "__iand__": "__and__",
    "__ior__": "__or__", "__ixor__": "__xor__", "__ilshift__": "__lshift__", "__irshift__": "__rshift__",
    "__imatmul__": "__matmul__",
}

_DTYPE_NAMES = {torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char",
                torch.uint8: "Byte", torch.bool: "Bool", torch.float32: "Float", torch.float64: "Double",
                torch.float16: "Half", torch.bfloat16: "BFloat16", torch.complex64: "ComplexFloat",
                torch.complex128: "ComplexDouble"}


def _dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def write_back(name: str, self: Any, result: Any) -> Any:
    """The value self holds after `self.<name>(...)` computed `result`: eager's checks, cast and broadcast."""
    if not isinstance(result, Proxy):
        raise NoDecomposition(f"{name} of an op returning {type(result).__name__}")
    shape, out_shape = tuple(self.shape), tuple(result.shape)
    try:
        fits = broadcast_shapes(shape, out_shape) == shape
    except RuntimeError:
        fits = False
    if not fits:
        raise RuntimeError(f"output with shape [{', '.join(map(str, shape))}] doesn't match the broadcast "
                           f"shape [{', '.join(map(str, out_shape))}]")
    if name in _EXACT_DTYPE and result.dtype != self.dtype:
        raise RuntimeError(f"the base given to {name} has dtype {_dtype_name(self.dtype)} but the "
                           f"operation's "
                           f"result requires dtype {_dtype_name(result.dtype)}")
    if not can_cast(result.dtype, self.dtype):
        raise RuntimeError(f"result type {_dtype_name(result.dtype)} can't be cast to the desired output "
                           f"type "
                           f"{_dtype_name(self.dtype)}")
    out = result
    if out_shape != shape:
        offset = len(shape) - len(out_shape)
        out = prims.broadcast_in_dim(out, shape, tuple(range(offset, len(shape))))
    if out.dtype != self.dtype or out_shape != shape:
        out = prims.convert_element_type(out, self.dtype)  # a fresh, dense tensor
    return out


@register(torch.Tensor.copy_)
def copy_(self: Any, src: Any, non_blocking: bool = False) -> Any:
    """self.copy_(src): src broadcast to self's shape and converted to self's dtype (any conversion, as
    eager's copy does; a complex source into a real tensor, which eager warns about, runs with torch)."""
    if not isinstance(self, Proxy):
        raise NoDecomposition("copy_ of a non-tensor")
    if isinstance(src, (bool, int, float)):
        fill = lookup(torch.Tensor.fill_)
        if fill is None:
            raise NoDecomposition("copy_ of a number")
        return fill(self, src)
    if not isinstance(src, Proxy):
        raise NoDecomposition(f"copy_ from a {type(src).__name__}")
    if src.device != self.device:
        raise NoDecomposition("copy_ across devices")
    if src.dtype.is_complex and not self.dtype.is_complex:
        raise NoDecomposition("copy_ of a complex tensor into a real one")
    shape, src_shape = tuple(self.shape), tuple(src.shape)
    if broadcast_shapes(shape, src_shape) != shape:  # (raises eager's error for mismatched sizes)
        raise RuntimeError(f"output with shape [{', '.join(map(str, shape))}] doesn't match the broadcast "
                           f"shape [{', '.join(map(str, src_shape))}]")
    if not is_non_overlapping_and_dense(shape, tuple(self.stride())):
        raise NoDecomposition("copy_ into a tensor with gaps or overlaps (its layout is eager's to keep)")
    out = src
    if src_shape != shape:
        out = prims.broadcast_in_dim(out, shape, tuple(range(len(shape) - len(src_shape), len(shape))))
    if out.dtype != self.dtype:
        out = prims.convert_element_type(out, self.dtype)
    # self's new value, laid out as self (and not an alias of src)
    fresh = prims.clone(out, torch.contiguous_format) if out is src else out
    return preserve_layout(fresh, self)


mark_inplace(torch.Tensor.copy_)


def _derived(name: str, functional: Any) -> Callable[..., Any]:
    def inplace(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(self, Proxy):
            raise NoDecomposition(f"{name} of a non-tensor")
        fn = lookup(functional)
        if fn is None:
            raise NoDecomposition(name)
        return write_back(name, self, fn(self, *args, **kwargs))
    inplace.__name__ = name
    inplace.__doc__ = f"In-place {name}: the functional decomposition, written back to self."
    return inplace


def _twins() -> list[tuple[Any, Any, str]]:
    """(functional, in-place twin, twin's name) for every registered functional with a twin."""
    pairs = []
    for twin_name, functional_name in _DUNDERS.items():
        target = getattr(torch.Tensor, functional_name, None)
        if target in DECOMPOSITIONS and hasattr(torch.Tensor, twin_name):
            pairs.append((target, getattr(torch.Tensor, twin_name), twin_name))
    for target in list(DECOMPOSITIONS):
        name = getattr(target, "__name__", None)
        if not isinstance(name, str) or target in VIEW_OPS:
            continue
        if name.startswith("_") or name.endswith("_") or name + "_" in _NOT_DERIVED:
            continue
        for space in (torch.Tensor, torch):
            if getattr(space, name, None) is target and getattr(space, name + "_", None) is not None:
                pairs.append((target, getattr(space, name + "_"), name + "_"))
    return pairs


def install() -> int:
    """Register the in-place twins not registered yet; returns how many were added."""
    added = 0
    for functional, twin, name in _twins():
        if twin in DECOMPOSITIONS:
            continue
        register(twin)(_derived(name, functional))
        mark_inplace(twin)
        added += 1
    return added


install()
