"""bfloat16 and float16 in generated C++: eager's values bit for bit when rounded after every op, the float
program's rounded once when rounded at the store, and loops that vectorize.

Half-precision values live in float registers and are loaded and stored as their 16 bits through integer
round-to-nearest-even conversions (kiln.codegen.header): every bit pattern widens exactly, every float
narrows as c10 narrows it (ties to even, subnormals kept, overflow to infinity, NaN stays NaN). With
config bfloat16_rounding / float16_rounding 'op' each op's result is rounded back to the half type as eager
rounds it; with 'store' (bfloat16's default, torch.compile's rule) a fused chain computes in float and
rounds where a value is stored or converted to a dtype other than float32. Before, a half value was a
struct local, which g++ copied as an aggregate and left every half-precision loop scalar (a bf16 pointwise
chain moved 0.5 GB/s)."""
import os
import shutil
import sys

import pytest
import torch
import torch.nn.functional as F

import kiln.ops
from kiln import config
from kiln.backends.cpp import compile_graph
from kiln.runtime.build import flags

sys.path.insert(0, os.path.dirname(__file__))
from test_cpp_exp import _scalar_exp_loops  # noqa: E402

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache_raising")]

HALF = [torch.bfloat16, torch.float16]


@pytest.fixture
def each_op():
    """Both half types rounded after every op, as eager rounds."""
    with config.patch(bfloat16_rounding="op", float16_rounding="op"):
        yield


@pytest.fixture
def once():
    """Both half types rounded once, where stored or converted."""
    with config.patch(bfloat16_rounding="store", float16_rounding="store"):
        yield


def compiled(fn, *inputs):
    return compile_graph(kiln.ops.trace(fn, *inputs), list(inputs))


def same_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal bit for bit, except that any NaN matches any NaN (eager's NaN payloads are not specified)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if not want.is_floating_point():
        assert torch.equal(got, want)
        return
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
    g, w = got[~nan].view(bits), want[~nan].view(bits)
    assert torch.equal(g, w), (got[~nan][g != w][:8], want[~nan][g != w][:8])


def all_patterns(dtype: torch.dtype) -> torch.Tensor:
    return torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16).view(dtype)


def narrowing_inputs(dtype: torch.dtype) -> torch.Tensor:
    """Floats around every kind of rounding to `dtype`: halfway ties (to even up and down), a hair either
    side of them, subnormals of both types, the overflow edge, infinities, NaNs, signed zeros."""
    halves = all_patterns(dtype)
    halves = halves[~halves.isnan()].float()
    up = torch.nextafter(halves, torch.full_like(halves, float("inf")))
    wide = halves.view(torch.int32)
    # the float halfway between each half value and its successor: the half value's bits plus half an ulp
    shift = 16 if dtype == torch.bfloat16 else None
    if shift is not None:
        ties = (wide + (1 << 15)).view(torch.float32)
    else:
        nxt = torch.nextafter(halves.to(dtype), torch.tensor(float("inf"), dtype=dtype)).float()
        ties = (halves + nxt) / 2  # exact in float: the halves have 11 significant bits
    ties = ties[ties.isfinite()]
    near = torch.cat([torch.nextafter(ties, torch.full_like(ties, float("inf"))),
                      torch.nextafter(ties, torch.full_like(ties, float("-inf")))])
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), -float("nan"), 1e-45, -1e-45,
                            1e-39, 1.1754942e-38, 1.1754944e-38, 3.4028235e38, 3.39e38, 65504.0, 65519.996,
                            65520.0, 65536.0, 2.0 ** -24, 2.0 ** -25, 1.5 * 2.0 ** -25, 2.0 ** -26, 6.1e-5,
                            5.96e-8, 2.98e-8])
    payload = torch.tensor([0x7F800001, 0x7FFFFFFF, 0xFFC00001 - 2 ** 32, 0x7FBFFFFF], dtype=torch.int32)
    return torch.cat([halves, up, ties, near, special, -special, payload.view(torch.float32)])


@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
def test_every_half_value_widens_exactly(dtype):
    x = all_patterns(dtype)
    fn = lambda t: t.float()  # noqa: E731
    same_bits(compiled(fn, x)(x), fn(x))


@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
def test_narrowing_rounds_as_eager(dtype, each_op):
    """float -> half at ties, subnormals, the overflow edge, NaNs and infinities, and the same rounding of
    an op's result in a register (the add of -0.0 keeps every value and rounds it)."""
    x = narrowing_inputs(dtype)
    for fn in (lambda t: t.to(dtype), lambda t: t.to(dtype).float(), lambda t: (t.to(dtype) + t.to(dtype)),
               lambda t: t.double().to(dtype)):
        same_bits(compiled(fn, x)(x), fn(x))
    y = x.to(dtype)
    fn = lambda a, b: a * b  # noqa: E731  (products of half values round in the register)
    b = torch.full_like(y, 0.75)
    same_bits(compiled(fn, y, b)(y, b), fn(y, b))


def chain(a, b):
    return ((a * b + 1) * a - b / (a.abs() + 1)).relu() * 3 - 0.5


def chain_operands(dtype: torch.dtype, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    shape = (37, 61) if layout == "odd" else (64, 96)
    a, b = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    if layout == "transposed":
        a = a.t()
        b = torch.randn(shape[1], shape[0]).to(dtype)
    elif layout == "sliced":
        a, b = a[::2, 3:], b[1::2, :-3]
    return a, b


LAYOUTS = ["contiguous", "odd", "transposed", "sliced"]


@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_pointwise_chain_matches_eager_bit_for_bit(dtype, layout, each_op):
    """Rounded after every op as eager rounds: equal bits, with vector tails (odd sizes) and strided
    operands."""
    a, b = chain_operands(dtype, layout)
    same_bits(compiled(chain, a, b)(a, b), chain(a, b))


@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_rounded_once_is_the_float_program_rounded_at_the_store(dtype, layout, once):
    """Rounded once: the chain is the same program run in float32 and converted to the half type at the end,
    within one of the half type's steps (g++ contracts a * b + 1 into one fused multiply-add, rounded once
    where the float program rounds twice), and nearer the float64 result than eager's."""
    a, b = chain_operands(dtype, layout)
    got = compiled(chain, a, b)(a, b)
    want = chain(a.float(), b.float()).to(dtype)
    step = torch.nextafter(want.abs(), torch.tensor(float("inf"), dtype=dtype)) - want.abs()
    assert ((got.float() - want.float()).abs() <= step.float()).all()
    assert (got != want).float().mean() < 0.01
    exact = chain(a.double(), b.double())
    assert (got.double() - exact).abs().max() <= (chain(a, b).double() - exact).abs().max()


@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
def test_rounded_once_where_the_value_leaves_the_half_type(dtype, once):
    """Rounded once: a value converted to a dtype other than float32 (an integer, float64) is rounded to the
    half type first, as eager's is; a value stored is rounded; a round trip through the half type between
    float32 ops inside one kernel is not (torch.compile's rule)."""
    torch.manual_seed(0)
    a, b = (torch.randn(64, 96) * 100).to(dtype), torch.randn(64, 96).to(dtype)
    fa, fb = a.float(), b.float()
    cases = [  # (function, the float program rounded where its value leaves the half type)
        (lambda a, b: (a * b + 0.5).to(torch.int32), (fa * fb + 0.5).to(dtype).to(torch.int32)),
        (lambda a, b: (a * b - a).double(), (fa * fb - fa).to(dtype).double()),
        (lambda a, b: a * b * 3, (fa * fb * 3).to(dtype)),
        (lambda a, b: a * 3 > b, fa * 3 > fb)]
    for fn, want in cases:
        same_bits(compiled(fn, a, b)(a, b), want)
    x = torch.randn(1000) * 1.001
    fn = lambda t: (t + 1).to(dtype).float() * 3  # noqa: E731
    same_bits(compiled(fn, x)(x), (x + 1) * 3)


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


NORMS = {
    "softmax": lambda x, w: torch.softmax(x, -1),
    "layer_norm": lambda x, w: F.layer_norm(x, (x.shape[-1],), w, w * 0.5),
    "rms_norm": rms_norm,
    "gelu_sum": lambda x, w: F.gelu(x * w + 1).sum(-1),
    "column_sum": lambda x, w: (x * x).sum(0),
}


@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", sorted(NORMS))
@pytest.mark.parametrize("cols", [1000, 67])
def test_reductions_accumulate_in_float(dtype, name, cols):
    """Softmax, the norms and the sums accumulate in float: as close to the float64 result as eager."""
    torch.manual_seed(0)
    x, w = torch.randn(33, cols).to(dtype), torch.randn(cols).to(dtype)
    fn = NORMS[name]
    got, want = compiled(fn, x, w)(x, w), fn(x, w)
    exact = fn(x.double(), w.double())
    assert got.dtype == want.dtype
    # at most an ulp or so from eager (the float sums run in another order), subnormals included
    info = torch.finfo(dtype)
    torch.testing.assert_close(got, want, atol=info.smallest_normal * info.eps, rtol=2 * info.eps)
    err_got = (got.double() - exact).abs().max()
    err_eager = (want.double() - exact).abs().max()
    assert err_got <= err_eager + torch.finfo(dtype).eps, (err_got, err_eager)


@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", ["chain", "softmax", "layer_norm", "rms_norm", "column_sum"])
def test_half_loops_vectorize(dtype, name, tmp_path):
    """Every loop that converts a half value (a load, a rounding, a store) is vectorized by g++."""
    x, w = torch.randn(64, 256).to(dtype), torch.randn(256).to(dtype)
    fn = chain if name == "chain" else NORMS[name]
    c = compiled(fn, x, w)
    marks = ("_to_float(", "_to_bf16(", "_to_fp16(", "kiln_round_")

    def marker(line):  # kernel lines (indented at least three levels), not the header's helpers
        return any(m in line for m in marks) and line.startswith("      ")
    assert not _scalar_exp_loops(c.cpp_source, tmp_path, marker=marker), c.cpp_source
    assert "-O3" in flags()
