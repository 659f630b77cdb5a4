"""Scheduling: fusion into kernels and memory planning."""
from .fusion import fuse
from .group import FusedGroup, IndexMap, Member, Role
from .memory import plan

__all__ = ["FusedGroup", "IndexMap", "Member", "Role", "fuse", "plan"]
