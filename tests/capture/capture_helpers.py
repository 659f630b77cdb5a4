"""Shared helpers of the capture tests: run a program eagerly and compiled, compare values and state."""
from __future__ import annotations

import copy
from typing import Any

import torch

import kiln
from kiln.graph import flatten


def assert_same(actual: Any, expected: Any) -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"expected a tensor, got {type(actual).__name__}"
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
        assert actual.shape == expected.shape and actual.dtype == expected.dtype
        return
    if isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected), f"{type(actual)} != {type(expected)}"
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e)
        return
    if isinstance(expected, dict):
        assert type(actual) is type(expected) and list(actual) == list(expected)
        for k in expected:
            assert_same(actual[k], expected[k])
        return
    if hasattr(expected, "__dict__") and not isinstance(expected, (type, torch.nn.Module)) and \
            not callable(expected):
        assert type(actual) is type(expected)
        assert_same(vars(actual), vars(expected))
        return
    assert actual == expected or actual is expected, f"{actual!r} != {expected!r}"


def run_both(fn: Any, *args: Any, backend: str = "eager", **kwargs: Any):
    """Run fn eagerly and compiled on separate copies of the arguments; return both results + states."""
    eager_args = copy.deepcopy((args, kwargs))
    compiled_args = copy.deepcopy((args, kwargs))
    expected = fn(*eager_args[0], **eager_args[1])
    compiled = kiln.compile(fn, backend=backend)
    actual = compiled(*compiled_args[0], **compiled_args[1])
    return compiled, actual, expected, compiled_args, eager_args


def check(fn: Any, *args: Any, graphs: int | None = None, breaks: int | None = None, calls: int = 2,
          backend: str = "eager", **kwargs: Any):
    """fn compiled equals fn eager (values and mutated arguments) on `calls` calls; count graphs/breaks."""
    kiln.reset()
    compiled = kiln.compile(fn, backend=backend)
    for _ in range(calls):
        eager_args = copy.deepcopy((args, kwargs))
        compiled_args = copy.deepcopy((args, kwargs))
        expected = fn(*eager_args[0], **eager_args[1])
        actual = compiled(*compiled_args[0], **compiled_args[1])
        assert_same(actual, expected)
        assert_same(compiled_args, eager_args)
    entries = all_entries(compiled)
    if graphs is not None:
        got = sum(1 for e in entries if e.graph is not None and e.ops)
        assert got == graphs, f"expected {graphs} graphs, got {got}: {[e.brk for e in entries]}"
    if breaks is not None:
        got = sum(1 for e in entries if e.brk is not None)
        assert got == breaks, f"expected {breaks} breaks, got {got}: {[e.brk for e in entries]}"
    return compiled


def all_entries(compiled: Any) -> list:
    """The cache entries of a compiled function and of the resume functions and callees it reached."""
    out, seen, todo = [], set(), [compiled]
    while todo:
        cf = todo.pop(0)
        if id(cf) in seen:
            continue
        seen.add(id(cf))
        for entry in cf.cache.entries:
            out.append(entry)
            todo.extend(entry.children)
    return out


def tensors_in(value: Any) -> list:
    return [v for v in flatten(value) if isinstance(v, torch.Tensor)]
