"""Exceptions and with-blocks in the symbolic interpreter.

`raise` inside compiled code raises a real exception object, carried as a `RaisedError`; the frame
unwinds to the innermost handler of its exception table exactly as CPython does (`Frame.unwind`), so
`try`/`except`/`finally` and exceptions raised by modelled builtins (KeyError, StopIteration, ...) behave
as eagerly. A raise that no frame handles breaks the graph and the code runs natively, raising there.

A with-block calls the manager's `__enter__` and `__exit__` (inlined when they are Python:
`contextlib.contextmanager`, `suppress`, `nullcontext`, `ExitStack`, user classes); torch.no_grad() and
friends switch grad mode in the graph; torch.autocast regions (the with-statement and the decorator) set
autocast's state for the ops traced inside, which record its casts (kiln.ops.autocast). Managers from torch
itself other than those (profilers, ...) change global state kiln would not replay: they break the graph.
"""
from __future__ import annotations

import dis
import types
from typing import Any

import torch

from ..ops import autocast
from .bytecode import PY
from .errors import HINTS, GraphBreak, RaisedError
from .frame import NULL


class GradModeContext:
    """torch.no_grad() / enable_grad() / set_grad_enabled(m) seen by the interpreter."""

    def __init__(self, enabled: bool, prev: bool | None = None):
        self.enabled = enabled
        self.prev = prev  # set_grad_enabled() changes the mode at construction, remembering this

    def enter(self, cap: Any) -> None:
        if self.prev is None:
            self.prev = torch.is_grad_enabled()
            set_grad(cap, self.enabled)
        return None

    def exit_fn(self) -> "GradModeExit":
        return GradModeExit(self)


class GradModeExit:
    def __init__(self, ctx: GradModeContext):
        self.ctx = ctx


def set_grad(cap: Any, enabled: bool) -> None:
    """Record a grad-mode change in the graph (and make it during capture, for correct metadata)."""
    if torch.is_grad_enabled() == enabled:
        return
    cap.graph.call_torch(torch._C._set_grad_enabled, (enabled,), {}, None, origin=cap.tracer.origin)
    torch._C._set_grad_enabled(enabled)
    cap.grad_changes += 1


class AutocastContext:
    """A torch.autocast instance in a with-block: while tracing its body, autocast's state is the one the
    region sets (for the ops' examples and their casts); leaving restores the state before it."""

    def __init__(self, manager: Any):
        self.manager = manager
        self.prev: tuple | None = None

    def enter(self, cap: Any) -> Any:
        m = self.manager
        if m.device not in autocast.DEVICES:
            raise GraphBreak(f"torch.autocast for device {m.device!r} (kiln follows cpu and cuda)")
        self.prev = autocast.saved()
        torch.set_autocast_enabled(m.device, bool(m._enabled))
        if m.fast_dtype is not None:
            torch.set_autocast_dtype(m.device, m.fast_dtype)
        torch.set_autocast_cache_enabled(bool(m._cache_enabled))
        return m  # `with torch.autocast(...) as a` binds the manager itself

    def exit_fn(self) -> "AutocastExit":
        return AutocastExit(self)


class AutocastExit:
    def __init__(self, ctx: AutocastContext):
        self.ctx = ctx

    def leave(self) -> bool:
        if self.ctx.prev is not None:
            autocast.restore(self.ctx.prev)
        return False  # exceptions propagate


class WithEnter:
    """3.14: the __enter__ of kiln's own context (grad mode, autocast) as LOAD_SPECIAL loads it."""

    def __init__(self, ctx: Any):
        self.ctx = ctx


class BlockOps:
    """Frame mixin: raise, except, finally, with."""

    def op_LOAD_ASSERTION_ERROR(self, inst: dis.Instruction) -> None:
        self.push(AssertionError)

    def make_exception(self, value: Any) -> Any:
        if isinstance(value, type) and issubclass(value, BaseException):
            value = value() if value.__module__ == "builtins" else self.call(value, [], {})
        if isinstance(value, BaseException):
            self.cap.new_local(value)
        return value

    def current_handled(self) -> Any:
        """The exception being handled, as sys.exc_info() sees it: the innermost `except` or `finally`
        running in this frame or in the frames that called it."""
        frame = self
        while frame is not None:
            if frame.handled is not None:
                return frame.handled
            frame = frame.parent
        return None

    def op_RAISE_VARARGS(self, inst: dis.Instruction) -> None:
        args = self.popn(inst.arg)
        handled = self.current_handled()
        exc = handled if inst.arg == 0 else args[0]
        if inst.arg == 0 and exc is None:
            exc = RuntimeError("No active exception to reraise")
        exc = self.make_exception(exc)
        if not isinstance(exc, (Exception, GeneratorExit)):
            brk = GraphBreak(f"the code raises a {type(exc).__name__}", HINTS["raise"])
            brk.resumable = False  # the exception's traceback must show the user's frame
            raise brk
        if inst.arg == 2:  # raise exc from cause
            cause = self.make_exception(args[1])
            if cause is not None and not isinstance(cause, BaseException):
                raise RaisedError(TypeError("exception causes must derive from BaseException"), "raise from")
            exc.__cause__ = cause
        if handled is not None and exc is not handled and isinstance(handled, BaseException):
            exc.__context__ = handled
        raise RaisedError(exc, f"the code raises {type(exc).__name__}: {exc}", HINTS["raise"])

    def op_PUSH_EXC_INFO(self, inst: dis.Instruction) -> None:
        exc = self.pop()
        handled = self.current_handled()
        if isinstance(exc, BaseException) and handled is not None and exc is not handled and \
                exc.__context__ is None and isinstance(handled, BaseException):
            exc.__context__ = handled  # raised while another was being handled (a builtin's error)
        self.push(self.handled)
        self.handled = exc
        self.push(exc)

    def op_POP_EXCEPT(self, inst: dis.Instruction) -> None:
        self.handled = self.pop()

    def op_CHECK_EXC_MATCH(self, inst: dis.Instruction) -> None:
        kind = self.pop()
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not all(isinstance(k, type) and issubclass(k, BaseException) for k in kinds):
            raise GraphBreak(f"`except` with {kind!r}, not exception classes")
        self.push(isinstance(self.stack[-1], kinds))

    def op_RERAISE(self, inst: dis.Instruction) -> None:
        exc = self.pop()
        if not isinstance(exc, (Exception, GeneratorExit)):
            raise GraphBreak("re-raising a value kiln did not see raised")
        raise RaisedError(exc, f"the code raises {type(exc).__name__}: {exc}", HINTS["raise"])

    # ---- with blocks ----
    def op_BEFORE_WITH(self, inst: dis.Instruction) -> None:
        manager = self.with_manager(self.pop())
        if isinstance(manager, (GradModeContext, AutocastContext)):
            self.push(manager.exit_fn())
            self.push(manager.enter(self.cap))
            return
        enter, leave, obj = manager
        self.push(types.MethodType(leave, obj))
        self.push(self.call(enter, [obj], {}))

    def op_LOAD_SPECIAL(self, inst: dis.Instruction) -> None:
        """3.14: a with-statement loads __exit__, then __enter__, each as (method, self) or (callable,
        NULL), in place of BEFORE_WITH."""
        obj = self.pop()
        name = inst.argval
        if name not in ("__enter__", "__exit__"):
            raise GraphBreak(f"`async with` ({name})")
        if self.with_pending is None:
            self.with_pending = {}
        pending = self.with_pending
        manager = pending.pop(id(obj))[1] if id(obj) in pending else self.with_manager(obj)
        if name == "__exit__":
            pending[id(obj)] = (obj, manager)  # (the object is held: its id stays its own)
        if isinstance(manager, (GradModeContext, AutocastContext)):
            self.push_callable(manager.exit_fn() if name == "__exit__" else WithEnter(manager))
            return
        enter, leave, obj = manager
        self.push(enter if name == "__enter__" else leave)
        self.push(obj)

    def with_manager(self, manager: Any) -> Any:
        """What a with-block on `manager` runs: kiln's own context for grad mode and autocast, else the
        (__enter__, __exit__, manager) of a Python context manager; anything else breaks."""
        from .values import class_lookup
        if type(manager) in (torch.no_grad, torch.enable_grad):  # an instance made outside
            manager = GradModeContext(type(manager) is torch.enable_grad)
        if isinstance(manager, torch.amp.autocast_mode.autocast):  # (and the cpu/cuda subclasses)
            manager = AutocastContext(manager)
        if isinstance(manager, (GradModeContext, AutocastContext)):
            return manager
        enter = class_lookup(type(manager), "__enter__")
        leave = class_lookup(type(manager), "__exit__")
        module = type(manager).__module__ or ""
        if module.split(".")[0] == "torch" or not (isinstance(enter, types.FunctionType) and
                                                    isinstance(leave, types.FunctionType)):
            raise GraphBreak(f"with-block on a {type(manager).__name__} (kiln follows Python context "
                             "managers and torch.no_grad/enable_grad/set_grad_enabled)",
                             "move the with-block outside the compiled function")
        return enter, leave, manager

    def op_WITH_EXCEPT_START(self, inst: dis.Instruction) -> None:
        """The with-block was left by an exception: call __exit__(type, value, traceback)."""
        exc = self.stack[-1]
        args = [type(exc), exc, getattr(exc, "__traceback__", None)]
        if PY >= (3, 14):  # (__exit__ and its self, or a callable and NULL, below lasti)
            leave, owner = self.stack[-5], self.stack[-4]
            if owner is not NULL:
                args = [owner] + args
        else:
            leave = self.stack[-4]
        self.push(self.call(leave, args, {}))

    def op_LOAD_COMMON_CONSTANT(self, inst: dis.Instruction) -> None:
        """3.14: AssertionError, NotImplementedError and a few builtins, by index."""
        self.push(inst.argval)
