"""Bytecode frontend: a symbolic interpreter over CPython bytecode (3.11, 3.12, 3.13: `bytecode.py` is the
one place that knows the version) that captures graphs of torch operations, with sources and guards, a
per-code cache and recapture on guard failure.

At a graph break (`stitch.py`) the entry runs the graph so far, rebuilds the stack and live locals, runs
the breaking instruction natively and continues in a resume function (`resume.py`: the original bytecode
behind a prologue that jumps to the next instruction), captured on its first call; callees that cannot be
inlined are called through the capture wrapper. Grad-mode switches cut graphs into segments
(`segments.py`)."""
from .cache import CacheEntry, CompiledFunction, reset
from .errors import BreakRecord, GraphBreak, GraphBreakError

__all__ = ["BreakRecord", "CacheEntry", "CompiledFunction", "GraphBreak", "GraphBreakError", "reset"]
