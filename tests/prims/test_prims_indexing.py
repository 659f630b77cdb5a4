"""Indexing prims against eager: meta shapes and dtypes equal the reference's; bad input raises eager's
exception type from the meta rule; out-of-range indices raise at run time."""
import pytest
import torch

from kiln import prims
from kiln.graph import TensorMeta
from prims_helpers import check_prim, meta_raises


x34 = torch.randn(3, 4)
idx = torch.tensor([[0, 1], [2, 0]])


def test_gather():
    torch.testing.assert_close(check_prim(prims.gather, x34, 0, idx), torch.gather(x34, 0, idx))
    torch.testing.assert_close(check_prim(prims.gather, x34, -1, idx), torch.gather(x34, -1, idx))
    big = torch.zeros(5, 2, dtype=torch.long)
    torch.testing.assert_close(check_prim(prims.gather, x34, 0, big), torch.gather(x34, 0, big))
    check_prim(prims.gather, torch.tensor(5.0), 0, torch.tensor([0]))
    check_prim(prims.gather, torch.randn(3), 0, torch.tensor(1))
    check_prim(prims.gather, x34, 1, torch.zeros(0, 7, dtype=torch.long))


def test_gather_errors():
    meta_raises(IndexError, prims.gather, x34, 2, idx)
    meta_raises(RuntimeError, prims.gather, x34, 0, idx.int())
    meta_raises(RuntimeError, prims.gather, x34, 0, idx[0], match="same number of dimensions")
    meta_raises(RuntimeError, prims.gather, x34, 0, torch.zeros(2, 5, dtype=torch.long),
                match=r"\[2, 5\].*\[3, 4\]")
    with pytest.raises(RuntimeError, match="out of bounds"):
        prims.gather(x34, 0, torch.full((2, 2), 5))
    with pytest.raises(RuntimeError):
        prims.gather(x34, 0, torch.full((2, 2), -1))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter_family(dim):
    src = torch.randn(2, 2)
    for p, ref in [(prims.scatter, torch.scatter), (prims.scatter_add, torch.scatter_add)]:
        torch.testing.assert_close(check_prim(p, x34, dim, idx, src), ref(x34, dim, idx, src))
    got = check_prim(prims.scatter, x34, dim, idx, 2.5)
    torch.testing.assert_close(got, torch.scatter(x34, dim, idx, 2.5))
    for reduce in ["sum", "prod", "mean", "amax", "amin"]:
        for include_self in (True, False):
            got = check_prim(prims.scatter_reduce, x34, dim, idx, src, reduce, include_self)
            torch.testing.assert_close(got, torch.scatter_reduce(x34, dim, idx, src, reduce,
                                                                 include_self=include_self))


def test_scatter_errors():
    meta_raises(RuntimeError, prims.scatter, x34, 0, idx, torch.randn(2, 2).double(), match="dtype")
    meta_raises(RuntimeError, prims.scatter, x34, 0, idx, torch.randn(1, 2), match=r"src \[1, 2\]")
    meta_raises(RuntimeError, prims.scatter_add, x34, 0, torch.zeros(2, 5, dtype=torch.long),
                torch.randn(2, 5), match=r"\[2, 5\]")
    meta_raises(RuntimeError, prims.scatter, x34, 0, idx.int(), torch.randn(2, 2))
    meta_raises(IndexError, prims.scatter, x34, 3, idx, 1.0)
    meta_raises(TypeError, prims.scatter, x34.long(), 0, idx, 1.5)
    meta_raises(TypeError, prims.scatter_add, x34, 0, idx, 1.0)
    meta_raises(RuntimeError, prims.scatter_reduce, x34, 0, idx, torch.randn(2, 2), "foo", True,
                match="reduce argument")
    with pytest.raises(RuntimeError):
        prims.scatter(torch.zeros(3), 0, torch.tensor([3]), 1.0)


def test_index_select():
    i = torch.tensor([2, 0, 2])
    torch.testing.assert_close(check_prim(prims.index_select, x34, 0, i), torch.index_select(x34, 0, i))
    torch.testing.assert_close(check_prim(prims.index_select, x34, -1, i), torch.index_select(x34, -1, i))
    check_prim(prims.index_select, x34, 1, torch.tensor(1))
    check_prim(prims.index_select, torch.tensor(1.0), 0, torch.tensor([0]))
    check_prim(prims.index_select, x34, 0, torch.zeros(0, dtype=torch.long))
    meta_raises(IndexError, prims.index_select, x34, 0, idx, match="vector")
    meta_raises(RuntimeError, prims.index_select, x34, 0, i.float())
    meta_raises(IndexError, prims.index_select, torch.tensor(1.0), 0, torch.tensor([0, 0]))
    with pytest.raises(IndexError):
        prims.index_select(x34, 0, torch.tensor([5]))


X = torch.randn(3, 4, 5)
I2 = torch.tensor([0, 2])
J2 = torch.tensor([-1, 1])


@pytest.mark.parametrize("indices", [
    [I2], [None, I2], [None, None, J2], [I2, J2], [I2, None, J2], [None, I2, J2], [I2, J2, J2],
    [torch.tensor(1)], [None, torch.tensor([[0, 1], [2, 3]])],
    [torch.tensor([[0], [2]]).expand(2, 3), None, torch.tensor([[1, 4, 0]]).expand(2, 3)],
    [torch.zeros(0, dtype=torch.long)],
])
def test_index_and_index_put(indices):
    want = torch.ops.aten.index.Tensor(X, indices)
    torch.testing.assert_close(check_prim(prims.index, X, indices), want)
    values = torch.randn(want.shape)
    for accumulate in (False, True):
        got = check_prim(prims.index_put, X, indices, values, accumulate)
        torch.testing.assert_close(got, torch.ops.aten.index_put(X, indices, values, accumulate))


def test_index_errors():
    meta_raises(IndexError, prims.index, X, [I2, I2, I2, I2], match="too many indices")
    meta_raises(IndexError, prims.index, X, [], match="at least one")
    meta_raises(IndexError, prims.index, X, [I2.int()])
    meta_raises(IndexError, prims.index, X, [I2 > 0])
    meta_raises(IndexError, prims.index, X, [I2, torch.tensor([0, 1, 2])])
    meta_raises(RuntimeError, prims.index_put, X, [I2], torch.randn(2, 4, 5).double(), False, match="dtype")
    meta_raises(RuntimeError, prims.index_put, X, [I2], torch.randn(4, 5), False, match="shape")
    with pytest.raises(IndexError, match="out of bounds"):
        prims.index(X, [torch.tensor([7])])
    with pytest.raises(IndexError):
        prims.index_put(X, [torch.tensor([-4])], torch.randn(1, 4, 5), False)


def test_record_on_proxies():
    from kiln.graph import Graph, Proxy, run
    g = Graph("t")
    a = Proxy(g.placeholder("a", TensorMeta((3, 4, 5), torch.float32)))
    i = Proxy(g.placeholder("i", TensorMeta((2,), torch.int64)))
    out = prims.index(a, [None, i])
    assert tuple(out.shape) == (3, 2, 5)
    g.output(out.node)
    torch.testing.assert_close(run(g, [X, I2]), X[:, I2])
    code, _ = g.python_code()
    assert "prims.index(a, [None, i])" in code
