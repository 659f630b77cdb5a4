"""`Role`: how a member of a fused kernel (`kiln.schedule.group.FusedGroup`) sits in its loop nest."""
from __future__ import annotations

import enum


class Role(enum.Enum):
    """How a member sits in its kernel's loop nest."""

    REDUCTION = "reduction"  # folds the inner ranges into one value per outer index
    INNER = "inner"          # pointwise over outer + inner, in the inner loop
    OUTER = "outer"          # pointwise over outer, once per outer iteration
    SCAN = "scan"            # a running fold along one dim (the kernel's inner range)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):  # a role spelled as a string is a stale comparison: say so loudly
            raise TypeError(f"compare a member's role with Role.{self.name}, not the string {other!r}")
        return self is other

    __hash__ = enum.Enum.__hash__

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)
