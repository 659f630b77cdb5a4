"""The compilers `kiln bench` compares: eager (the model itself), the baselines, and kiln.

An adapter is `compile(model, cache_dir) -> callable`. Baselines that call torch's own compiler (the
torch.compile column) live in the top-level `bench/baselines.py`, outside `kiln/` — kiln never imports
torch's compiler stack — and are loaded from that file by path. kiln's column is `kiln.compile(model,
backend=...)`; names are `kiln` (backend from --kiln-backend) or `kiln:NAME` (e.g. `kiln:prims`).
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import pathlib
import sys
from types import ModuleType
from typing import Any, Callable

import torch

Adapter = Callable[[torch.nn.Module, "str | None"], Callable[..., Any]]
BASELINES_FILE = pathlib.Path(__file__).resolve().parents[2] / "bench" / "baselines.py"


_REGISTERED: dict[str, Adapter] = {}


class Unavailable(Exception):
    """The compiler cannot run here (not built yet, not installed); its rows say why."""


def load_baselines(path: pathlib.Path = BASELINES_FILE) -> ModuleType | None:
    """The `bench/baselines.py` module of a source checkout, or None where it is missing."""
    if not path.is_file():
        return None
    name = "kiln_bench_baselines"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def baseline_names() -> list[str]:
    """Names of the baseline compilers found in bench/baselines.py (e.g. ['torch.compile'])."""
    module = load_baselines()
    return list(module.BASELINES) if module is not None else []


def kiln_backend_of(name: str, default: str) -> str | None:
    """'kiln' -> default backend, 'kiln:cpp' -> 'cpp'; None for names that are not kiln's."""
    if name == "kiln":
        return default
    if name.startswith("kiln:"):
        return name.split(":", 1)[1]
    return None


def kiln_availability() -> str | None:
    """None when kiln.compile exists, else why kiln's column cannot run."""
    import kiln
    if not hasattr(kiln, "compile"):
        return "kiln.compile is not built yet (the capture frontend has not landed)"
    return None


def register(name: str, adapter: Adapter) -> Adapter:
    """Add a compiler for this process (used in-process, e.g. by tests: worker.run_job)."""
    _REGISTERED[name] = adapter
    return adapter


def get(name: str, kiln_backend: str = "auto") -> Adapter:
    """The adapter called `name`: 'eager', a registered one, a baseline, 'kiln' or 'kiln:BACKEND'."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name == "eager":
        return lambda model, cache_dir: model
    backend = kiln_backend_of(name, kiln_backend)
    if backend is not None:
        return _kiln_adapter(backend)
    module = load_baselines()
    if module is None:
        raise Unavailable(f"{name}: bench/baselines.py not found (run from a source checkout: "
                          "pip install -e .)")
    if name not in module.BASELINES:
        raise ValueError(f"unknown compiler {name!r}; known: eager, kiln, kiln:BACKEND, "
                         f"{', '.join(module.BASELINES)}")
    return module.BASELINES[name]


def _kiln_adapter(backend: str) -> Adapter:
    def compile_with_kiln(model: torch.nn.Module, cache_dir: str | None) -> Callable[..., Any]:
        import kiln
        reason = kiln_availability()
        if reason is not None:
            raise Unavailable(reason)
        if cache_dir:
            kiln.config.set("cache_dir", cache_dir)
        return kiln.compile(model, backend=backend)
    return compile_with_kiln


def kiln_graph_counts(model: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
    """kiln's graph and graph-break counts: kiln.counters as the compiled runs left them, then
    kiln.explain(model, ...) on a fresh call where it exists (it captures again, so it goes second)."""
    import kiln
    snapshot = {category: dict(values) for category, values in kiln.counters.items()}
    counts: dict[str, Any] = {"counters": snapshot,
                              "graph_count": sum(snapshot.get("graphs", {}).values()),
                              "graph_break_count": sum(snapshot.get("graph_breaks", {}).values())}
    if hasattr(kiln, "explain"):
        with contextlib.redirect_stdout(io.StringIO()):   # explain prints its report; keep the counts only
            report = kiln.explain(model, *args, **kwargs)
        for key in ("graph_count", "graph_break_count"):
            value = getattr(report, key, None)
            if value is not None:
                counts[key] = int(value)
    return counts
