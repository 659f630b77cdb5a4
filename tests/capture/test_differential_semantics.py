"""Differential programs for Python semantics kiln once got wrong (issue 35): asserts under pytest's
assertion rewriting, hasattr on tensors, __new__ returning another class, isinstance's arguments,
attributes of NamedTuple subclasses, partials live across a break, module hooks, disabled functions."""
from __future__ import annotations

import functools
import typing
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


# ---- construction: __new__ and a metaclass's __call__ decide, as type.__call__ does
class Plain:
    pass


class NewReturnsOther:
    def __new__(cls):
        o = object.__new__(Plain)
        o.a = 7
        return o

    def __init__(self):  # not run: __new__ returned no instance of this class
        self.a = 11


class NewAndInit:
    def __new__(cls, v):
        o = super().__new__(cls)
        o.made = 1
        return o

    def __init__(self, v):
        self.v = v


class Tagged(type):
    def __call__(cls, v):
        return ("made by the metaclass", cls.__name__, v)


class ByMetaclass(metaclass=Tagged):
    def __init__(self, v):
        self.v = v


def s_new_returns_another_class(x):
    b = NewReturnsOther()
    return torch.sin(x) * b.a, type(b).__name__


def s_new_then_init(x):
    b = NewAndInit(3)
    return x * b.v + b.made, type(b).__name__


def s_new_missing_argument(x):
    try:
        NewAndInit()
    except TypeError:
        return x - 1
    return x


def s_metaclass_call(x):
    return x + 1, ByMetaclass(2)


def s_object_new_with_arguments(x):
    try:
        object.__new__(Plain, 1)
    except TypeError:
        return x * 2
    return x


# ---- builtins called with arguments they do not take raise eager's TypeError
def s_isinstance_keyword(x):
    return isinstance(x, torch.Tensor, invalid=True)


def s_isinstance_keyword_caught(x):
    try:
        return isinstance(x, torch.Tensor, invalid=True)
    except TypeError:
        return x + 1


def s_getattr_too_many(x):
    try:
        return getattr(x, "shape", 1, 2)
    except TypeError:
        return x * 3


def s_len_keyword(x):
    try:
        return len(x, obj=x)
    except TypeError:
        return x - 3


# ---- attributes of NamedTuple instances: a subclass's instance has a __dict__, a plain one has none
class Pair(typing.NamedTuple):
    a: torch.Tensor
    b: int


class PairWithDict(Pair):
    pass


def s_named_tuple_subclass_attr_set(tup, t):
    tup.c = t
    return tup


def s_named_tuple_subclass_attr_identity(tup, t):
    tup.c = t * 2
    return tup, vars(tup), tup.c + 1


def s_named_tuple_subclass_attr_read(tup):
    return tup.a * tup.scale, getattr(tup, "missing", 3)


def s_named_tuple_subclass_made_here(x):
    tup = PairWithDict(x, 2)
    tup.c = x + 1
    return tup, vars(tup)


def s_named_tuple_attr_set_raises(x):
    tup = Pair(x, 2)
    tup.c = x + 1
    return tup


def s_named_tuple_attr_set_caught(tup):
    try:
        tup.c = 1
    except AttributeError:
        return tup.a - 1
    return tup.a


def with_scale(scale):
    def make():
        tup = PairWithDict(X.clone(), 1)
        tup.scale = scale
        return (tup,)
    return make


# ---- functools.partial: live across a break (rebuilt), and one from outside (what it binds is guarded)
def add_k(x, k=0):
    return x + k


def s_partial_keyword_across_break(x):
    p = functools.partial(add_k, k=1)
    print("break")
    return p(x)


def s_partial_returned_across_break(x):
    p = functools.partial(add_k, x, k=2)
    print("break")
    return p(), p.keywords, p.args[0] is x


def s_partial_from_outside(p, x):
    return p(x)


TABLE = [
    (s_partial_keyword_across_break, (X,)), (s_partial_returned_across_break, (X,)),
    (s_partial_from_outside, (functools.partial(add_k, k=3), X)),
    (s_named_tuple_subclass_attr_set, (PairWithDict(X, 1), X * 3)),
    (s_named_tuple_subclass_attr_identity, (PairWithDict(X, 1), X)),
    (s_named_tuple_subclass_attr_read, with_scale(4)), (s_named_tuple_subclass_made_here, (X,)),
    (s_named_tuple_attr_set_raises, (X,)), (s_named_tuple_attr_set_caught, (Pair(X, 1),)),
    (s_new_returns_another_class, (X,)), (s_new_then_init, (X,)), (s_new_missing_argument, (X,)),
    (s_metaclass_call, (X,)), (s_object_new_with_arguments, (X,)),
    (s_isinstance_keyword, (X,)), (s_isinstance_keyword_caught, (X,)), (s_getattr_too_many, (X,)),
    (s_len_keyword, (X,)),
    (s_hasattr_on_tensor, (X,)), (s_hasattr_on_tagged_tensor, tagged(test=None)),
    (s_getattr_default_on_tensor, (X,)), (s_getattr_default_on_tagged_tensor, tagged(scale=5)),
    (s_tensor_attr_read, tagged(scale=2.5)), (s_missing_tensor_attr_caught, (X,)),
    (s_proxy_internals_are_no_attributes, (X,)), (s_hasattr_tensor_attrs, (X,)),
    (s_assert_breaks_inside, (X,)), (s_assert_passes_then_break, (X,)), (s_assert_message_then_break, (X,)),
    (s_assert_after_break, (X,)),
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


def test_named_tuple_subclass_attributes():
    """The tuple passed in is the one returned, with the attribute set on it; one made inside has it too;
    an attribute read is guarded."""
    kiln.reset()
    compiled = kiln.compile(s_named_tuple_subclass_attr_set, backend="eager")
    tup = PairWithDict(X, 1)
    assert compiled(tup, X) is tup and tup.c is not None
    torch.testing.assert_close(tup.c, X)
    made = kiln.compile(s_named_tuple_subclass_made_here, backend="eager")(X)[0]
    torch.testing.assert_close(made.c, X + 1)
    read = kiln.compile(s_named_tuple_subclass_attr_read, backend="eager")
    (tup,) = with_scale(4)()
    torch.testing.assert_close(read(tup)[0], X * 4)
    tup.scale = 5
    tup.missing = 6
    assert read(tup)[1] == 6
    torch.testing.assert_close(read(tup)[0], X * 5)


def test_partial_from_outside_is_guarded():
    kiln.reset()
    compiled = kiln.compile(s_partial_from_outside, backend="eager")
    for p in (functools.partial(add_k, k=1), functools.partial(add_k, k=5),
              functools.partial(torch.mul, other=3), functools.partial(add_k, X)):
        torch.testing.assert_close(compiled(p, X), p(X))


# ---- module hooks: global and per-module, registered before or after the first call
class TwoLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.b(self.a(x).relu())


def _fired(model, x, log):
    log.clear()
    model(x).sum().backward()
    return list(log)


@pytest.mark.parametrize("register", [
    torch.nn.modules.module.register_module_full_backward_pre_hook,
    torch.nn.modules.module.register_module_full_backward_hook,
    torch.nn.modules.module.register_module_forward_hook,
    torch.nn.modules.module.register_module_forward_pre_hook,
], ids=lambda f: f.__name__)
def test_global_module_hooks_fire_on_submodules(register):
    kiln.reset()
    model = TwoLinear()
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(2, 4, requires_grad=True)
    log: list = []
    assert _fired(compiled, x, log) == _fired(model, x, log) == []
    handle = register(lambda mod, *args: log.append(type(mod).__name__))
    try:
        expected = _fired(model, x, log)
        assert expected and _fired(compiled, x, log) == expected
    finally:
        handle.remove()
    assert _fired(compiled, x, log) == []


@pytest.mark.parametrize("kind", ["full_backward", "full_backward_pre", "forward", "forward_pre"])
def test_submodule_hook_added_after_first_call(kind):
    kiln.reset()
    model = TwoLinear()
    compiled = kiln.compile(model, backend="eager")
    through_function = kiln.compile(lambda x: model(x), backend="eager")
    x = torch.randn(2, 4, requires_grad=True)
    log: list = []
    assert _fired(compiled, x, log) == _fired(through_function, x, log) == []
    getattr(model.b, f"register_{kind}_hook")(lambda mod, *args: log.append(kind))
    expected = _fired(model, x, log)
    assert expected == [kind]
    assert _fired(compiled, x, log) == expected
    assert _fired(through_function, x, log) == expected


# ---- disabled functions run natively: a counted break at the call, the rest of the caller captured
COMPILING: list = []


@torch.compiler.disable
def torch_disabled(x):
    COMPILING.append(torch.compiler.is_compiling())
    return x * 2


def _torch_disabled_by_call(x):
    COMPILING.append(torch.compiler.is_compiling())
    return x - 1


torch_disabled_by_call = torch.compiler.disable(_torch_disabled_by_call)


@kiln.disable
def kiln_disabled(x):
    COMPILING.append(torch.compiler.is_compiling())
    return x + 10


def _kiln_disabled_by_call(x):
    COMPILING.append(torch.compiler.is_compiling())
    return x / 2


kiln_disabled_by_call = kiln.disable(_kiln_disabled_by_call)


class WithDisabledMethod(torch.nn.Module):
    @torch.compiler.disable
    def helper(self, x):
        COMPILING.append(torch.compiler.is_compiling())
        return x + 1

    def forward(self, x):
        return self.helper(x.sin()).cos()


def calls_disabled(x):
    y = x.sin()
    z = torch_disabled(y) + torch_disabled_by_call(y) + kiln_disabled(y) + kiln_disabled_by_call(y)
    return z.cos()


def calls_disabled_in_a_loop(x):
    for i in range(2):
        print("a break in a loop: this frame runs natively, its callees are captured")
        x = torch_disabled(x) + kiln_disabled(x)
    return x


def test_disabled_functions_run_natively(counters):
    kiln.reset()
    x = torch.randn(3)
    COMPILING.clear()
    expected = calls_disabled(x)
    compiled = kiln.compile(calls_disabled, backend="eager")
    for _ in range(2):
        COMPILING.clear()
        torch.testing.assert_close(compiled(x), expected)
        assert COMPILING == [False] * 4  # each ran, natively
    breaks = [b for b in counters["graph_breaks"] if "disabled by" in b]
    assert len(breaks) == 4, dict(counters["graph_breaks"])
    assert sum(1 for b in breaks if "torch.compiler.disable" in b) == 2
    # the code around the calls is captured: sin before them, the sum and cos after them
    ops = [op for e in all_entries(compiled) if e.graph is not None for op in e.ops]
    assert ops, [e.brk for e in all_entries(compiled)]
    assert not counters["capture_errors"], dict(counters["capture_errors"])


def test_disabled_method_and_native_frames(counters):
    kiln.reset()
    model = WithDisabledMethod()
    x = torch.randn(3)
    COMPILING.clear()
    torch.testing.assert_close(kiln.compile(model, backend="eager")(x), model(x))
    assert COMPILING == [False, False]
    COMPILING.clear()
    expected = calls_disabled_in_a_loop(x)
    torch.testing.assert_close(kiln.compile(calls_disabled_in_a_loop, backend="eager")(x), expected)
    assert COMPILING == [False] * 8
    assert not counters["capture_errors"], dict(counters["capture_errors"])


def test_compiling_a_disabled_function_returns_it():
    assert kiln.compile(torch_disabled, backend="eager") is torch_disabled
    assert kiln.compile(kiln_disabled) is kiln_disabled
    assert kiln_disabled_by_call.__wrapped__ is _kiln_disabled_by_call
    assert kiln.disable(reason="why")(_kiln_disabled_by_call)(torch.ones(1)).item() == 0.5


@torch.compiler.disable
class DisabledModule(torch.nn.Module):
    def forward(self, x):
        COMPILING.append(torch.compiler.is_compiling())
        return x * 3


class Recording(torch.nn.Module):
    def forward(self, x):
        COMPILING.append(torch.compiler.is_compiling())
        return x - 3


class CallsDisabledModules(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.by_class = DisabledModule()
        self.by_instance = torch.compiler.disable(Recording())

    def forward(self, x):
        return self.by_instance(self.by_class(x.sin())).cos()


def test_disabled_modules_run_natively(counters):
    kiln.reset()
    model = CallsDisabledModules()
    x = torch.randn(3)
    COMPILING.clear()
    expected = model(x)
    assert COMPILING == [False, False]
    compiled = kiln.compile(model, backend="eager")
    for _ in range(2):
        COMPILING.clear()
        torch.testing.assert_close(compiled(x), expected)
        assert COMPILING == [False, False]
    breaks = [b for b in counters["graph_breaks"] if "disabled by torch.compiler.disable" in b]
    assert len(breaks) == 2, dict(counters["graph_breaks"])
    assert kiln.compile(model.by_class) is model.by_class
