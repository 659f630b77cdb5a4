"""Runtime: build, cache and load generated C++."""
from .build import BuildError, CompilerNotFound, build, find_compiler, forget_loaded

__all__ = ["BuildError", "CompilerNotFound", "build", "find_compiler", "forget_loaded"]
