"""Creation and random prims against eager factories: values, metas, and random streams under a seed."""
import pytest
import torch

from kiln import prims


def check_meta(p, *args):
    out = p(*args)
    meta = p.meta(*args)
    assert tuple(meta.shape) == tuple(out.shape) and meta.dtype == out.dtype and meta.device == out.device
    if out.numel() > 1:
        assert tuple(meta.strides) == tuple(out.stride())
    return out


def test_iota_matches_arange():
    for length, start, step, dtype in [(5, 0, 1, torch.int64), (7, 3, -2, torch.int32),
                                       (0, 0, 1, torch.int64),
                                       (9, 0.1, 0.1, torch.float32), (50, -2.5, 0.37, torch.float64),
                                       (1000, 0.0, 0.001, torch.float32), (11, 1.0, 0.5, torch.float16)]:
        out = check_meta(prims.iota, length, start, step, dtype)
        if dtype.is_floating_point:
            expected = torch.arange(start, start + (length - 0.5) * step, step, dtype=dtype)
        else:
            expected = torch.arange(start, start + length * step, step, dtype=dtype)
        assert torch.equal(out, expected)
    with pytest.raises(TypeError):
        prims.iota.meta(3, 0, 1, torch.bool)


def test_full_and_empty_strided():
    assert torch.equal(check_meta(prims.full, (2, 3), 1.5, torch.float32), torch.full((2, 3), 1.5))
    assert torch.equal(check_meta(prims.full, (), 7, torch.int64), torch.tensor(7))
    out = check_meta(prims.empty_strided, (2, 3), (1, 2), torch.float32)
    assert out.stride() == (1, 2)
    with pytest.raises(TypeError):
        prims.full.meta((2,), 1j, torch.float32)


def test_random_prims_follow_eager_streams():
    cases = [
        (lambda: prims.uniform((4, 5), 0.0, 1.0, torch.float32), lambda: torch.rand(4, 5)),
        (lambda: prims.uniform((3,), -2.0, 2.0, torch.float64), lambda: torch.empty(3, dtype=torch.float64)
         .uniform_(-2, 2)),
        (lambda: prims.normal((40,), 0.0, 1.0, torch.float32), lambda: torch.randn(40)),
        (lambda: prims.normal((7,), 1.0, 2.0, torch.float64), lambda: torch.normal(1.0, 2.0, (7,),
                                                                                   dtype=torch.float64)),
        (lambda: prims.randint(-3, 9, (30,), torch.int64), lambda: torch.randint(-3, 9, (30,))),
    ]
    for ours, eager in cases:
        torch.manual_seed(0)
        a = ours()
        torch.manual_seed(0)
        b = eager()
        assert torch.equal(a, b)
    probs = torch.rand(64)
    torch.manual_seed(1)
    a = prims.bernoulli(probs)
    torch.manual_seed(1)
    assert torch.equal(a, torch.bernoulli(probs))
    gen = torch.Generator().manual_seed(5)
    a = prims.bernoulli(probs, 0.25, gen)
    assert torch.equal(a, torch.bernoulli(probs, 0.25, generator=torch.Generator().manual_seed(5)))


def test_random_metas():
    m = prims.uniform.meta((2, 3), 0.0, 1.0, torch.float16)
    assert m.shape == (2, 3) and m.dtype == torch.float16
    assert "random" in prims.uniform.tags and "random" in prims.bernoulli.tags
    with pytest.raises(TypeError):
        prims.normal.meta((2,), 0.0, 1.0, torch.int64)
    with pytest.raises(RuntimeError):
        prims.randint.meta(5, 5, (2,), torch.int64)
    with pytest.raises(TypeError):
        prims.bernoulli.meta(torch.ones(2, dtype=torch.int64))
