"""Capture records ops; it does not run them (issue 41 item 4). A decomposed op's result metadata comes from
its decomposition, eager's checks from the meta device (and, for small tensors, a run on zero-filled
stand-ins), its aliasing from the meta device; the examples of its results are computed only when something
asks for one (`kiln.ops.standins.LazyRun`). `check_metas` runs every op on its examples as capture used to."""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln import config
from kiln.counters import counters
from kiln.graph import Graph, Proxy, TensorMeta
from kiln.ops import standins


@pytest.fixture
def example_runs(monkeypatch):
    """The ops run on examples (real values) while capturing."""
    seen: list[str] = []
    original = standins._run

    def spy(func, args, kwargs, on, *rest):
        if on == "example":
            seen.append(getattr(func, "__name__", str(func)))
        return original(func, args, kwargs, on, *rest)
    monkeypatch.setattr(standins, "_run", spy)
    return seen


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(32)
        self.qkv = torch.nn.Linear(32, 96)
        self.out = torch.nn.Linear(32, 32)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).split(32, dim=-1)
        q, k, v = (t.view(2, 8, 4, 8).transpose(1, 2) for t in (q, k, v))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.out(a.transpose(1, 2).reshape(2, 8, 32))


@pytest.mark.parametrize("backend", ["eager", "cpp"])
def test_capture_runs_no_op_on_examples(example_runs, backend):
    torch.manual_seed(0)
    model = _Block().eval()
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        expected = model(x)
        kiln.reset()
        counters.clear()
        got = kiln.compile(model, backend=backend)(x)
    torch.testing.assert_close(got, expected)
    assert sum(counters["graphs"].values()) == 1
    assert example_runs == []
    assert not counters["capture"]["deferred example runs"]


def test_check_metas_runs_every_op_on_its_examples(example_runs):
    torch.manual_seed(0)
    model = _Block().eval()
    x = torch.randn(2, 8, 32)
    with torch.no_grad(), config.patch(check_metas=True):
        expected = model(x)
        kiln.reset()
        got = kiln.compile(model, backend="eager")(x)
    torch.testing.assert_close(got, expected)
    assert len(example_runs) >= 10


def _chain(n: int) -> tuple[Proxy, torch.Tensor]:
    graph = Graph("chain")
    x = torch.arange(4.0)
    p = Proxy(graph.placeholder("x", TensorMeta.of(x)), example=x)
    for _ in range(n):
        q = Proxy(graph.placeholder("y", TensorMeta.of(x)))  # (a node to hold; only the example matters)
        q.example = standins.LazyRun(torch.add, (p, 1), {}, protect=False).leaf(0)
        p = q
    return p, x


def test_a_long_chain_of_deferred_examples_resolves_in_order():
    p, x = _chain(5000)  # (deeper than Python's recursion limit)
    assert p.example_at_hand() is None and p.has_example()
    torch.testing.assert_close(p.example, x + 5000)
    assert p.example_at_hand() is not None


def test_an_in_place_update_keeps_the_example_it_read():
    """A deferred run reads its arguments' examples as they were when it was recorded."""
    def f(x):
        y = x * 2
        z = y + 1  # reads y before the update
        y.add_(100)
        w = y.add_(z[0])  # reads z and y: examples asked for (z shares no memory with y)
        return z, w
    x = torch.arange(6.0).reshape(2, 3)
    kiln.reset()
    for got, want in zip(kiln.compile(f, backend="eager")(x), f(x)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("backend", ["eager", "cpp"])
def test_aliasing_is_eagers_from_the_meta_device(example_runs, backend):
    """reshape is a view of a contiguous tensor and a copy of a transposed one; einsum that only permutes
    returns a view: an in-place update after them shows where eager's memory is shared, and only there."""
    def f(x):
        x = x * 1  # (an intermediate: its aliases are capture's to track)
        view = x.reshape(-1)
        copy = x.t().reshape(-1)
        perm = torch.einsum("ij->ji", x)
        x.add_(1)
        return view * 1, copy * 1, perm * 1, x.stride(), perm.stride()
    x = torch.arange(6.0).reshape(2, 3)
    kiln.reset()
    got = kiln.compile(f, backend=backend)(x)
    want = f(x)
    for g, w in zip(got, want):
        if isinstance(w, torch.Tensor):
            torch.testing.assert_close(g, w)
        else:
            assert g == w
    assert example_runs == []


def test_stride_of_an_intermediate_is_eagers(example_runs):
    def f(x):
        y = x.t() * 2  # elementwise over a transposed input: eager keeps its layout
        z = y.contiguous()
        return y.stride(), z.stride(), y.is_contiguous(), x.t().is_contiguous()
    x = torch.randn(3, 5)
    kiln.reset()
    assert kiln.compile(f, backend="eager")(x) == f(x)
    assert example_runs == []


@pytest.mark.parametrize("make", [
    lambda: (torch.ones(3, 4, dtype=torch.bool), True),  # sub with a bool: eager's check (meta does not)
    lambda: (torch.ones(3, 4, dtype=torch.int64), torch.ones(3, 4, dtype=torch.int64)),  # igamma of ints
], ids=["sub_bool", "igamma_int"])
def test_eagers_dtype_errors_without_running_examples(make):
    a, b = make()
    op = torch.sub if a.dtype == torch.bool else torch.igamma
    with pytest.raises(Exception) as eager:
        op(a, b)
    kiln.reset()
    with pytest.raises(type(eager.value)):
        kiln.compile(lambda a, b: op(a, b) + 0, backend="eager")(a, b)


def test_a_zero_divisor_in_the_stand_ins_is_not_an_error():
    """The zero-filled run fails where the values do not (integer division): the examples decide."""
    def f(a, b):
        return a // b + 1
    a, b = torch.tensor([7, 9]), torch.tensor([2, 4])
    kiln.reset()
    torch.testing.assert_close(kiln.compile(f, backend="eager")(a, b), f(a, b))


@pytest.mark.parametrize("backend", ["eager", "cpp"])
def test_a_fallback_is_recorded_from_the_meta_device(example_runs, backend):
    """torch.histc has no decomposition: it runs with torch in the graph, its result's metadata from the
    meta device (on the CPU, as eager's), the examples before it never computed."""
    def f(x):
        y = torch.tanh(x * 2)
        h = torch.histc(y, bins=4, min=-1, max=1)
        return h + 1, y.sum()
    x = torch.randn(64)
    kiln.reset()
    counters.clear()
    got, want = kiln.compile(f, backend=backend)(x), f(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
        assert g.device == w.device and g.dtype == w.dtype
    assert counters["fallback"]["torch.histc"] >= 1  # (counted by capture, and by the cpp backend again)
    assert counters["capture"]["fallbacks recorded from the meta device"] == 1
    assert example_runs == []
