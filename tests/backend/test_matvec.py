"""A one-row float32 product (a linear at batch 1) is a kiln reduction kernel, not the library's gemv
(kiln/lower/matvec.py): eager's values within float32 summation order, its neighbours fused, and every
other product still the library call."""
import shutil

import pytest
import torch
import torch.nn.functional as F

import kiln
import kiln.ops
from kiln import config
from kiln.backends.cpp import compile_graph

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache_raising")]


def compiled(fn, *inputs):
    return compile_graph(kiln.ops.trace(fn, *inputs), list(inputs))


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


CASES = {
    "linear": (lambda x, w: F.linear(x, w), (1, 96), (200, 96)),
    "linear of a batch of one sequence of one token": (lambda x, w: F.linear(x, w), (1, 1, 96), (200, 96)),
    "biased linear then gelu": (lambda x, w, b: F.gelu(F.linear(x, w, b)), (1, 96), (200, 96), (200,)),
    "normalized input": (lambda x, w: F.linear(F.layer_norm(x, (96,)), w) * 2, (1, 96), (200, 96)),
    "vector times matrix": (lambda x, w: x @ w, (1, 96), (96, 200)),
    "a vector": (lambda x, w: F.linear(x, w), (96,), (300, 96)),
    "long rows": (lambda x, w: F.linear(x, w), (1, 5000), (40, 5000)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_one_row_products_are_kernels_with_eager_values(name, counters):
    fn, *shapes = CASES[name]
    inputs = [torch.randn(s, generator=_gen(k)) for k, s in enumerate(shapes)]
    got, want = compiled(fn, *inputs)(*inputs), fn(*inputs)
    assert got.shape == want.shape and got.dtype == want.dtype and got.stride() == want.stride()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # no closer to float64 than eager is a bug: a sum in another order, not a different one
    exact = fn(*[t.double() for t in inputs])
    assert (got.double() - exact).abs().max() <= 4 * (want.double() - exact).abs().max() + 1e-6
    assert not counters["extern"].get("prims.mm") and not counters["extern"].get("prims.addmm"), \
        dict(counters["extern"])


@pytest.mark.parametrize("shape,dtype", [((2, 96), torch.float32), ((1, 96), torch.float16),
                                         ((1, 8), torch.float32)],
                         ids=["two rows", "float16", "a small weight"])
def test_other_products_stay_library_calls(shape, dtype, counters):
    w = torch.randn(200 if shape[1] > 8 else 16, shape[1], dtype=dtype)
    x = torch.randn(shape, dtype=dtype)
    got = compiled(lambda x, w: F.linear(x, w), x, w)(x, w)
    assert torch.equal(got, F.linear(x, w))
    assert counters["extern"]["prims.mm"] == 1, dict(counters["extern"])


@pytest.mark.parametrize("bias", [False, True])
def test_bfloat16_rows_are_kernels_rounded_once(bias, counters):
    """eager's bfloat16 product multiplies and sums in float32 and rounds once: so does the kernel (on this
    machine bit for bit: the sums differ in order only)."""
    w = torch.randn(300, 96, generator=_gen(1)).bfloat16()
    b = torch.randn(300, generator=_gen(2)).bfloat16() if bias else None
    x = torch.randn(1, 96, generator=_gen(3)).bfloat16()
    fn = (lambda x, w, b: F.linear(x, w, b)) if bias else (lambda x, w: F.linear(x, w))
    inputs = (x, w, b) if bias else (x, w)
    # (a biased one under half_addmm_min_macs is a float32 mm of upcasts plus the bias: a float32 row)
    got = compiled(fn, *inputs)(*inputs)
    want = fn(*inputs)
    assert got.dtype == want.dtype and got.stride() == want.stride()
    exact = fn(*[t.double() for t in inputs])
    # one rounding of a float32 sum: within half a bfloat16 step of the float64 product, as eager is
    assert (got.double() - exact).abs().max() <= (want.double() - exact).abs().max() * 1.01 + 1e-3
    torch.testing.assert_close(got, want)
    assert not counters["extern"], dict(counters["extern"])


def test_a_decode_step_trains_and_recompiles_for_two_rows(counters):
    lin = torch.nn.Linear(64, 128)
    ref = torch.nn.Linear(64, 128)
    ref.load_state_dict(lin.state_dict())
    f = kiln.compile(lambda x: torch.tanh(lin(x)).sum())
    for rows in (1, 2):
        x = torch.randn(rows, 64, generator=_gen(rows))
        f(x).backward()
        torch.tanh(ref(x)).sum().backward()
        for p, q in zip(lin.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5)
