"""kiln: a compiler for unmodified PyTorch programs.

The public API (DESIGN.md): kiln.compile, kiln.explain, kiln.reset, kiln.counters, kiln.register_backend.
"""
from . import config
from .counters import counters

__all__ = ["config", "counters"]
__version__ = "0.1.0"
