"""In-place torch ops kiln cannot decompose, and `out=` arguments: the graph stays functional.

Reads of a tensor before such a call must see its old values, reads after it the new ones, and a graph
input updated this way is written back — whatever order the backend computes things in (the cpp backend
inlines pointwise work into its consumers, so a mutation the graph did not record would be reordered).
"""
import shutil

import pytest
import torch

import kiln
from kiln import config

BACKENDS = ["prims"] + (["cpp"] if shutil.which(config.get("cxx")) else [])


def same_as_eager(fn, *inputs, backend, seed=0):
    eager_inputs = [t.clone() for t in inputs]
    torch.manual_seed(seed)
    expected = fn(*eager_inputs)
    kiln_inputs = [t.clone() for t in inputs]
    compiled = kiln.compile(fn, backend=backend)
    torch.manual_seed(seed)
    got = compiled(*kiln_inputs)
    torch.testing.assert_close(got, expected)
    for a, b in zip(kiln_inputs, eager_inputs):
        torch.testing.assert_close(a, b)  # the inputs were updated as eager updates them


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_in_place_method_without_decomposition(backend):
    def fn(x):
        before = x * 2
        x.exponential_()
        return before, x + 1
    same_as_eager(fn, torch.rand(37) + 0.5, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_in_place_on_an_intermediate_and_nn_init(backend):
    def fn(x):
        y = x.clone()
        before = y.sum()
        y.cauchy_()
        torch.nn.init.uniform_(x, 0.0, 3.0)  # torch passes the target as a keyword
        return before, y * 1, x - 1
    same_as_eager(fn, torch.randn(5, 7), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_argument(backend):
    def pointwise(x, y):
        before = y * 2
        torch.add(x, 1, out=y)
        return before, y + 1

    def fallback(x, y):
        before = y * 2
        torch.linalg.eigvalsh(x @ x.t(), out=y)  # an op without a decomposition
        return before, y + 1

    def into_a_view(x, y):
        torch.exp(x[0], out=y[:2])
        return y * 1

    def two_outs(x, y):
        before = y * 2
        values, indices = torch.max(x, 0, out=(y, torch.empty(4, dtype=torch.long)))
        return before, y + 1, values, indices
    same_as_eager(pointwise, torch.randn(6), torch.randn(6), backend=backend)
    same_as_eager(fallback, torch.randn(4, 4), torch.randn(4), backend=backend)
    same_as_eager(into_a_view, torch.randn(4, 2), torch.randn(4), backend=backend)
    same_as_eager(two_outs, torch.randn(4, 4), torch.randn(4), backend=backend)


def test_shape_changing_in_place_op_breaks_the_graph():
    def fn(x):
        x.resize_(8)
        return x + 1
    x = torch.ones(4)
    out = kiln.compile(fn, backend="prims")(x)
    assert out.shape == (8,) and x.shape == (8,)
    report = kiln.explain(fn, torch.ones(4))
    assert report.graph_break_count == 1 and "changes the shape or strides" in str(report)


def test_out_that_resizes_breaks_the_graph():
    def fn(x, y):
        torch.add(x, 1, out=y)
        return y * 2
    x, y = torch.randn(6), torch.empty(0)
    out = kiln.compile(fn, backend="prims")(x, y)
    torch.testing.assert_close(out, (x + 1) * 2)
    assert y.shape == (6,)
