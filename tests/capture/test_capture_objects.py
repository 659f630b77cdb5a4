"""Regression tests: user classes with dunder operators, with-blocks on Python context managers, `in` on
module containers, operator.itemgetter — each traced (one graph) and equal to eager."""
from __future__ import annotations

import contextlib
import operator

import torch
import torch.nn as nn
from capture_helpers import check

X = torch.randn(3, 4)


class Vec:
    def __init__(self, t):
        self.t = t

    def __add__(self, other):
        return Vec(self.t + (other.t if isinstance(other, Vec) else other))

    def __radd__(self, other):
        return Vec(other + self.t)

    def __mul__(self, k):
        return Vec(self.t * k)

    def __neg__(self):
        return Vec(-self.t)

    def __eq__(self, other):
        return isinstance(other, Vec) and self.t is other.t

    def __lt__(self, other):
        return self.t.shape[0] < other.t.shape[0]

    def __iadd__(self, other):
        self.t = self.t + other
        return self


class SubVec(Vec):
    def __radd__(self, other):
        return SubVec(self.t * 100)


def test_user_binary_reflected_and_inplace():
    def f(x):
        a = Vec(x)
        b = (a + 1) + Vec(x * 2)
        c = 3 + (-b) * 2
        a += 5
        sub = Vec(x) + SubVec(x)  # a subclass's reflected method goes first
        return c.t, a.t, sub.t, a == a, a != Vec(x), Vec(x) < Vec(x[:2]), Vec(x) > Vec(x[:2])
    check(f, X, graphs=1, breaks=0)


def test_unsupported_operand_raises_typeerror_like_eager():
    class NoAdd:
        pass

    def f(x):
        try:
            return NoAdd() + 1
        except TypeError:
            return x + 1
    check(f, X, graphs=1, breaks=0)


class Recorder:
    def __init__(self, log, suppress=False):
        self.log = log
        self.suppress = suppress

    def __enter__(self):
        self.log.append("enter")
        return self

    def __exit__(self, kind, value, tb):
        self.log.append(("exit", None if kind is None else kind.__name__))
        return self.suppress


@contextlib.contextmanager
def scaled(log, k):
    log.append("before")
    try:
        yield k
    finally:
        log.append("after")


def test_with_blocks_on_python_managers():
    def f(x):
        log = []
        with Recorder(log):
            y = x + 1
        with Recorder(log, suppress=True):
            raise KeyError("swallowed")
        with scaled(log, 3) as k:
            y = y * k
        with contextlib.suppress(IndexError):
            y = y + [][0]
        with contextlib.nullcontext(y) as same:
            y = same - 1
        with contextlib.ExitStack() as stack:
            stack.enter_context(Recorder(log))
            y = y * 2
        return y, log
    check(f, X, graphs=1, breaks=0)


def test_exception_through_contextmanager_reaches_handler():
    def f(x):
        log = []
        try:
            with scaled(log, 2):
                raise ValueError("inner")
        except ValueError as e:
            return x * 2, log, str(e)
    check(f, X, graphs=1, breaks=0)


def test_exit_raising_chains_context():
    class ExitRaises:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            raise IndexError("from exit")

    def f(x):
        try:
            with ExitRaises():
                raise KeyError("first")
        except IndexError as e:
            return x, type(e.__context__).__name__
    check(f, X, graphs=0, breaks=0)


def test_torch_state_managers_break_instead_of_running_at_trace_time():
    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ x.t()
        return y.dtype, y.float() * 1
    check(f, X)


def test_in_on_module_containers_and_itemgetter():
    seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    other = nn.Linear(4, 4)
    mdict = nn.ModuleDict({"a": nn.Linear(4, 4)})

    def f(x):
        first = seq[0]
        pick = operator.itemgetter(1, 0)
        pair = pick([x, x * 2])
        return (first in seq, other in seq, "a" in mdict, "b" in mdict, pair[0] + pair[1],
                operator.attrgetter("shape")(x))
    check(f, X, graphs=1, breaks=0)


def test_user_except_catches_missing_attribute_and_guards_its_absence():
    class Holder:
        pass

    def f(x, obj):
        try:
            v = obj.cache
        except AttributeError:
            v = 0
        return x + v
    import kiln
    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    obj = Holder()
    torch.testing.assert_close(compiled(X, obj), f(X, obj))
    obj.cache = 5  # the guard on the attribute's absence fails: a recapture
    torch.testing.assert_close(compiled(X, obj), f(X, obj))


# found by review: builtins on user objects, live class state, ranges
LOG = []


class Dunders:
    def __int__(self):
        LOG.append("int")
        return len(LOG)

    def __str__(self):
        LOG.append("str")
        return "d" * len(LOG)

    def __iter__(self):
        LOG.append("iter")
        return iter([1, 2, 3])

    def __reversed__(self):
        return iter(["custom"])


def test_builtins_on_user_objects_run_their_dunders_each_call():
    def f(x, d):
        return x + int(d), len(str(d)), 2 in d, list(reversed(d))
    import kiln
    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    for _ in range(3):
        LOG.clear()
        expected, expected_log = f(X, Dunders()), list(LOG)
        LOG.clear()
        got = compiled(X, Dunders())
        assert LOG == expected_log
        torch.testing.assert_close(got[0], expected[0])
        assert got[1:] == expected[1:]


def test_user_setattr_result_is_stored_once():
    class Doubling:
        def __setattr__(self, name, value):
            object.__setattr__(self, name, value * 2 if isinstance(value, int) else value)

    def f(x, o):
        o.a = 3
        o.a += 1
        return x * o.a
    import kiln
    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    for _ in range(2):
        e, k = Doubling(), Doubling()
        torch.testing.assert_close(compiled(X, k), f(X, e))
        assert vars(k) == vars(e)


class Base:
    tag = "base"


class Derived(Base):
    pass


def test_base_class_write_seen_through_subclass_and_methods_patched():
    def f(x, d):
        Base.tag = "changed"
        Derived.who = lambda self: "patched"  # noqa: E731
        return Derived.tag, d.tag, d.who(), x + 1
    import kiln
    for _ in range(2):
        Base.tag = "base"
        if "who" in Derived.__dict__:
            del Derived.who
        expected = f(X, Derived())
        Base.tag = "base"
        del Derived.who
        kiln.reset()
        got = kiln.compile(f, backend="eager")(X, Derived())
        assert got[:3] == expected[:3]
    del Derived.who


def test_range_argument_is_guarded_and_count_uses_user_eq():
    class AlwaysEqual:
        def __eq__(self, other):
            return True

    def f(x, r):
        return [x * i for i in r], [1, AlwaysEqual()].count(3)
    import kiln
    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    for r in (range(2), range(3)):
        got, expected = compiled(X, r), f(X, r)
        assert len(got[0]) == len(expected[0]) and got[1] == expected[1]


def test_unhashable_set_element_raises_eagers_error():
    def f(x):
        try:
            return {[1]: 2}
        except TypeError as e:
            return str(e), x + 1
    check(f, X)
