"""Scheduling: fusion into kernels, their order, and memory planning.

- `group.py`  a kernel (`FusedGroup`): immutable, its members each with a `Role` (role.py), an `IndexMap`
- `deps.py`   which schedule items must run before which (read-after-write, fallbacks' order)
- `fusion.py` `fuse`: candidate pairs from the dependencies, legal when no path between them runs through a
              third item, merged by bytes saved, then launch-only merges in program order
- `order.py`  `order`: a dependency order that keeps peak memory low;  `locality.py` buffers kept inside a
              kernel;  `memory.py` `plan`: segments, allocations, frees, reuse, in-place writes (its kernels
              are copies carrying their locals);  `printer.py` the fused schedule as runnable Python
"""
from .fusion import fuse
from .group import FusedGroup, IndexMap, Member, Role
from .memory import plan

__all__ = ["FusedGroup", "IndexMap", "Member", "Role", "fuse", "plan"]
