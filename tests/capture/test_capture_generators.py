"""Regression tests: generators and iterators are symbolic (nothing real is advanced while tracing),
module iteration, container methods with Python key functions, os.environ reads, `raise ... from`."""
from __future__ import annotations

import itertools
import os

import pytest
import torch
import torch.nn as nn
from capture_helpers import all_entries, check

import kiln

X = torch.randn(2, 8)


class Stage(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 4)

    def forward(self, x):
        for blk in self.children():
            x = blk(x)
        return x


class ParamSum(Stage):
    def forward(self, x):
        return x.sum() + sum(p.sum() for p in self.parameters())


class FirstChild(Stage):
    def forward(self, x):
        return next(iter(self.children()))(x)


class ByName(Stage):
    def forward(self, x):
        return dict(self.named_children())["b"](self.a(x))


class Parent(nn.Module):
    def __init__(self):
        super().__init__()
        self.stage = Stage()
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.stage(x))


@pytest.mark.parametrize("cls", [Stage, ParamSum, FirstChild, ByName, Parent])
@pytest.mark.parametrize("backend", ["eager", "auto"])
def test_module_generators(cls, backend):
    torch.manual_seed(0)
    model = cls()
    kiln.reset()
    compiled = kiln.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(compiled(X), model(X))


def test_children_loop_is_one_graph():
    model = Stage()

    def f(x):
        return model(x)
    with torch.no_grad():
        check(f, X, graphs=1, breaks=0)


def test_list_methods_with_key():
    def f(x):
        lst = [x, x + 1, x + 2, x + 3]
        lst[1:3] = [x * 2, x * 3, x * 4]
        del lst[0]
        lst.insert(0, x - 1)
        lst.sort(key=lambda t: float(t.sum()))
        return lst
    check(f, X)


def test_sorted_min_max_with_python_key():
    def f(x):
        items = [(3, x), (1, x * 2), (2, x * 3)]
        first = min(items, key=lambda p: p[0])[1]
        last = max(items, key=lambda p: p[0])[1]
        order = sorted(items, key=lambda p: -p[0])
        return first + last, [p[0] for p in order]
    check(f, X, graphs=1, breaks=0)


def test_list_concat_then_append():
    def f(x):
        a = [x]
        b = a + [x * 2]
        b.append(x * 3)
        return len(b), sum(b)
    check(f, X)


def test_generator_send_close():
    def f(x):
        def acc():
            total = 0
            while True:
                v = yield total
                if v is None:
                    return
                total = total + v
        it = acc()
        next(it)
        it.send(x)
        out = it.send(x * 2)
        it.close()
        return out
    check(f, X, graphs=1, breaks=0)


def test_generator_interleaves_with_its_consumer():
    def f(x):
        log = []

        def gen():
            for i in range(3):
                log.append(("gen", i))
                yield x * i
        out = x
        for t in gen():
            log.append(("body", len(log)))
            out = out + t
        return out, log
    check(f, X)


def test_infinite_generator_consumed_partly():
    def f(x):
        def count():
            i = 0
            while True:
                yield i
                i += 1
        return [x * i for i in itertools.islice(count(), 3)], list(zip(range(2), count()))
    check(f, X, graphs=1, breaks=0)


def test_yield_from_returns_value():
    def f(x):
        def inner():
            yield x
            yield x + 1
            return 10

        def outer():
            got = yield from inner()
            yield x * got
        return list(outer())
    check(f, X, graphs=1, breaks=0)


def test_stop_iteration_is_catchable():
    def f(x):
        it = iter([x])
        first = next(it)
        try:
            next(it)
        except StopIteration:
            return first + 1
        return first
    check(f, X, graphs=1, breaks=0)


def test_outside_generator_is_consumed_as_far_as_eager():
    def f(x, gen):
        return x + next(gen)

    def make():
        return (torch.full((2, 8), float(i)) for i in range(5))
    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    eager_gen, kiln_gen = make(), make()
    for _ in range(2):
        torch.testing.assert_close(compiled(X, kiln_gen), f(X, eager_gen))
    assert [float(t[0, 0]) for t in kiln_gen] == [float(t[0, 0]) for t in eager_gen] == [2.0, 3.0, 4.0]


def test_outside_iterator_loop_not_advanced_by_tracing():
    def f(x, it):
        for t in it:
            x = x + t
        return x
    items = [torch.ones(2, 8) * i for i in range(3)]
    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    torch.testing.assert_close(compiled(X, iter(items)), f(X, iter(items)))


def test_os_environ_get_is_guarded(monkeypatch):
    def f(x):
        if os.environ.get("KILN_TEST_FLAG_XYZ", "0") == "1":
            return x * 2
        return x + 1
    monkeypatch.delenv("KILN_TEST_FLAG_XYZ", raising=False)
    compiled = check(f, X, graphs=1, breaks=0)
    monkeypatch.setenv("KILN_TEST_FLAG_XYZ", "1")
    torch.testing.assert_close(compiled(X), X * 2)


def test_raise_from_caught_in_same_function():
    def f(x, d):
        try:
            try:
                v = d["missing"]
            except KeyError as e:
                raise ValueError("no key") from e
        except ValueError as e:
            v = x * 3 if isinstance(e.__cause__, KeyError) else x
        return v
    check(f, X, {"a": 1}, graphs=1, breaks=0)


def test_user_setitem_is_inlined():
    class Box:
        def __init__(self):
            self.items = {}

        def __setitem__(self, k, v):
            self.items[k] = v * 2

        def __getitem__(self, k):
            return self.items[k]

    def f(x):
        b = Box()
        b["a"] = x
        return b["a"] + 1
    check(f, X, graphs=1, breaks=0)


def test_huggingface_llama_defaults_capture():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
    model = transformers.LlamaModel(config).eval()
    ids = torch.randint(0, 128, (2, 8))
    kiln.reset()

    def f(ids):
        return model(ids).last_hidden_state
    compiled = kiln.compile(f, backend="eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids), f(ids))
    entries = all_entries(compiled)
    assert sum(1 for e in entries if e.graph is not None and e.ops) >= 1
    assert [e.brk for e in entries if e.brk is not None] == []


def test_deque_extendleft_indexing():
    import collections

    def f(x):
        d = collections.deque([x, x + 1])
        d.extendleft([x * 2, x * 3])
        return d[0] + d[-1], len(d), d[1]
    check(f, X, graphs=1, breaks=0)


def test_partial_with_module_keyword():
    import functools
    lin = nn.Linear(8, 8)

    def apply(x, module=None, scale=1.0):
        return module(x) * scale

    def f(x):
        p = functools.partial(apply, module=lin)
        q = functools.partial(apply, scale=2.0, module=lin)
        return p(x) + q(x)
    with torch.no_grad():
        check(f, X, graphs=1, breaks=0)


def test_lru_cached_helper_with_constants():
    import functools

    @functools.lru_cache(None)
    def widths(n):
        return tuple(2 ** i for i in range(n))

    def f(x):
        return x * sum(widths(3)) + len(widths(2))
    check(f, X, graphs=1, breaks=0)
