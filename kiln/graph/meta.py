"""Tensor metadata: what a graph knows about a value without computing it.

A shape entry is an `int` or a sympy expression (a symbolic size); meta rules compute with either.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence, Union

import sympy
import torch

Dim = Union[int, sympy.Expr]

_DTYPE_ABBREV = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
    torch.bool: "b8", torch.complex64: "c64", torch.complex128: "c128",
}


def dtype_abbrev(dtype: torch.dtype) -> str:
    return _DTYPE_ABBREV.get(dtype, str(dtype).removeprefix("torch."))


def contiguous_strides(shape: Sequence[Dim]) -> tuple[Dim, ...]:
    """Row-major strides of a shape (size-0 and size-1 dims get the stride they would have at size 1)."""
    strides: list[Dim] = []
    running: Dim = 1
    for size in reversed(shape):
        strides.append(running)
        running = running * (size if not (isinstance(size, int) and size == 0) else 1)
    return tuple(reversed(strides))


def dense_strides(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Non-overlapping and dense: the strides are a permutation of some contiguous layout's."""
    expected = 1
    for size, stride in sorted(zip(shape, strides), key=lambda p: p[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def numel(shape: Sequence[Dim]) -> Dim:
    total: Dim = 1
    for size in shape:
        total = total * size
    return total


@dataclasses.dataclass(frozen=True, slots=True)
class TensorMeta:
    """Shape, strides, dtype, device and requires_grad of a tensor value."""

    shape: tuple[Dim, ...]
    dtype: torch.dtype
    device: torch.device = torch.device("cpu")
    strides: tuple[Dim, ...] | None = None
    requires_grad: bool = False

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
        return TensorMeta(tuple(t.shape), t.dtype, t.device, tuple(t.stride()), t.requires_grad)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> Dim:
        return numel(self.shape)

    def is_contiguous(self) -> bool:
        expected = contiguous_strides(self.shape)
        return all(
            size == 1 or stride == want
            for size, stride, want in zip(self.shape, self.strides, expected)
        ) or self.numel() == 0

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
        text = f"{dtype_abbrev(self.dtype)}[{', '.join(str(s) for s in self.shape)}]"
        if not self.is_contiguous():
            text += f" strides=({', '.join(str(s) for s in self.strides)})"
        if self.device.type != "cpu":
            text += f" {self.device}"
        if self.requires_grad:
            text += " grad"
        return text
