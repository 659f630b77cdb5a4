"""Reduction prims: explicit dims, exact output metadata, eager's errors, references."""
import pytest
import torch

from kiln import prims
from kiln.graph import TensorMeta


def meta(shape, dtype=torch.float32):
    return TensorMeta(shape, dtype)


def test_meta_shapes_and_dtypes():
    assert prims.sum.meta(meta((2, 3, 4)), (0, 2)) == meta((3,))
    assert prims.amax.meta(meta((2, 3)), ()) == meta((2, 3))
    assert prims.argmax.meta(meta((2, 3)), (1,)) == meta((2,), torch.int64)
    assert prims.argmin.meta(meta((2, 3)), (0, 1)) == meta((), torch.int64)
    assert prims.var.meta(meta((2, 3), torch.float64), (1,), 1) == meta((2,), torch.float64)
    assert prims.var.meta(meta((2, 3), torch.complex64), (1,), 0).dtype == torch.float32
    v, m = prims.var_mean.meta(meta((2, 3)), (0,), 1)
    assert v == meta((3,)) and m == meta((3,))


def test_meta_refuses_loose_dims_and_dtypes():
    with pytest.raises(IndexError):
        prims.sum.meta(meta((2, 3)), (2,))
    with pytest.raises(IndexError):
        prims.sum.meta(meta((2, 3)), (1, 0))  # must be increasing
    with pytest.raises(TypeError):
        prims.sum.meta(meta((2, 3)), 1)
    with pytest.raises(TypeError):
        prims.sum.meta(meta((2,), torch.bool), (0,))
    with pytest.raises(RuntimeError, match="floating point"):
        prims.var.meta(meta((2,), torch.int64), (0,), 1)
    with pytest.raises(RuntimeError):
        prims.argmax.meta(meta((2, 3, 4)), (0, 1))  # one dim or every dim


def test_empty_reductions_raise_like_eager():
    with pytest.raises(IndexError, match="amax"):
        prims.amax.meta(meta((0, 3)), (0,))
    assert prims.amax.meta(meta((0, 3)), (1,)) == meta((0,))
    with pytest.raises(IndexError, match="argmax"):
        prims.argmax.meta(meta((0, 3)), (0, 1))
    assert prims.sum.meta(meta((0, 3)), (0,)) == meta((3,))


def test_references():
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    torch.testing.assert_close(prims.sum(x, (0, 2)), x.sum((0, 2)))
    torch.testing.assert_close(prims.prod(x, (0, 2)), x.prod(2).prod(0))
    torch.testing.assert_close(prims.prod(x, (0, 1, 2)), x.prod())
    torch.testing.assert_close(prims.amax(x, (1,)), x.amax(1))
    torch.testing.assert_close(prims.argmax(x, (0, 1, 2)), x.argmax())
    torch.testing.assert_close(prims.var(x, (1, 2), 0), x.var((1, 2), correction=0))
    torch.testing.assert_close(prims.sum(x, ()), x)
    assert prims.sum(x, ()).data_ptr() != x.data_ptr()
    assert torch.isnan(prims.var(x, (), 1)).all()
    v, m = prims.var_mean(x, (0,), 1)
    torch.testing.assert_close((v, m), torch.var_mean(x, 0))


def test_records_on_proxies():
    import kiln.ops
    g = kiln.ops.trace(lambda a: torch.sum(a, 1, keepdim=True), torch.randn(2, 3))
    p = kiln.graph.to_prims(g)
    names = [n.target.name for n in p.nodes if n.op == "call_prim"]
    assert names == ["sum", "broadcast_in_dim"]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8, torch.float16, torch.int64])
def test_references_keep_the_dtype(dtype):
    x = torch.ones(2, 3, dtype=dtype)
    for p in [prims.sum, prims.prod, prims.amax, prims.amin]:
        for dims in [(0,), (0, 1), ()]:
            out = p(x, dims)
            assert out.dtype == dtype and out.dtype == p.meta(x, dims).dtype
