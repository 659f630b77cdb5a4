"""Bytecode frontend: a symbolic interpreter over CPython 3.11 bytecode that captures graphs of torch
operations, with sources and guards, graph breaks, a per-code cache and recapture on guard failure."""
from .cache import CacheEntry, CompiledFunction, reset
from .errors import BreakRecord, GraphBreak, GraphBreakError

__all__ = ["BreakRecord", "CacheEntry", "CompiledFunction", "GraphBreak", "GraphBreakError", "reset"]
