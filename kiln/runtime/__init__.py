"""Runtime: build, cache and load generated C++."""
from .build import BuildError, CompilerNotFound, KernelLoadError, build, find_compiler, forget_loaded
from .cache import CacheWriteError

__all__ = ["BuildError", "CacheWriteError", "CompilerNotFound", "KernelLoadError", "build", "find_compiler",
           "forget_loaded"]
