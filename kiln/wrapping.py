"""The nn.Module that kiln.compile returns for a module: one wrapper class, whose module API and attributes
read and write through to the module it wraps (`_orig_mod`). CompiledModule, CompiledDDP and CompiledFSDP
subclass it and differ only in how a call runs."""
from __future__ import annotations

import functools
import threading
import types
from typing import Any, Callable

import torch


class WrappedModule(torch.nn.Module):
    """Attribute access, parameters, buffers, state_dict, train()/eval(), hooks: the wrapped module's."""

    def _wrap(self, module: torch.nn.Module) -> None:
        """Call from __init__ after super().__init__(): `module` becomes the one behind every attribute."""
        self.__dict__.pop("training", None)  # read through to the wrapped module
        object.__setattr__(self, "_orig_mod", module)

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_orig_mod"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._orig_mod, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._orig_mod, name)

    def __dir__(self) -> list[str]:
        return dir(self._orig_mod)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._orig_mod!r})"

    # the module API, delegated to the wrapped module
    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.load_state_dict(*args, **kwargs)

    def parameters(self, recurse: bool = True) -> Any:
        return self._orig_mod.parameters(recurse)

    def named_parameters(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.named_parameters(*args, **kwargs)

    def buffers(self, recurse: bool = True) -> Any:
        return self._orig_mod.buffers(recurse)

    def named_buffers(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.named_buffers(*args, **kwargs)

    def children(self) -> Any:
        return self._orig_mod.children()

    def named_children(self) -> Any:
        return self._orig_mod.named_children()

    def modules(self) -> Any:
        return self._orig_mod.modules()

    def named_modules(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.named_modules(*args, **kwargs)

    def train(self, mode: bool = True) -> Any:
        self._orig_mod.train(mode)
        return self

    def eval(self) -> Any:
        self._orig_mod.eval()
        return self

    def to(self, *args: Any, **kwargs: Any) -> Any:
        self._orig_mod.to(*args, **kwargs)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._orig_mod.zero_grad(set_to_none)

    def register_forward_hook(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.register_forward_hook(*args, **kwargs)

    def register_forward_pre_hook(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.register_forward_pre_hook(*args, **kwargs)

    def apply(self, fn: Callable[[torch.nn.Module], None]) -> Any:
        self._orig_mod.apply(fn)
        return self


_ABSENT = object()


class ForwardRoute:
    """While entered, `module.forward` (an instance attribute) is `forward`: a method of the module that calls
    `self(...)` or `self.forward(...)` — Hugging Face's `generate` calling the model for prefill and each
    decode step — runs the compiled forward, with the module's hooks around it as `module(...)` runs them.

    The module is unchanged outside: entries nest and may come from several threads (a count; the first
    entry installs, the last exit restores what the instance held before, absent or the user's own
    `forward`). A method that assigns its own `forward` while routed keeps it. While any routed call runs,
    a direct call of the module from another thread also runs the compiled forward: same results."""

    def __init__(self, module: torch.nn.Module, forward: Callable[..., Any]):
        self.module = module
        self.forward = forward
        self.depth = 0
        self.saved: Any = _ABSENT
        self.lock = threading.Lock()

    def __enter__(self) -> "ForwardRoute":
        with self.lock:
            if self.depth == 0:
                attributes = vars(self.module)
                self.saved = attributes.get("forward", _ABSENT)
                attributes["forward"] = self.forward
            self.depth += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth:
                return
            attributes = vars(self.module)
            if attributes.get("forward") is self.forward:  # (not replaced by the method itself)
                if self.saved is _ABSENT:
                    del attributes["forward"]
                else:
                    attributes["forward"] = self.saved
            self.saved = _ABSENT


class RoutedMethod:
    """A method of a compiled module's wrapped module (`compiled.generate`), bound to that module — `self`,
    `super()` and `type(self)` inside are the user's — whose calls run with the module's forward routed to
    the compiled forward (`ForwardRoute`). Introspection sees the method: `inspect.signature`, `__name__`,
    `__doc__`, `__wrapped__`, `__self__`, `__func__`. `defaults` are keyword arguments added to each call
    where the caller did not pass them."""

    def __init__(self, method: types.MethodType, route: ForwardRoute, owner: torch.nn.Module,
                 defaults: dict | None = None):
        functools.update_wrapper(self, method)
        self.__func__ = method.__func__
        self.__self__ = method.__self__
        self.route = route
        self.owner = owner  # the compiled module this method was read from
        self.defaults = dict(defaults or {})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        for key, value in self.defaults.items():
            kwargs.setdefault(key, value)
        with self.route:
            return self.__func__(self.__self__, *args, **kwargs)

    def __repr__(self) -> str:
        return (f"<method {self.__func__.__qualname__} of {type(self.__self__).__name__}, its forward calls "
                "compiled by kiln>")
