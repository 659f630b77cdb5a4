"""Differential programs for Python semantics kiln once got wrong (issue 35): asserts under pytest's
assertion rewriting, hasattr on tensors, __new__ returning another class, isinstance's arguments,
attributes of NamedTuple subclasses, partials live across a break, module hooks, disabled functions."""
from __future__ import annotations

import warnings

import pytest
import torch
from capture_helpers import all_entries
from diff_helpers import params, run_program

import kiln

X = torch.randn(3, 4)


# ---- asserts: this module is rewritten by pytest, its asserts keep values in locals named `@py_assert0`
def s_assert_passes_then_break(x):
    assert x.shape[0] == 3
    print("break")
    return x + 1


def s_assert_message_then_break(x):
    y = x * 2
    assert y.shape == (3, 4), f"bad shape {y.shape}"
    print("break")
    return y + 1


def s_assert_after_break(x):
    print("break")
    assert x.dim() == 2 and x.shape[1] == 4
    return x - 1


def s_assert_fails_after_break(x):
    print("break")
    assert x.shape[0] == 99, "x has 3 rows"
    return x


def s_assert_tensor_then_break(x):
    assert (x.abs() >= 0).all()
    y = x.sin()
    print("break")
    return y


def noisy(n):
    print("break inside the assert")
    return n


def s_assert_breaks_inside(x):
    y = x * 2
    assert y.shape[0] == noisy(3)
    return y + 1


TABLE = [
    (s_assert_breaks_inside, (X,)), (s_assert_passes_then_break, (X,)), (s_assert_message_then_break, (X,)), (s_assert_after_break, (X,)),
    (s_assert_fails_after_break, (X,)), (s_assert_tensor_then_break, (X,)),
]

KNOWN: dict[str, str] = {}


@pytest.mark.parametrize("fn,args,options", params(TABLE, KNOWN))
def test_semantics(fn, args, options):
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*internal error.*")
        run_program(fn, args, **options)


def test_asserts_are_rewritten_here():
    """The programs above test what they mean to: pytest rewrote their asserts (non-identifier locals)."""
    names = s_assert_message_then_break.__code__.co_varnames
    if not any(n.startswith("@py_assert") for n in names):
        raise AssertionError(f"this module's asserts are not rewritten by pytest: {names} "
                             "(run without --assert=plain)")


def test_assert_under_pytest_is_compiled(counters):
    """A function with a rewritten assert live across a break compiles both sides of the break."""
    kiln.reset()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*internal error.*")
        compiled = kiln.compile(s_assert_breaks_inside, backend="eager")
        torch.testing.assert_close(compiled(X), X * 2 + 1)
    graphs = [e for e in all_entries(compiled) if e.graph is not None and e.ops]
    assert len(graphs) == 2, [e.brk for e in all_entries(compiled)]
    assert not counters["capture_errors"], dict(counters["capture_errors"])
