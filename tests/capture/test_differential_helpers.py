"""The differential helper itself: it must notice wrong values, wrong state, wrong exception types and
iterators consumed too far, otherwise every differential program would pass vacuously."""
from __future__ import annotations

import collections

import pytest
import torch
import diff_helpers
from diff_helpers import Mismatch, run_program, same


def _fake_compile(replacement):
    def compile(fn, backend="eager"):
        return replacement
    return compile


def test_same_notices_differences():
    same([1, {"a": torch.ones(2)}], [1, {"a": torch.ones(2)}])
    cases = [
        ([torch.ones(2)], [torch.zeros(2)]),
        (torch.ones(2, dtype=torch.float64), torch.ones(2)),
        (torch.ones(4, 2).t(), torch.ones(2, 4)),
        ((1, 2), [1, 2]),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
        (collections.OrderedDict(a=1), {"a": 1}),
        (collections.deque([1], maxlen=2), collections.deque([1])),
        ({1, 2}, {1, 3}),
        (1, 1.0),
        (True, 1),
        (iter([2, 3]), iter([1, 2, 3])),
        (ValueError("a"), KeyError("a")),
    ]
    for actual, expected in cases:
        with pytest.raises(Mismatch):
            same(actual, expected)


def test_run_program_wrong_value(monkeypatch):
    monkeypatch.setitem(vars(diff_helpers.kiln), "compile", _fake_compile(lambda x: x + 3))
    with pytest.raises(Mismatch, match="values differ"):
        run_program(lambda x: x * 2, (torch.ones(3),))


def test_run_program_wrong_mutation(monkeypatch):
    def fn(x, lst):
        lst.append(1)
        return x

    monkeypatch.setitem(vars(diff_helpers.kiln), "compile", _fake_compile(lambda x, lst: x))
    with pytest.raises(Mismatch, match="arguments after the call"):
        run_program(fn, (torch.ones(3), []))


def test_run_program_exception_type(monkeypatch):
    def fn(x):
        raise KeyError("k")

    def wrong(x):
        raise ValueError("v")

    monkeypatch.setitem(vars(diff_helpers.kiln), "compile", _fake_compile(wrong))
    with pytest.raises(Mismatch, match="compiled raised ValueError"):
        run_program(fn, (1,))
    monkeypatch.setitem(vars(diff_helpers.kiln), "compile", _fake_compile(lambda x: 0))
    with pytest.raises(Mismatch, match="compiled returned"):
        run_program(fn, (1,))


def test_run_program_iterator_consumption(monkeypatch):
    def fn(it):
        return next(it)

    def too_far(it):
        v = next(it)
        next(it)
        return v

    monkeypatch.setitem(vars(diff_helpers.kiln), "compile", _fake_compile(too_far))
    with pytest.raises(Mismatch, match="rest of the iterator"):
        run_program(fn, lambda: (iter([1, 2, 3]),))


def test_run_program_returned_alias(monkeypatch):
    monkeypatch.setitem(vars(diff_helpers.kiln), "compile", _fake_compile(lambda x: x.clone()))
    with pytest.raises(Mismatch, match="different object"):
        run_program(lambda x: x, (torch.ones(3),))


def test_run_program_view_returned_as_copy(monkeypatch):
    monkeypatch.setitem(vars(diff_helpers.kiln), "compile", _fake_compile(lambda x: x[0].clone()))
    with pytest.raises(Mismatch, match="storage shared in eager only"):
        run_program(lambda x: x[0], (torch.ones(2, 3),))


def test_run_program_process_state(monkeypatch):
    def fn(x):
        torch.set_grad_enabled(False)
        return x

    monkeypatch.setitem(vars(diff_helpers.kiln), "compile", _fake_compile(lambda x: x))
    with pytest.raises(Mismatch, match="process state"):
        run_program(fn, (1,))


def test_run_program_globals(monkeypatch):
    def fn(x):
        G["k"] = x
        return x

    monkeypatch.setitem(vars(diff_helpers.kiln), "compile", _fake_compile(lambda x: x))
    with pytest.raises(Mismatch, match="globals after the call"):
        run_program(fn, (1,), globals_=("G",))


G: dict = {}
