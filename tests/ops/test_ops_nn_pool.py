"""Pooling decompositions (max, avg, lp, adaptive) against eager, through trace -> to_prims -> run."""
import os
import sys

import pytest
import torch
import torch.nn.functional as F

import kiln.ops
from kiln import graph as kg
from kiln.counters import counters

sys.path.insert(0, os.path.dirname(__file__))
from test_ops_nn import check_error, check_nn  # noqa: E402

DTYPES = [torch.float32, torch.float64]

POOL_CASES = [
    # (kernel, stride, padding, dilation, ceil_mode)
    (2, None, 0, 1, False), (3, 1, 1, 1, False), (3, 2, 1, 1, True), (2, 2, 0, 1, True), (3, 2, 0, 2, False),
    (3, 3, 1, 1, True), ((2, 3), (1, 2), (1, 0), 1, False),
]


def _case(n, case):
    k, s, p, d, c = case
    fix = lambda v: v if not isinstance(v, tuple) else (v * 3)[:n]  # noqa: E731
    return fix(k), (None if s is None else fix(s)), fix(p), fix(d), c


@pytest.mark.parametrize("case", POOL_CASES)
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("dtype", DTYPES)
def test_max_pool(case, n, dtype):
    torch.manual_seed(0)
    k, s, p, d, c = _case(n, case)
    op = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[n]
    x = torch.randn((2, 3) + (7, 6, 5)[:n], dtype=dtype)
    check_nn(lambda a: op(a, k, s, p, d, c), x)
    check_nn(lambda a: op(a, k, s, p, d, c), x[0])  # no batch dim


@pytest.mark.parametrize("case", POOL_CASES)
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("include_pad", [True, False])
def test_avg_pool(case, n, include_pad):
    torch.manual_seed(0)
    k, s, p, d, c = _case(n, case)
    if d != 1 and d != (1,) * n and not isinstance(d, int) or d == 2:
        return  # avg_pool has no dilation
    op = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[n]
    for dtype in DTYPES:
        x = torch.randn((2, 3) + (7, 6, 5)[:n], dtype=dtype)
        check_nn(lambda a: op(a, k, s, p, c, include_pad), x)
        if n > 1:
            check_nn(lambda a: op(a, k, s, p, c, include_pad, 5), x)


def test_pool_modules_and_nan():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    x[0, 1, 2, 3] = float("nan")
    check_nn(lambda a, m: m(a), x, torch.nn.MaxPool2d(3, 2, 1))
    check_nn(lambda a, m: m(a), x, torch.nn.AvgPool2d(2))
    check_nn(lambda a: F.max_pool2d(a, 2), x.to(torch.bfloat16))
    check_nn(lambda a: F.avg_pool2d(a, 3, 1, 1), x.to(torch.bfloat16))


def test_pool_errors():
    x = torch.randn(2, 3, 4, 4)
    check_error(lambda a: F.max_pool2d(a, 2, padding=2), x)
    check_error(lambda a: F.max_pool2d(a, 5), x)
    check_error(lambda a: F.avg_pool2d(a, 0), x)
    check_error(lambda a: F.max_pool2d(a, 2), torch.randn(4))


@pytest.mark.parametrize("case", POOL_CASES)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_max_pool_with_indices(case, n):
    """Indices as eager's scan: ties keep the first element, NaN the last, an all -inf window its first
    element inside the input (never the padding)."""
    torch.manual_seed(0)
    k, s, p, d, c = _case(n, case)
    op = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[n]
    x = torch.randn((2, 3) + (7, 6, 5)[:n]).round()  # many ties
    x.view(-1)[::7] = float("nan")
    x.view(-1)[3::11] = float("-inf")
    check_nn(lambda a: op(a, k, s, p, d, c, return_indices=True), x)
    check_nn(lambda a: op(a, k, s, p, d, c, return_indices=True), x[0].to(torch.float64))
    check_nn(lambda a: op(a, k, s, p, d, c, return_indices=True), torch.randint(-2, 2, x.shape))


def test_adaptive_max_pool_with_indices():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 6)
    check_nn(lambda a: F.adaptive_max_pool2d(a, (4, 3), return_indices=True), x)
    check_nn(lambda a: F.adaptive_max_pool1d(a, 3, return_indices=True), x[:, :, 0])
    counters.clear()
    g = kiln.ops.trace(lambda a: F.adaptive_max_pool2d(a, 5, return_indices=True), x)  # irregular windows
    assert len(g.fallbacks()) == 1


@pytest.mark.parametrize("out", [1, 2, 3, (2, 5), (None, 3), 7])
@pytest.mark.parametrize("dtype", DTYPES)
def test_adaptive_avg_pool(out, dtype):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 6, 5, dtype=dtype)
    check_nn(lambda a: F.adaptive_avg_pool2d(a, out), x[:, :, 0])
    check_nn(lambda a: F.adaptive_avg_pool2d(a, out), x[0, :, 0])
    check_nn(lambda a: F.adaptive_avg_pool3d(a, out if not isinstance(out, tuple) else out + (2,)), x)
    if not isinstance(out, tuple):
        check_nn(lambda a: F.adaptive_avg_pool1d(a, out), x[:, :, 0, 0])
    check_nn(lambda a, m: m(a), x[:, :, 0], torch.nn.AdaptiveAvgPool2d(out))


def test_adaptive_max_pool():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 6)
    check_nn(lambda a: F.adaptive_max_pool2d(a, (4, 3)), x)
    check_nn(lambda a: F.adaptive_max_pool2d(a, 1), x)
    check_nn(lambda a: F.adaptive_max_pool1d(a, 2), x[:, :, 0])
    check_nn(lambda a: F.adaptive_max_pool2d(a, 5), x)  # irregular windows
    check_nn(lambda a: F.adaptive_max_pool3d(a, (3, 2, 1)), x)
    check_nn(lambda a, m: m(a), x, torch.nn.AdaptiveMaxPool2d((3, 4)))


@pytest.mark.parametrize("n", [1, 2, 3])
def test_lp_pool(n):
    torch.manual_seed(0)
    op = {1: F.lp_pool1d, 2: F.lp_pool2d, 3: F.lp_pool3d}[n]
    x = torch.rand((2, 3) + (6, 6, 4)[:n]) + 0.1
    check_nn(lambda a: op(a, 2.0, 2), x)
    check_nn(lambda a: op(a, 3, 2, 1, True), x)


@pytest.mark.parametrize("args", [dict(kernel_size=2), dict(kernel_size=(2, 3), stride=2, padding=1),
                                  dict(kernel_size=3, dilation=2, padding=(0, 2)), dict(kernel_size=1)],
                         ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_unfold(args, dtype):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 6, dtype=dtype)
    check_nn(lambda a: F.unfold(a, **args), x)
    check_nn(lambda a: F.unfold(a, **args), x[0])
    check_nn(lambda a, m: m(a), x, torch.nn.Unfold(**args))


def test_unfold_errors_and_channel_shuffle():
    x = torch.randn(2, 6, 3, 3)
    check_error(lambda a: F.unfold(a, 4), x)
    check_error(lambda a: F.unfold(a, 2), torch.randn(3, 3), exc=IndexError)
    check_nn(lambda a: F.channel_shuffle(a, 3), x)
    check_nn(lambda a, m: m(a), x, torch.nn.ChannelShuffle(2))
    check_error(lambda a: F.channel_shuffle(a, 4), x)


def test_pool_random_configurations():
    """Seeded random kernel/stride/padding/dilation/ceil_mode configurations, including invalid ones
    (eager's exception type is expected then)."""
    import random
    rng = random.Random(0)
    for _ in range(40):
        n = rng.choice([1, 2, 3])
        x = torch.randn([2, 3] + [rng.randint(1, 8) for _ in range(n)])
        k = [rng.randint(1, 4) for _ in range(n)]
        s = [rng.randint(1, 3) for _ in range(n)]
        p = [rng.randint(0, 2) for _ in range(n)]
        d = [rng.randint(1, 2) for _ in range(n)]
        ceil, include_pad = rng.random() < 0.5, rng.random() < 0.5
        max_pool = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[n]
        avg_pool = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[n]
        for fn in (lambda a: max_pool(a, k, s, p, d, ceil),
                   lambda a: avg_pool(a, k, s, p, ceil, include_pad)):
            try:
                fn(x)
            except RuntimeError:
                check_error(fn, x)
                continue
            check_nn(fn, x)


@pytest.mark.parametrize("include_pad", [True, False])
def test_window_larger_than_the_input_is_one_reduction(include_pad):
    """transformers' ALIGN pools with AvgPool2d(hidden_dim, ceil_mode=True): one window of 64x64 over a 2x2
    map (one graph node per element never finished compiling). A window above MAX_WINDOW_TAPS with one
    position per dim is a sum (a maximum) over the input it covers; with more positions the op runs as a
    fallback, counted."""
    from kiln.ops import nn_pool
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 4)
    for fn in (lambda a: F.avg_pool2d(a, 64, ceil_mode=True, count_include_pad=include_pad),
               lambda a: F.avg_pool2d(a, (20, 17), padding=(3, 8), ceil_mode=True,
                                      count_include_pad=include_pad),
               lambda a: F.avg_pool2d(a, 20, ceil_mode=True, divisor_override=7),
               lambda a: F.max_pool2d(a, (20, 17), padding=(3, 8), ceil_mode=True),
               lambda a: F.avg_pool1d(a[0], 300, ceil_mode=True)):
        g = check_nn(fn, x)
        assert len(g.nodes) < 40
    big = torch.randn(1, 2, 40, 40)
    fn = lambda a: F.avg_pool2d(a, 17, stride=10)  # noqa: E731
    counters.clear()
    p = kg.to_prims(kiln.ops.trace(fn, big))
    torch.testing.assert_close(kg.run(p, [big]), fn(big))
    assert [n.target_name() for n in p.fallbacks()] == ["torch.nn.functional.avg_pool2d"]
    assert any("window of 289 elements" in reason for reason in counters["no_decomposition"])
    assert nn_pool.MAX_WINDOW_TAPS < 17 * 17
