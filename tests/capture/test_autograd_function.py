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
