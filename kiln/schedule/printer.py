"""The fused schedule as a runnable Python module (the loop IR after fusion).

`schedule_python(loop, schedule)` prints one `def kernelN(ops)` per kernel (`FusedGroup`): its iteration
space (outer ranges `x*`, inner ranges `r*`), then each member in order with its role, the index its body is
called with (the kernel's loop variables through `member_index`, collapsed dims expanded back) and its
store, every index expression simplified over the kernel's ranges as the code generators simplify them.
`run(inputs..., *, constants=None)` allocates each kernel's buffers (no memory-plan reuse: separate buffers
give the same values), calls the kernels and the extern and fallback nodes in the schedule's order on the
reference handler, and returns the graph's outputs; see `kiln.lower.printer` for the module's contract.

Members run one after another over the whole space, each finishing before the next starts; a kernel runs
them per outer iteration instead, which gives the same values because fusion lets a member read only the
element an earlier member wrote for the same outer index.
"""
from __future__ import annotations

from typing import Any

import sympy

from ..lower.index import simplify_index
from ..lower.ir import ExternNode, LoopGraph, Reduction
from ..lower.ops import PrintHandler
from ..lower.printer import ModuleWriter, grid_line, layout_text
from .role import Role

# This module reads kernels through their attributes (name, outer, inner, members, member_index, ...) and
# FusedGroup.describe(body=True) calls kernel_python (kiln.schedule.group imports this module lazily).


def _member_text(data: Any) -> str:
    if isinstance(data, Reduction):
        return f"Reduction {data.reduction_type} over {list(data.ranges)} x {list(data.reduction_ranges)}"
    if hasattr(data, "scan_type"):
        return f"Scan {data.scan_type} along dim {data.dim} over {list(data.ranges)}"
    return f"Pointwise over {list(data.ranges)}"


def _index_tuple(index: list) -> str:
    texts = [PrintHandler.index_text(e) for e in index]
    return f"({texts[0]},)" if len(texts) == 1 else f"({', '.join(texts)})"


def kernel_python(group: Any) -> str:
    """One kernel as `def kernelN(ops)`: the members' bodies over the kernel's iteration space."""
    ranges = group.var_ranges()
    outer_vars, inner_vars = group.outer_vars(), group.inner_vars()
    lines = [f"def {group.name}(ops):", f"    # {group.describe()}",
             f"    {grid_line(outer_vars + inner_vars, group.outer, group.inner or ())}"]
    handler = PrintHandler(indent="    ", ranges=ranges)
    for member in group.members:
        buf, data = member.buffer, member.buffer.data
        index, rindex = group.member_index(member)
        at = _index_tuple(index) + (f" x {_index_tuple(rindex)}" if rindex else "")
        lines.append(f"    # {buf.name} ({member.role}): {_member_text(data)} at {at} -> {layout_text(buf)}")
        handler.lines = []
        if member.role is Role.REDUCTION:
            value = data.fn(handler, index, rindex)
            value = f"ops.reduce({data.reduction_type!r}, {value}, {buf.dtype})"
        else:
            value = data.fn(handler, index)
            if member.role is Role.SCAN:
                value = f"ops.scan({data.scan_type!r}, {value}, {len(group.outer)}, {buf.dtype})"
        store = PrintHandler.index_text(simplify_index(sympy.expand(group.store_index(member)), ranges))
        lines += handler.lines
        lines.append(f"    ops.store({buf.name!r}, {store}, {value})")
    return "\n".join(lines)


def schedule_python(loop: LoopGraph, schedule: list, header: str = "") -> str:
    """The fused schedule of `loop` as a runnable Python module; see the module docstring."""
    writer = ModuleWriter(loop, header, "fused loop IR")
    for item in schedule:
        if isinstance(item, ExternNode):
            writer.extern(item)
            continue
        writer.define(kernel_python(item))
        for member in item.members:
            writer.allocate(member.buffer)
        writer.statement(f"{item.name}(ops)")
    return writer.source()
