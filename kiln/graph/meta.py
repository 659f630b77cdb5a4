"""Tensor metadata: what a graph knows about a value without computing it.

A shape entry is an `int` or a sympy expression (a symbolic size); meta rules compute with either.
"""
from __future__ import annotations

import dataclasses

import torch

from .symbolic import dim_text, hint_of
from .layout import Dim, contiguous_strides, is_contiguous, is_non_overlapping_and_dense, numel

# `dense_strides` is the name capture imports (a bool: the strides are some permutation of a dense layout)
dense_strides = is_non_overlapping_and_dense

_DTYPE_ABBREV = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
    torch.bool: "b8", torch.complex64: "c64", torch.complex128: "c128",
}


def dtype_abbrev(dtype: torch.dtype) -> str:
    return _DTYPE_ABBREV.get(dtype, str(dtype).removeprefix("torch."))


@dataclasses.dataclass(frozen=True, slots=True)
class TensorMeta:
    """Shape, strides, dtype, device, requires_grad and storage offset of a tensor value.

    `storage_offset` is eager's: elements from the start of the storage to element 0. A view prim's meta
    rule gives its input's offset moved by the view; any other prim's result starts a storage (0). Only
    differences of offsets along a chain of views mean something to a compiled graph (the offset of an
    input is not guarded).
    """

    shape: tuple[Dim, ...]
    dtype: torch.dtype
    device: torch.device = torch.device("cpu")
    strides: tuple[Dim, ...] | None = None
    requires_grad: bool = False
    storage_offset: Dim = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.shape))
        if self.strides is None:
            object.__setattr__(self, "strides", contiguous_strides(self.shape))
        else:
            object.__setattr__(self, "strides", tuple(self.strides))
        if not isinstance(self.device, torch.device):
            object.__setattr__(self, "device", torch.device(self.device))

    @staticmethod
    def of(t: torch.Tensor) -> "TensorMeta":
        return TensorMeta(tuple(t.shape), t.dtype, t.device, tuple(t.stride()), t.requires_grad,
                          t.storage_offset())

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> Dim:
        return numel(self.shape)

    def is_contiguous(self) -> bool:
        return is_contiguous(self.shape, self.strides)

    def with_(self, **changes) -> "TensorMeta":
        return dataclasses.replace(self, **changes)

    def empty(self, device: str | torch.device | None = None) -> torch.Tensor:
        """An uninitialized tensor with this metadata (on `device`, default the meta device)."""
        if any(not isinstance(s, int) for s in self.shape):
            raise NotImplementedError("cannot allocate a tensor with symbolic sizes")
        return torch.empty_strided(self.shape, self.strides, dtype=self.dtype,
                                   device=device if device is not None else "meta")

    def short(self) -> str:
        """`f32[4, 8]`, with strides when they are not contiguous."""
        text = f"{dtype_abbrev(self.dtype)}[{', '.join(dim_text(s) for s in self.shape)}]"
        if not hint_of(self).is_contiguous():  # (printing decides nothing about symbolic sizes)
            text += f" strides=({', '.join(dim_text(s) for s in self.strides)})"
        if self.device.type != "cpu":
            text += f" {self.device}"
        if self.requires_grad:
            text += " grad"
        return text
