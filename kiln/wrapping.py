"""The nn.Module that kiln.compile returns for a module: one wrapper class, whose module API and attributes
read and write through to the module it wraps (`_orig_mod`). CompiledModule, CompiledDDP and CompiledFSDP
subclass it and differ only in how a call runs."""
from __future__ import annotations

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
