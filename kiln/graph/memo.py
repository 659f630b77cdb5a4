"""Work a capture repeats in every new process, kept on disk: compiled entry functions and guard text.

A capture writes each graph's entry function as Python source (its guards and the graph's call) and
compiles it; on a model with hundreds of parameters the guards alone are hundreds of expressions, and
rewriting them (kiln.capture.guards.check_expr) and compiling the source cost ~0.2 s of a warm compile.
Both are pure functions of their text, so a new process capturing the same program takes them from the
store that `kiln.runtime.code_cache` installs here (the kernel cache's directory, trusted and evicted as
kernels are). Without a store (kiln.graph used on its own) both are computed each time.

Keys hash the inputs' text with what else decides the result: Python's version and bytecode magic for a
code object; the text of kiln's own sources for a rewrite kiln does (`kiln_source_digest`).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import marshal
import os
import sys
import types
from typing import Any, Callable, Protocol

from ..counters import counters

FORMAT = "kiln memo v1"
KEY_DIGITS = 32


class Store(Protocol):
    def get(self, key: str, suffix: str) -> bytes | None: ...

    def put(self, key: str, suffix: str, data: bytes) -> None: ...


_STORE: list[Store] = []


def install(store: Store | None) -> None:
    """Use `store` from now on (None: keep nothing)."""
    _STORE[:] = [store] if store is not None else []


@functools.lru_cache(maxsize=None)
def kiln_source_digest() -> str:
    """sha256 over the text of every kiln source file: a change to any of them is a new key."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256()
    for directory, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                digest.update(os.path.relpath(path, root).encode() + b"\0")
                with open(path, "rb") as f:
                    digest.update(f.read())
    return digest.hexdigest()


def key_of(*parts: str) -> str:
    digest = hashlib.sha256(FORMAT.encode())
    for part in parts:
        data = part.encode("utf-8", "surrogatepass")
        digest.update(str(len(data)).encode() + b":" + data)
    return digest.hexdigest()[:KEY_DIGITS]


def compile_code(source: str | Any, filename: str, text: str | None = None) -> types.CodeType:
    """compile(source, filename, "exec"), from the store when it holds it. `source` may be an AST, with
    `text` the text that determines it (its source and how it was changed)."""
    store = _STORE[0] if _STORE else None
    if store is None:
        return compile(source, filename, "exec")
    key = key_of("code", sys.version, importlib.util.MAGIC_NUMBER.hex(), filename,
                 text if text is not None else source)
    data = store.get(key, ".code")
    if data is not None:
        try:
            code = marshal.loads(data)
        except (EOFError, ValueError, TypeError):
            code = None
        if isinstance(code, types.CodeType):
            counters["cache"]["entry functions loaded"] += 1
            return code
    code = compile(source, filename, "exec")
    store.put(key, ".code", marshal.dumps(code))
    return code


def derived_text(kind: str, inputs: str, derive: Callable[[], str]) -> str:
    """`derive()`, a text kiln's code makes from `inputs` alone, from the store when it holds it."""
    store = _STORE[0] if _STORE else None
    if store is None:
        return derive()
    key = key_of("text", kind, kiln_source_digest(), inputs)
    data = store.get(key, ".text")
    if data is not None:
        try:
            return data.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            pass
    out = derive()
    store.put(key, ".text", out.encode("utf-8", "surrogatepass"))
    return out


__all__ = ["Store", "install", "kiln_source_digest", "key_of", "compile_code", "derived_text"]
