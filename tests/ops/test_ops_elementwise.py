"""Elementwise decompositions against eager: values, dtypes, errors, and no fallbacks."""
import operator
import warnings

import pytest
import torch

import kiln.graph
import kiln.ops
from kiln.counters import counters

warnings.filterwarnings("ignore", category=UserWarning)

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.uint8,
          torch.bool]


def sample(dtype, shape=(3, 4), seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        t = torch.randn(shape, dtype=torch.float64, generator=g) * 3
        if t.numel() > 3:
            flat = t.view(-1)
            flat[0], flat[1], flat[2] = 0.0, float("nan"), float("inf")
        return t.to(dtype)
    low = 0 if dtype == torch.uint8 else -9
    return torch.randint(low, 10, shape, dtype=dtype, generator=g)


def compare(fn, *inputs):
    """Trace fn, decompose to prims and run; assert eager's values (or eager's exception type), and that
    nothing fell back."""
    try:
        expected, error = fn(*[i.clone() for i in inputs]), None
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
    got = kiln.graph.run(p, [i.clone() for i in inputs])
    torch.testing.assert_close(got, expected, equal_nan=True, check_stride=False)
    assert not p.fallbacks(), [n.target_name() for n in p.fallbacks()]
    assert not counters["decomposition_mismatch"] and not counters["decomposition_error"], dict(counters)


UNARY = ["abs", "neg", "positive", "sign", "sgn", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p",
         "sqrt", "rsqrt", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh",
         "acosh", "atanh", "erf", "erfc", "erfinv", "lgamma", "digamma", "sigmoid", "reciprocal", "i0",
         "ceil", "floor", "trunc", "fix", "round", "frac", "square", "deg2rad", "rad2deg", "sinc", "signbit",
         "isnan", "isinf", "isfinite", "isposinf", "isneginf", "isreal", "nan_to_num", "logit", "angle",
         "bitwise_not", "logical_not", "arcsin", "arctanh", "absolute", "negative"]
SPECIAL = ["i0e", "i1", "i1e", "ndtr", "ndtri", "log_ndtr", "erfcx", "entr", "expit", "logit", "sinc",
           "round", "exp2", "expm1", "gammaln", "psi", "erfinv"]


@pytest.mark.parametrize("name", UNARY)
def test_unary(name):
    for dtype in DTYPES:
        x = sample(dtype)
        compare(lambda a: getattr(torch, name)(a), x)
        compare(lambda a: getattr(a, name)(), x)


@pytest.mark.parametrize("name", SPECIAL)
def test_special(name):
    for dtype in DTYPES:
        compare(lambda a: getattr(torch.special, name)(a), sample(dtype))


BINARY = ["add", "sub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "pow",
          "float_power", "atan2", "hypot", "copysign", "nextafter", "maximum", "minimum", "fmax", "fmin",
          "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "bitwise_and",
          "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift", "heaviside", "isclose",
          "xlogy", "logaddexp", "logaddexp2", "ldexp", "igamma", "igammac", "rsub", "clamp_min", "clamp_max",
          "max", "min"]
PAIRS = [(torch.float32, torch.float32), (torch.float64, torch.float32), (torch.int64, torch.int64),
         (torch.int32, torch.int64), (torch.bool, torch.bool), (torch.float16, torch.float16),
         (torch.uint8, torch.int64), (torch.int64, torch.float32), (torch.bfloat16, torch.float16)]


def _operands(da, db):
    a, b, b0 = sample(da), sample(db, (4,), seed=1), sample(db, (), seed=2)
    if not db.is_floating_point and db != torch.bool:  # integer division by zero raises at run time
        b, b0 = b.masked_fill(b == 0, 3), b0.masked_fill(b0 == 0, 2)
    return a, [b, b0, 2, -3, 2.5, True]


def _with(other, fn):
    """fn(x, y) where y is either a traced tensor or a Python number baked in."""
    if isinstance(other, torch.Tensor):
        return fn, other
    return (lambda x, _unused, other=other: fn(x, other)), torch.zeros(())


@pytest.mark.parametrize("name", BINARY)
def test_binary(name):
    op = getattr(torch, name)
    for da, db in PAIRS:
        a, others = _operands(da, db)
        for other in others:
            fn, y = _with(other, op)
            compare(fn, a, y)


OPERATORS = [operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod,
             operator.pow, operator.and_, operator.or_, operator.xor, operator.lshift, operator.rshift,
             operator.eq, operator.ne, operator.lt, operator.ge]


@pytest.mark.parametrize("op", OPERATORS, ids=lambda op: op.__name__)
def test_operators_and_reflected(op):
    for da, db in PAIRS:
        a, others = _operands(da, db)
        for other in others:
            fn, y = _with(other, op)
            compare(fn, a, y)
            rfn, y = _with(other, lambda x, y: op(y, x))
            compare(rfn, a, y)


@pytest.mark.parametrize("mode", ["trunc", "floor"])
def test_div_rounding_modes(mode):
    for da, db in PAIRS:
        a, others = _operands(da, db)
        for other in others[:3] + [-2.5]:
            fn, y = _with(other, lambda x, y: torch.div(x, y, rounding_mode=mode))
            compare(fn, a, y)
    x = torch.tensor([7.0, -7.0, 1.0, -0.0, 5.5])
    compare(lambda a, b: torch.div(a, b, rounding_mode=mode), x, torch.tensor([2.0, 2.0, 0.1, 3.0, -0.0]))


def test_ternary_and_composites():
    x, y, z = sample(torch.float32), sample(torch.float32, (4,), 1), sample(torch.float32, (3, 1), 2)
    xi = sample(torch.int64)
    cond = x > 0
    cases = [
        (lambda c, a, b: torch.where(c, a, b), (cond, x, y)),
        (lambda c, a, b: torch.where(c, a, 2), (cond, xi, y)),
        (lambda c, a, b: torch.where(c, 1.0, 0), (cond, x, y)),
        (lambda c, a, b: a.where(c, b), (cond, x, y)),
        (lambda c, a, b: torch.where(a, a, b), (x, x, y)),  # non-bool condition: eager's error
        (lambda a, b, c: torch.clamp(a, -1, 1), (x, y, z)),
        (lambda a, b, c: torch.clamp(a, min=b, max=c), (x, y, z)),
        (lambda a, b, c: torch.clip(a, max=0.5), (xi, y, z)),
        (lambda a, b, c: torch.clamp(a, 1.5), (xi, y, z)),
        (lambda a, b, c: torch.clamp(a), (x, y, z)),
        (lambda a, b, c: torch.lerp(a, b, 0.3), (x, y, z)),
        (lambda a, b, c: torch.lerp(a, b, 0.7), (x, y, z)),
        (lambda a, b, c: torch.lerp(a, b, c), (x, y, z)),
        (lambda a, b, c: torch.addcmul(a, b, c, value=0.5), (x, y, z)),
        (lambda a, b, c: torch.addcdiv(a, b, c, value=2), (x, y, z)),
        (lambda a, b, c: torch.addcdiv(a, b, c), (xi, xi, xi)),
        (lambda a, b, c: torch.isclose(a, b, rtol=0.1, atol=0.5, equal_nan=True), (x, y, z)),
        (lambda a, b, c: torch.nan_to_num(a, nan=1.0, posinf=2.0, neginf=-2.0), (x, y, z)),
        (lambda a, b, c: torch.logit(a, 0.25), (x, y, z)),
        (lambda a, b, c: torch.round(a, decimals=2), (x, y, z)),
        (lambda a, b, c: torch.round(a, decimals=-1), (x * 100, y, z)),
        (lambda a, b, c: torch.add(a, b, alpha=2), (x, y, z)),
        (lambda a, b, c: torch.sub(a, b, alpha=0.5), (xi, y, z)),
        (lambda a, b, c: torch.special.xlog1py(a, b), (x, y, z)),
        (lambda a, b, c: torch.special.zeta(a.abs() + 1, 2.0), (x, y, z)),
        (lambda a, b, c: torch.pow(2, a), (xi.abs(), y, z)),
        (lambda a, b, c: torch.pow(a, -1), (xi, y, z)),
        (lambda a, b, c: a ** 0.5 + a ** -2 + a ** 3, (x, y, z)),
    ]
    for fn, inputs in cases:
        compare(fn, *inputs)


def test_zero_dim_and_scalar_promotion():
    f16, i64_0d, f64_0d = sample(torch.float16), torch.tensor(3), torch.tensor(2.5, dtype=torch.float64)
    compare(lambda a, b: a + b, f16, i64_0d)
    compare(lambda a, b: a * b, f16, f64_0d)
    compare(lambda a, b: a * b, i64_0d, f64_0d)
    compare(lambda a, b: a + b, sample(torch.int32), torch.tensor(1.5))
    compare(lambda a: a + 300, sample(torch.uint8))
    compare(lambda a: a * True, sample(torch.bool))
    compare(lambda a: a + 1j, sample(torch.float32))


def test_broadcast_error_names_shapes():
    with pytest.raises(RuntimeError, match=r"size of tensor a \(3\) must match the size of tensor b \(2\)"):
        kiln.ops.trace(torch.add, torch.ones(2, 3), torch.ones(3, 2))
    with pytest.raises(RuntimeError):
        kiln.ops.symbolic_call(torch.add, kiln.graph.TensorMeta((2, 3), torch.float32),
                               kiln.graph.TensorMeta((3, 2), torch.float32))


def test_empty_and_zero_dim():
    for shape in [(0,), (), (2, 0, 3)]:
        x = sample(torch.float32, shape)
        compare(lambda a: torch.exp(a) + 1, x)
        compare(lambda a: torch.where(a > 0, a, 0.0), x)


def test_conversions():
    x, xi = sample(torch.float32), sample(torch.int64)
    for fn in [lambda a: a.float(), lambda a: a.double(), lambda a: a.half(), lambda a: a.bfloat16(),
               lambda a: a.int(), lambda a: a.long(), lambda a: a.short(), lambda a: a.char(),
               lambda a: a.byte(),
               lambda a: a.bool(), lambda a: a.to(torch.float64), lambda a: a.to("cpu", torch.int32),
               lambda a: a.to(dtype=torch.int16), lambda a: a.to(torch.float32, copy=True),
               lambda a: a.type_as(xi),
               lambda a: a.type(torch.int8), lambda a: a.to(device="cpu")]:
        compare(fn, x)
        compare(fn, xi)


def test_same_dtype_cast_aliases_like_eager():
    x = torch.randn(3)
    g = kiln.ops.trace(lambda a: a.float(), x)
    out = kiln.graph.run(kiln.graph.to_prims(g), [x])
    assert out is x  # eager's x.float() is x itself


def test_ceil_of_integers_is_a_copy():
    g = kiln.ops.trace(lambda a: torch.ceil(a), torch.arange(3))
    x = torch.arange(3)
    out = kiln.graph.run(kiln.graph.to_prims(g), [x])
    assert torch.equal(out, x) and out.data_ptr() != x.data_ptr()


def test_dtype_queries_and_real_identities():
    for x in [sample(torch.float32), sample(torch.int64)]:
        compare(lambda a: a * torch.is_floating_point(a) + torch.is_complex(a), x)
        compare(lambda a: torch.conj(a) + torch.real(a) + a.resolve_conj() + torch.conj_physical(a), x)
        compare(lambda a: a * a.is_signed(), x)


def test_complex_inputs_are_exact_or_fall_back():
    x = torch.randn(3, 4, dtype=torch.complex64)
    for fn in [torch.exp, torch.sigmoid, torch.abs, torch.sgn, torch.exp2, lambda a: a * 2j,
               lambda a: a + 1.5,
               lambda a: torch.sum(a, 1), torch.mean, lambda a: torch.var(a, 0), torch.isnan, torch.angle]:
        expected = fn(x)
        g = kiln.ops.trace(fn, x)
        got = kiln.graph.run(kiln.graph.to_prims(g), [x])
        torch.testing.assert_close(got, expected, equal_nan=True)


def test_float16_quotient_rounds_before_trunc():
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(2000, generator=g) * 10).half()
    b = torch.randn(2000, generator=g).half()
    for mode in ["trunc", "floor"]:
        compare(lambda x, y: torch.div(x, y, rounding_mode=mode), a, b)


@pytest.mark.parametrize("fn", [lambda a: a.to(memory_format=torch.channels_last),
                                lambda a: a.half(memory_format=torch.channels_last),
                                lambda a: a.to(torch.float64, memory_format=torch.channels_last),
                                lambda a: a.float(memory_format=torch.contiguous_format),
                                lambda a: a.double(), lambda a: a.to(torch.float32, copy=True)])
def test_memory_format_conversions_keep_eager_strides(fn):
    x = torch.randn(2, 3, 4, 5)
    for inp in [x, x.to(memory_format=torch.channels_last), x.transpose(1, 3), x[:, :2]]:
        expected = fn(inp)
        g = kiln.ops.trace(fn, inp)
        p = kiln.graph.to_prims(g)
        got = kiln.graph.run(p, [inp])
        assert not p.fallbacks()
        assert torch.equal(got, expected) and got.dtype == expected.dtype
        assert got.stride() == expected.stride()


def test_equality_with_non_tensors_like_eager():
    def fn(a):
        return a == None, a != None, a == "x", a != "x", a == 1, a != a  # noqa: E711
    x = torch.ones(2)
    g = kiln.ops.trace(fn, x)
    got = kiln.graph.run(kiln.graph.to_prims(g), [x])
    expected = fn(x)
    assert got[:4] == expected[:4]
    torch.testing.assert_close(got[4:], expected[4:])
