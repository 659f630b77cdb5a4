"""kiln: a compiler for unmodified PyTorch programs.

The public API (DESIGN.md): kiln.compile, kiln.explain, kiln.check, kiln.profile, kiln.reset,
kiln.counters, kiln.register_backend, kiln.GraphBreakError.
"""
from . import config
from .counters import counters

__all__ = ["config", "counters", "compile", "explain", "check", "reset", "register_backend",
           "GraphBreakError", "mark_dynamic", "mark_static", "profile"]
__version__ = "0.1.0"


def __getattr__(name: str):  # the API imports torch and kiln.ops; load it on first use
    if name in ("compile", "explain", "check", "reset", "register_backend", "GraphBreakError",
                "CompiledModule", "mark_dynamic", "mark_static"):
        with _collector_paused():
            from . import api
        return getattr(api, name)
    if name == "profile":  # the module is kiln.profiler, so `kiln.profile` stays this function
        with _collector_paused():
            from .profiler import profile
        return profile
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")


class _collector_paused:
    """Python's cyclic GC off while kiln's modules load: their ~1000 registrations start full collections
    over all of torch's objects, ~0.15 s of a warm compile in a new process (the import is 0.05 s without)."""

    def __enter__(self) -> None:
        import gc
        self.was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        import gc
        if self.was:
            gc.enable()
