"""Differential programs for grad mode and autograd flags: each runs eagerly and compiled (cpp backend) with
grad mode on and off and an input that does or does not require grad; results are compared on values, dtypes,
shapes, requires_grad, is_leaf, grad_fn presence, the input's state afterwards, the grad mode afterwards and
the input's gradient when eager's results reach it.

Wrong before their fixes (found by this file's first version):
- c_enable_grad under no_grad: the `with torch.enable_grad():` segment compiled without its backward;
- c_no_grad_then_inplace (and a Linear whose weight is clamped under no_grad in forward): the later read
  differentiated with respect to the graph's new value, not the leaf, so the leaf got no gradient;
- c_new_tensor (and zeros_like(x) of an x that requires grad): the output came back requiring grad;
- a call inside torch.autograd.forward_ad.dual_level: the result came back without its tangent (now the frame
  runs eagerly while forward-mode AD is active, a guard, and a break explain shows).
"""
from __future__ import annotations

import pytest
import torch
from diff_helpers import autograd_signature, tensor_values

import kiln



def c_nograd_block(x):
    with torch.no_grad():
        y = x * 2
    return y, y + x


def c_enable_grad(x):
    with torch.enable_grad():
        y = x * 2
    return y


def c_detach(x):
    return x.detach() * 2 + x


def c_inference(x):
    with torch.inference_mode():
        y = x * 2
    return y * 1


def c_retain(x):
    y = x * 2
    y.retain_grad()
    return y.sum()


def c_inplace_leaf(x):
    x.add_(1)
    return x


def c_autograd_grad(x):
    y = (x * x).sum()
    (g,) = torch.autograd.grad(y, x, create_graph=False)
    return g


def c_data_mul(x):
    x.data.mul_(2)
    return x * 1


def c_set_grad_call(x):
    torch.set_grad_enabled(False)
    y = x * 2
    torch.set_grad_enabled(True)
    return y


def c_set_grad_leak(x):
    torch.set_grad_enabled(False)
    return x * 2


def c_nograd_deco(x):
    @torch.no_grad()
    def inner(t):
        return t * 3
    return inner(x) + x


def c_hook(x):
    y = x * 2
    y.register_hook(lambda g: g * 10)
    return y.sum()


def c_detach_inplace(x):
    y = x * 2
    y.detach_()
    return y


def c_is_grad_enabled(x):
    return x * 2 if torch.is_grad_enabled() else x * 3


def c_requires_grad_read(x):
    y = x * 2
    return y + 1 if y.requires_grad else y - 1


def c_clone_inplace(x):
    y = x.clone()
    y.mul_(3)
    return y


def c_grad_attr(x):
    return x.grad is None


def c_backward_inside(x):
    y = (x * x).sum()
    y.backward()
    return x.grad * 1


def c_no_grad_then_inplace(x):
    with torch.no_grad():
        x.mul_(2)
    return x + 1


def c_view_of_leaf_inplace(x):
    v = x[0]
    v.add_(1)
    return x


def c_requires_grad_false_input(x):
    x.requires_grad_(False)
    return x * 2


def c_new_tensor(x):
    return x.new_tensor([1.0, 2.0]) * 2, x * 1


def c_detach_requires(x):
    d = x.detach().requires_grad_()
    return d * 2


def c_zeros_like_of_grad_input(x):
    return torch.zeros_like(x) + 1, x * 0


CASES = {name: fn for name, fn in sorted(globals().items()) if name.startswith("c_")}


def _run(fn, grad, requires_grad, compiled=None):
    torch.manual_seed(0)
    x = torch.randn(2, 3, requires_grad=requires_grad)
    before = torch.is_grad_enabled()
    try:
        with torch.set_grad_enabled(grad):
            try:
                result = (compiled or fn)(x)
            except Exception as e:  # (eager's exception is part of the behaviour compared)
                result = e
            grad_after = torch.is_grad_enabled()
    finally:
        torch.set_grad_enabled(before)
    outs = [t for t in (result if isinstance(result, tuple) else (result,)) if isinstance(t, torch.Tensor)]
    gradient = None
    if x.requires_grad and any(t.requires_grad and t.grad_fn is not None for t in outs):
        try:
            sum(t.sum() for t in outs if t.requires_grad).backward()
            gradient = x.grad
        except Exception as e:
            gradient = e
    return result, x.detach().clone(), grad_after, gradient


@pytest.mark.parametrize("requires_grad", [True, False], ids=["input_requires_grad", "plain_input"])
@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_grad_mode_program(name, grad, requires_grad):
    fn = CASES[name]
    expected = _run(fn, grad, requires_grad)
    kiln.reset()
    got = _run(fn, grad, requires_grad, kiln.compile(fn, backend="cpp"))
    assert autograd_signature(got[0]) == autograd_signature(expected[0])
    for a, b in zip(tensor_values(got[0]), tensor_values(expected[0])):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(got[1], expected[1])  # the input afterwards
    assert got[2] == expected[2]  # grad mode afterwards
    assert autograd_signature(got[3]) == autograd_signature(expected[3])
    if isinstance(expected[3], torch.Tensor):
        torch.testing.assert_close(got[3], expected[3])


class _Clipped(torch.nn.Module):
    """A weight clamped under no_grad in forward (WGAN-style clipping), then used with grad on."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        with torch.no_grad():
            self.lin.weight.clamp_(-0.1, 0.1)
        return self.lin(x).sum()


def test_weight_clamped_under_no_grad_in_forward_still_gets_its_gradient(counters):
    kiln.reset()
    model, twin = _Clipped(), _Clipped()
    twin.load_state_dict(model.state_dict())
    compiled = kiln.compile(twin)
    x = torch.randn(5, 4)
    for _ in range(2):
        model(x).backward()
        compiled(x).backward()
        for name, p in model.named_parameters():
            torch.testing.assert_close(twin.get_parameter(name), p)
            torch.testing.assert_close(twin.get_parameter(name).grad, p.grad)
    assert any("updated in place under no_grad" in k for k in counters["graph_breaks"])


def test_forward_mode_ad_keeps_its_tangents(counters):
    import torch.autograd.forward_ad as fwAD
    kiln.reset()
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.GELU())
    compiled = kiln.compile(lambda x: model(x).sin() * 2, backend="cpp")
    x, t = torch.randn(5, 4), torch.randn(5, 4)
    plain = compiled(x)  # captured without forward AD first: its entry must not serve dual tensors
    with fwAD.dual_level():
        expected = fwAD.unpack_dual(model(fwAD.make_dual(x, t)).sin() * 2)
        got = fwAD.unpack_dual(compiled(fwAD.make_dual(x, t)))
    assert got.tangent is not None
    torch.testing.assert_close(got.primal, expected.primal)
    torch.testing.assert_close(got.tangent, expected.tangent)
    torch.testing.assert_close(compiled(x), plain)  # and the compiled entry serves plain calls again
    assert any("forward-mode AD is active" in k for k in counters["graph_breaks"])
    jvp = torch.func.jvp(compiled, (x,), (t,))[1]
    torch.testing.assert_close(jvp, expected.tangent)
