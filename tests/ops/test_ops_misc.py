"""Composite decompositions (kiln/ops/misc.py and the additions to elementwise/creation/shape) against eager:
every test traces the op, runs the prim graph on the reference interpreter and compares with eager, and
asserts the op decomposed (no fallback node)."""
import math
import warnings

import pytest
import torch

import kiln.graph
import kiln.ops

NAN = float("nan")


def run(fn, *inputs, seed=None):
    graph = kiln.ops.trace(fn, *inputs)
    prim_graph = kiln.graph.to_prims(graph)
    kiln.graph.verify(prim_graph)
    assert not prim_graph.fallbacks(), prim_graph.fallbacks()
    if seed is not None:
        torch.manual_seed(seed)
    return kiln.graph.run(prim_graph, list(inputs))


def check(fn, *inputs, exact=False, seed=None):
    out = run(fn, *inputs, seed=seed)
    if seed is not None:
        torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = fn(*inputs)
    torch.testing.assert_close(out, expected, equal_nan=True, rtol=0 if exact else None,
                               atol=0 if exact else None)
    return out


# ---- elementwise additions -------------------------------------------------------------------------------

SPECIAL_POINTS = torch.tensor([0., -0., -1., 0.3, -2.5, 1e-3, 5., math.inf, -math.inf, NAN, 0.5, 100.])


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_polygamma(n, dtype):
    x = torch.cat([SPECIAL_POINTS, torch.randn(200) * 5]).to(dtype)
    check(lambda t: torch.polygamma(n, t), x)
    check(lambda t: t.polygamma(n), x)


def test_polygamma_of_integers():
    check(lambda t: torch.special.polygamma(2, t), torch.arange(-3, 6))


def test_special_bessel_functions():
    x = torch.cat([SPECIAL_POINTS, torch.randn(200) * 5, torch.rand(50) - 0.5])
    check(lambda t: torch.special.spherical_bessel_j0(t), x)
    check(lambda t: torch.special.spherical_bessel_j0(t), x.double())
    check(lambda t: torch.special.modified_bessel_i0(t), x)
    check(lambda t: torch.special.modified_bessel_i1(t), x)


@pytest.mark.parametrize("op", [torch.special.modified_bessel_k0, torch.special.modified_bessel_k1,
                                torch.special.scaled_modified_bessel_k0, torch.special.scaled_modified_bessel_k1,
                                torch.special.bessel_j0, torch.special.bessel_j1, torch.special.bessel_y0,
                                torch.special.bessel_y1])
def test_bessel_functions(op):
    x = torch.cat([SPECIAL_POINTS, torch.rand(300) * 30, torch.rand(200) * 12 - 6,
                   torch.tensor([2., 5., -5., 1e-6, 2.0000002, 4.9999995, 5.0000005])])
    check(lambda t: op(t), x)
    check(lambda t: op(t), x.double())
    check(lambda t: op(t), torch.arange(-2, 7))


def test_frexp_every_exponent():
    bits = [(e << 23) | m for e in range(256) for m in (0, 1, 0x400000, 0x7FFFFF, 0x123456)]
    x = torch.tensor(bits, dtype=torch.int32).view(torch.float32)
    x = torch.cat([x, -x, torch.randn(100) * 1e10])
    mantissa, exponent = run(lambda t: tuple(torch.frexp(t)), x)
    want_mantissa, want_exponent = torch.frexp(x)
    assert exponent.dtype == torch.int32
    assert torch.equal(exponent, want_exponent)
    assert torch.equal(mantissa.nan_to_num(), want_mantissa.nan_to_num())


# ---- creation additions ----------------------------------------------------------------------------------

@pytest.mark.parametrize("steps", [0, 1, 2, 7, 50])
def test_linspace_logspace_with_tensor_bounds(steps):
    start, end = torch.tensor(-2.0), torch.tensor(3, dtype=torch.int64)
    check(lambda a, b: torch.linspace(a, b, steps), start, end)
    check(lambda a: torch.linspace(a, 4.5, steps, dtype=torch.float64), start)
    check(lambda b: torch.logspace(-1, b, steps, base=2.0), end)


def test_normal_with_tensor_mean_and_std():
    check(lambda m, s: torch.normal(m, s), torch.randn(3, 4), torch.rand(3, 4), seed=3)
    check(lambda m, s: torch.normal(m, s), torch.randn(1, 2, 3), torch.rand(5, 2, 3), seed=3)
    check(lambda m: torch.normal(m, 2.0), torch.randn(30), seed=3)
    check(lambda s: torch.normal(0.3, s), torch.rand(4, 3), seed=3)


# ---- shape: aten.slice -----------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [(0, None, None, 1), (1, -3, None, 2), (1, 2, 100, 1), (0, -100, 3, 1),
                                  (1, 4, 2, 1), (-1, 1, -1, 3)])
def test_aten_slice(args):
    x = torch.randn(5, 6)
    out = check(lambda t: torch.ops.aten.slice.Tensor(t, *args), x, exact=True)
    assert out.stride() == torch.ops.aten.slice.Tensor(x, *args).stride()


# ---- misc ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", range(7))
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_diff(n, dim):
    check(lambda t: torch.diff(t, n=n, dim=dim), torch.randn(4, 5), exact=True)


def test_diff_variants():
    check(lambda t, p, a: torch.diff(t, 2, 1, p, a), torch.randn(4, 5), torch.randn(4, 2),
          torch.ones(4, 1, dtype=torch.int64), exact=True)
    check(lambda t: torch.diff(t), torch.tensor([True, False, False, True]))
    check(lambda t: t.diff(dim=0), torch.randint(0, 9, (3, 4)))


def test_cross():
    check(lambda a, b: torch.linalg.cross(a, b), torch.randn(5, 3), torch.randn(5, 3))
    check(lambda a, b: torch.linalg.cross(a, b, dim=1), torch.randn(5, 3, 5), torch.randn(5, 3, 5))
    check(lambda a, b: torch.linalg.cross(a, b), torch.randn(1, 3), torch.randn(5, 3))
    check(lambda a, b: torch.cross(a, b), torch.randn(4, 3, 3), torch.randn(4, 3, 3))
    check(lambda a, b: a.cross(b, dim=0), torch.randint(-5, 5, (3, 2)), torch.randint(-5, 5, (3, 2)), exact=True)


@pytest.mark.parametrize("correction", [0, 1, 2, 5])
def test_cov(correction):
    x = torch.randn(3, 5)
    fweights, aweights = torch.randint(0, 4, (5,)), torch.rand(5)
    check(lambda t: torch.cov(t, correction=correction), x)
    check(lambda t: torch.cov(t, correction=correction), torch.randn(5))
    check(lambda t: torch.cov(t, correction=correction), torch.randint(0, 9, (3, 5)))
    check(lambda t, f: torch.cov(t, correction=correction, fweights=f), x, fweights)
    check(lambda t, a: torch.cov(t, correction=correction, aweights=a), x, aweights)
    check(lambda t, f, a: torch.cov(t, correction=correction, fweights=f, aweights=a), x, fweights, aweights)


def test_cov_with_invalid_weights_raises_like_eager():
    graph = kiln.graph.to_prims(kiln.ops.trace(lambda t, f: torch.cov(t, fweights=f), torch.randn(3, 5),
                                               torch.ones(5, dtype=torch.int64)))
    for weights in (torch.tensor([1, -1, 2, 2, 2]), torch.zeros(5, dtype=torch.int64)):
        x = torch.randn(3, 5)
        with pytest.raises(RuntimeError):
            torch.cov(x, fweights=weights)
        with pytest.raises(RuntimeError, match="cov"):
            kiln.graph.run(graph, [x, weights])


@pytest.mark.parametrize("shape", [(2,), (1, 2), (3, 2), (2, 3), (1, 1), (4,)])
def test_corrcoef(shape):
    check(lambda t: torch.corrcoef(t), torch.randn(*shape))


def test_isin():
    elements, tests = torch.tensor([1., 2, NAN, -0., 3]), torch.tensor([0., 2, NAN])
    check(lambda a, b: torch.isin(a, b), elements, tests)
    check(lambda a, b: torch.isin(a, b, invert=True), elements, tests)
    check(lambda a, b: torch.isin(a, b), torch.randint(0, 5, (3, 4)), torch.tensor([1.5, 2.0]))
    check(lambda a: torch.isin(a, 2), torch.randint(0, 5, (3, 4)))
    check(lambda b: torch.isin(2, b), torch.randint(0, 5, (3, 4)))
    check(lambda a, b: torch.isin(a, b), torch.randn(20), torch.randn(0))


@pytest.mark.parametrize("size", [(4, 5), (1, 5), (5,), (4, 1), (1, 1), (1,), ()])
def test_sum_to_size(size):
    check(lambda t: t.sum_to_size(size), torch.randn(4, 5))


@pytest.mark.parametrize("p", [1, 2, 3, 5])
def test_mvlgamma(p):
    check(lambda t: torch.mvlgamma(t, p), torch.rand(5, 5) * 5 + 3)
    check(lambda t: t.mvlgamma(p), torch.randint(3, 9, (5,)))
    check(lambda t: torch.special.multigammaln(t, p), torch.tensor(4.5))


def test_sym_helpers_on_numbers():
    import torch.masked
    check(lambda t: torch.masked.var(t, 1, correction=1), torch.randn(3, 4))
    check(lambda t: torch.masked.std(t, 0, unbiased=False, keepdim=True), torch.randn(3, 4))


SELECTION_INPUTS = [torch.randn(3, 5), torch.randn(5), torch.randn(()),
                    torch.tensor([[1., NAN, 3, 2], [NAN, NAN, 5, NAN], [2, 2, 1, 1], [4, NAN, 0, NAN]]),
                    torch.randint(0, 4, (3, 6)), torch.randn(3, 2, 1, 2)]


@pytest.mark.parametrize("x", SELECTION_INPUTS)
@pytest.mark.parametrize("op", [torch.median, torch.nanmedian])
def test_median(x, op):
    check(lambda t: op(t), x)
    for dim in range(-max(x.ndim, 1), max(x.ndim, 1)):
        for keepdim in (False, True):
            check(lambda t: tuple(op(t, dim, keepdim)), x)


def test_nanmedian_of_an_all_nan_row():
    # the value is NaN; eager's index there is whatever std::nth_element leaves (kiln: the first)
    x = torch.tensor([[NAN, NAN, NAN, NAN], [1., 2, NAN, 0]])
    values, _ = run(lambda t: tuple(torch.nanmedian(t, 1)), x)
    torch.testing.assert_close(values, torch.nanmedian(x, 1).values, equal_nan=True)


def test_kthvalue_with_ties_gives_eager_values():
    x = torch.tensor([[2., 2, 1, 1, 3], [NAN, 0, 0, NAN, 1]])
    for k in range(1, 6):
        values, _ = run(lambda t: tuple(torch.kthvalue(t, k, 1)), x)
        torch.testing.assert_close(values, torch.kthvalue(x, k, 1).values, equal_nan=True)


@pytest.mark.parametrize("x", [torch.randn(3, 5), torch.randn(5), torch.randn(()), torch.randn(3, 2, 1, 2),
                               torch.tensor([[1., NAN, 3, 2], [0.5, 7, 5, NAN], [4, 6, 0, 9]])])
def test_kthvalue(x):
    for dim in range(-max(x.ndim, 1), max(x.ndim, 1)):
        for k in range(1, (x.shape[dim] if x.ndim else 1) + 1):
            check(lambda t: tuple(torch.kthvalue(t, k, dim)), x)
            check(lambda t: tuple(t.kthvalue(k, dim, True)), x)


@pytest.mark.parametrize("x", [t for t in SELECTION_INPUTS if t.is_floating_point()])
@pytest.mark.parametrize("op", [torch.quantile, torch.nanquantile])
@pytest.mark.parametrize("interpolation", ["linear", "lower", "higher", "midpoint", "nearest"])
def test_quantile(x, op, interpolation):
    for q in (0.0, 0.3, 1.0, torch.tensor([0.1, 0.9, 0.5])):
        check(lambda t: op(t, q, interpolation=interpolation), x)
        for dim in range(-max(x.ndim, 1), max(x.ndim, 1)):
            check(lambda t: op(t, q, dim, True, interpolation=interpolation), x)


def test_small_composites():
    check(lambda t: torch.trace(t), torch.randn(3, 4))
    check(lambda t: t.trace(), torch.randint(0, 5, (4, 3), dtype=torch.int32))
    check(lambda a, b: torch.kron(a, b), torch.randn(2, 3, 2), torch.randn(4, 1), exact=True)
    check(lambda a, b: torch.kron(a, b), torch.randn(()), torch.randn(4, 1), exact=True)
    for shift in (torch.fft.fftshift, torch.fft.ifftshift):
        check(lambda t: shift(t), torch.randn(3, 4, 5), exact=True)
        check(lambda t: shift(t, (0, -1)), torch.randn(3, 4, 5), exact=True)
    for p in (2, 1, 0, 3.5, math.inf, -math.inf):
        check(lambda a, b: torch.dist(a, b, p), torch.randn(3, 4), torch.randn(4))
    for p in (1, 2, 3.5):
        check(lambda t: torch.renorm(t, p, 1, 0.5), torch.randn(3, 4, 2))
    for n in range(7):
        check(lambda t: torch.linalg.matrix_power(t, n), torch.randn(2, 3, 3))
    for n in (None, 2, 5):
        check(lambda t: torch.linalg.vander(t, N=n), torch.randn(3, 4))


@pytest.mark.parametrize("op", [torch.trapezoid, torch.trapz, torch.cumulative_trapezoid])
def test_trapezoid_rules(op):
    for dim in (0, -1):
        check(lambda y: op(y, dim=dim), torch.randn(3, 4))
        check(lambda y: op(y, dx=0.3, dim=dim), torch.randn(3, 4))
        check(lambda y, x: op(y, x, dim=dim), torch.randn(3, 4), torch.randn(3, 4))
    check(lambda y, x: op(y, x), torch.randn(2, 3, 4), torch.randn(4))
    check(lambda y: op(y), torch.randint(0, 5, (3, 4)))


@pytest.mark.parametrize("n", [0, 1, 2, 5])
def test_combinations(n):
    for r in range(5):
        for with_replacement in (False, True):
            check(lambda t: torch.combinations(t, r, with_replacement), torch.randn(n), exact=True)


def test_chunk_cat():
    check(lambda a, b: torch._chunk_cat([a, b], 1, 2), torch.randn(2, 3), torch.randn(2, 2), exact=True)
    check(lambda a, b, c: torch._chunk_cat([a, b, c], 1, 3), torch.randn(2, 3, 3), torch.randn(2, 3),
          torch.randn(2, 3, 271), exact=True)


@pytest.mark.parametrize("right", [False, True])
def test_searchsorted_and_bucketize(right):
    boundaries = torch.tensor([1., 2, 2, 3, 5, 8, 8, 9])
    values = torch.tensor([[0., 1, 2, 2.5, 8, 9, 10, NAN], [-1, 3, 5, 5.5, 7, 8.5, 1e9, -1e9]])
    check(lambda b, v: torch.searchsorted(b, v, right=right), boundaries, values)
    check(lambda b, v: torch.bucketize(v, b, right=right, out_int32=True), boundaries, values)
    # unsorted boundaries: eager's binary search, not a count
    check(lambda b, v: torch.searchsorted(b, v, right=right), torch.tensor([3., 1, NAN, 2, 0, 7, 7]), values)
    side = "right" if right else "left"
    check(lambda b, v: torch.searchsorted(b, v, side=side), torch.sort(torch.randn(2, 9))[0], torch.randn(2, 4))
    s = torch.randn(10)
    check(lambda b, v, o: torch.searchsorted(b, v, right=right, sorter=o), s, torch.randn(3, 3), torch.argsort(s))
    check(lambda b: torch.searchsorted(b, 2.5, right=right), torch.arange(6))
    check(lambda b, v: torch.searchsorted(b, v, right=right), torch.zeros(0), torch.randn(3))


@pytest.mark.parametrize("edge_order", [1, 2])
def test_gradient(edge_order):
    check(lambda t: torch.gradient(t, edge_order=edge_order), torch.randn(5))
    check(lambda t: torch.gradient(t, spacing=2.0, edge_order=edge_order), torch.randn(5, 5))
    check(lambda t: torch.gradient(t, spacing=[2.0, 2.1], dim=(0, 1), edge_order=edge_order), torch.randn(5, 5))
    check(lambda t, a, b: torch.gradient(t, spacing=[a, b], dim=(0, -1), edge_order=edge_order),
          torch.randn(3, 3, 3), torch.tensor([0., 1, 3]), torch.tensor([0., 2, 3]))
    check(lambda t: torch.gradient(t, dim=1, edge_order=edge_order), torch.randint(0, 9, (3, 5)))


def test_errors_match_eager():
    with pytest.raises(RuntimeError, match="at least one-dimensional"):
        kiln.ops.trace(lambda t: torch.diff(t), torch.tensor(1.))
    with pytest.raises(RuntimeError, match="must have length 3"):
        kiln.ops.trace(lambda a, b: torch.linalg.cross(a, b), torch.randn(5, 4), torch.randn(5, 4))
    with pytest.raises(RuntimeError, match="selected index k out of range"):
        kiln.ops.trace(lambda t: torch.kthvalue(t, 6), torch.randn(5))
    with pytest.raises(RuntimeError, match="q must be in the range"):
        kiln.ops.trace(lambda t: torch.quantile(t, 1.5), torch.randn(5))


@pytest.mark.parametrize("shape, dim", [((5,), 0), ((5, 5), 0), ((5, 10, 5), -1), ((3, 4), 1)])
def test_softmax_backward_data(shape, dim):
    grad, out = torch.randn(shape), torch.softmax(torch.randn(shape), dim)
    check(lambda g, o: torch.ops.aten._softmax_backward_data(g, o, dim, torch.float32), grad, out)


@pytest.mark.parametrize("fn, good, bad", [
    (lambda x, w: torch.cov(x, fweights=w),
     (torch.randn(2, 4), torch.tensor([1, 2, 1, 1])), (torch.randn(2, 4), torch.tensor([1, -2, 1, 1]))),
    (lambda x, q: torch.quantile(x, q),
     (torch.randn(5), torch.tensor([0.2, 0.5])), (torch.randn(5), torch.tensor([0.2, 1.5]))),
    (lambda m, s: torch.normal(m, s), (torch.zeros(3), torch.ones(3)), (torch.zeros(3), -torch.ones(3))),
])
def test_value_checks_raise_like_eager_when_the_graph_runs(fn, good, bad):
    # eager checks these tensors' values; the decomposed graph must raise the same type, not give numbers
    g = kiln.ops.trace(fn, *good)
    p = kiln.graph.to_prims(g)
    assert not p.fallbacks()
    with pytest.raises(RuntimeError) as eager_error:
        fn(*bad)
    with pytest.raises(RuntimeError) as kiln_error:
        kiln.graph.run(p, list(bad))
    assert str(kiln_error.value).split("\n")[0] in str(eager_error.value) or \
        str(kiln_error.value).split(" ")[0] == str(eager_error.value).split(" ")[0]
