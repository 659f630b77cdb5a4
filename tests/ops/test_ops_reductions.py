"""Reduction decompositions against eager: dims, keepdim, dtype, corrections, empty and 0-d inputs."""
import math
import warnings

import pytest
import torch

import kiln.graph
import kiln.ops
from kiln.counters import counters

warnings.filterwarnings("ignore", category=UserWarning)

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.uint8,
          torch.bool]
SHAPES = [(3, 4), (), (0, 3), (2, 0), (5,), (2, 3, 4)]


def sample(dtype, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, dtype=torch.float64, generator=g) * 3).to(dtype)
    return torch.randint(0 if dtype == torch.uint8 else -9, 10, shape, dtype=dtype, generator=g)


def compare(fn, *inputs):
    try:
        expected, error = fn(*inputs), None
    except Exception as e:  # eager's error is the expectation
        expected, error = None, e
    counters.clear()
    if error is not None:
        with pytest.raises(type(error)):
            g = kiln.ops.trace(fn, *inputs)
            kiln.graph.run(kiln.graph.to_prims(g), list(inputs))
        return
    g = kiln.ops.trace(fn, *inputs)
    p = kiln.graph.to_prims(g)
    kiln.graph.verify(p)
    got = kiln.graph.run(p, list(inputs))
    torch.testing.assert_close(got, expected, equal_nan=True, check_stride=False)
    assert type(got) is type(expected)
    assert not p.fallbacks(), [n.target_name() for n in p.fallbacks()]
    assert not counters["decomposition_mismatch"] and not counters["decomposition_error"], dict(counters)


CASES = {
    "sum": [(), (1,), (-1, True), ([0, 1],), ((),), (0, False, torch.float64), (torch.float64,)],
    "nansum": [(), (1,), (0, True)],
    "mean": [(), (1,), (-1, True), ([0, 1],)],
    "nanmean": [(), (1,), (0, True)],
    "prod": [(), (1,), (0, True)],
    "amax": [(), (1,), (-1, True), ([0, 1],)],
    "amin": [(), (0,), (-1, True)],
    "argmax": [(), (1,), (0, True), (None, True)],
    "argmin": [(), (1,), (0, True)],
    "max": [(), (1,), (0, True)],
    "min": [(), (1,), (0, True)],
    "var": [(), (1,), (0, True), (None, False), (1, False, True)],
    "std": [(), (1,), (0, True), (False,)],
    "var_mean": [(), (1,)],
    "std_mean": [(), (1,)],
    "any": [(), (1,), (0, True)],
    "all": [(), (1,), (0, True)],
    "count_nonzero": [(), (1,), ((0, 1),)],
    "logsumexp": [((0, 1),), (1,), (0, True)],
    "norm": [(), (1,), (3, 1), (math.inf,), ("fro", (0, 1)), (1, -1, True)],
}
KWARGS = {
    "var": [dict(correction=0), dict(dim=1, correction=2, keepdim=True), dict(unbiased=False)],
    "std": [dict(dim=0, unbiased=True, keepdim=True)],
    "sum": [dict(dtype=torch.float32), dict(dim=1, keepdim=True)],
    "aminmax": [dict(), dict(dim=1), dict(dim=0, keepdim=True)],
    "mean": [dict(dtype=torch.float64)],
    "max": [dict(dim=1)],
    "var_mean": [dict(dim=0, correction=0, keepdim=True)],
}


@pytest.mark.parametrize("name", sorted(set(CASES) | set(KWARGS)))
def test_reduction(name):
    op = getattr(torch, name)
    for dtype in DTYPES:
        for shape in SHAPES:
            x = sample(dtype, shape)
            for args in CASES.get(name, []):
                compare(lambda a: op(a, *args), x)
                if hasattr(torch.Tensor, name) and name != "norm":
                    compare(lambda a: getattr(a, name)(*args), x)
            for kwargs in KWARGS.get(name, []):
                compare(lambda a: op(a, **kwargs), x)


@pytest.mark.parametrize("ord", [2, 1, 0, 3.5, -1, math.inf, -math.inf])
def test_vector_norm(ord):
    for dtype in [torch.float32, torch.float64, torch.float16, torch.int64]:
        for shape in SHAPES:
            x = sample(dtype, shape)
            compare(lambda a: torch.linalg.vector_norm(a, ord), x)
            compare(lambda a: torch.linalg.vector_norm(a, ord, dim=-1, keepdim=True), x)
    compare(lambda a: torch.linalg.vector_norm(a, dtype=torch.float64), sample(torch.float32, (3, 4)))


def test_nan_handling():
    x = torch.tensor([[1.0, float("nan"), 3.0], [float("nan")] * 3, [1.0, -math.inf, math.inf]])
    for fn in [torch.nansum, torch.nanmean, lambda a: torch.nanmean(a, 1), torch.amax, torch.amin,
               lambda a: torch.argmax(a, 1), lambda a: torch.max(a, 1), lambda a: torch.min(a, 0),
               lambda a: torch.logsumexp(a, 1), lambda a: torch.var_mean(a, 1), torch.sum, torch.max]:
        compare(fn, x)
    compare(lambda a: torch.logsumexp(a, 0), torch.tensor([-math.inf, -math.inf]))


def test_named_tuples():
    x = sample(torch.float32, (3, 4))
    g = kiln.ops.trace(lambda a: torch.max(a, 1), x)
    out = kiln.graph.run(kiln.graph.to_prims(g), [x])
    assert isinstance(out, torch.return_types.max)
    assert torch.equal(out.indices, torch.max(x, 1).indices)
    compare(lambda a: torch.min(a, dim=0, keepdim=True), x)
    compare(lambda a: torch.aminmax(a, dim=1), x)
    compare(lambda a, b: torch.max(a, b), x, sample(torch.float32, (4,), 1))


def test_errors_like_eager():
    compare(lambda a: torch.mean(a), sample(torch.int64, (3,)))
    compare(lambda a: torch.var(a), sample(torch.int64, (3,)))
    compare(lambda a: torch.amax(a, 0), torch.empty(0, 3))
    compare(lambda a: torch.argmax(a), torch.empty(0, 3))
    compare(lambda a: torch.max(a), torch.empty(0, 3))
    compare(lambda a: torch.sum(a, 2), torch.empty(2, 3))
    compare(lambda a: torch.sum(a, (0, 0)), torch.empty(2, 3))
    compare(lambda a: torch.linalg.vector_norm(a), sample(torch.int64, (3,)))
