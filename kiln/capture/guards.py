"""Guards: the facts a captured graph relies on, checked before each reuse.

Each guard is a Python expression over sources (`x.shape == (4, 8)`, `self.fc.weight is __Parameter_3`).
A cache entry compiles all of them into one function (see `entry.py`); on a miss, `first_failure` names the
guard that failed, for the recompile log and the recompile-limit warning.
"""
from __future__ import annotations

from typing import Any

import torch

from .. import config
from .sources import Namespace, Source

log = config.channel("guards")

PRIMITIVES = (type(None), bool, int, float, str, bytes, complex, type(Ellipsis), type(NotImplemented),
              torch.dtype, torch.device, torch.memory_format, torch.layout)


def is_constant(value: Any) -> bool:
    """Immutable Python values guarded by equality (and nested tuples/frozensets of them)."""
    if isinstance(value, PRIMITIVES) and type(value) in PRIMITIVES:
        return True
    if type(value) in (tuple, frozenset, torch.Size):
        return all(is_constant(v) for v in value)
    if type(value) in (slice, range):
        return is_constant(value.start) and is_constant(value.stop) and is_constant(value.step)
    return False


class Guard:
    __slots__ = ("expr", "text", "kind")

    def __init__(self, expr: str, text: str, kind: str):
        self.expr = expr
        self.text = text
        self.kind = kind

    def __repr__(self) -> str:
        return f"Guard({self.text})"


class GuardSet:
    """The guards of one capture, in the order their values were read (parents before children)."""

    def __init__(self, ns: Namespace):
        self.ns = ns
        self.guards: list[Guard] = []
        self._seen: set[str] = set()

    def add(self, expr: str, text: str, kind: str) -> None:
        if expr in self._seen:
            return
        self._seen.add(expr)
        self.guards.append(Guard(expr, text, kind))

    def __len__(self) -> int:
        return len(self.guards)

    # ---- by value kind ----
    def constant(self, source: Source, value: Any) -> None:
        if value is None:
            self.add(f"{source.expr} is None", f"{source.name} is None", "constant")
            return
        if type(value) is bool:
            self.add(f"{source.expr} is {value}", f"{source.name} is {value}", "constant")
            return
        lit = self.ns.literal(value)
        typ = self.ns.hold(type(value), "type")
        self.add(f"type({source.expr}) is {typ} and {source.expr} == {lit}",
                 f"{source.name} == {value!r}", "constant")

    def identity(self, source: Source, value: Any) -> None:
        self.add(f"{source.expr} is {self.ns.hold(value, type(value).__name__)}",
                 f"{source.name} is <{type(value).__name__} at {id(value):#x}>", "identity")

    def type_of(self, source: Source, value: Any) -> None:
        self.add(f"type({source.expr}) is {self.ns.hold(type(value), 'type')}",
                 f"type({source.name}) is {type(value).__qualname__}", "type")

    def length(self, source: Source, value: Any) -> None:
        self.type_of(source, value)
        self.add(f"len({source.expr}) == {len(value)}", f"len({source.name}) == {len(value)}", "length")

    def keys(self, source: Source, value: dict) -> None:
        self.type_of(source, value)
        keys = tuple(value)
        self.add(f"tuple({source.expr}) == {self.ns.literal(keys)}", f"keys of {source.name} == {keys!r}",
                 "keys")

    def tensor(self, source: Source, t: torch.Tensor) -> None:
        """Type, dtype, device, shape, strides and requires_grad of an input tensor."""
        e = source.expr
        typ = self.ns.hold(type(t), "type")
        dtype = self.ns.hold(t.dtype, "dtype")
        device = self.ns.hold(t.device, "device")
        shape = tuple(t.shape)
        strides = tuple(t.stride())
        self.add(f"type({e}) is {typ} and {e}.dtype is {dtype} and {e}.shape == {shape!r} and "
                 f"{e}.stride() == {strides!r} and {e}.requires_grad is {t.requires_grad} and "
                 f"{e}.device == {device}",
                 f"{source.name}: {type(t).__name__} {str(t.dtype).removeprefix('torch.')}{list(shape)} "
                 f"strides={strides} device={t.device} requires_grad={t.requires_grad}", "tensor")

    def parameter(self, source: Source, t: torch.Tensor) -> None:
        """Parameters and buffers: the same object (its values may change), same requires_grad."""
        self.identity(source, t)
        self.add(f"{source.expr}.requires_grad is {t.requires_grad}",
                 f"{source.name}.requires_grad is {t.requires_grad}", "tensor")

    def grad_mode(self, enabled: bool) -> None:
        fn = self.ns.hold(torch.is_grad_enabled, "is_grad_enabled")
        self.add(f"{fn}() is {enabled}", f"torch.is_grad_enabled() is {enabled}", "grad_mode")

    def default_dtype(self, dtype: torch.dtype) -> None:
        """Factories without a dtype (torch.ones(2), torch.tensor([1.5])) bake the default dtype in."""
        fn = self.ns.hold(torch.get_default_dtype, "get_default_dtype")
        self.add(f"{fn}() is {self.ns.hold(dtype, 'dtype')}", f"torch.get_default_dtype() is {dtype}",
                 "default_dtype")

    def describe(self) -> list[str]:
        return [g.text for g in self.guards]


def check_expr(guards: list[Guard]) -> str:
    if not guards:
        return "True"
    return " and ".join(f"({g.expr})" for g in guards)
