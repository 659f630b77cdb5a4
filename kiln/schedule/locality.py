"""Where a kernel's buffers live: one pure rule, used by the memory plan and by the kernel order.

A buffer written by a kernel and read by no one else (not an output, not read by another kernel or an
extern) never needs memory: it stays inside the kernel, as a register holding the current outer iteration's
value ("scalar"), a per-thread scratch row ("array"), or — for a pointwise row buffer on a target without
scratch rows — recomputed from its body wherever the kernel reads it ("recompute"), when the Target
allows that kind. A kernel whose threads split its inner loops keeps everything in memory (a row is then
shared between threads). A part of a concatenation computed in place always stores into its memory.
"""
from __future__ import annotations

import math

from ..lower.ir import ExternNode
from ..lower.sizes import hint
from ..lower.target import Target
from .group import FusedGroup, Role


def splits_inner(group: FusedGroup, target: Target) -> bool:
    """Threads split the kernel's inner loops: its outer ranges are too few to feed them."""
    if group.has_role(Role.SCAN):
        return False  # a scan runs its inner loop in order
    # heuristics: asked of the sizes' hints when they are symbolic (either answer is right at every size)
    return hint(math.prod(group.outer)) < target.min_parallel_outer and \
        hint(math.prod(group.inner or ())) >= target.parallel_threshold


def runs_parallel(group: FusedGroup, target: Target) -> bool:
    """The kernel's iterations are spread over threads (it is big enough to pay for starting them)."""
    return hint(math.prod(group.outer)) * max(hint(math.prod(group.inner or ())), 1) >= target.parallel_threshold


def item_reads(item: FusedGroup | ExternNode) -> list[str]:
    """Every buffer a schedule item loads (a kernel's reads of its own members included)."""
    if isinstance(item, FusedGroup):
        return list(dict.fromkeys(name for m in item.members for name, _ in m.buffer.reads()))
    return item.reads()


def local_buffers(schedule: list[FusedGroup | ExternNode], kept: set[str], target: Target) -> dict[str, str]:
    """Buffer -> "scalar" | "array" | "recompute" for each buffer that stays inside the kernel writing it."""
    readers: dict[str, set[int]] = {}
    for item in schedule:
        for name in item_reads(item):
            readers.setdefault(name, set()).add(id(item))
    local: dict[str, str] = {}
    for item in schedule:
        if not isinstance(item, FusedGroup) or splits_inner(item, target):
            continue
        for member in item.members:
            name = member.buffer.name
            if name in kept or name not in readers or readers[name] - {id(item)} or \
                    member.buffer.storage is not None:  # a window of a concatenation: read through it
                continue
            if member.role in (Role.INNER, Role.SCAN):
                kinds = ["array", "recompute"] if member.role is Role.INNER else ["array"]
            else:
                kinds = ["scalar"]
            kind = next((k for k in kinds if k in target.local_kinds), None)
            if kind is not None:
                local[name] = kind
    return local
