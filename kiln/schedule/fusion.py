"""Fusion: group the loop graph's computed buffers into kernels.

A kernel (`FusedGroup`) has outer ranges O, shared by all its members and run in parallel, and inner ranges
I. A member is a reduction over I producing a buffer of shape O, a pointwise of shape O+I computed in its
own inner loop, or a pointwise of shape O computed once per outer iteration (a reduction epilogue). Members
run in order inside one outer iteration, so a member may read what an earlier member of the same kernel
wrote — provided it reads exactly the element written for the current outer index (then no other thread
is involved). Softmax over the last dim (max, sum of exp, divide) and layer_norm (mean, variance,
normalize) each become one kernel; a pointwise chain was already inlined into one body by lowering.
Extern and fallback nodes end the current kernel.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import sympy

from .. import config
from ..graph.pipeline import FUEL
from ..lower.index import FloorDiv, ModularIndexing, index_var, linear_index, simplify_index
from ..lower.ir import ComputedBuffer, ConcatBuffer, ExternNode, LoopGraph, Pointwise, Reduction, Scan
from ..lower.ops import DepsHandler
from ..lower.sizes import size_symbols
from ..lower.target import Target

log = config.channel("fusion")


@dataclasses.dataclass
class Member:
    buffer: ComputedBuffer
    role: str  # "reduction", "inner" (pointwise over O+I) or "outer" (pointwise over O)


@dataclasses.dataclass
class FusedGroup:
    """One kernel: its members run together in one loop nest over `outer`."""

    name: str
    outer: tuple[int, ...]
    inner: tuple[int, ...] | None  # None while the group holds only pointwise members over `outer`
    members: list[Member]
    local: dict[str, str] = dataclasses.field(default_factory=dict)  # buffer -> "scalar" | "array"
    # a pure pointwise kernel whose dims were collapsed: its index -> the members' original index
    expand: Any = None

    def outer_vars(self) -> list[sympy.Symbol]:
        return [index_var("x", d) for d in range(len(self.outer))]

    def inner_vars(self) -> list[sympy.Symbol]:
        return [index_var("r", d) for d in range(len(self.inner or ()))]

    def var_ranges(self) -> dict[sympy.Symbol, int]:
        ranges = dict(zip(self.outer_vars(), self.outer))
        ranges.update(zip(self.inner_vars(), self.inner or ()))
        return ranges

    def member_index(self, member: Member) -> tuple[list, list]:
        """(index, rindex) the member's body is called with."""
        if member.role == "inner":
            index = self.outer_vars() + self.inner_vars()
            return (self.expand(index) if self.expand is not None else index), []
        if member.role == "reduction":
            return self.outer_vars(), self.inner_vars()
        if member.role == "scan":
            dim = member.buffer.data.dim
            outer = self.outer_vars()
            return outer[:dim] + self.inner_vars() + outer[dim:], []
        # a pure pointwise kernel whose dims all collapsed away (every size 1) keeps "outer" members
        index = self.outer_vars()
        return (self.expand(index) if self.expand is not None else index), []

    def store_index(self, member: Member) -> sympy.Expr:
        index, _ = self.member_index(member)
        layout = member.buffer.layout
        return linear_index(index, layout.strides, layout.offset)

    def member_loads(self, member: Member) -> list[tuple[str, sympy.Expr]]:
        from ..lower.ops import DepsHandler
        deps = DepsHandler()
        index, rindex = self.member_index(member)
        if member.role == "reduction":
            member.buffer.data.fn(deps, index, rindex)
        else:
            member.buffer.data.fn(deps, index)
        ranges = self.var_ranges()
        return [(name, simplify_index(sympy.expand(expr), ranges)) for name, expr in deps.loads]

    def buffer_names(self) -> list[str]:
        return [m.buffer.name for m in self.members]

    def describe(self, body: bool = False) -> str:
        """One line (the header comment of the kernel in `kiln.schedule.printer`'s module: cheap enough for
        the fusion log); with `body`, the whole kernel as that module prints it (`def kernelN(ops)`)."""
        if body:
            from .printer import kernel_python
            return kernel_python(self)
        roles = ", ".join(f"{m.buffer.name}:{m.role}" for m in self.members)
        return f"{self.name}: outer={list(self.outer)} inner={list(self.inner or [])} members=[{roles}]"


def _role(group: FusedGroup, buf: ComputedBuffer) -> str | None:
    """How `buf` would sit in `group`, or None if its iteration space does not fit."""
    data = buf.data
    if isinstance(data, Scan):
        return None  # a scan starts its own kernel (later pointwise may join it)
    if isinstance(data, Reduction):
        if group.inner is None:
            return "reduction" if group.outer == data.ranges and not _has_inner(group) else None
        return "reduction" if (group.outer, group.inner) == (data.ranges, data.reduction_ranges) else None
    if group.inner is None:
        return "outer" if data.ranges == group.outer else None
    if data.ranges == group.outer + group.inner:
        return "inner"
    if data.ranges == group.outer:
        return "outer"
    return None


def _has_inner(group: FusedGroup) -> bool:
    return any(m.role != "outer" for m in group.members)


def _reads_are_local(group: FusedGroup, member: Member, joined: dict[str, list[str]]) -> bool:
    """Every read of a buffer of `group` hits the element written for the current outer index. A read of a
    concatenation (`joined`: its parts) that `group` writes a part of never is (kept simple)."""
    written = {m.buffer.name: m for m in group.members}
    # a size-1 loop variable is always 0, whether or not an index expression mentions it
    ones = {v: 0 for v, size in group.var_ranges().items() if size == 1}
    for name, expr in group.member_loads(member):
        if any(part in written for part in joined.get(name, ())):
            return False
        producer = written.get(name)
        if producer is None:
            continue
        if producer.role == "inner" and member.role == "outer":
            return False  # an inner loop's buffer is complete, but read at a single point: keep it simple
        want = simplify_index(sympy.expand(group.store_index(producer)), group.var_ranges())
        if sympy.expand(expr - want).xreplace(ones) != 0:
            return False
    return True


def _try_add(group: FusedGroup, buf: ComputedBuffer, joined: dict[str, list[str]]) -> bool:
    if any(m.role == "scan" for m in group.members) and group.inner is not None:
        scan = next(m.buffer.data for m in group.members if m.role == "scan")
        if scan.dim != len(scan.ranges) - 1 or isinstance(buf.data, (Reduction, Scan)):
            return False  # only when the scanned dim is the last one is the kernel's O+I the tensor's shape
    role = _role(group, buf)
    if role is None and group.inner is None and isinstance(buf.data, Reduction):
        # a pointwise group over O+I turns into a reduction group (outer O, inner I)
        data = buf.data
        if group.outer == data.ranges + data.reduction_ranges and data.reduction_ranges:
            candidate = FusedGroup(group.name, data.ranges, data.reduction_ranges,
                                   [Member(m.buffer, "inner") for m in group.members])
            member = Member(buf, "reduction")
            if all(_reads_are_local(candidate, m, joined) for m in candidate.members + [member]):
                candidate.members.append(member)
                group.outer, group.inner, group.members = candidate.outer, candidate.inner, candidate.members
                return True
        return False
    if role is None:
        return False
    member = Member(buf, role)
    trial = FusedGroup(group.name, group.outer, group.inner, group.members)
    if role == "reduction" and group.inner is None:
        trial.inner = buf.data.reduction_ranges
    if not _reads_are_local(trial, member, joined):
        return False
    group.inner = trial.inner
    group.members.append(member)
    return True


def _new_group(index: int, buf: ComputedBuffer) -> FusedGroup:
    data = buf.data
    if isinstance(data, Scan):
        outer = tuple(s for d, s in enumerate(data.ranges) if d != data.dim)
        return FusedGroup(f"kernel{index}", outer, (data.ranges[data.dim],), [Member(buf, "scan")])
    if isinstance(data, Reduction):
        return FusedGroup(f"kernel{index}", data.ranges, data.reduction_ranges, [Member(buf, "reduction")])
    return FusedGroup(f"kernel{index}", data.ranges, None, [Member(buf, "outer")])


def fuse(graph: LoopGraph, target: Target) -> list[FusedGroup | ExternNode]:
    """The graph's nodes grouped into kernels (in an order that respects every dependency).

    A node joins the latest kernel it fits (vertical fusion), or an earlier one of the same segment when
    it reads nothing written after that kernel (horizontal fusion of siblings); else it starts a kernel.
    Each fusion spends a unit of optimization fuel. What may fuse does not depend on the target today (a
    kernel is a loop nest on every target); `target` is where a target-specific limit would come from.
    """
    schedule: list[FusedGroup | ExternNode] = []
    open_groups: list[FusedGroup] = []  # kernels since the last extern call
    joined = {name: buf.parts for name, buf in graph.buffers.items() if isinstance(buf, ConcatBuffer)}
    for node in graph.nodes:
        if isinstance(node, ExternNode):
            open_groups = []
            schedule.append(node)
            continue
        reads = {source for name, _ in node.reads() for source in graph.sources(name)}
        placed = None
        for group in reversed(open_groups):
            before = (group.outer, group.inner, list(group.members))
            if _try_add(group, node, joined):
                if FUEL.take("fuse", lambda: f"fuse {node.name} into {group.name}"):
                    placed = group
                else:
                    group.outer, group.inner, group.members = before
                break
            if reads & set(group.buffer_names()):
                break  # it reads this kernel's output: it cannot move before it
        if placed is not None:
            log.debug("fuse %s into %s", node.name, placed.describe())
            continue
        if open_groups:
            log.debug("%s starts a new kernel (fits none of %s)", node.name,
                      ", ".join(g.name for g in open_groups))
        group = _new_group(sum(isinstance(s, FusedGroup) for s in schedule), node)
        schedule.append(group)
        open_groups.append(group)
    for item in schedule:
        if isinstance(item, FusedGroup):
            _finish(item)
    return schedule


class _IndexProbe(DepsHandler):
    """Records loads and index expressions (what collapsing dims must keep affine)."""

    def index_expr(self, expr: sympy.Expr, dtype: Any) -> None:
        self.loads.append(("", expr))


def _collapse(group: FusedGroup) -> None:
    """Merge adjacent dims every access walks contiguously (e.g. [N, C, 7] → [N * C * 7])."""
    shape = group.outer
    if len(shape) < 2:
        return
    variables = [index_var("x", d) for d in range(len(shape))]
    exprs = []
    for m in group.members:
        probe = _IndexProbe()
        m.buffer.data.fn(probe, variables)
        exprs += [sympy.expand(e) for _, e in probe.loads]
        layout = m.buffer.layout
        exprs.append(linear_index(variables, layout.strides, layout.offset))

    def mergeable(prev: int, d: int) -> bool:
        for e in exprs:
            for v in (variables[prev], variables[d]):
                if any(f.has(v) for f in e.atoms(FloorDiv, ModularIndexing)):
                    return False
            outer, inner = sympy.diff(e, variables[prev]), sympy.diff(e, variables[d])
            # affine in both (coefficients free of loop variables; symbolic sizes allowed), and the outer
            # dim steps over the inner one exactly
            if (outer.free_symbols | inner.free_symbols) - size_symbols((outer, inner)) or \
                    sympy.expand(outer - inner * shape[d]) != 0:
                return False
        return True
    # size-1 dims always have index 0: leave them out, and merge the others where memory allows; the loops
    # follow the first member's stored layout (an NHWC output walks C innermost, contiguously)
    dims = _store_order(group, [d for d in range(len(shape)) if shape[d] != 1])
    runs: list[list[int]] = []
    for d in dims:
        if runs and mergeable(runs[-1][-1], d):
            runs[-1].append(d)
        else:
            runs.append([d])
    if len(runs) == len(shape) and dims == sorted(dims):
        return
    new_shape = []
    for run in runs:
        size = 1
        for d in run:
            size *= shape[d]
        new_shape.append(size)
    rank = len(shape)

    def expand(index: list) -> list:
        full = [sympy.Integer(0)] * rank
        for run, i in zip(runs, index):
            full[run[-1]] = i
        return full
    group.outer = tuple(new_shape)
    group.expand = expand
    log.debug("%s: dims %s collapse to %s", group.name, list(shape), new_shape)


def _store_order(group: FusedGroup, dims: list[int]) -> list[int]:
    """`dims` ordered by the first member's strides, largest first (stable: row-major stays as it is)."""
    strides = group.members[0].buffer.layout.strides
    if not all(isinstance(strides[d], int) for d in dims):
        return dims  # symbolic strides: the logical order
    return sorted(dims, key=lambda d: -strides[d])


def _finish(group: FusedGroup) -> None:
    """A pure pointwise kernel iterates its last dim as the inner (vectorized) loop."""
    if group.inner is None:
        _collapse(group)
        if group.outer:
            outer, inner = group.outer[:-1], group.outer[-1:]
            group.members = [Member(m.buffer, "inner") for m in group.members]
            group.outer, group.inner = outer, inner
        else:
            group.inner = ()


def is_pointwise(buf: Any) -> bool:
    return isinstance(buf, ComputedBuffer) and isinstance(buf.data, Pointwise)
