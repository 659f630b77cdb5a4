"""Scheduling: fusion into kernels and memory planning."""
from .fusion import FusedGroup, Member, fuse
from .memory import plan

__all__ = ["FusedGroup", "Member", "fuse", "plan"]
