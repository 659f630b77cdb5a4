"""Which elements of a tensor share memory: what an in-place update must know before it is recorded
functionally (kiln/ops/registry.py). A write into a tensor whose elements share memory (an expanded input,
an unfolded view), or through a view of one, is eager's to do: eager refuses most ("more than one element of
the written-to tensor refers to a single memory location") and computes the rest through the shared
memory, where a write shows in every element sharing it.
"""
from __future__ import annotations

from typing import Any

import torch

from ..graph import Proxy, TensorMeta, layout


def overlaps_itself(t: torch.Tensor) -> bool:
    """Whether two elements of `t` share a memory location (an expanded or unfolded view)."""
    if any(st == 0 and n > 1 for n, st in zip(t.shape, t.stride())):
        return True
    if t.numel() <= 1 or t.is_contiguous():
        return False
    with torch._C.DisableTorchFunction():  # (called while tracing: these are not ops of the graph)
        offsets = torch.zeros((), dtype=torch.int64)
        for n, st in zip(t.shape, t.stride()):
            offsets = offsets.unsqueeze(-1) + torch.arange(n, dtype=torch.int64) * st
        return offsets.unique().numel() != t.numel()


def overlapping(proxy: Proxy) -> bool:
    """Whether two elements of the tensor a proxy stands for share memory; unknown counts as yes."""
    meta = proxy.meta
    if layout.is_non_overlapping(meta.shape, meta.strides):
        return False
    example = proxy.example  # (a graph input's example may be a dense copy: only its values count)
    if example is None or example.numel() > (1 << 22) or tuple(example.stride()) != tuple(meta.strides):
        return True
    return overlaps_itself(example)


def uniform_fill(func: Any, args: tuple) -> bool:
    """zero_ or fill_ with a number: every element gets one value, so shared memory changes nothing."""
    if func in (torch.Tensor.zero_, torch.zero_):
        return True
    return func in (torch.Tensor.fill_, torch.fill_) and len(args) > 1 and \
        not isinstance(args[1], (torch.Tensor, Proxy))


def shared_memory(target: Proxy, root: Proxy, input_name: str | None, input_meta: Any,
                  uniform: bool) -> str | None:
    """The tensor (described) whose elements share the memory an update of `target` (a view of `root`, or
    root itself) writes, or None. When root is graph input `input_name`, it is judged by its placeholder's
    meta (the real tensor's layout: an updated input's proxy carries the meta of its latest value).
    `uniform`: a zero_/fill_ with a number, which every element sharing memory sees alike (of root itself)."""
    if input_name is not None and not (uniform and root is target) and isinstance(input_meta, TensorMeta) \
            and not layout.is_non_overlapping(input_meta.shape, input_meta.strides):
        return f"input {input_name} ({input_meta.short()}, strides {tuple(input_meta.strides)})"
    for proxy in ([root] if root is not target else []) + ([] if uniform else [target]):
        if overlapping(proxy):
            return f"tensor {proxy.node.name} ({proxy.meta.short()}, strides {tuple(proxy.meta.strides)})"
    return None


def borrow(t: torch.Tensor) -> torch.Tensor:
    """Mark `t` (a detached alias of a user's tensor, used as a graph input's example while tracing, or an
    example sharing its memory) as memory kiln must not write: a run on examples that could write it runs
    on a copy, and a run that writes it anyway raises (kiln.ops.registry)."""
    t._kiln_borrowed = True  # type: ignore[attr-defined]
    return t


def borrowed(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and getattr(v, "_kiln_borrowed", False)


def storage_key(t: Any) -> int | None:
    if not isinstance(t, torch.Tensor) or t.device.type == "meta" or t.layout != torch.strided:
        return None  # (sparse tensors have no storage to compare)
    if t.untyped_storage().nbytes() == 0:
        return None
    return t.untyped_storage().data_ptr()


def _positions(t: torch.Tensor) -> torch.Tensor:
    """The storage offsets of t's elements, in t's element size."""
    offsets = torch.full((), t.storage_offset(), dtype=torch.int64)
    for n, st in zip(t.shape, t.stride()):
        offsets = offsets.unsqueeze(-1) + torch.arange(n, dtype=torch.int64) * st
    return offsets.reshape(-1)


def memory_relation(a: Any, b: Any) -> str:
    """"same" (a and b map each index to the same location), "disjoint", or "partial" (also when unknown)."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.dtype != b.dtype or \
            a.numel() > (1 << 22) or b.numel() > (1 << 22) or storage_key(a) != storage_key(b):
        return "partial"
    pa, pb = _positions(a), _positions(b)
    if a.shape == b.shape and torch.equal(pa, pb):
        return "same"
    if torch.isin(pa, pb).any():
        return "partial"
    return "disjoint"
