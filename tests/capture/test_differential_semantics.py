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


# ---- attributes on tensors: a program's own (`t.tag = ...`), read and guarded
def tagged(**attrs):
    def make():
        t = X.clone()
        for name, value in attrs.items():
            setattr(t, name, value)
        return (t,)
    return make


def s_hasattr_on_tensor(x):
    return x + 2 if hasattr(x, "test") else x + 1


def s_getattr_default_on_tensor(x):
    return x * getattr(x, "scale", 3)


def s_hasattr_on_tagged_tensor(x):
    return x + 2 if hasattr(x, "test") else x + 1


def s_getattr_default_on_tagged_tensor(x):
    return x * getattr(x, "scale", 3)


def s_tensor_attr_read(x):
    return x * x.scale


def s_missing_tensor_attr_caught(x):
    y = x + 1
    try:
        return y.scale
    except AttributeError:
        return y - 1


def s_proxy_internals_are_no_attributes(x):
    return hasattr(x, "node"), hasattr(x, "meta"), hasattr(x, "example"), hasattr(x * 2, "meta")


def s_hasattr_tensor_attrs(x):
    return hasattr(x, "shape"), hasattr(x, "mT"), hasattr(x, "_version"), hasattr(x, "no_such")


TABLE = [
    (s_hasattr_on_tensor, (X,)), (s_hasattr_on_tagged_tensor, tagged(test=None)),
    (s_getattr_default_on_tensor, (X,)), (s_getattr_default_on_tagged_tensor, tagged(scale=5)),
    (s_tensor_attr_read, tagged(scale=2.5)), (s_missing_tensor_attr_caught, (X,)),
    (s_proxy_internals_are_no_attributes, (X,)), (s_hasattr_tensor_attrs, (X,)),
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


def test_tensor_attributes_are_guarded():
    """An attribute set on a later call's tensor (or removed, or changed) is seen: the first capture's
    answer is not reused."""
    kiln.reset()
    tag = kiln.compile(s_hasattr_on_tensor, backend="eager")
    scale = kiln.compile(s_getattr_default_on_tensor, backend="eager")
    t = X.clone()
    torch.testing.assert_close(tag(t), t + 1)
    torch.testing.assert_close(scale(t), t * 3)
    t.test = None
    t.scale = 5
    torch.testing.assert_close(tag(t), t + 2)
    torch.testing.assert_close(scale(t), t * 5)
    t.scale = 7
    torch.testing.assert_close(scale(t), t * 7)
    del t.test, t.scale
    torch.testing.assert_close(tag(t), t + 1)
    torch.testing.assert_close(scale(t), t * 3)
