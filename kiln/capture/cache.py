"""Per-code cache of captured entries, recapture on guard failure, and the recompile limit.

`CompiledFunction(fn)` is what `kiln.compile` returns for a function: each call tries the cache entries
of its code object (each entry checks its guards and runs its graph); a miss captures again. After
`recompile_limit` captures of one code object, it runs eagerly with one warning naming the guard that
kept failing.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import keyword
import logging
import os
import re
import time
import types
import warnings
import weakref
from typing import Any, Callable, Iterator

import torch

from .. import config
from ..counters import counters
from ..graph import count_ops, torch_internals
from ..graph.pipeline import without_cyclic_gc
from ..ops import autocast
from .dynamic import changed_dims, changed_ints
from .disabled import disabled_by, module_disabled_by
from .entry import MISS, NO_SELF, make_eager_entry, make_graph_entry, source_reader
from .errors import BreakRecord, CaptureErrorRecord, GraphBreak, GraphBreakError
from .calls import bind_arguments, sets_state
from .frame import Frame, StopCapture
from .guards import hooks_present, is_constant
from .interpreter import Interpreter
from .native import routed_function
from .resume import NotResumable, check_resumable, make_resume_function
from .stitch import CALL_OPS, make_break_entry
from .sources import local
from .state import Capture

log_capture = config.channel("capture")
log_guards = config.channel("guards")
log_recompiles = config.channel("recompiles")
log_breaks = config.channel("breaks")
log_graph = config.channel("graph")
log_dynamic = config.channel("dynamic")


class CacheEntry:
    """One capture: its guards, its graph (the graph before the break, if the frame broke), the break,
    its entry function, and the compiled functions it calls (resume functions, callees captured as their
    own frames)."""

    def __init__(self, fn: Callable[..., Any], checks: list, guards: list[str], graph: Any,
                 brk: BreakRecord | None, source: str, ops: dict[str, int], children: list | None = None):
        self.tensor_inputs: list[tuple[Any, tuple]] = []  # (source, shape) of plain tensor inputs
        self.int_inputs: list[tuple[Any, int]] = []  # (source, value) of int inputs guarded as constants
        self.reader: Callable[..., Any] | None = None  # reader(expr, *args, **kwargs): a source's value
        self.symbols: list[str] = []  # the shape env's description (symbols, their sources, facts)
        self.fn = fn
        self.checks = checks
        self.guards = guards
        self.graph = graph
        self.brk = brk
        self.source = source
        self.ops = ops
        self.name = ""  # the captured frame's readable name (CompiledFunction.name)
        self.where: tuple[str, int] = ("", 0)  # the frame's file and first line
        self.capture_ms = 0.0  # the capture's time (with the backend's compile of its graph, if it ran then)
        self.children: list["CompiledFunction"] = children if children is not None else []

    def first_failure(self, args: tuple, kwargs: dict) -> str:
        for check, text in zip(self.checks, self.guards):
            try:
                if not check(*args, **kwargs):
                    return text.failure() if hasattr(text, "failure") else text  # (a bulk guard's item)
            except Exception as e:
                return f"{text} (raised {type(e).__name__})"
        return "(no guard failed)"


class CaptureScope:
    """What the captures of one top-level compiled function create and call: the compiled functions of
    callees captured as their own frames and of resume functions, and their caches. A scope lives as long
    as the top-level cache (the compiled functions that share it) and no longer, so dropping a compiled
    model frees the entries and the parameters and modules they hold; nothing process-wide keeps them."""

    def __init__(self) -> None:
        self.caches: dict[tuple, CodeCache] = {}
        self.callees: dict[tuple, CompiledFunction] = {}
        self.resumes: dict[tuple, CompiledFunction] = {}


_SERIALS = itertools.count()


class CodeCache:
    def __init__(self, name: str, scope: CaptureScope | None = None):
        self.name = name
        self.serial = next(_SERIALS)  # (a cache's id is reused once it is freed)
        self.scope = scope if scope is not None else CaptureScope()
        self.entries: list[CacheEntry] = []
        self.eager = False
        self.warned = False
        # (source expr, dim) made symbolic by a recompile -> the least size its symbol stands for: 1 where
        # the dim was seen at size 1 (the graph then serves size 1 too), else 2
        self.dynamic_dims: dict[tuple[str, int], int] = {}


# the caches of top-level compiled functions, held by those functions only: compiling a function again while
# an earlier compile of it is alive shares its cache; once every compiled function using a cache is dropped,
# the cache goes with its entries. (The key's ids stay valid while the cache lives: its compiled functions
# hold the owner, the closure cells, the globals and the compiler.)
_CACHES: "weakref.WeakValueDictionary[tuple, CodeCache]" = weakref.WeakValueDictionary()
_ALL_CACHES: "weakref.WeakSet[CodeCache]" = weakref.WeakSet()  # top-level and scoped, for reset()


def cache_for(code: types.CodeType, owner: Any, extra: Any = None,
              scope: CaptureScope | None = None) -> CodeCache:
    """The cache of a code object for this owner (a bound self) and key: a top-level one (scope None) or
    one in the scope of the top-level compiled function whose captures call it."""
    key = (code, id(owner), extra)
    table = _CACHES if scope is None else scope.caches
    cache = table.get(key)
    if cache is None:
        cache = table[key] = CodeCache(code.co_qualname, scope)
        _ALL_CACHES.add(cache)
    return cache


def reset() -> None:
    """Forget every cache entry (the compiled functions capture again on their next call)."""
    for cache in list(_ALL_CACHES):
        cache.entries.clear()
        cache.eager = False
        cache.warned = False
        cache.dynamic_dims.clear()


_WARNED: set[str] = set()


def warn_once(key: str, message: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def frame_name(fn: Any, bound_self: Any = NO_SELF) -> str:
    """A captured frame's readable name: the function a decorator wraps (`functools.wraps`' `__wrapped__`,
    innermost first: transformers' `can_return_tuple.<locals>.wrapper` around `GPT2Model.forward` is
    `GPT2Model.forward`), a closure bound to a module as its class and the function's name, else the code's
    qualified name (a resume function's names the line it continues at: `f (resumed at line 12)`)."""
    code = fn.__code__
    inner, depth = fn, 0
    while getattr(inner, "__wrapped__", None) is not None and depth < 32:
        inner, depth = inner.__wrapped__, depth + 1
    name = getattr(inner, "__qualname__", None)
    if inner is not fn and isinstance(name, str):
        return name
    if "<locals>" in code.co_qualname and isinstance(bound_self, torch.nn.Module):
        method = "forward" if getattr(type(bound_self), "forward", None) is fn else code.co_name
        return f"{type(bound_self).__name__}.{method}"
    return code.co_qualname


def graph_name(frame: str) -> str:
    """A graph's name (an identifier: generated code and debug dump directories use it) from its frame's
    readable name: `GPT2Model.forward` -> `GPT2Model_forward`, `f (resumed at line 12)` -> `f_line_12`."""
    frame = frame.rsplit(".<locals>.", 1)[-1].replace("(resumed at ", "")
    name = re.sub(r"\W+", "_", frame).strip("_")
    # (`<lambda>` would be `lambda`, a keyword: the graph's printed code and its generated functions take it)
    return name if name.isidentifier() and not keyword.iskeyword(name) else f"g_{name}"


class CompiledFunction:
    """A function (or a bound method) whose frames kiln captures."""

    def __init__(self, fn: Callable[..., Any], backend: Callable[..., Any], fullgraph: bool = False,
                 raise_on_error: bool = False, bound_self: Any = NO_SELF, family: Any = None,
                 dynamic: bool | None = None, scope: CaptureScope | None = None):
        self.fn = fn
        self.dynamic = dynamic
        self.code = fn.__code__
        self.backend = backend  # a compiler: backend(graph, example_inputs), its options bound
        # the config flags this compile set (kiln.compile(options=), on its compiler's context): capture's
        # decompositions read them too (e.g. conv_gemm_max_macs picks a convolution's decomposition)
        self.options: dict[str, Any] = dict(getattr(getattr(backend, "context", None), "options", None) or {})
        self.fullgraph = fullgraph
        self.raise_on_error = raise_on_error
        self.bound_self = bound_self
        # functions of one code object share a cache only when they share their closure cells (the
        # guards read the cells captured first) and their defaults (an entry runs with the defaults of
        # the function it was made for); `family` separates caches per compiler (the backend and its
        # options: kiln.compile(f, backend="cpp") never runs graphs an earlier kiln.compile(f) compiled)
        family = backend if family is None else family
        # (and their globals: code objects compare by value, so equal code exec'd in two namespaces is
        # two functions reading different globals)
        # (`scope`: the top-level compiled function's, for a callee or resume function its captures call)
        self.cache = cache_for(self.code, bound_self, (closure_key(fn), defaults_key(fn), id(fn.__globals__),
                                                       family), scope)
        self.scope = self.cache.scope
        self.name = frame_name(fn, bound_self)  # (counters, logs, explain, graph and dump names)
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.bound_self is not NO_SELF:
            args = (self.bound_self,) + args
        for entry in self.cache.entries:
            result = entry.fn(*args, **kwargs)
            if result is not MISS:
                counters["cache_hits"][self.name] += 1  # (looked up: kiln.reset() replaces the counters)
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
                warn_once(f"limit:{cache.serial}", message)
                log_recompiles.warning(message)
                return self.run_eagerly(args, kwargs)
            grown = self._automatic_dynamic(cache, args, kwargs)
            if grown:
                reason = f"{reason}; size change {grown}: now dynamic"
                log_dynamic.info("%s: %s: now dynamic (recapturing with symbolic sizes)", self.name, grown)
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
            record_error(CaptureErrorRecord(self.name, f"{type(e).__name__}: {e}", interpreted_at(e)))
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
            record_error(CaptureErrorRecord(self.name, f"the guards of a fresh capture fail: {reason}"))
            warn_once(f"guard:{self.name}", f"kiln: guards of a fresh capture of {self.name} fail "
                      f"({reason}); running eagerly")
            cache.eager = True
            return self.run_eagerly(args, kwargs)
        return result

    def _automatic_dynamic(self, cache: CodeCache, args: tuple, kwargs: dict) -> str:
        """Dims whose size differs from the last capture's become symbolic in the next one (unless
        compiled with dynamic=False). Returns the change, for the recompile reason."""
        entry = cache.entries[-1]
        if self.dynamic is False or entry.reader is None:
            return ""
        read = lambda expr: entry.reader(expr, *args, **kwargs)  # noqa: E731
        changed = changed_dims(entry.tensor_inputs, read) + changed_ints(entry.int_inputs, read)
        new = [c for c in changed if (c[0], c[2]) not in cache.dynamic_dims]
        for expr, _, d, old, now in new:
            cache.dynamic_dims[(expr, d)] = 1 if 1 in (old, now) and d >= 0 else 2
        if new:
            counters["automatic_dynamic"][self.name] += 1
        return ", ".join(f"{name}{'' if d < 0 else f'.size({d})'} {old} -> {now}" for _, name, d, old, now in new)

    def _interpret(self, args: tuple, kwargs: dict, stop_at: int | None) -> tuple:
        """Run the frame symbolically: (capture, top frame, return value, break, stopped, grad changed)."""
        fn, code = self.fn, self.code
        root = self.bound_self if isinstance(self.bound_self, torch.nn.Module) else None
        cap = Capture(graph_name(self.name), root=root, dynamic=self.dynamic,
                      dynamic_dims=self.cache.dynamic_dims, options=self.options)
        # the frame and its line, for the index of KILN_DEBUG_DIR
        cap.graph.origin = f"{self.name} ({code.co_filename}:{code.co_firstlineno})"
        rng = torch.random.get_rng_state()
        grad = torch.is_grad_enabled()
        autocast_before = cap.autocast_saved = autocast.saved()
        cap.autocast_entry = autocast.state()
        brk: GraphBreak | None = None
        frame = ret = None
        stopped = False
        grad_changed = False
        try:
            cap.guards.grad_mode(grad)
            forward_ad = torch_internals.forward_ad_active()
            cap.guards.forward_ad(forward_ad)
            if forward_ad:
                # (dual tensors: their tangents would be dropped, eager's forward-mode rules must run)
                brk = GraphBreak("forward-mode AD is active (torch.autograd.forward_ad.dual_level): kiln's "
                                 "graphs carry no tangents", "the frame runs eagerly while it is")
                brk.resumable = False
                brk.where.append((code.co_filename, code.co_firstlineno))
                raise brk
            cap.guards.autocast(cap.autocast_entry)
            cap.guards.default_dtype(torch.get_default_dtype())
            try:
                values = bind_arguments(fn, args, kwargs)
            except TypeError as e:
                raise GraphBreak(f"the call's arguments do not match: {e}") from None
            f_locals = {name: cap.wrap(value, local(name)) for name, value in values.items()}
            frame = Interpreter(cap, code, fn, f_locals, fn.__globals__)
            frame.stop_at = stop_at
            try:
                ret = frame.run()
            except StopCapture:
                stopped = True
        except GraphBreak as e:
            brk = e
        finally:
            grad_changed = torch.is_grad_enabled() != grad
            torch.random.set_rng_state(rng)
            torch._C._set_grad_enabled(grad)
            autocast.restore(autocast_before)  # (a region the capture entered and did not leave)
        return cap, frame, ret, brk, stopped, grad_changed

    @without_cyclic_gc
    def capture(self, args: tuple, kwargs: dict) -> CacheEntry:
        """Interpret the frame symbolically for these arguments and build a cache entry. A frame that
        breaks is captured again up to the breaking instruction, and continues in resume functions."""
        fn, code = self.fn, self.code
        start = time.perf_counter()
        counters["captures"][self.name] += 1
        cap, frame, ret, brk, _, _ = self._interpret(args, kwargs, None)
        if brk is None:
            try:
                entry_fn, checks, source = make_graph_entry(cap, fn, code, ret, self.backend)
            except GraphBreak as e:
                brk = e
                brk.where.append((code.co_filename, frame.lineno))
        children: list = []
        if brk is not None:
            if self.fullgraph or self.raise_on_error:
                raise GraphBreakError(f"kiln could not capture {self.name} in one graph:\n"
                                      f"{brk.describe()}") from brk.cause
            resumed = self._capture_until(args, kwargs, brk, children)
            if resumed is not None:
                cap, entry_fn, checks, source, record = resumed
            else:
                entry_fn, checks, source = make_eager_entry(cap, self._native_frame(children), code)
                record = BreakRecord(brk, resumed=False)
                record.native_frame = f"{self.name} ({code.co_filename}:{code.co_firstlineno})"
                counters["frames_run_natively"][record.native_frame] += 1
            counters["graph_breaks"][f"{record.location}: {record.reason}"] += 1
            log_breaks.info("graph break in %s at %s", self.name, brk.describe())
        guards = cap.guards.describe()
        graph = cap.graph if brk is None or record.resumed else None
        ops = count_ops(graph) if graph is not None else {}
        ops.pop("torch._C._set_grad_enabled", None)  # grad-mode switches run between graph segments
        if ops:
            counters["graphs"][self.name] += 1
        entry = CacheEntry(entry_fn, checks, guards, graph, record if brk is not None else None, source, ops,
                           children)
        entry.name = self.name
        entry.where = (code.co_filename, code.co_firstlineno)
        entry.tensor_inputs = [(src, tuple(t.shape)) for src, t, by_identity in cap.inputs if not by_identity]
        entry.tensor_inputs += cap.alias_inputs
        entry.int_inputs = list(cap.int_inputs)
        entry.reader = source_reader(cap, fn, code) if entry.tensor_inputs or entry.int_inputs else None
        entry.symbols = cap.shape_env.describe() if cap.shape_env.hints else []
        if graph is not None and log_graph.isEnabledFor(logging.INFO):  # (printing a large graph takes ms)
            code = graph.python_code(f"capture of {self.name}", log_graph.isEnabledFor(logging.DEBUG))[0]
            log_graph.info("captured %s:\n%s", self.name, code)
        log_guards.info("guards of %s:\n  %s", self.name, "\n  ".join(guards))
        if entry.symbols:
            log_dynamic.info("symbolic sizes of %s:\n  %s", self.name, "\n  ".join(entry.symbols))
        log_capture.info("captured %s in %.1f ms (%d guards)", self.name,
                         (time.perf_counter() - start) * 1e3, len(guards))
        entry.capture_ms = (time.perf_counter() - start) * 1e3
        for recording in _RECORDING:
            recording.entries.append(entry)
        return entry

    def _native_frame(self, children: list) -> Callable[..., Any]:
        """The function an entry runs when the frame runs natively: a copy whose calls go through the
        capture wrapper, so the frame's callees are still captured (invariant 6)."""
        try:
            caller = CalleeCaller(self.backend, self.raise_on_error, children, self.scope, self.dynamic)
            return routed_function(self.fn, caller)
        except Exception as e:  # an unusual code object: the frame and its callees run natively
            counters["capture_errors"][f"{self.name}: routing calls: {type(e).__name__}: {e}"] += 1
            record_error(CaptureErrorRecord(self.name, f"routing calls: {type(e).__name__}: {e}"))
            return self.fn

    def _capture_until(self, args: tuple, kwargs: dict, brk: GraphBreak, children: list) -> tuple | None:
        """Capture the frame again, stopping before the instruction that broke, and build an entry that
        runs the graph, that instruction natively, and a resume function. None: run the frame natively."""
        if brk.top_index is None:
            brk.reason += " (the frame runs eagerly)"
            return None
        try:
            # refuse early (loops, try/with blocks) before capturing a second time
            inst = Interpreter.instructions(self.code)[brk.top_index]
            check_resumable(self.code, inst.offset, inst.opname in CALL_OPS)
            cap, frame, _, _, stopped, grad_changed = self._interpret(args, kwargs, brk.top_index)
            if not stopped:
                raise NotResumable("a second capture did not reach the break")
            caller = CalleeCaller(self.backend, self.raise_on_error, children, self.scope, self.dynamic)
            entry_fn, checks, source, resumes = make_break_entry(
                cap, self.fn, self.code, frame, brk, self.backend, self._resume_function, caller,
                grad_changed)
        except GraphBreak as e:
            why = e.reason if isinstance(e, NotResumable) else f"{e.reason} (while resuming)"
            brk.reason += f" (the frame runs eagerly: {why})"
            log_breaks.info("cannot resume %s: %s", self.name, why)
            return None
        children.extend(r for r in resumes if r not in children)
        record_brk = brk
        if brk.in_callee and len(brk.where) > 1:
            inner = brk.where[0]
            record_brk = GraphBreak(f"call not inlined: {brk.reason} (at {inner[0]}:{inner[1]}); the callee "
                                    f"is captured as its own frame", brk.hint)
            record_brk.where = [brk.where[-1]]
        return cap, entry_fn, checks, source, BreakRecord(record_brk, resumed=True)

    def _resume_function(self, rcode: types.CodeType) -> "CompiledFunction":
        """The compiled resume function for a resume code of this frame (one per code and backend)."""
        key = (rcode, closure_key(self.fn), id(self.fn.__globals__), id(self.backend))
        compiled = self.scope.resumes.get(key)
        if compiled is None:
            fn = make_resume_function(self.fn, rcode)
            compiled = self.scope.resumes[key] = CompiledFunction(
                fn, self.backend, raise_on_error=self.raise_on_error, family=self.backend,
                dynamic=self.dynamic, scope=self.scope)
        return compiled


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


class Recording:
    """What `recording()` collects: cache entries captured, and internal errors that stopped a capture."""

    def __init__(self) -> None:
        self.entries: list[CacheEntry] = []
        self.errors: list[CaptureErrorRecord] = []


_RECORDING: list[Recording] = []  # the recordings `recording()` fills


@contextlib.contextmanager
def recording() -> Iterator[Recording]:
    """`with recording() as recorded:` collects every cache entry captured inside the block, and every
    internal capture error (kiln.explain)."""
    recorded = Recording()
    _RECORDING.append(recorded)
    try:
        yield recorded
    finally:
        _RECORDING.remove(recorded)


def start_recording(recorded: Recording) -> None:
    """Fill `recorded` from now on, as `recording()` does for a block (the compile report's record)."""
    if recorded not in _RECORDING:
        _RECORDING.append(recorded)


def record_error(error: CaptureErrorRecord) -> None:
    for recorded in _RECORDING:
        recorded.errors.append(error)


def interpreted_at(exc: BaseException) -> tuple[str, int] | None:
    """The user's file and line the symbolic interpreter was at when `exc` escaped it (innermost frame)."""
    where = None
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame.f_locals.get("self")
        if isinstance(frame, Frame):
            where = (frame.code.co_filename, frame.lineno)
        tb = tb.tb_next
    return where


def closure_key(fn: Any) -> tuple:
    return tuple(id(c) for c in (getattr(fn, "__closure__", None) or ()))


def defaults_key(fn: Any) -> tuple:
    """Positional and keyword defaults: by value when they are hashable constants, else by identity."""
    values = list(getattr(fn, "__defaults__", None) or ()) + \
        [v for _, v in sorted((getattr(fn, "__kwdefaults__", None) or {}).items())]
    return tuple(v if _hashable_constant(v) else ("id", id(v)) for v in values)


def _hashable_constant(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return is_constant(value)


class CalleeCaller:
    """Calls a function the interpreter could not inline through the capture wrapper, so the callee is
    captured as its own frame (with its own graphs, breaks and resume functions)."""

    def __init__(self, backend: Callable[..., Any], raise_on_error: bool, children: list,
                 scope: CaptureScope, dynamic: bool | None = None):
        self.dynamic = dynamic
        self.scope = scope  # the callees' compiled functions live in the caller's top-level scope
        self.backend = backend
        self.raise_on_error = raise_on_error
        self.children = children

    def __call__(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        target, bound = self.compiled_for(fn)
        if target is None:
            return fn(*args, **kwargs)
        if bound is not NO_SELF:
            return target(bound, *args, **kwargs)
        return target(*args, **kwargs)

    def compiled_for(self, fn: Any) -> tuple[Any, Any]:
        bound = NO_SELF
        if isinstance(fn, torch.nn.Module):
            if hooks_present(fn) or module_disabled_by(fn) is not None:  # (checked on every call)
                return None, NO_SELF
            fn = fn.forward
        if isinstance(fn, types.MethodType):
            fn, bound = fn.__func__, fn.__self__
        if not isinstance(fn, types.FunctionType) or fn.__code__.co_flags & (0x20 | 0x80 | 0x100 | 0x200):
            return None, NO_SELF
        if disabled_by(fn) is not None:
            return None, NO_SELF  # kiln.disable / torch.compiler.disable: it and its callees run natively
        if (fn.__module__ or "").startswith("kiln.") or (fn.__code__.co_filename.startswith(_TORCH_DIR)
                                                        and sets_state(fn)):
            return None, NO_SELF  # torch.set_default_dtype and friends run as they are
        if not all(name.isidentifier() for name in fn.__code__.co_varnames[:fn.__code__.co_argcount]):
            return None, NO_SELF  # a comprehension's `.0`: no entry function can take it
        defaults = fn.__defaults__ or ()
        kwdefaults = tuple((fn.__kwdefaults__ or {}).items())
        same = (defaults, kwdefaults) if all(_hashable_constant(v) for v in defaults) and all(
            _hashable_constant(v) for _, v in kwdefaults) else id(fn)
        key = (fn.__code__, closure_key(fn), id(fn.__globals__), same, id(self.backend), self.dynamic)
        compiled = self.scope.callees.get(key)
        if compiled is None:
            compiled = self.scope.callees[key] = CompiledFunction(
                fn, self.backend, raise_on_error=self.raise_on_error, family=self.backend,
                dynamic=self.dynamic, scope=self.scope)
        if compiled not in self.children:
            self.children.append(compiled)
        return compiled, bound
