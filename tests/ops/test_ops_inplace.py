"""In-place ops derived from functional decompositions: graph inputs are mutated exactly as eager."""
import pytest
import torch

import kiln.graph
import kiln.ops
from kiln.ops.registry import DECOMPOSITIONS, INPLACE_OPS


def run_both(fn, *inputs):
    """Eager on clones, kiln (trace + prims + run) on other clones: (eager, kiln) inputs, outputs."""
    eager_inputs = [t.clone() for t in inputs]
    kiln_inputs = [t.clone() for t in inputs]
    trace_inputs = [t.clone() for t in inputs]
    expected = fn(*eager_inputs)
    g = kiln.ops.trace(fn, *trace_inputs)
    for before, after in zip(inputs, trace_inputs):
        assert torch.equal(before, after), "tracing must not mutate the example inputs"
    p = kiln.graph.to_prims(g)
    kiln.graph.verify(p)
    got = kiln.graph.run(p, kiln_inputs)
    assert not p.fallbacks(), [n.target_name() for n in p.fallbacks()]
    return eager_inputs, kiln_inputs, expected, got


def check(fn, *inputs):
    eager_inputs, kiln_inputs, expected, got = run_both(fn, *inputs)
    for e, k in zip(eager_inputs, kiln_inputs):
        torch.testing.assert_close(k, e, equal_nan=True)
    torch.testing.assert_close(got, expected, equal_nan=True)


def test_add_on_graph_input():
    def f(x, y):
        x.add_(y)
        return x * 2
    check(f, torch.randn(3, 4), torch.randn(4))


def test_iadd_operator():
    def f(x, y):
        x += y
        x *= 3
        x -= 1
        return x
    check(f, torch.randn(3, 4), torch.randn(3, 4))
    check(f, torch.randint(0, 9, (3, 4)), torch.randint(0, 9, (4,)))


def test_mul_scalar_and_chains():
    def f(x, y):
        x.mul_(2)
        y.sub_(x)
        return x.clamp_(min=-0.5).exp_() + y
    check(f, torch.randn(3, 4), torch.randn(3, 4))


def test_inplace_on_intermediate():
    def f(x, y):
        z = x + 1
        z.div_(y)
        z.pow_(2)
        return z
    check(f, torch.randn(3, 4), torch.rand(4) + 0.5)


def test_various_twins():
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    xi = torch.randint(-5, 5, (3, 4))
    check(lambda a, b: a.lt_(b), x, y)
    check(lambda a, b: torch.exp_(a), x, y)
    check(lambda a, b: a.__ipow__(2), xi, xi)
    check(lambda a, b: a.floor_divide_(3), xi, xi)
    check(lambda a, b: a.bitwise_and_(b), xi, xi.flip(0))
    check(lambda a, b: a.addcmul_(b, b, value=0.5), x, y)
    check(lambda a, b: a.lerp_(b, 0.3), x, y)
    check(lambda a, b: a.nan_to_num_(), x, y)
    check(lambda a, b: a.float_power_(2), x.double(), y)
    check(lambda a, b: a.sigmoid_(), torch.randn(0, 3), y)
    check(lambda a, b: a.add_(b), torch.randn(()), torch.randn(()))


@pytest.mark.parametrize("fn, inputs, message", [
    (lambda a, b: a.add_(b), (torch.zeros(3, dtype=torch.int64), torch.randn(3)),
     "result type Float can't be cast to the desired output type Long"),
    (lambda a, b: a.add_(b), (torch.randn(4), torch.randn(3, 4)), "doesn't match the broadcast shape"),
    (lambda a, b: a.div_(b), (torch.ones(3, dtype=torch.int64), torch.ones(3, dtype=torch.int64)),
     "can't be cast"),
    (lambda a, b: a.float_power_(2), (torch.randn(3), torch.randn(3)), "float_power_"),
])
def test_errors_like_eager(fn, inputs, message):
    with pytest.raises(RuntimeError):
        fn(*[t.clone() for t in inputs])
    with pytest.raises(RuntimeError, match=message):
        kiln.ops.trace(fn, *inputs)


def test_twins_are_registered_for_other_modules():
    for name in ["add_", "mul_", "clamp_", "div_", "__iadd__", "__ipow__", "exp_", "masked_fill_", "relu_"]:
        twin = getattr(torch.Tensor, name)
        if name in ("masked_fill_", "relu_"):  # registered only if their functional form is
            functional = getattr(torch.Tensor, name[:-1])
            if functional not in DECOMPOSITIONS:
                continue
        assert twin in DECOMPOSITIONS and twin in INPLACE_OPS, name
    for name in ["unsqueeze_", "squeeze_", "t_", "transpose_", "uniform_", "bernoulli_"]:
        twin = getattr(torch.Tensor, name)
        assert twin not in DECOMPOSITIONS or DECOMPOSITIONS[twin].__doc__ is None or \
            "written back" not in DECOMPOSITIONS[twin].__doc__, name


def test_install_is_idempotent():
    import kiln.ops.inplace as inplace
    assert inplace.install() == 0


@pytest.mark.parametrize("case", ["same", "broadcast", "to_int", "to_float", "to_bool", "number", "transposed",
                                  "local", "int_number"])
def test_copy_(case):
    """Tensor.copy_ (state updates in Mamba2, Bamba and KV caches): eager's broadcast and any dtype
    conversion, no fallback."""
    x, y = torch.randn(3, 4) * 4, torch.randn(3, 4) * 4
    fns = {
        "same": (lambda s, v: (s.copy_(v * 2), s + 1)[1], (x, y)),
        "broadcast": (lambda s, v: s.copy_(v[0]) * 1, (x, y)),
        "to_int": (lambda s, v: s.copy_(v) + 0, (torch.zeros(3, 4, dtype=torch.int32), y)),
        "to_float": (lambda s, v: s.copy_(v) * 1, (x, torch.randint(-9, 9, (3, 4)))),
        "to_bool": (lambda s, v: s.copy_(v) | False, (torch.zeros(3, 4, dtype=torch.bool), y)),
        "number": (lambda s, v: s.copy_(2.5) + v, (x, y)),
        "int_number": (lambda s, v: s.copy_(7) + 1, (torch.zeros(3, 4, dtype=torch.int64), y)),
        "transposed": (lambda s, v: (s.t().copy_(v.t() + 1), s * 2)[1], (x, y)),
        "local": (lambda s, v: torch.zeros(4).copy_(v[1]) + s[0], (x, y)),
    }
    fn, inputs = fns[case]
    check(fn, *inputs)


def test_copy_mismatched_shape_raises_as_eager():
    def f(s, v):
        return s.copy_(v)
    with pytest.raises(RuntimeError, match="must match the size"):
        f(torch.zeros(3, 4), torch.zeros(3, 5))
    with pytest.raises(RuntimeError, match="must match the size"):
        kiln.ops.trace(f, torch.zeros(3, 4), torch.zeros(3, 5))
