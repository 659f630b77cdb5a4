"""Column reductions in the cpp backend (kiln/codegen/cpp_columns.py) against eager: the reduced axis is
strided, the output index contiguous — sum(0), middle dims of 3-D tensors, transposed inputs — over dtypes,
tails, size-1 and large shapes, NaN, epilogues; and which kernels take the column path."""
import shutil

import pytest
import torch

import kiln.ops
from kiln import config
from kiln.backends.cpp import compile_graph
from kiln.testing.tolerance import OP_TOL, accuracy_rule

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache_raising")]

MARK = "// column reduction"


def compiled(fn, *inputs):
    graph = kiln.ops.trace(fn, *inputs)
    return compile_graph(graph, list(inputs))


def assert_matches(c, fn, *inputs, **tol):
    """c(*inputs) is eager's result (assert_close), or else as close to the float64 result as the
    accuracy rule asks (a sum in another order rounds differently from eager's)."""
    actual, eager = c(*inputs), fn(*inputs)
    try:
        torch.testing.assert_close(actual, eager, equal_nan=True, **tol)
    except AssertionError:
        fp64 = fn(*[x.double() if x.is_floating_point() else x for x in inputs])
        pairs = zip(actual, eager, fp64) if isinstance(eager, tuple) else [(actual, eager, fp64)]
        for a, e, r in pairs:
            if not a.is_floating_point():
                raise
            verdict = accuracy_rule(a, e, r, tol=OP_TOL, allclose_to="fp64")
            assert verdict.passed, verdict.reason


def check(fn, *inputs, column=True, **tol):
    """Compare with eager (twice: fresh values the second time); `column`: whether the column path ran."""
    c = compiled(fn, *inputs)
    assert_matches(c, fn, *inputs, **tol)
    fresh = [x.clone().uniform_(-2, 2) if x.is_floating_point() else x for x in inputs]
    assert_matches(c, fn, *fresh, **tol)
    if column is not None:
        assert (MARK in c.cpp_source) == column, c.cpp_source
    return c


def make(shape, dtype, low=-3.0, high=3.0):
    if dtype == torch.int64:
        return torch.randint(-50, 50, shape)
    return torch.empty(shape, dtype=torch.float64).uniform_(low, high).to(dtype)


REDUCTIONS = {
    "sum": lambda x, d: x.sum(d),
    "mean": lambda x, d: x.mean(d),
    "amax": lambda x, d: x.amax(d),
    "amin": lambda x, d: x.amin(d),
    "prod": lambda x, d: x.prod(d),
}


@pytest.mark.parametrize("op", list(REDUCTIONS))
@pytest.mark.parametrize("shape,dim", [((37, 45), 0), ((300, 17), 0), ((5, 8), 0), ((4096, 9), 0),
                                       ((6, 33, 19), 1), ((7, 5, 40), 0), ((3, 130, 600), 1)])
def test_reductions_over_leading_and_middle_dims(op, shape, dim):
    low, high = (0.9, 1.1) if op == "prod" else (-3.0, 3.0)
    x = make(shape, torch.float32, low, high)
    fn = REDUCTIONS[op]
    c = compiled(lambda x: fn(x, dim), x)
    assert_matches(c, lambda x: fn(x, dim), x)
    assert MARK in c.cpp_source


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("op", ["sum", "amax", "amin", "prod"])
def test_dtypes(dtype, op):
    low, high = (0.95, 1.05) if op == "prod" else (-3.0, 3.0)
    x = make((203, 77), dtype, low, high)
    if op == "prod" and dtype == torch.int64:
        x = torch.randint(-2, 3, (30, 77))  # products up to 2**30: no overflow
    fn = REDUCTIONS[op]
    if op == "prod" and dtype in (torch.float16, torch.bfloat16):
        # eager's half-precision prod drifts (0.01 off over 200 rows); kiln multiplies in float: compare
        # with the float64 product, rounded once
        c = compiled(lambda x: fn(x, 0), x)
        torch.testing.assert_close(c(x), fn(x.double(), 0).to(dtype))
        assert MARK in c.cpp_source
        return
    check(lambda x: fn(x, 0), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_mean_of_low_precision(dtype):
    check(lambda x: x.mean(0), make((519, 100), dtype))


def test_keepdim_and_epilogues():
    x, b = make((129, 70), torch.float32), make((70,), torch.float32)
    check(lambda x: x.sum(0, keepdim=True), x)
    check(lambda x: x.amax(0, keepdim=True) - x.amin(0, keepdim=True), x)
    check(lambda x, b: (x * x).sum(0) + b, x, b)
    check(lambda x: x.var(0), x)                    # a reduction reading an earlier one, then an epilogue
    check(lambda x: (x.sum(0), x.amax(0), x.abs().sum(0).sqrt()), x)   # siblings in one pass
    check(lambda x: torch.sqrt(x.var(0, keepdim=True) + 1e-5) * x.mean(0, keepdim=True), x)
    check(lambda x: (x - 1).exp().sum(0).log(), x)


def test_large_shapes_and_split():
    x = torch.randn(3000, 1000)
    check(lambda x: (x * x).sum(0), x, rtol=1e-5, atol=1e-4)
    check(lambda x: x.amax(0), x)
    # narrow output, long reduced axis: threads split the rows (when there are several threads)
    y = torch.randn(40000, 24)
    c = check(lambda y: y.sum(0), y, rtol=1e-5, atol=1e-4)
    assert "kiln_ns" in c.cpp_source
    check(lambda y: (y.amin(0), y.mean(0) * 2), y, rtol=1e-5, atol=1e-4)
    z = torch.randn(8, 2000, 64)
    check(lambda z: z.sum(1), z, rtol=1e-5, atol=1e-4)


def test_float32_sum_accuracy():
    # 1e6 rows of a constant: a plain float running sum would be thousands off; float blocks added in
    # double stay within a few units of the float32 result's own rounding (0.06), as the row path
    x = torch.full((1_000_000, 16), 1.1)
    c = compiled(lambda x: x.sum(0), x)
    exact = x.double().sum(0)
    assert (c(x).double() - exact).abs().max().item() <= 1.1e6 * 1e-5
    assert MARK in c.cpp_source


def test_tails_and_size_one():
    for shape in [(1, 50), (2, 9), (17, 31), (64, 513), (3, 1025), (1000, 8)]:
        x = make(shape, torch.float32)
        check(lambda x: x.sum(0), x)
        check(lambda x: x.amax(0), x)
    # outputs narrower than MIN_COLUMNS and size-1 reductions keep the general path
    check(lambda x: x.sum(0), make((100, 3), torch.float32), column=False)
    check(lambda x: x.sum(1, keepdim=True), make((50, 1, 40), torch.float32), column=None)


def test_empty_reductions_and_bools():
    empty = torch.randn(0, 50)
    check(lambda x: x.sum(0), empty, column=None)
    check(lambda x: x.prod(0), empty, column=None)
    check(lambda x: x.sum((0, 1)), torch.randn(5, 0, 50), column=None)
    x = make((77, 90), torch.float32)
    check(lambda x: ((x > 0).any(0), (x > -2.5).all(0), (x > 0).sum(0)), x, column=None)
    check(lambda x: x.to(torch.int32).sum(0, dtype=torch.int32), x, column=None)


def test_nan_propagates_through_max_and_min():
    x = make((300, 41), torch.float32)
    x[5, 3] = float("nan")
    x[299, 40] = float("nan")
    x[0, 0] = float("nan")
    x[:, 7] = float("nan")
    for fn in (lambda x: x.amax(0), lambda x: x.amin(0), lambda x: x.sum(0)):
        c = compiled(fn, x)
        assert_matches(c, fn, x)
        assert MARK in c.cpp_source
    y = x.double()
    c = compiled(lambda y: y.amax(0), y)
    torch.testing.assert_close(c(y), y.amax(0), equal_nan=True)
    inf = torch.full((200, 30), -float("inf"))
    check(lambda x: x.amax(0), inf)


def test_non_contiguous_inputs():
    base = make((90, 130), torch.float32)
    t = base.t()                                   # [130, 90], columns contiguous
    check(lambda t: t.sum(1), t)                   # reduced dim strided, output index contiguous
    check(lambda t: t.sum(0), t, column=False)     # reduced dim contiguous: a row reduction
    check(lambda x: x.t().amax(1), base)
    sliced = make((200, 100), torch.float32)[::2, 10:90]
    check(lambda s: s.sum(0), sliced)
    stepped = make((64, 200), torch.float32)[:, ::2]   # output stride 2: still the column loop order
    check(lambda s: s.sum(0), stepped, column=None)
    p = make((6, 40, 50), torch.float32).permute(1, 0, 2)   # [40, 6, 50]
    check(lambda p: p.sum(0), p)
    check(lambda p: p.sum(1), p)
    mixed = make((50, 60), torch.float32)
    check(lambda a: (a * a.t()).sum(0), mixed[:, :50], column=False)   # one operand each way
    w = make((50,), torch.float32)
    check(lambda a, w: (a * w[:, None]).sum(0), mixed[:, :50], w)      # a broadcast row weight


def test_row_reductions_and_arg_reductions_keep_the_general_path():
    x = make((64, 128), torch.float32)
    check(lambda x: x.sum(1), x, column=False)
    check(lambda x: x.argmax(0), x, column=False)
    check(lambda x: torch.softmax(x, 0), x, column=None)


def test_sum_over_leading_dims():
    x = make((9, 11, 70), torch.float32)
    check(lambda x: x.sum((0, 1)), x)
    check(lambda x: x.amax((0, 1)), x)
    big = make((600, 3, 40), torch.float32)     # inner rows beyond a float block in one dim
    check(lambda x: x.sum((0, 1)), big, rtol=1e-5, atol=1e-4)


def _bn_silu(x, w, b):
    return torch.nn.functional.silu(x * w[:, None, None] + b[:, None, None])


@pytest.mark.parametrize("shape", [(8, 32, 16, 16), (2, 480, 2, 2), (3, 40, 5, 7), (1, 300, 3, 3)])
def test_inner_producer_in_column_order(shape):
    # BatchNorm+SiLU stored and its channel mean over a channels-last buffer (EfficientNet's squeeze-
    # excitation input): one kernel, the pointwise producer computed per element of the column loop
    x = make(shape, torch.float32).to(memory_format=torch.channels_last)
    w, b = make(shape[1:2], torch.float32), make(shape[1:2], torch.float32)

    def fn(x, w, b):
        y = _bn_silu(x, w, b)
        return y, y.mean((2, 3), keepdim=True)
    c = check(fn, x, w, b)
    assert c(x, w, b)[0].stride() == fn(x, w, b)[0].stride()
    assert c.cpp_source.count("// kernel0:") == 1 and "// kernel1:" not in c.cpp_source, c.cpp_source


def test_inner_producers_and_later_passes():
    x = make((4, 64, 6, 6), torch.float32).to(memory_format=torch.channels_last)
    w, b = make((64,), torch.float32), make((64,), torch.float32)
    # an inner member reading the first pass's reduction, summed by a second pass
    check(lambda x: (x - x.mean((2, 3), keepdim=True)).square().mean((2, 3)), x)
    check(lambda x, w, b: (lambda y: (y, y.amax((2, 3)), (y * 2).sum((2, 3))))(_bn_silu(x, w, b)), x, w, b)
    # softmax over the strided axis: inner members after each reduction
    check(lambda x: torch.softmax(x, 0), make((300, 40), torch.float32), column=None)
    check(lambda x: torch.softmax(x, 2), x, column=None)
    # a depthwise 3x3 convolution, BatchNorm, SiLU and the mean, channels-last (EfficientNet's late stages,
    # after their explicit padding): the convolution and BatchNorm are held in variables of the element's
    # iteration, the SiLU stored
    k = make((64, 1, 3, 3), torch.float32)
    xp = make((4, 64, 8, 8), torch.float32).to(memory_format=torch.channels_last)

    def depthwise(x, k, w, b):
        y = _bn_silu(torch.nn.functional.conv2d(x, k, groups=64), w, b)
        return y, y.mean((2, 3))
    c = check(depthwise, xp, k, w, b)
    assert "  float loc_buf0;" in c.cpp_source, c.cpp_source
    # the weights, read at 9 * c + tap, come from per-tile arrays (g++ leaves the loop scalar otherwise)
    assert "pre8[kj] = p_" in c.cpp_source and "pre9[" not in c.cpp_source, c.cpp_source
    check(lambda x, k, w, b: _bn_silu(torch.nn.functional.conv2d(x, k, groups=64), w, b).mean((2, 3)),
          xp, k, w, b)
    check(lambda x, k, w, b: depthwise(torch.nn.functional.pad(x, (1, 1, 1, 1)), k, w, b), xp, k, w, b,
          column=None)


def test_preloaded_strided_operands():
    # operands invariant along the reduced loops, strided along the tile: read once per tile, in every
    # pass that reads them; columns of a row-major weight, a slice with a step, float64
    x = make((6, 48, 5, 5), torch.float32).to(memory_format=torch.channels_last)
    wt = make((48, 3), torch.float32)                         # wt[:, j]: element c at 3 * c + j
    c = check(lambda x, wt: (x * wt[:, 0, None, None] + wt[:, 2, None, None]).sum((2, 3)), x, wt)
    assert "pre1[kj]" in c.cpp_source, c.cpp_source
    check(lambda x, wt: ((x - (x * wt[:, 1, None, None]).mean((2, 3), keepdim=True)) * wt[:, 1, None, None])
          .square().sum((2, 3)), x, wt)
    stepped = make((144,), torch.float64)[::3]
    check(lambda x, s: (x * s[:, None, None]).exp().sum((2, 3)), x.double(), stepped)


def test_parameters_alone_do_not_choose_the_column_order():
    # the same depthwise kernel over a row-major (NCHW) input: the loads the reduced loops move are strided
    # along the channels, only the per-channel parameters are contiguous; the general path runs it
    # (EfficientNet at batch 2: the column order ran its kernels 2x slower)
    x = make((2, 96, 10, 10), torch.float32)
    k, w, b = make((96, 1, 3, 3), torch.float32), make((96,), torch.float32), make((96,), torch.float32)
    check(lambda x, k, w, b: (lambda y: (y, y.mean((2, 3))))(
        _bn_silu(torch.nn.functional.conv2d(x, k, stride=2, groups=96), w, b)), x, k, w, b, column=False)
    check(lambda x, w, b: (x * w[:, None, None] + b[:, None, None]).sum((2, 3)), x, w, b, column=False)
