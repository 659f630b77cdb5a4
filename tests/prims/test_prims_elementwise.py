"""Elementwise prims: strict meta rules (no promotion, no broadcasting) and references equal to eager."""
import pytest
import torch

from kiln import prims
from kiln.graph import TensorMeta


def meta(shape, dtype=torch.float32):
    return TensorMeta(shape, dtype)


def test_binary_meta_is_strict():
    assert prims.add.meta(meta((2, 3)), meta((2, 3))) == meta((2, 3))
    with pytest.raises(RuntimeError, match="same shape"):
        prims.add.meta(meta((2, 3)), meta((3,)))
    with pytest.raises(TypeError, match="same dtype"):
        prims.add.meta(meta((2, 3)), meta((2, 3), torch.float64))
    with pytest.raises(TypeError, match="scalar"):
        prims.add.meta(meta((2,), torch.int64), 2.5)
    assert prims.lt.meta(meta((2,)), 1.0).dtype == torch.bool


def test_float_only_prims_refuse_integers():
    for p in [prims.exp, prims.log, prims.erf, prims.i0e, prims.ndtr, prims.erfcx]:
        with pytest.raises(TypeError):
            p.meta(meta((2,), torch.int64))
    with pytest.raises(TypeError):
        prims.bitwise_and.meta(meta((2,)), meta((2,)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.uint8, torch.bool])
def test_scalar_operands_compute_in_tensor_dtype(dtype):
    x = (torch.arange(6).reshape(2, 3) % 3).to(dtype)
    if dtype != torch.bool:
        torch.testing.assert_close(prims.add(x, 2), x + torch.tensor(2, dtype=dtype))
        torch.testing.assert_close(prims.add(2, x), torch.tensor(2, dtype=dtype) + x)
    assert prims.eq(x, True if dtype == torch.bool else 1).dtype == torch.bool


def test_scalar_first_operand():
    x = torch.tensor([1.0, 2.0, 4.0])
    torch.testing.assert_close(prims.sub(1.0, x), 1.0 - x)
    torch.testing.assert_close(prims.div(1.0, x), 1.0 / x)
    torch.testing.assert_close(prims.remainder(5.0, x), torch.remainder(5.0, x))


def test_wrapped_scalars_convert_like_torch():
    u8 = torch.tensor([1, 2], dtype=torch.uint8)
    assert torch.equal(prims.add(u8, 255), u8 + 255)  # wraps around
    f64 = torch.tensor([1.0], dtype=torch.float64)
    big = torch.finfo(torch.float64).max
    assert prims.where(torch.tensor([True]), big, f64).item() == big  # no float32 round trip


def test_special_prims_match_torch():
    x = torch.linspace(-3, 3, 11, dtype=torch.float64)
    for p, ref in [(prims.i0e, torch.special.i0e), (prims.i1, torch.special.i1),
                   (prims.ndtr, torch.special.ndtr),
                   (prims.log_ndtr, torch.special.log_ndtr), (prims.erfcx, torch.special.erfcx)]:
        torch.testing.assert_close(p(x), ref(x))
    p = torch.rand(5, dtype=torch.float64)
    torch.testing.assert_close(prims.ndtri(p), torch.special.ndtri(p))


def test_where_meta():
    assert prims.where.meta(meta((2,), torch.bool), meta((2,)), 0.0) == meta((2,))
    with pytest.raises(TypeError):
        prims.where.meta(meta((2,)), meta((2,)), meta((2,)))
    with pytest.raises(TypeError):
        prims.where.meta(meta((2,), torch.bool), 1.0, 0.0)


def test_convert_element_type_copies():
    x = torch.randn(3)
    y = prims.convert_element_type(x, torch.float32)
    assert torch.equal(x, y) and x.data_ptr() != y.data_ptr()


ALL_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
              torch.int16, torch.uint8, torch.bool, torch.complex64]


def _value(dtype, shape=(2, 3)):
    return (torch.arange(6).reshape(shape) % 3 + 1).to(dtype)


def test_references_agree_with_meta_for_every_dtype():
    """Where a prim's meta accepts an input, its reference returns exactly that shape and dtype."""
    from kiln.prims import elementwise as family
    checked = 0
    for p in [v for v in vars(family).values() if isinstance(v, prims.Prim)]:
        for dtype in ALL_DTYPES:
            x = _value(dtype)
            if "unary" in p.tags:
                operand_lists = [(x,)] if p.name != "convert_element_type" else [(x, torch.float64)]
            elif "binary" in p.tags:
                number = True if dtype == torch.bool else 2
                operand_lists = [(x, x), (x, number), (number, x)]
            else:
                continue
            for operands in operand_lists:
                try:
                    expected = p.meta(*operands)
                except (TypeError, RuntimeError):
                    continue
                out = p(*operands)
                assert out.dtype == expected.dtype and tuple(out.shape) == expected.shape, (p.name, dtype)
                checked += 1
    assert checked > 300
