"""Kernel order for low peak memory (kiln/schedule/order.py) and the plan's peak (Plan.peak_bytes).

Graphs are compiled with the order applied after fusion (as compile_graph does once it is wired in) and
compared with eager; program order's peak comes from the plan of the schedule with `memory_order` off.
"""
import random
import shutil

import pytest
import torch
import torch.nn.functional as F

import kiln.ops
from kiln import config
from kiln.backends import cpp
from kiln.codegen.cpp import CPP_TARGET
from kiln.graph import to_prims
from kiln.lower import lower
from kiln.lower.ir import ExternNode
from kiln.schedule import FusedGroup, fuse, plan
from kiln.schedule.order import _greedy, _Items, order

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache_raising")]


@pytest.fixture
def ordered_compile(monkeypatch):
    """compile_graph with `order` applied to the fused schedule (unless cpp.py does it already)."""
    def compile_fn(fn, *inputs, memory_order=True):
        with config.patch(memory_order=memory_order):
            return cpp.compile_graph(kiln.ops.trace(fn, *inputs), list(inputs))
    return compile_fn


def schedules(fn, *inputs):
    """(loop graph, fused schedule, ordered schedule) of `fn`."""
    loop = lower(to_prims(kiln.ops.trace(fn, *inputs)), CPP_TARGET)
    schedule = fuse(loop, CPP_TARGET)
    return loop, schedule, order(loop, schedule, CPP_TARGET)


def planned_peak(fn, *inputs, memory_order=False, in_place=True):
    """Plan.peak_bytes of `fn` in program order (or ordered), without building it."""
    loop = lower(to_prims(kiln.ops.trace(fn, *inputs)), CPP_TARGET)
    schedule = order(loop, fuse(loop, CPP_TARGET), CPP_TARGET, enabled=memory_order)
    return plan(loop, schedule, CPP_TARGET, in_place=in_place).peak_bytes(loop)


def names(item):
    return [m.buffer.name for m in item.members] if isinstance(item, FusedGroup) else \
        [o.name for o in item.outputs]


def assert_dependencies_kept(loop, ordered):
    """Every buffer an item reads is an input or written by an item before it; fallbacks in program order."""
    ready = {b.name for b in loop.inputs + loop.constants}
    for item in ordered:
        reads = [n for m in item.members for n, _ in m.buffer.reads()] if isinstance(item, FusedGroup) \
            else item.reads()
        own = set(names(item))
        assert all(n in ready or n in own for n in reads), (item.describe(), sorted(ready))
        ready |= own
    fallbacks = [node.name for node in loop.nodes if isinstance(node, ExternNode) and node.kind == "fallback"]
    assert [s.name for s in ordered if isinstance(s, ExternNode) and s.kind == "fallback"] == fallbacks


def three_products(x, w1, w2, w3):
    m1, m2, m3 = x @ w1, x @ w2, x @ w3  # program order holds all three products at once
    return m1.relu().sum() + m2.sigmoid().sum() + m3.tanh().sum()


def three_product_inputs():
    torch.manual_seed(0)
    return torch.randn(64, 32), torch.randn(32, 256), torch.randn(32, 192), torch.randn(32, 128)


def test_bad_program_order_lowers_the_peak(ordered_compile):
    inputs = three_product_inputs()
    ordered = ordered_compile(three_products, *inputs)
    # program order: the three f32 products [64, 256], [64, 192], [64, 128] plus three f32 scalars
    assert planned_peak(three_products, *inputs) == 64 * (256 + 192 + 128) * 4 + 3 * 4
    # each product reduced right after it is made: at most the largest product and its sum
    assert ordered.plan.peak_bytes(ordered.loop) == 64 * 256 * 4 + 4
    assert [s.name for s in ordered.schedule] == ["buf0", "kernel0", "buf1", "kernel1", "buf2", "kernel2"]
    torch.testing.assert_close(ordered(*inputs), three_products(*inputs))


def test_peak_bytes_counts_reused_memory_from_its_free_to_its_reuse(ordered_compile):
    torch.manual_seed(0)
    x, w = torch.randn(64, 48), torch.randn(48, 48) / 8
    w2, w3 = torch.randn(48, 32) / 8, torch.randn(32, 48) / 8

    def fn(x, w, w2, w3):
        y1 = (x @ w).exp()  # a kernel's buffer, freed after the next matmul and reused by the last kernel
        y3 = (y1 @ w2) @ w3
        return y3.exp()
    c = ordered_compile(fn, x, w, w2, w3)
    assert c.plan.steps[-1].allocs == [("buf4", "buf1")], c.wrapper_source  # y3.exp() into y1's memory
    # while `y3` is computed: y1's memory (held for the reuse), y1 @ w2 and y3
    assert c.plan.peak_bytes(c.loop) == (64 * 48 + 64 * 32 + 64 * 48) * 4
    torch.testing.assert_close(c(x, w, w2, w3), fn(x, w, w2, w3))


def test_peak_bytes_counts_in_place_writes_once(ordered_compile):
    torch.manual_seed(0)
    x = torch.randn(64, 48)

    def fn(x):
        a = torch.sigmoid(x) * 2
        s = a.sum(0)
        b = torch.exp(a) / s  # written over `a`
        return torch.tanh(b) + b.sum(0)  # written over `b`
    c = ordered_compile(fn, x)
    assert c.plan.steps[0].inplace, c.wrapper_source
    assert c.plan.peak_bytes(c.loop) == 64 * 48 * 4 + 2 * 48 * 4  # one [64, 48] block and the two sums
    assert planned_peak(fn, x, in_place=False) == 3 * 64 * 48 * 4 + 2 * 48 * 4
    torch.testing.assert_close(c(x), fn(x))


def test_good_program_order_is_kept():
    torch.manual_seed(0)
    x, w1, w2 = torch.randn(16, 32), torch.randn(32, 64), torch.randn(64, 8)

    def mlp(x, w1, w2):
        h = F.layer_norm(x, (32,))
        h = F.gelu(h @ w1)
        return torch.softmax(h @ w2, -1)
    loop, schedule, ordered = schedules(mlp, x, w1, w2)
    assert ordered is schedule and [s.name for s in schedule] == [s.name for s in fuse(loop, CPP_TARGET)]

    def branches(x, w1, w2):
        a = (x @ w1).relu().sum(0)  # each product is reduced before the next is made
        b = (x @ w1[:, :16]).tanh().sum(0)
        return a, b
    loop, schedule, ordered = schedules(branches, x, w1, w2)
    assert ordered is schedule
    # the greedy order runs the smaller product first: no lower peak, so program order stays
    items = _Items(loop, schedule, CPP_TARGET)
    assert _greedy(items, items.dependencies()) == [2, 3, 0, 1]


def test_flag_off_returns_the_schedule():
    loop, schedule, _ = schedules(three_products, *three_product_inputs())
    assert order(loop, schedule, CPP_TARGET) is not schedule
    assert order(loop, schedule, CPP_TARGET, enabled=False) is schedule


def random_ops(x, w1, w2):
    a = torch.rand(64, 256)  # fallback (prims.uniform)
    b = torch.rand(64, 192)  # fallback (prims.uniform): running it (and its sum) before `a` would hold less
    scaled = (a * b.sum()).sum(0)
    m1, m2 = x @ w1, x @ w2  # products better reduced one at a time
    d = F.dropout(x, 0.5, training=True)  # fallback (prims.bernoulli)
    c = torch.bernoulli(torch.full((8, 32), 0.3))  # fallback (prims.bernoulli)
    return scaled + m1.relu().sum(0), m2.tanh().sum() + d.sum() + c.sum()


def test_random_fallbacks_keep_their_order(ordered_compile):
    torch.manual_seed(0)
    inputs = torch.randn(64, 32), torch.randn(32, 256), torch.randn(32, 192)
    loop, schedule, ordered = schedules(random_ops, *inputs)
    kinds = [s.target_name for s in schedule if isinstance(s, ExternNode) and s.kind == "fallback"]
    assert kinds == ["prims.uniform", "prims.uniform", "prims.bernoulli", "prims.bernoulli"], kinds
    assert ordered is not schedule  # the matmuls and their reductions moved
    assert_dependencies_kept(loop, ordered)

    c = ordered_compile(random_ops, *inputs)
    torch.manual_seed(7)
    want = random_ops(*inputs)
    after_eager = torch.rand(3)
    torch.manual_seed(7)
    got = c(*inputs)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.rand(3), after_eager)  # the generator advanced as in eager


def random_dag(seed):
    """A function of (x, w) building a random DAG of matmuls, pointwise ops and reductions on [16, 16]."""
    rng = random.Random(seed)
    steps = []
    for _ in range(rng.randint(8, 14)):
        kind = rng.choice(["mm", "mm", "unary", "binary", "reduce"])
        steps.append((kind, rng.random(), rng.random(), rng.choice([torch.tanh, torch.sigmoid, torch.relu])))

    def fn(x, w):
        values = [x, w]
        for kind, u, v, unary in steps:
            a, b = values[int(u * len(values))], values[int(v * len(values))]
            if kind == "mm":
                values.append(a @ w)
            elif kind == "unary":
                values.append(unary(a) * 2)
            elif kind == "binary":
                values.append(a - b * 0.5)
            else:
                values.append(a - a.sum(-1, keepdim=True) / 16)
        # a few results, each summed (so large intermediates can die early)
        return sum(t.sum(0) for t in values[2::3]) + values[-1].amax(0)
    return fn


def test_random_dags_respect_dependencies():
    reordered = 0
    for seed in range(30):
        fn = random_dag(seed)
        x, w = torch.randn(16, 16), torch.randn(16, 16) / 4
        loop, schedule, ordered = schedules(fn, x, w)
        assert sorted(id(s) for s in ordered) == sorted(id(s) for s in schedule)
        assert_dependencies_kept(loop, ordered)
        if ordered is not schedule:
            reordered += 1
            assert planned_peak(fn, x, w, memory_order=True) < planned_peak(fn, x, w), seed
    assert reordered >= 3, reordered


@pytest.mark.parametrize("seed", [1, 7, 19])  # graphs the order changes
def test_random_dags_against_eager(ordered_compile, seed):
    fn = random_dag(seed)
    torch.manual_seed(seed)
    x, w = torch.randn(16, 16), torch.randn(16, 16) / 4
    c = ordered_compile(fn, x, w)
    assert [s.name for s in c.schedule] != [s.name for s in schedules(fn, x, w)[1]]
    torch.testing.assert_close(c(x, w), fn(x, w), atol=1e-5, rtol=1e-5)
