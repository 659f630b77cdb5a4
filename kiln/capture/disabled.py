"""Functions compiled code calls natively: `kiln.disable` and `torch.compiler.disable`.

A call of a disabled function is a graph break: the graph so far runs, the function runs as CPython runs it
(its callees too, with `torch.compiler.is_compiling()` False inside), and the rest of the caller is captured
again. torch's wrapper is recognised by the attributes torch._dynamo sets on it (`_torchdynamo_disable`),
which kiln reads without importing torch._dynamo.
"""
from __future__ import annotations

import functools
import types
from typing import Any, Callable

_KILN_FLAG = "_kiln_disable"
_TORCH_FLAG = "_torchdynamo_disable"


def disable(fn: Callable[..., Any] | None = None, *, reason: str | None = None) -> Any:
    """`fn` run natively whenever kiln-compiled code calls it (a counted graph break at the call), and
    never captured when compiled itself. A decorator (`@kiln.disable`, `@kiln.disable(reason=...)`) or a
    call (`kiln.disable(fn)`); torch.compile is not affected (torch.compiler.disable disables both)."""
    if fn is None:
        return lambda f: disable(f, reason=reason)
    if not callable(fn):
        raise TypeError(f"kiln.disable expects a function or other callable, got a {type(fn).__name__}")

    def disabled(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)
    if isinstance(fn, types.FunctionType | types.MethodType | functools.partial):
        disabled = functools.wraps(fn)(disabled)
    else:
        disabled.__wrapped__ = fn  # type: ignore[attr-defined]
    setattr(disabled, _KILN_FLAG, True)
    disabled._kiln_disable_reason = reason  # type: ignore[attr-defined]
    return disabled


def disabled_by(fn: Any) -> str | None:
    """What disabled compiling `fn` ("kiln.disable", "torch.compiler.disable"), or None when nothing did.
    Reads only a Python function's own attributes (never a getattr that could run user code)."""
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    if not isinstance(fn, types.FunctionType):
        return None
    attrs = fn.__dict__
    if attrs.get(_KILN_FLAG) is True:
        return "kiln.disable"
    if attrs.get(_TORCH_FLAG) is True:
        return "torch.compiler.disable"
    return None


def module_disabled_by(module: Any) -> str | None:
    """disabled_by for calling an nn.Module: its class decorated (torch.compiler.disable on a class wraps
    its __call__ and _call_impl) or its forward a disabled function (torch.compiler.disable(module)'s
    wrapper sets one on itself)."""
    cls = type(module)
    for name in ("__call__", "_call_impl"):
        for klass in cls.__mro__:
            if name in klass.__dict__:
                found = disabled_by(klass.__dict__[name])
                if found is not None:
                    return found
                break
    return disabled_by(module.__dict__.get("forward"))
