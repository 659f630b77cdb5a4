"""tanh and erf in generated C++: float32 uses kiln's own rational approximations (kiln_tanh, kiln_erf in
codegen/header.py), which must stay within a few ulp of the exact value at every input, keep eager's special
values exactly, and vectorize without libmvec (libmvec's SIMD tanhf/erff left the GELU and tanh kernels
bound by arithmetic, not memory). float64 keeps <cmath>."""
import os
import shutil
import sys

import pytest
import torch
import torch.nn.functional as F

from kiln import config

sys.path.insert(0, os.path.dirname(__file__))
from test_cpp_exp import _scalar_exp_loops, compiled  # noqa: E402

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache_raising")]

SPECIAL = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-30, -1e-30, 1e-38, 3.9, 3.91, 3.92, 3.93,
           3.99, 4.0, 4.01, 8.99, 9.0, 9.01, 20.0, 88.0, 1e30, 3.4e38]


def _inputs(dtype):
    # every float32 bit pattern in a stride over [0, 12] (and its negation), then the specials in every
    # lane position of a 16-wide vector
    bits = torch.arange(0, 0x41400000, 4099, dtype=torch.int64).to(torch.int32)
    dense = bits.view(torch.float32)
    dense = torch.cat([dense, -dense])
    special = torch.tensor(SPECIAL + [-v for v in SPECIAL])
    x = torch.cat([dense] + [special.roll(i) for i in range(16)])
    return x.to(dtype)


@pytest.mark.parametrize("name", ["tanh", "erf"])
def test_float32_within_a_few_ulp_of_exact_and_specials_exact(name):
    fn = getattr(torch, name)
    x = _inputs(torch.float32)
    got = compiled(fn, x)(x)
    exact = fn(x.double())
    want = exact.float()  # the correctly rounded result (float64 is exact enough here)
    # ulp of the correctly rounded result; normal results only (a subnormal has no relative precision)
    normal = want.abs() >= torch.finfo(torch.float32).tiny
    ulp = (torch.nextafter(want.abs(), torch.tensor(float("inf"))) - want.abs())[normal].double()
    err = (got.double() - exact)[normal].abs() / ulp
    assert err.max().item() <= 8, (name, x[normal][err.argmax()].item(), err.max().item())
    # where the result is tiny, within one subnormal step
    assert ((got.double() - exact)[~normal & ~x.isnan()].abs() <= 1.5e-45).all()
    # zeros with eager's sign, NaN where eager has NaN, +-1 exactly where the correctly rounded result is
    eager = fn(x)
    assert torch.equal(got.isnan(), eager.isnan())
    number = ~eager.isnan()  # (a NaN's sign bit is not specified)
    assert torch.equal(torch.signbit(got[number]), torch.signbit(eager[number]))
    assert torch.equal(got.abs() == 1, want.abs() == 1), x[(got.abs() == 1) != (want.abs() == 1)]
    torch.testing.assert_close(got, eager, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["tanh", "erf"])
def test_other_float_types_match_eager(name, dtype):
    fn = getattr(torch, name)
    x = _inputs(dtype)
    got = compiled(fn, x)(x)
    torch.testing.assert_close(got, fn(x), equal_nan=True)
    number = ~x.isnan()  # (a NaN's sign bit is not specified)
    assert torch.equal(torch.signbit(got[number]), torch.signbit(fn(x)[number]))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_kernels_match_eager_and_vectorize(approximate, tmp_path):
    torch.manual_seed(0)
    a, b = torch.randn(64, 256) * 3, torch.randn(64, 256)

    def fn(a, b):
        return F.gelu(a * b + 1, approximate=approximate).sum(-1), torch.tanh(a) * b - a

    c = compiled(fn, a, b)
    for got, want in zip(c(a, b), fn(a, b)):
        torch.testing.assert_close(got, want)
    marker = "kiln_erf(" if approximate == "none" else "kiln_tanh("
    assert marker in c.cpp_source
    assert not _scalar_exp_loops(c.cpp_source, tmp_path, marker=lambda line: marker in line), c.cpp_source
