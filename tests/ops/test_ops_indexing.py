"""Indexing, sorting and scan decompositions against eager: values, shapes, dtypes, fully decomposed, and
eager's exception types for bad input. Data-dependent ops must fall back (and still be right)."""
import pytest
import torch
import torch.nn.functional as F

import kiln.ops
import ops_helpers
from kiln import graph as kg
from kiln.counters import counters, reset
from kiln.graph import Graph, Proxy, TensorMeta, tracing
from kiln.ops.indexing import advanced_index, advanced_index_put

MY_MODULES = ("kiln.ops.indexing", "kiln.ops.linalg")


def check_op(fn, *inputs, decomposed=True):
    return ops_helpers.check_op(fn, *inputs, decomposed=decomposed, modules=MY_MODULES)


def raises(exc, fn, *args, match=None):
    """Eager raises exc on these inputs, and so does tracing them (the decomposition's check or eager's)."""
    with pytest.raises(exc):
        fn(*args)
    with pytest.raises(exc, match=match):
        kiln.ops.trace(fn, *args)


x34 = torch.randn(3, 4)
x345 = torch.randn(3, 4, 5)
idx = torch.tensor([[0, 1], [2, 0]])


def test_gather_scatter():
    check_op(lambda x, i: torch.gather(x, 1, i), x34, idx)
    check_op(lambda x, i: x.gather(0, i), x34, idx.int())
    src = torch.randn(2, 2)
    check_op(lambda x, i, s: torch.scatter(x, 0, i, s), x34, idx, src)
    check_op(lambda x, i, s: x.scatter(1, i, s), x34, idx, src)
    check_op(lambda x, i: torch.scatter(x, 0, i, 2.5), x34, idx)
    check_op(lambda x, i: torch.scatter(x, 0, i, value=-2.5), x34.long(), idx)
    check_op(lambda x, i: torch.scatter(x, 0, i, 0.5), x34 > 0, idx)
    check_op(lambda x, i, s: torch.scatter(x, 0, i, s, reduce="add"), x34, idx, src)
    check_op(lambda x, i, s: torch.scatter(x, 0, i, s, reduce="multiply"), x34, idx, src)
    check_op(lambda x, i: torch.scatter(x, 0, i, 1.5, reduce="add"), x34, idx)
    check_op(lambda x, i: torch.scatter(x, 1, i, value=3, reduce="multiply"), x34.long(), idx)
    check_op(lambda x, i, s: torch.scatter_add(x, 0, i, s), x34, idx, src)
    check_op(lambda x, i, s: x.scatter_add(-1, i, s), x34, idx, src)
    check_op(lambda x, i, s: x.scatter_add(-1, i, s), x34, idx.int(), src)
    check_op(lambda x, i, s: torch.scatter(x, 1, i, s), x34, idx.int(), src)
    check_op(lambda x, i: torch.gather(x, 0, i), x34, torch.zeros(0, 4, dtype=torch.uint8), decomposed=False)
    for reduce in ["sum", "prod", "mean", "amax", "amin"]:
        for include_self in (True, False):
            check_op(lambda x, i, s: torch.scatter_reduce(x, 0, i, s, reduce, include_self=include_self),
                     x34, idx, src)
    check_op(lambda x, i, s: x.scatter_reduce(0, i, s, "mean"), x34.long(), idx, src.long())


def test_gather_scatter_errors():
    raises(IndexError, lambda x, i: torch.gather(x, 2, i), x34, idx)
    raises(RuntimeError, lambda x, i: torch.gather(x, 0, i), x34, idx[0])
    raises(RuntimeError, lambda x, i: torch.gather(x, 0, i), x34, torch.zeros(2, 5, dtype=torch.long))
    raises(RuntimeError, lambda x, i: torch.gather(x, 0, i), x34, idx.float())
    raises(RuntimeError, lambda x, i, s: torch.scatter(x, 0, i, s), x34, idx, torch.randn(2, 2).double())
    raises(RuntimeError, lambda x, i, s: torch.scatter(x, 0, i, s), x34, idx, torch.randn(1, 2))
    raises(RuntimeError, lambda x, i, s: torch.scatter_reduce(x, 0, i, s, "foo"), x34, idx, torch.randn(2, 2))
    with pytest.raises(RuntimeError, match="out of bounds"):  # out-of-range indices raise at run time
        g = kiln.ops.trace(lambda x, i: torch.gather(x, 0, i), x34, idx)
        kg.run(kg.to_prims(g), [x34, torch.full((2, 2), 5)])


def test_index_select_take():
    i = torch.tensor([2, 0, 2])
    check_op(lambda x, i: torch.index_select(x, 0, i), x34, i)
    check_op(lambda x, i: x.index_select(-1, i), x34, i.int())
    check_op(lambda x, i: torch.index_select(x, 1, i), x34, torch.tensor(1))
    check_op(lambda x, i: torch.take(x, i), x34, torch.tensor([[-1, 2], [11, 0]]))
    check_op(lambda x, i: x.take(i), x34, torch.tensor(5))
    check_op(lambda x, i: torch.take_along_dim(x, i, 0), x34, torch.tensor([[0], [1]]))
    check_op(lambda x, i: torch.take_along_dim(x, i, 0), x34, torch.tensor([[0, 1, 2, 2]]))
    check_op(lambda x, i: torch.take_along_dim(x, i, dim=1), x345, torch.zeros(1, 2, 5, dtype=torch.long))
    check_op(lambda x, i: torch.take_along_dim(x, i), x34, torch.tensor([0, 5, 11]))
    check_op(lambda x, i: torch.take_along_dim(x, i, -1), x34, torch.tensor([[-1, 7, -6, 4]]))
    check_op(lambda x: torch.take_along_dim(x, torch.argsort(x, 1), 1), x34)
    raises(IndexError, lambda x, i: torch.index_select(x, 0, i), x34, idx)
    raises(RuntimeError, lambda x, i: torch.index_select(x, 0, i), x34, i.float())
    raises(RuntimeError, lambda x, i: torch.take(x, i), x34, i.int())
    raises(RuntimeError, lambda x, i: torch.take_along_dim(x, i, 1), x34, i)


def test_index_add_copy_fill():
    src = torch.randn(2, 4)
    i = torch.tensor([2, 0])
    check_op(lambda x, i, s: torch.index_add(x, 0, i, s), x34, i, src)
    check_op(lambda x, i, s: torch.index_add(x, 0, i, s, alpha=2), x34, torch.tensor([1, 1]), src)
    check_op(lambda x, i, s: x.index_add(1, i, s), x34, i.int(), torch.randn(3, 2))
    check_op(lambda x, i, s: torch.index_copy(x, 0, i, s), x34, i, src)
    check_op(lambda x, i, s: x.index_copy(-1, i, s), x345, i, torch.randn(3, 4, 2))
    check_op(lambda x, i: torch.index_fill(x, 0, i, 1.5), x34, torch.tensor([-1, 0]))
    check_op(lambda x, i: x.index_fill(1, i, -3), x34.long(), torch.tensor(2))
    check_op(lambda x, i, v: torch.index_fill(x, 1, i, v), x34, i, torch.tensor(2.0, dtype=torch.float64))
    zero_d, one = torch.tensor(1.5), torch.tensor([0])
    check_op(lambda x, i, s: torch.index_add(x, 0, i, s, alpha=2), zero_d, one, torch.tensor(3.0))
    check_op(lambda x, i, s: torch.index_copy(x, 0, i, s), zero_d, one, torch.tensor(3.0))
    check_op(lambda x, i, s: torch.index_copy(x, 0, i, s), torch.zeros(3), one + 1, torch.tensor(3.0))
    check_op(lambda x, i: torch.index_fill(x, 0, i, 5.0), zero_d, torch.tensor(-1))
    raises(RuntimeError, lambda x, i, s: torch.index_add(x, 0, i, s), zero_d, one, torch.ones(1))
    raises(RuntimeError, lambda x, i, s: torch.index_add(x, 0, i, s), x34, i, torch.randn(3, 4))
    raises(RuntimeError, lambda x, i, s: torch.index_add(x, 0, i, s), x34, i, src.double())
    raises(IndexError, lambda x, i, s: torch.index_add(x, 0, i, s), x34, idx, src)
    raises(IndexError, lambda x, i, s: torch.index_copy(x, 0, i, s), x34, i, torch.randn(3, 4))
    raises(RuntimeError, lambda x, i, s: torch.index_copy(x, 0, i, s), x34, i.int(), src)
    raises(IndexError, lambda x, i: torch.index_fill(x, 0, i, 1.0), x34, i.int())
    raises(RuntimeError, lambda x, i, v: torch.index_fill(x, 0, i, v), x34, i, torch.ones(1))


def test_index_reduce_and_put():
    src = torch.randn(3, 3)
    i = torch.tensor([0, 0, 3])
    for reduce in ["prod", "mean", "amax", "amin"]:
        for include_self in (True, False):
            check_op(lambda x, i, s: torch.index_reduce(x, 1, i, s, reduce, include_self=include_self),
                     x34, i, src)
    check_op(lambda x, i, s: x.index_reduce(0, i, s, "mean"), x34.long(), torch.tensor([2, 2]).int(),
             torch.randint(-5, 5, (2, 4)))
    check_op(lambda x, i, s: torch.put(x, i, s), x34, torch.tensor([[-1, 0], [5, 11]]), torch.randn(2, 2))
    check_op(lambda x, i, s: x.put(i, s, accumulate=True), x34, torch.tensor([1, 1, -12]), torch.randn(3))
    check_op(lambda x, i, s: torch.put(x, i, s), torch.tensor(1.0), torch.tensor([0]), torch.tensor([5.0]))
    raises(IndexError, lambda x, i, s: torch.put(x, i, s), x34, torch.tensor([1, 1]), torch.randn(3))
    raises(RuntimeError, lambda x, i, s: torch.put(x, i, s), x34, torch.tensor([1]).int(), torch.randn(1))
    raises(RuntimeError, lambda x, i, s: torch.index_reduce(x, 1, i, s, "sum"), x34, i, src)


def test_masked():
    m = x34 > 0
    check_op(lambda x, m: x.masked_fill(m, 2.0), x34, m)
    check_op(lambda x, m: torch.masked_fill(x, m, -1.5), x34.long(), m)
    check_op(lambda x, m: torch.masked_fill(x, m, float("-inf")), x34, m[0])
    check_op(lambda x, m: torch.masked_fill(x, m, 1.0), torch.randn(4), m)  # broadcasts self
    check_op(lambda x, m, v: x.masked_fill(m, v), x34, m, torch.tensor(3.0, dtype=torch.float64))
    raises(RuntimeError, lambda x, m: x.masked_fill(m, 1.0), x34, m.to(torch.uint8))
    raises(RuntimeError, lambda x, m, v: x.masked_fill(m, v), x34, m, torch.ones(1))
    raises(RuntimeError, lambda x, m: x.masked_fill(m, 300), x34.to(torch.int8), m)
    raises(RuntimeError, lambda x, m: x.masked_fill(m, 1e6), x34.half(), m)
    raises(RuntimeError, lambda x, m: x.masked_fill(m, float("nan")), x34.long(), m)
    raises(RuntimeError, lambda x, i: x.scatter(0, i, float("inf")), x34.long(), idx)
    raises(RuntimeError, lambda x, i: x.index_fill(0, i, -129), x34.to(torch.int8), idx[0])
    check_op(lambda x, m: x.masked_fill(m, float("inf")), x34.half(), m)
    check_op(lambda x, m: x.masked_fill(m, 2.5), x34 > 0, m)


@pytest.mark.parametrize("fn", [
    lambda x: torch.masked_select(x, x > 0), lambda x: torch.nonzero(x > 0), lambda x: torch.argwhere(x),
    lambda x: (x > 0).nonzero(), lambda x: torch.masked_scatter(x, x > 0, torch.ones(12)),
])
def test_data_dependent_fall_back(fn):
    reset()
    p = check_op(fn, x34, decomposed=False)
    assert p.fallbacks()
    assert not counters["decomposition_error"]


INDICES = [
    [torch.tensor([0, 2])], [None, torch.tensor([1, -1, 0])], [None, None, torch.tensor(3)],
    [torch.tensor([0, 2]), torch.tensor([-1, 1])], [torch.tensor([0, 2]), None, torch.tensor([4, 1])],
    [None, torch.tensor([0, 2]), torch.tensor([4, 1])],
    [torch.tensor([[0], [2]]), None, torch.tensor([1, 4, 0])],
    [torch.tensor([[0, 1], [2, 0]]), torch.tensor([3, 3])], [torch.tensor([1], dtype=torch.int32)],
    [torch.tensor([0, 1]), torch.tensor(2), torch.tensor([[0], [4]])],
]


def _symbolic(fn, x, indices, *rest):
    """Run fn on proxies of x, the index tensors and rest, inside a fresh graph; return the output value."""
    g = Graph("t")
    proxies = {}
    with tracing(g):
        def proxy(t):
            if t is None or not isinstance(t, torch.Tensor):
                return t
            return Proxy(g.placeholder(f"a{len(proxies)}", TensorMeta.of(t)), example=t)
        px = proxy(x)
        proxies["x"] = px
        pi = [proxy(i) for i in indices]
        pr = [proxy(v) for v in rest]
        out = fn(px, pi, *pr)
    g.output(out.node)
    inputs = [x] + [i for i in indices if i is not None] + [v for v in rest if isinstance(v, torch.Tensor)]
    return kg.run(kg.to_prims(g) if any(n.op == "call_torch" for n in g.nodes) else g, inputs)


@pytest.mark.parametrize("indices", INDICES, ids=str)
def test_advanced_index(indices):
    want = torch.ops.aten.index.Tensor(x345, indices)
    torch.testing.assert_close(_symbolic(advanced_index, x345, indices), want)
    check_op(lambda x, *ii: torch.ops.aten.index.Tensor(x, _fill(indices, ii)), x345,
             *[i for i in indices if i is not None])
    for accumulate in (False, True):
        values = torch.randn(want.shape)
        expected = torch.ops.aten.index_put(x345, indices, values, accumulate)
        got = _symbolic(lambda x, ii, v: advanced_index_put(x, ii, v, accumulate), x345, indices, values)
        torch.testing.assert_close(got, expected)
        expected = x345.clone()
        expected[tuple(slice(None) if i is None else i for i in indices)] = 2.5
        got = _symbolic(lambda x, ii: advanced_index_put(x, ii, 2.5), x345, indices)
        torch.testing.assert_close(got, expected)


def _fill(indices, tensors):
    it = iter(tensors)
    return [None if i is None else next(it) for i in indices]


def test_advanced_index_put_values():
    i = torch.tensor([0, 1])
    for values in [torch.ones(4, 5), torch.ones(1, 2, 4, 5), torch.ones(5), torch.tensor(3.0), 7]:
        expected = x345.clone()
        expected[i] = values
        torch.testing.assert_close(_symbolic(advanced_index_put, x345, [i], values), expected)
    for values in [torch.ones(5, dtype=torch.float64), torch.tensor(3)]:
        with pytest.raises(RuntimeError, match="dtypes match"):
            x345.clone()[i] = values
        with pytest.raises(RuntimeError, match="dtypes match"):
            _symbolic(advanced_index_put, x345, [i], values)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        _symbolic(advanced_index_put, x345, [i], torch.ones(3, 5))


@pytest.mark.parametrize("mask, values", [
    (x345 > 0, 1.5), (x345[:, :, 0] > 0, torch.randn(5)), (x345[:, :, 0] > 0, torch.randn(1, 5)),
    (x345[:, 0, 0] > 0, torch.randn(4, 5)), (x345[:, 0, 0] > 0, torch.tensor(2)),
    (x345[:, 0, 0] > 0, torch.ones(1, dtype=torch.float64)), (x345[:, :, 0] > 0, torch.randn(1, 1)),
])
def test_mask_put(mask, values):
    for accumulate in (False, True):
        expected = x345.clone()
        if accumulate:
            expected = torch.index_put(expected, (mask,), torch.as_tensor(values, dtype=x345.dtype), True)
        else:
            expected[mask] = values
        got = _symbolic(lambda x, ii, v: advanced_index_put(x, ii, v, accumulate), x345, [mask], values)
        torch.testing.assert_close(got, expected)


def test_mask_index_falls_back():
    with pytest.raises(kiln.ops.NoDecomposition):
        _symbolic(advanced_index, x345, [x345[:, 0, 0] > 0])
    with pytest.raises(kiln.ops.NoDecomposition):
        _symbolic(advanced_index_put, x345, [x345[:, 0, 0] > 0], torch.randn(2, 4, 5))


def test_index_put():
    i, j = torch.tensor([0, 2, 0]), torch.tensor([1, 1, 3])
    check_op(lambda x, i, j, v: torch.index_put(x, (i, j), v), x34, i, j, torch.randn(3))
    check_op(lambda x, i, j, v: torch.index_put(x, (i, j), v, accumulate=True), x34, i, j, torch.randn(3))
    check_op(lambda x, i, v: x.index_put((i,), v, True), x34, i, torch.randn(4))
    check_op(lambda x, m, v: torch.index_put(x, (m,), v), x34, x34[:, 0] > 0, torch.randn(4))
    check_op(lambda x, m, v: torch.index_put(x, (m,), v, True), x34, x34 > 0, torch.tensor(2.0))
    mask = torch.tensor([True, False, True])
    check_op(lambda x, m, v: torch.index_put(x, (m,), v), x34, mask, torch.randn(2, 4),
             decomposed=False)  # values shaped by the mask's True count
    raises(RuntimeError, lambda x, i, v: torch.index_put(x, (i,), v), x34, i, torch.randn(3))
    raises(RuntimeError, lambda x, i, v: torch.index_put(x, (i,), v), x34, i, torch.randn(4).double())


def test_index_errors():
    raises(IndexError, lambda x, i, j: x[i, j], x34, torch.tensor([0, 1]), torch.tensor([0, 1, 2]))
    raises(IndexError, lambda x, i: torch.ops.aten.index.Tensor(x, [i, i, i]), x34, torch.tensor([0]))
    raises(IndexError, lambda x, i: torch.ops.aten.index.Tensor(x, [i]), x34, torch.tensor([0.0]))
    with pytest.raises(IndexError, match="too many indices"):
        advanced_index(x34, [None, None, None])
    with pytest.raises(IndexError, match="out of bounds"):
        g = kiln.ops.trace(lambda x, i: torch.ops.aten.index.Tensor(x, [i]), x34, torch.tensor([0]))
        kg.run(kg.to_prims(g), [x34, torch.tensor([7])])


def test_embedding():
    w = torch.randn(10, 3)
    i = torch.tensor([[1, 2, 9], [0, 0, 4]])
    check_op(F.embedding, i, w)
    check_op(lambda i, w: F.embedding(i, w, padding_idx=0), i.int(), w)
    check_op(lambda i, w: torch.embedding(w, i), i[0], w)
    check_op(F.embedding, torch.tensor(3), w)
    check_op(lambda i, w: F.embedding(i, w, max_norm=1.0), i, w.clone(), decomposed=False)
    raises(RuntimeError, F.embedding, i.float(), w)
    raises(RuntimeError, F.embedding, i, torch.randn(10))
    raises(AssertionError, lambda i, w: F.embedding(i, w, padding_idx=10), i, w)
    check_op(lambda i, w: F.embedding(i, w, padding_idx=-10), i, w)
    with pytest.raises(IndexError):
        g = kiln.ops.trace(F.embedding, i, w)
        kg.run(kg.to_prims(g), [torch.tensor([[-1, 0, 0], [0, 0, 0]]), w])


@pytest.mark.parametrize("x", [torch.randn(4, 6), torch.randint(0, 3, (4, 6)), torch.tensor(2.5),
                               torch.tensor([True, False, True])], ids=lambda x: f"{x.dtype}-{x.ndim}")
def test_sort_topk(x):
    check_op(lambda x: torch.sort(x), x)
    check_op(lambda x: torch.sort(x, stable=True, dim=0, descending=True), x)
    check_op(lambda x: torch.sort(x, 0, True), x)
    check_op(lambda x: x.sort(dim=0, stable=True).indices, x)
    check_op(lambda x: torch.sort(x, stable=None), x)
    check_op(lambda x: torch.argsort(x, stable=True, descending=True), x)
    check_op(lambda x: x.argsort(dim=0, stable=True), x)
    check_op(torch.msort, x)
    if x.dtype != torch.bool:
        check_op(lambda x: torch.topk(x, 1), x)
        check_op(lambda x: x.topk(1, dim=0, largest=False).values, x)


def test_sort_errors():
    raises(IndexError, lambda x: torch.sort(x, 2), x34)
    raises(RuntimeError, lambda x: torch.topk(x, 5), x34)


@pytest.mark.parametrize("x", [torch.randn(3, 5), torch.randint(-3, 4, (3, 5)), torch.randn(3, 5) > 0,
                               torch.tensor(2.0), torch.randn(3, 5).half()],
                         ids=lambda x: f"{x.dtype}-{x.ndim}")
def test_scans(x):
    for dim in range(-max(x.ndim, 1), max(x.ndim, 1)):
        check_op(lambda x: torch.cumsum(x, dim), x)
        check_op(lambda x: x.cumprod(dim), x)
        check_op(lambda x: torch.cumsum(x, dim, dtype=torch.float64), x)
        check_op(lambda x: x.cumprod(dim=dim, dtype=torch.int32), x)
        check_op(lambda x: torch.cummax(x, dim), x)
        check_op(lambda x: x.cummin(dim).indices, x)
        if x.dtype.is_floating_point:
            check_op(lambda x: torch.logcumsumexp(x, dim), x)
    raises(IndexError, lambda x: torch.cumsum(x, 5), x)
    if not x.dtype.is_floating_point:
        raises(NotImplementedError, lambda x: torch.logcumsumexp(x, 0), x)


def test_kthvalue_falls_back():
    check_op(lambda x: torch.kthvalue(x, 2, 1), x34, decomposed=False)


def test_mask_put_after_a_whole_dim():
    mask = torch.tensor([True, False, True, True])
    for values in [torch.randn(5), 2.0, torch.randn(3, 1, 1)]:
        expected = x345.clone()
        expected[:, mask] = values
        got = _symbolic(lambda x, ii, v: advanced_index_put(x, ii, v), x345, [None, mask], values)
        torch.testing.assert_close(got, expected)
