"""Lowering: prims → the loop IR (Pointwise, Reduction, Extern, Fallback; views fold into indices)."""
from .ir import (Buffer, BufferRef, ComputedBuffer, ExternNode, InputBuffer, Layout, LoopGraph, OutputView,
                 Pointwise, Reduction, Scan)
from .lowering import LOWERINGS, Box, Lowering, Unlowerable, lower
from .target import Target

__all__ = ["Buffer", "BufferRef", "ComputedBuffer", "ExternNode", "InputBuffer", "Layout", "LoopGraph",
           "OutputView", "Pointwise", "Reduction", "Scan", "LOWERINGS", "Box", "Lowering", "Unlowerable",
           "lower", "Target"]
