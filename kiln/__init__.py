"""kiln: a compiler for unmodified PyTorch programs.

The public API (kiln/api.py): kiln.compile, kiln.disable, kiln.explain, kiln.check, kiln.profile, kiln.reset,
kiln.counters, kiln.register_backend, kiln.GraphBreakError, kiln.report.
"""
from . import config
from .counters import counters

__all__ = ["config", "counters", "compile", "disable", "explain", "check", "report", "reset",
           "register_backend", "GraphBreakError", "mark_dynamic", "mark_static", "profile"]
__version__ = "0.1.0"


# the CPython versions whose bytecode the capture reads (kiln.capture.bytecode); the backends
# (kiln.ops.trace + a backend) run on any
CAPTURE_PYTHONS = ((3, 11), (3, 12), (3, 13), (3, 14))


def __getattr__(name: str):  # the API imports torch and kiln.ops; load it on first use
    if name in ("compile", "disable", "explain", "check", "report", "reset", "register_backend",
                "GraphBreakError",
                "CompiledModule", "mark_dynamic", "mark_static"):
        _check_python()
        with _collector_paused():
            from . import api
        return getattr(api, name)
    if name == "profile":  # the module is kiln.profiler, so `kiln.profile` stays this function
        _check_python()
        with _collector_paused():
            from .profiler import profile
        return profile
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")


def _check_python() -> None:
    import sys
    if sys.version_info[:2] not in CAPTURE_PYTHONS:
        versions = ", ".join(".".join(map(str, v)) for v in CAPTURE_PYTHONS)
        raise RuntimeError(
            f"kiln.compile captures CPython {versions} bytecode; this is Python {sys.version.split()[0]}, whose "
            f"bytecode it does not read yet. Run under one of those, or compile a "
            f"traced graph without capture: kiln.backends.lookup_backend(name)(kiln.ops.trace(fn, *args), args)")


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
