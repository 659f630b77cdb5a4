"""Sources: where a value that came from outside the captured frame can be found again.

A source is a Python expression over the generated entry function's namespace: the frame's parameters by
name, and objects the capture holds (globals dicts, closure cells, modules) under generated names. The same
expression names the value's guard (`x.shape == ...`) and reloads it on every call (`self.fc.weight`).
"""
from __future__ import annotations

import keyword
from typing import Any


def _dotted(attr: str) -> bool:
    """Whether `x.<attr>` spells getattr(x, attr): an identifier that is no keyword (`x.class` does not
    parse) and is not private (`__a`, which a class body would mangle). Dunders (`__dict__`, `__code__`)
    are spelled with a dot so that the guards' shared reads see them as one attribute chain: spelled as a
    getattr call, `cfg.__dict__` was read again by every guard on one of its items (64 times per call of an
    HF model, each through transformers' Python `__getattribute__`)."""
    if not attr.isidentifier() or keyword.iskeyword(attr):
        return False
    return not attr.startswith("__") or attr.endswith("__")


class Namespace:
    """Names for the objects generated code refers to (held by the entry function's globals)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self._ids: dict[int, str] = {}

    def hold(self, obj: Any, hint: str = "k") -> str:
        key = id(obj)
        name = self._ids.get(key)
        if name is None:
            hint = "".join(c if c.isalnum() else "_" for c in hint)[:24]
            name = f"__{hint}_{len(self.values)}"
            self._ids[key] = name
            self.values[name] = obj
        return name

    def literal(self, value: Any) -> str:
        """Python source for a constant value (primitives inline, anything else held by name)."""
        if value is None or isinstance(value, (bool, int, str, bytes)) and type(value) in (bool, int, str,
                                                                                          bytes):
            return repr(value)
        if type(value) is float and value == value and value not in (float("inf"), float("-inf")):
            return repr(value)
        return self.hold(value, type(value).__name__)


class Source:
    """A reloadable location: `expr` is runnable in the entry function, `name` is for people."""

    __slots__ = ("expr", "name", "base", "kind")

    def __init__(self, expr: str, name: str, base: "Source | None" = None, kind: str = "local"):
        self.expr = expr
        self.name = name
        self.base = base
        self.kind = kind

    def __repr__(self) -> str:
        return f"Source({self.name})"

    def attr(self, attr: str) -> "Source":
        if _dotted(attr):
            return Source(f"{self.expr}.{attr}", f"{self.name}.{attr}", self, "attr")
        return Source(f"getattr({self.expr}, {attr!r})", f"getattr({self.name}, {attr!r})", self, "attr")

    def item(self, key: Any, ns: "Namespace | None" = None) -> "Source":
        """self[key]; a key without a literal spelling (a class, a typing form) is held by `ns`."""
        spelled = repr(key) if ns is None else ns.literal(key)
        return Source(f"{self.expr}[{spelled}]", f"{self.name}[{key!r}]", self, "item")

    def call(self, method: str) -> "Source":
        return Source(f"{self.expr}.{method}()", f"{self.name}.{method}()", self, "call")

    def in_module(self) -> bool:
        """Whether this source reaches into an nn.Module's parameters or buffers."""
        return "._parameters[" in self.expr or "._buffers[" in self.expr


def local(name: str) -> Source:
    return Source(name, name, None, "local")


def global_(ns: Namespace, gdict: dict, name: str) -> Source:
    module = gdict.get("__name__", "?")
    return Source(f"{ns.hold(gdict, 'G')}[{name!r}]", f"G[{name!r}]" if module == "__main__" else
                  f"{module}.{name}", None, "global")


def builtin(ns: Namespace, bdict: dict, name: str) -> Source:
    return Source(f"{ns.hold(bdict, 'B')}[{name!r}]", f"builtins.{name}", None, "global")


def cell(ns: Namespace, cell_obj: Any, name: str) -> Source:
    return Source(f"{ns.hold(cell_obj, 'cell_' + name)}.cell_contents", f"<closure {name}>", None, "cell")


def held(ns: Namespace, obj: Any, name: str) -> Source:
    return Source(ns.hold(obj, name), name, None, "const")
