"""User torch.autograd.Function under kiln.compile: the user's backward is the gradient, never kiln's own
derivative of the traced forward (which gave a straight-through round no gradient at all)."""
from __future__ import annotations

import pytest
import torch

import kiln


class _StraightThrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        return torch.round(a)

    @staticmethod
    def backward(ctx, g):
        return g * 3  # not round's derivative (zero): the user's choice


def _ste(x):
    return (_StraightThrough.apply(x * 2) + x).sum()


@pytest.mark.parametrize("backend", ["eager", "cpp"])
def test_custom_backward_is_used(backend, counters):
    kiln.reset()
    cf = kiln.compile(_ste, backend=backend)
    for _ in range(2):
        x = torch.randn(5, requires_grad=True)
        _ste(x).backward()
        expected = x.grad.clone()
        x.grad = None
        out = cf(x)
        torch.testing.assert_close(out, _ste(x))
        out.backward()
        torch.testing.assert_close(x.grad, expected)
    assert any("torch.autograd.Function _StraightThrough" in k for k in counters["graph_breaks"])


def test_without_grad_the_forward_is_traced(counters):
    """No input requires grad: the forward alone matters, and it is captured in the graph."""
    kiln.reset()
    cf = kiln.compile(_ste, backend="cpp")
    x = torch.randn(5)
    torch.testing.assert_close(cf(x), _ste(x))
    assert not counters["graph_breaks"]
    assert sum(counters["graphs"].values()) == 1


_FACTORIES = {
    "zeros_like": lambda x: torch.zeros_like(x),
    "ones_like": lambda x: torch.ones_like(x),
    "full_like": lambda x: torch.full_like(x, 2.0),
    "empty_like": lambda x: torch.empty_like(x).fill_(3),
    "new_zeros": lambda x: x.new_zeros(3),
    "new_full": lambda x: x.new_full((3,), 1.0),
    "asked": lambda x: torch.zeros_like(x, requires_grad=True),
    "differentiable": lambda x: x * 0,
}


@pytest.mark.parametrize("case", sorted(_FACTORIES))
def test_requires_grad_of_factories_read_in_compiled_code(case):
    """zeros_like(x) of an x that requires grad does not require grad; code branching on it took the other
    branch under kiln."""
    make = _FACTORIES[case]

    def f(x):
        z = make(x)
        return (z + 1) if z.requires_grad else (z - 1)
    kiln.reset()
    x = torch.randn(3, requires_grad=True)
    torch.testing.assert_close(kiln.compile(f, backend="eager")(x), f(x))


_LEAVES = {
    "zeros": lambda x: torch.zeros(x.shape, requires_grad=True),
    "ones_like": lambda x: torch.ones_like(x, requires_grad=True),
    "full": lambda x: torch.full(x.shape, 2.0, requires_grad=True),
    "tensor": lambda x: torch.tensor([1.0, 2.0, 3.0], requires_grad=True),
    "new_zeros": lambda x: x.new_zeros(x.shape, requires_grad=True),
    "randn": lambda x: torch.randn(x.shape, requires_grad=True),
}


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("case", sorted(_LEAVES))
def test_a_leaf_made_with_requires_grad_inside_compiled_code(case, grad, counters):
    """A factory asked for requires_grad=True makes a leaf inside the graph. With grad mode on, eager's
    results computed from it require grad and backward reaches the leaf; kiln returned them without grad
    (autograd is built for the graph's inputs), so `.backward()` raised. It now breaks there, with the reason."""
    make = _LEAVES[case]

    def f(x):
        z = make(x)
        return z, z * 2 + x

    kiln.reset()
    x = torch.randn(3)
    with torch.set_grad_enabled(grad):
        torch.manual_seed(1)
        z, out = f(x)
        torch.manual_seed(1)
        kz, kout = kiln.compile(f, backend="cpp")(x)
    torch.testing.assert_close((kz, kout), (z, out))
    for e, k in ((z, kz), (out, kout)):
        assert (k.requires_grad, k.is_leaf) == (e.requires_grad, e.is_leaf)
    if grad:
        out.sum().backward()
        kout.sum().backward()
        torch.testing.assert_close(kz.grad, z.grad)
        assert any("makes a leaf that requires grad" in k for k in counters["graph_breaks"]), \
            dict(counters["graph_breaks"])
    else:
        assert not counters["graph_breaks"]
