"""VJP rules of the elementwise prims against eager autograd of each prim's reference.

Every case runs the rule twice: on real tensors (the prims run their references) and traced on proxies
(which checks the prims' strict meta rules: no broadcasting, no promotion), the traced graph then run by the
interpreter. Both must match `torch.autograd.grad` of `p.ref`; a None gradient counts as zeros.
"""
import math

import pytest
import torch

from kiln import prims
from kiln.graph import Graph, Proxy, TensorMeta
from kiln.graph.interpreter import run
from kiln.prims import elementwise
from kiln.prims.registry import PRIMS

SHAPE = (4, 5)
ELEMENTWISE = sorted(n for n, v in vars(elementwise).items() if isinstance(v, prims.Prim))


def uniform(lo, hi):
    def make(dtype, gen):
        return torch.rand(SHAPE, dtype=dtype, generator=gen) * (hi - lo) + lo
    return make


def nonzero(lo, hi):
    """Magnitudes in [lo, hi), random signs."""
    def make(dtype, gen):
        mag = torch.rand(SHAPE, dtype=dtype, generator=gen) * (hi - lo) + lo
        sign = torch.randint(0, 2, SHAPE, generator=gen).to(dtype) * 2 - 1
        return mag * sign
    return make


def values(*vs):
    """The given values tiled over SHAPE (edge cases)."""
    def make(dtype, gen):
        flat = torch.tensor(vs, dtype=dtype)
        return flat.repeat(math.ceil(SHAPE[0] * SHAPE[1] / len(vs)))[: SHAPE[0] * SHAPE[1]].reshape(SHAPE)
    return make


def number(v):
    return lambda dtype, gen: v


def tie_with(make_a, n_ties=7):
    """An operand equal to the first one at some places (maximum/minimum ties)."""
    def make(dtype, gen, first):
        b = make_a(dtype, gen)
        idx = torch.randperm(b.numel(), generator=gen)[:n_ties]
        b.view(-1)[idx] = first.view(-1)[idx]
        return b
    make.tied = True
    return make


ANY = uniform(-2, 2)
POS = uniform(0.2, 3)
UNIT = uniform(-0.95, 0.95)

# (prim name, argument makers, id); several cases per prim where edge values matter
CASES = [
    ("abs", [ANY]), ("abs", [values(0.0, -1.5, 2.0)]), ("neg", [ANY]),
    ("exp", [ANY]), ("exp2", [ANY]), ("expm1", [ANY]),
    ("log", [POS]), ("log2", [POS]), ("log10", [POS]), ("log1p", [uniform(-0.9, 3)]),
    ("sqrt", [POS]), ("sqrt", [values(0.0, 1.0, 4.0)]), ("rsqrt", [POS]), ("reciprocal", [nonzero(0.3, 3)]),
    ("sin", [ANY]), ("cos", [ANY]), ("tan", [uniform(-1.2, 1.2)]),
    ("asin", [UNIT]), ("acos", [UNIT]), ("atan", [ANY]),
    ("sinh", [ANY]), ("cosh", [ANY]), ("tanh", [ANY]),
    ("asinh", [ANY]), ("acosh", [uniform(1.1, 4)]), ("atanh", [UNIT]),
    ("erf", [ANY]), ("erfc", [ANY]), ("erfinv", [UNIT]),
    ("lgamma", [uniform(0.1, 6)]), ("lgamma", [uniform(-2.9, -2.1)]),
    ("digamma", [uniform(0.05, 12)]), ("digamma", [uniform(-3.9, -3.1)]), ("digamma", [uniform(20, 200)]),
    ("digamma", [values(0.0, 0.5, 1.0, 6.0)]),
    ("sigmoid", [uniform(-6, 6)]),
    ("i0", [uniform(-4, 4)]), ("i0e", [uniform(-4, 4)]), ("i0e", [values(0.0, -1.0, 1.0)]),
    ("i1", [uniform(-4, 4)]), ("i1", [values(0.0, 1e-20, -2.0)]),
    ("i1e", [uniform(-4, 4)]), ("i1e", [values(0.0, 1e-20, 3.0)]),
    ("ndtr", [uniform(-4, 4)]), ("ndtri", [uniform(0.02, 0.98)]), ("log_ndtr", [uniform(-6, 4)]),
    ("erfcx", [uniform(-2, 6)]),
    ("add", [ANY, ANY]), ("add", [ANY, number(1.5)]), ("add", [number(2), ANY]),
    ("sub", [ANY, ANY]), ("sub", [number(0.5), ANY]),
    ("mul", [ANY, ANY]), ("mul", [ANY, number(-3.0)]), ("mul", [number(2), ANY]),
    ("div", [ANY, nonzero(0.5, 2)]), ("div", [number(3.0), nonzero(0.5, 2)]), ("div", [ANY, number(4.0)]),
    ("div", [values(1.0, -1.0, 0.0), values(0.0, 0.0, 2.0)]),
    ("remainder", [uniform(-5, 5), nonzero(0.5, 2)]), ("remainder", [number(3.5), nonzero(0.5, 2)]),
    ("remainder", [values(-3.0, 3.0, 4.5, -4.5, 0.0), values(1.5, -1.5, 1.5, -2.0, 1.0)]),
    ("remainder", [ANY, number(0.75)]),
    ("fmod", [uniform(-5, 5), nonzero(0.5, 2)]), ("fmod", [number(-3.5), nonzero(0.5, 2)]),
    ("pow", [uniform(0.5, 2), ANY]),
    ("pow", [values(0.0, 0.0, 0.0, 2.0, 0.0), values(0.0, 2.0, -1.0, 0.0, 0.5)]),
    ("pow", [nonzero(0.5, 2), values(2.0, 3.0, 0.0, -1.0)]),
    ("pow", [ANY, number(2)]), ("pow", [ANY, number(3.0)]), ("pow", [ANY, number(0)]),
    ("pow", [POS, number(0.5)]), ("pow", [POS, number(-1.5)]), ("pow", [values(0.0, 1.0, -2.0), number(2.0)]),
    ("pow", [number(2.0), ANY]), ("pow", [number(0.0), values(0.0, 1.0, -1.0, 2.0)]),
    ("pow", [number(-2.0), values(1.0, 2.0, 3.0)]),
    ("atan2", [ANY, ANY]), ("atan2", [number(1.0), ANY]), ("atan2", [ANY, number(-0.5)]),
    ("hypot", [ANY, ANY]), ("hypot", [ANY, number(2.0)]),
    ("copysign", [ANY, ANY]), ("copysign", [values(0.0, 1.5, -2.0), ANY]), ("copysign", [ANY, number(-1.0)]),
    ("maximum", [ANY, tie_with(ANY)]), ("minimum", [ANY, tie_with(ANY)]),
    ("maximum", [values(1.0, float("nan"), 2.0), values(float("nan"), 0.0, 2.0)]),
    ("minimum", [values(1.0, float("nan"), 2.0), values(float("nan"), 0.0, 2.0)]),
    ("maximum", [ANY, number(0.0)]), ("minimum", [number(0.5), ANY]),
    ("fmax", [ANY, tie_with(ANY)]), ("fmin", [ANY, tie_with(ANY)]),
    ("fmax", [values(1.0, float("nan"), 2.0, float("nan")), values(float("nan"), 0.0, 2.0, float("nan"))]),
    ("fmin", [values(1.0, float("nan"), 2.0, float("nan")), values(float("nan"), 0.0, 2.0, float("nan"))]),
    ("fmax", [ANY, number(0.0)]),
    ("zeta", [uniform(1.5, 4), uniform(0.5, 3)]), ("zeta", [number(2.0), uniform(0.5, 3)]),
    ("igamma", [uniform(0.5, 3), uniform(0.5, 3)]), ("igammac", [uniform(0.5, 3), uniform(0.5, 3)]),
    ("igamma", [number(1.5), uniform(0.5, 3)]),
    ("nextafter", [ANY, ANY]), ("nextafter", [values(1.0, 2.0, float("nan")), values(1.0, 0.0, 1.0)]),
    ("nextafter", [ANY, number(0.0)]),
]

# eager raises "not implemented" for these arguments' gradients: as tensors the rules refuse them
NOT_IMPLEMENTED_IN_EAGER = {"zeta": {0}, "igamma": {0}, "igammac": {0}}

NON_DIFFERENTIABLE = ["sign", "ceil", "floor", "round", "trunc", "bitwise_not", "isnan", "isinf", "isfinite",
                      "signbit", "bitwise_and", "bitwise_or", "bitwise_xor", "shift_left", "shift_right",
                      "eq", "ne", "lt", "le", "gt", "ge"]
DIFFERENTIABLE = {name for name, _ in CASES} | {"where", "convert_element_type"}
FLOAT32_PRIMS = {"exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "erfinv", "lgamma", "digamma", "i1",
                 "log_ndtr", "div", "pow", "remainder", "maximum", "fmin", "atan2", "igamma"}


def _ids():
    seen = {}
    out = []
    for name, _ in CASES:
        seen[name] = seen.get(name, 0) + 1
        out.append(f"{name}-{seen[name]}")
    return out


def tolerances(dtype):
    if dtype == torch.float64:
        return dict(rtol=1e-9, atol=1e-12)
    if dtype == torch.float32:
        return dict(rtol=2e-5, atol=1e-6)
    return dict(rtol=2e-2, atol=1e-3)  # float16 / bfloat16: eager rounds each step of the formula too


def as_zeros(grad, like):
    return torch.zeros_like(like) if grad is None else grad


def eager_grads(p, args, g, skip=()):
    """torch.autograd.grad of the prim's reference wrt each float tensor argument (None for the others)."""
    leaves = [a.detach().requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point()
              and i not in skip else a for i, a in enumerate(args)]
    wanted = [x for x in leaves if isinstance(x, torch.Tensor) and x.requires_grad]
    out = p.ref(*leaves)
    if not (wanted and out.requires_grad):
        return [None for _ in leaves]
    found = iter(torch.autograd.grad(out, wanted, g, allow_unused=True))
    return [next(found) if isinstance(x, torch.Tensor) and x.requires_grad else None for x in leaves]


def traced_grads(p, args, g):
    """The rule traced on proxies (strict metas checked), the backward graph run by the interpreter."""
    graph = Graph("backward")
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    proxies = iter([Proxy(graph.placeholder(f"x{i}", TensorMeta.of(t))) for i, t in enumerate(tensors)])
    pargs = [next(proxies) if isinstance(a, torch.Tensor) else a for a in args]
    pg = Proxy(graph.placeholder("g", TensorMeta.of(g)))
    py = p(*pargs)
    result = p.rules["vjp"]((pg,), (py,), *pargs)
    assert len(result) == len(args)
    for r, a in zip(result, args):
        if r is not None:
            assert tuple(r.meta.shape) == tuple(a.shape) and r.meta.dtype == a.dtype, (p.name, r.meta)
    graph.output(tuple(r.node if r is not None else None for r in result))
    return run(graph, [*tensors, g])


def check_case(name, makers, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    p = PRIMS[name]
    args = []
    for make in makers:
        args.append(make(dtype, gen, args[0]) if getattr(make, "tied", False) else make(dtype, gen))
    like = next(a for a in args if isinstance(a, torch.Tensor))
    g = torch.randn(like.shape, dtype=dtype, generator=gen)
    skip = NOT_IMPLEMENTED_IN_EAGER.get(name, set())
    y = p(*args)
    if any(isinstance(args[i], torch.Tensor) for i in skip):
        # eager has no gradient there: the rule refuses, so the graph runs with torch (eager's error)
        with pytest.raises(NotImplementedError, match="eager does not implement it"):
            p.rules["vjp"]((g,), (y,), *args)
        return
    expected = eager_grads(p, args, g, skip)
    got = p.rules["vjp"]((g,), (y,), *args)
    traced = traced_grads(p, args, g)
    assert len(got) == len(args)
    for i, (a, e, r, t) in enumerate(zip(args, expected, got, traced)):
        if not isinstance(a, torch.Tensor):
            assert r is None and t is None, (name, i)
            continue
        if i in skip:
            assert r is None and t is None, (name, i)
            continue
        e = as_zeros(e, a)
        for value in (r, t):
            value = as_zeros(value, a)
            assert value.dtype == a.dtype and value.shape == a.shape
            torch.testing.assert_close(value, e, equal_nan=True, **tolerances(dtype),
                                       msg=lambda m: f"{name} grad {i}: {m}\nargs={args}")


@pytest.mark.parametrize("name,makers", CASES, ids=_ids())
def test_vjp_matches_eager_float64(name, makers):
    check_case(name, makers, torch.float64)


@pytest.mark.parametrize("name,makers", [c for c in CASES if c[0] in FLOAT32_PRIMS],
                         ids=[i for i, c in zip(_ids(), CASES) if c[0] in FLOAT32_PRIMS])
def test_vjp_matches_eager_float32(name, makers):
    check_case(name, makers, torch.float32, seed=1)


HALF_PRIMS = {"exp", "sigmoid", "tanh", "mul", "div", "maximum", "pow", "sqrt", "erf"}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name,makers", [c for c in CASES if c[0] in HALF_PRIMS],
                         ids=[i for i, c in zip(_ids(), CASES) if c[0] in HALF_PRIMS])
def test_vjp_half_precision_keeps_the_dtype(name, makers, dtype):
    check_case(name, makers, dtype, seed=2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_where_routes_the_gradient_by_the_condition(dtype):
    gen = torch.Generator().manual_seed(3)
    cond = torch.rand(SHAPE, generator=gen) > 0.5
    a, b, g = (torch.randn(SHAPE, dtype=dtype, generator=gen) for _ in range(3))
    for args in [(cond, a, b), (cond, a, 2.0), (cond, -1.0, b)]:
        expected = eager_grads(prims.where, args, g)
        got = prims.where.rules["vjp"]((g,), (prims.where(*args),), *args)
        traced = traced_grads(prims.where, args, g)
        assert got[0] is None and traced[0] is None
        for a_i, e, r, t in zip(args[1:], expected[1:], got[1:], traced[1:]):
            if not isinstance(a_i, torch.Tensor):
                assert r is None and t is None
                continue
            torch.testing.assert_close(r, e)
            torch.testing.assert_close(t, e)


@pytest.mark.parametrize("src,dst", [(torch.float32, torch.float64), (torch.float64, torch.float32),
                                     (torch.float32, torch.bfloat16), (torch.float16, torch.float32)])
def test_convert_element_type_converts_the_gradient_back(src, dst):
    a = torch.randn(SHAPE, dtype=src)
    g = torch.randn(SHAPE, dtype=dst)
    (expected, _) = eager_grads(prims.convert_element_type, (a, dst), g)
    got = prims.convert_element_type.rules["vjp"]((g,), (prims.convert_element_type(a, dst),), a, dst)
    assert got[1] is None and got[0].dtype == src
    torch.testing.assert_close(got[0], expected)
    torch.testing.assert_close(traced_grads(prims.convert_element_type, (a, dst), g)[0], expected)


def test_convert_element_type_with_dtype_as_keyword():
    a = torch.randn(SHAPE)
    g = torch.randn(SHAPE, dtype=torch.float64)
    got = prims.convert_element_type.rules["vjp"]((g,), (a.double(),), a, dtype=torch.float64)
    assert len(got) == 1
    torch.testing.assert_close(got[0], g.float())


def test_convert_element_type_to_or_from_integers_has_no_gradient():
    rule = prims.convert_element_type.rules["vjp"]
    a = torch.randn(SHAPE)
    assert rule((torch.ones(SHAPE, dtype=torch.int64),), (a.long(),), a, torch.int64) == (None, None)
    i = torch.arange(20).reshape(SHAPE)
    assert rule((torch.ones(SHAPE),), (i.float(),), i, torch.float32) == (None, None)


def test_every_elementwise_prim_has_a_vjp_rule():
    missing = [n for n in ELEMENTWISE if "vjp" not in PRIMS[n].rules]
    assert not missing
    assert set(ELEMENTWISE) == DIFFERENTIABLE | set(NON_DIFFERENTIABLE)


@pytest.mark.parametrize("name", NON_DIFFERENTIABLE)
def test_non_differentiable_prims_give_no_gradient(name):
    p = PRIMS[name]
    dtype = torch.float64 if name in ("sign", "ceil", "floor", "round", "trunc", "isnan", "isinf", "isfinite",
                                      "signbit", "eq", "ne", "lt", "le", "gt", "ge") else torch.int64
    a = torch.randn(SHAPE, dtype=torch.float64).mul(5).to(dtype)
    args = (a,) if "unary" in p.tags else (a, a.clone())
    if name.startswith("shift"):
        args = (a, torch.full(SHAPE, 2, dtype=torch.int64))
    y = p(*args)
    assert p.rules["vjp"]((torch.ones(SHAPE),), (y,), *args) == (None,) * len(args)
    if dtype.is_floating_point:  # eager agrees: zero gradients or none
        for e in eager_grads(p, args, torch.ones_like(y, dtype=torch.float64) if y.is_floating_point()
                             else None):
            assert e is None or not e.any()


def test_integer_operands_and_missing_gradients_give_none():
    i = torch.arange(20).reshape(SHAPE)
    assert prims.add.rules["vjp"]((i,), (i + i,), i, i) == (None, None)
    assert prims.mul.rules["vjp"]((i,), (i * 2,), i, 2) == (None, None)
    x = torch.randn(SHAPE, dtype=torch.float64)
    assert prims.exp.rules["vjp"]((None,), (x.exp(),), x) == (None,)
    assert prims.pow.rules["vjp"]((None,), (x,), x, x) == (None, None)


def test_complex_inputs_are_refused_not_given_a_wrong_gradient():
    z = torch.randn(SHAPE, dtype=torch.complex64)
    with pytest.raises(NotImplementedError, match="vjp of prims.exp wrt a: complex"):
        prims.exp.rules["vjp"]((z,), (z.exp(),), z)


@pytest.mark.parametrize("name,arg", [("zeta", 0), ("igamma", 0), ("igammac", 0)])
def test_gradients_eager_does_not_implement_are_refused(name, arg):
    p = PRIMS[name]
    a = torch.rand(SHAPE, dtype=torch.float64) + 1.5
    b = torch.rand(SHAPE, dtype=torch.float64) + 0.5
    leaves = [a.clone().requires_grad_(i == arg) for i, a in enumerate((a, b))]
    with pytest.raises(RuntimeError, match="not implemented"):
        torch.autograd.grad(p.ref(*leaves), leaves[arg], torch.ones(SHAPE, dtype=torch.float64))
    with pytest.raises(NotImplementedError, match="eager does not implement it"):
        p.rules["vjp"]((torch.ones(SHAPE, dtype=torch.float64),), (p(a, b),), a, b)
