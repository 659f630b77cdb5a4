"""Per-code cache of captured entries, recapture on guard failure, and the recompile limit.

`CompiledFunction(fn)` is what `kiln.compile` returns for a function: each call tries the cache entries
of its code object (each entry checks its guards and runs its graph); a miss captures again. After
`recompile_limit` captures of one code object, it runs eagerly with one warning naming the guard that
kept failing.
"""
from __future__ import annotations

import collections
import functools
import time
import types
import warnings
from typing import Any, Callable

import torch

from .. import config
from ..counters import counters
from ..graph import compile_python, count_ops
from .entry import MISS, NO_SELF, make_eager_entry, make_graph_entry
from .errors import BreakRecord, GraphBreak, GraphBreakError
from .calls import bind_arguments
from .interpreter import Interpreter
from .sources import local
from .state import Capture

log_capture = config.channel("capture")
log_guards = config.channel("guards")
log_recompiles = config.channel("recompiles")
log_breaks = config.channel("breaks")
log_graph = config.channel("graph")


def graph_compiler(backend: Callable[..., Any]) -> Callable[..., Any]:
    """The backend, except that the plain `eager` backend runs the graph's printed Python (one generated
    function instead of the node-by-node interpreter: the same torch calls, less per-call overhead)."""
    from ..backends import eager
    if backend is not eager:
        return backend

    def compile_eager(graph: Any, example_inputs: list) -> Callable[..., Any]:
        try:
            return compile_python(graph)
        except Exception:  # anything the printer cannot spell runs on the interpreter
            return eager(graph, example_inputs)
    return compile_eager


class CacheEntry:
    """One capture: its guards, its graph (or the break that made it run eagerly), its entry function."""

    def __init__(self, fn: Callable[..., Any], checks: list, guards: list[str], graph: Any,
                 brk: BreakRecord | None, source: str, ops: dict[str, int]):
        self.fn = fn
        self.checks = checks
        self.guards = guards
        self.graph = graph
        self.brk = brk
        self.source = source
        self.ops = ops

    def first_failure(self, args: tuple, kwargs: dict) -> str:
        for check, text in zip(self.checks, self.guards):
            try:
                if not check(*args, **kwargs):
                    return text
            except Exception as e:
                return f"{text} (raised {type(e).__name__})"
        return "(no guard failed)"


class CodeCache:
    def __init__(self, name: str):
        self.name = name
        self.entries: list[CacheEntry] = []
        self.eager = False
        self.warned = False


_CACHES: "collections.OrderedDict[tuple, CodeCache]" = collections.OrderedDict()


def cache_for(code: types.CodeType, owner: Any) -> CodeCache:
    key = (code, id(owner))
    cache = _CACHES.get(key)
    if cache is None:
        cache = _CACHES[key] = CodeCache(code.co_qualname)
    return cache


def reset() -> None:
    """Forget every cache entry (the compiled functions capture again on their next call)."""
    for cache in _CACHES.values():
        cache.entries.clear()
        cache.eager = False
        cache.warned = False


_WARNED: set[str] = set()


def warn_once(key: str, message: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


class CompiledFunction:
    """A function (or a bound method) whose frames kiln captures."""

    def __init__(self, fn: Callable[..., Any], backend: Callable[..., Any], fullgraph: bool = False,
                 raise_on_error: bool = False, bound_self: Any = NO_SELF):
        self.fn = fn
        self.code = fn.__code__
        self.backend = graph_compiler(backend)
        self.fullgraph = fullgraph
        self.raise_on_error = raise_on_error
        self.bound_self = bound_self
        self.cache = cache_for(self.code, bound_self)
        self.name = self.code.co_qualname
        self.hits = counters["cache_hits"]
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.bound_self is not NO_SELF:
            args = (self.bound_self,) + args
        for entry in self.cache.entries:
            result = entry.fn(*args, **kwargs)
            if result is not MISS:
                self.hits[self.name] += 1
                return result
        return self._miss(args, kwargs)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return types.MethodType(self, obj)

    def run_eagerly(self, args: tuple, kwargs: dict) -> Any:
        return self.fn(*args, **kwargs)  # args include the bound self

    def _miss(self, args: tuple, kwargs: dict) -> Any:
        cache = self.cache
        if cache.eager:
            return self.run_eagerly(args, kwargs)
        if cache.entries:
            reason = cache.entries[-1].first_failure(args, kwargs)
            limit = config.get("recompile_limit")
            if len(cache.entries) >= limit:
                cache.eager = True
                counters["recompile_limit"][self.name] += 1
                message = (f"kiln: {self.name} ({self.code.co_filename}:{self.code.co_firstlineno}) was "
                           f"captured {len(cache.entries)} times (recompile_limit={limit}); it now runs "
                           f"eagerly. The guard that kept failing: {reason}. Make that value constant, "
                           f"or raise KILN_RECOMPILE_LIMIT.")
                warn_once(f"limit:{id(cache)}", message)
                log_recompiles.warning(message)
                return self.run_eagerly(args, kwargs)
            counters["recompiles"][f"{self.name}: {reason}"] += 1
            log_recompiles.info("recompiling %s: guard failed: %s", self.name, reason)
        try:
            entry = self.capture(args, kwargs)
        except GraphBreakError:
            raise
        except Exception as e:
            if self.raise_on_error or config.get("raise_on_error"):
                raise
            counters["capture_errors"][f"{self.name}: {type(e).__name__}: {e}"] += 1
            warn_once(f"error:{self.name}", f"kiln: internal error while capturing {self.name} "
                      f"({type(e).__name__}: {e}); running it eagerly")
            cache.eager = True
            return self.run_eagerly(args, kwargs)
        cache.entries.append(entry)
        result = entry.fn(*args, **kwargs)
        if result is MISS:
            reason = entry.first_failure(args, kwargs)
            cache.entries.remove(entry)
            counters["capture_errors"][f"{self.name}: fresh guards failed: {reason}"] += 1
            warn_once(f"guard:{self.name}", f"kiln: guards of a fresh capture of {self.name} fail "
                      f"({reason}); running eagerly")
            cache.eager = True
            return self.run_eagerly(args, kwargs)
        return result

    def capture(self, args: tuple, kwargs: dict) -> CacheEntry:
        """Interpret the frame symbolically for these arguments and build a cache entry."""
        fn, code = self.fn, self.code
        start = time.perf_counter()
        root = self.bound_self if isinstance(self.bound_self, torch.nn.Module) else None
        cap = Capture(code.co_name.replace("<", "_").replace(">", "_"), root=root)
        counters["captures"][self.name] += 1
        rng = torch.random.get_rng_state()
        grad = torch.is_grad_enabled()
        brk: GraphBreak | None = None
        try:
            cap.guards.grad_mode(grad)
            try:
                values = bind_arguments(fn, args, kwargs)
            except TypeError as e:
                raise GraphBreak(f"the call's arguments do not match: {e}") from None
            f_locals = {name: cap.wrap(value, local(name)) for name, value in values.items()}
            frame = Interpreter(cap, code, fn, f_locals, fn.__globals__)
            try:
                ret = frame.run()
            except GraphBreak as e:
                brk = e
            if brk is None:
                try:
                    entry_fn, checks, source = make_graph_entry(cap, fn, code, ret, self.backend)
                except GraphBreak as e:
                    brk = e
                    brk.where.append((code.co_filename, frame.lineno))
        except GraphBreak as e:
            brk = e
        finally:
            torch.random.set_rng_state(rng)
            torch._C._set_grad_enabled(grad)
        guards = cap.guards.describe()
        if brk is not None:
            record = BreakRecord(brk, resumed=False)
            counters["graph_breaks"][f"{record.location}: {record.reason}"] += 1
            log_breaks.info("graph break in %s at %s", self.name, brk.describe())
            if self.fullgraph or self.raise_on_error:
                raise GraphBreakError(f"kiln could not capture {self.name} in one graph:\n"
                                      f"{brk.describe()}") from brk.cause
            entry_fn, checks, source = make_eager_entry(cap, fn, code)
            entry = CacheEntry(entry_fn, checks, guards, None, record, source, {})
        else:
            graph = cap.graph
            ops = count_ops(graph)
            if any(n.op in ("call_torch", "call_prim") for n in graph.nodes):
                counters["graphs"][self.name] += 1
            entry = CacheEntry(entry_fn, checks, guards, graph, None, source, ops)
            log_graph.info("captured %s:\n%s", self.name, graph.python_code(f"capture of {self.name}")[0])
        log_guards.info("guards of %s:\n  %s", self.name, "\n  ".join(guards))
        log_capture.info("captured %s in %.1f ms (%d guards)", self.name,
                         (time.perf_counter() - start) * 1e3, len(guards))
        return entry
