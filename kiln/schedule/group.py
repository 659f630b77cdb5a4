"""A kernel of the fused schedule: `FusedGroup`, its members and their `Role`s (immutable values).

A kernel has outer ranges O, shared by all its members and run in parallel, and inner ranges I. A member
is a reduction over I producing a buffer of shape O (`Role.REDUCTION`), a pointwise of shape O+I computed
in its own inner loop (`Role.INNER`), a pointwise of shape O computed once per outer iteration
(`Role.OUTER`: a reduction epilogue) or a scan along one dim (`Role.SCAN`). Members run in order inside one
outer iteration. A pure pointwise kernel whose dims were collapsed (`kiln.schedule.fusion`) calls its
members' bodies through an explicit `IndexMap` from the kernel's loop variables to each original dim.
Groups are never changed after they are made: fusion builds new ones, and the memory plan gives a kernel
the buffers that stay inside it (`local`) by making a copy.
"""
from __future__ import annotations

import dataclasses
import types
from typing import Mapping

import sympy

from ..lower.index import index_var, linear_index, simplify_index
from ..lower.ir import ComputedBuffer
from .role import Role

__all__ = ["FusedGroup", "IndexMap", "Member", "Role"]


@dataclasses.dataclass(frozen=True, eq=False)
class Member:
    buffer: ComputedBuffer
    role: Role


@dataclasses.dataclass(frozen=True)
class IndexMap:
    """Kernel loop variables -> a member's original index: `dims[d]` is the position of the kernel
    variable that indexes original dim d, or None where d is always 0 (a size-1 dim, or a dim merged into a
    later one: affine accesses reach the same element through the later dim's variable alone)."""

    dims: tuple[int | None, ...]

    def __call__(self, index: list) -> list:
        return [sympy.Integer(0) if k is None else index[k] for k in self.dims]


_NO_LOCALS: Mapping[str, str] = types.MappingProxyType({})


@dataclasses.dataclass(frozen=True, eq=False)
class FusedGroup:
    """One kernel: its members run together in one loop nest over `outer`."""

    name: str
    outer: tuple[int, ...]
    inner: tuple[int, ...] | None  # None while the group holds only pointwise members over `outer`
    members: tuple[Member, ...]
    # buffer -> "scalar" | "array" | "recompute": buffers that never leave the kernel (the memory plan's)
    local: Mapping[str, str] = dataclasses.field(default_factory=lambda: _NO_LOCALS)
    index_map: IndexMap | None = None  # a pure pointwise kernel whose dims were collapsed

    def with_locals(self, local: Mapping[str, str]) -> FusedGroup:
        return dataclasses.replace(self, local=types.MappingProxyType(dict(local)))

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
        if member.role is Role.INNER:
            index = self.outer_vars() + self.inner_vars()
            return (self.index_map(index) if self.index_map is not None else index), []
        if member.role is Role.REDUCTION:
            return self.outer_vars(), self.inner_vars()
        if member.role is Role.SCAN:
            dim = member.buffer.data.dim
            outer = self.outer_vars()
            return outer[:dim] + self.inner_vars() + outer[dim:], []
        # a pure pointwise kernel whose dims all collapsed away (every size 1) keeps OUTER members
        index = self.outer_vars()
        return (self.index_map(index) if self.index_map is not None else index), []

    def store_index(self, member: Member) -> sympy.Expr:
        index, _ = self.member_index(member)
        layout = member.buffer.layout
        return linear_index(index, layout.strides, layout.offset)

    def member_loads(self, member: Member) -> list[tuple[str, sympy.Expr]]:
        from ..lower.ops import DepsHandler
        deps = DepsHandler()
        index, rindex = self.member_index(member)
        if member.role is Role.REDUCTION:
            member.buffer.data.fn(deps, index, rindex)
        else:
            member.buffer.data.fn(deps, index)
        ranges = self.var_ranges()
        return [(name, simplify_index(sympy.expand(expr), ranges)) for name, expr in deps.loads]

    def buffer_names(self) -> list[str]:
        return [m.buffer.name for m in self.members]

    def has_role(self, role: Role) -> bool:
        return any(m.role is role for m in self.members)

    def describe(self, body: bool = False) -> str:
        """One line (the header comment of the kernel in `kiln.schedule.printer`'s module: cheap enough for
        the fusion log); with `body`, the whole kernel as that module prints it (`def kernelN(ops)`)."""
        if body:
            from .printer import kernel_python
            return kernel_python(self)
        roles = ", ".join(f"{m.buffer.name}:{m.role}" for m in self.members)
        return f"{self.name}: outer={list(self.outer)} inner={list(self.inner or [])} members=[{roles}]"

