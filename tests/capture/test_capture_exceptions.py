"""try/except in captured code: exceptions raised on real values unwind to the program's own handlers
(CPython's exception table), so lookups like Mapping.get (try: self[key] except KeyError) stay in the
graph."""
from __future__ import annotations

from collections.abc import MutableMapping

import pytest
import torch
from capture_helpers import check

import kiln


class Registry(MutableMapping):
    """Like transformers' GeneralInterface: a class-wide mapping with a local override."""
    _global = {"paged|eager": torch.tanh, "sdpa": torch.sigmoid}

    def __init__(self):
        self._local = {}

    def __getitem__(self, key):
        if key in self._local:
            return self._local[key]
        return self._global[key]

    def __setitem__(self, key, value):
        self._local[key] = value

    def __delitem__(self, key):
        del self._local[key]

    def __iter__(self):
        return iter({**self._global, **self._local})

    def __len__(self):
        return len(self._global) + len(self._local)


REGISTRY = Registry()


def test_mapping_get_missing_key_uses_default():
    def fn(x):
        act = REGISTRY.get("eager", torch.relu)   # Mapping.get: KeyError caught inside
        return act(x) + ("eager" in REGISTRY) + ("sdpa" in REGISTRY)
    check(fn, torch.randn(4, 5), graphs=1, breaks=0)


def test_mapping_get_present_key():
    def fn(x):
        return REGISTRY.get("sdpa", torch.relu)(x)
    check(fn, torch.randn(4, 5), graphs=1, breaks=0)


def test_try_except_in_top_frame():
    table = {"a": 2.0}

    def fn(x, key):
        try:
            scale = table[key]
        except KeyError as e:
            scale = len(str(e))
        return x * scale
    check(fn, torch.randn(3), "a", graphs=1, breaks=0)
    check(fn, torch.randn(3), "missing", graphs=1, breaks=0)


def _raises(kind):
    raise kind("from a callee")


def test_raise_in_callee_caught_by_caller_with_tuple_and_finally():
    def fn(x):
        out = []
        try:
            _raises(ValueError)
        except (TypeError, ValueError) as e:
            out.append(str(e))
            x = x + 1
        finally:
            x = x * 2
        try:
            try:
                _raises(IndexError)
            except KeyError:
                x = x - 100
        except LookupError:   # not caught by the inner handler: re-raised to this one
            x = x - 1
        return x, out
    check(fn, torch.randn(3), graphs=1, breaks=0)


def test_uncaught_exception_raises_as_eager():
    def fn(x):
        try:
            return x + {"a": 1}["b"]
        except ValueError:
            return x
    compiled = kiln.compile(fn, backend="eager")
    with pytest.raises(KeyError, match="b"):
        compiled(torch.randn(3))


def test_tensor_op_errors_are_not_handled_symbolically():
    """An error from a tensor op on proxies is not taken for eager's own (a decomposition could raise
    differently): the frame runs eagerly, with eager's result."""
    def fn(x, y):
        try:
            return x + y
        except RuntimeError:
            return x * 2
    check(fn, torch.randn(3), torch.randn(4), breaks=1)
