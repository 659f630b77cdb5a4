"""Lowering: prims → the loop IR (Pointwise, Reduction, Extern, Fallback; views fold into indices)."""
from .ir import (Buffer, BufferRef, ComputedBuffer, ExternNode, InputBuffer, Layout, LoopGraph, OutputView,
                 Pointwise, Reduction, Scan)
from .lowering import LOWERINGS, SUPPORTED_DTYPES, Box, Lowering, Unlowerable, lower

__all__ = ["Buffer", "BufferRef", "ComputedBuffer", "ExternNode", "InputBuffer", "Layout", "LoopGraph",
           "OutputView", "Pointwise", "Reduction", "Scan", "LOWERINGS", "SUPPORTED_DTYPES", "Box", "Lowering",
           "Unlowerable", "lower"]
