"""Weight gradients come out of kiln's backward in their parameters' layout (kiln.autograd.layout), so eager's
AccumulateGrad keeps them without a copy; and the backward computes no gradient an input does not need."""
from __future__ import annotations

import copy
import shutil

import pytest
import torch

import kiln
import kiln.ops
from kiln import config
from kiln.autograd.joint import differentiate
from kiln.backends import aot
from kiln.graph import to_prims

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache")]


def _backward_results(monkeypatch):
    results = []
    run = aot._State.run_backward

    def recording(self, inputs):
        out = run(self, inputs)
        results.append(out)
        return out
    monkeypatch.setattr(aot._State, "run_backward", recording)
    return results


@pytest.mark.parametrize("shape", [(5, 12), (2, 5, 12)], ids=["2-D input", "3-D input"])
def test_linear_weight_gradients_are_contiguous_and_equal_eager(shape, monkeypatch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    eager = copy.deepcopy(model)
    results = _backward_results(monkeypatch)
    x = torch.randn(shape)
    kiln.reset()
    kiln.compile(model)(x).square().sum().backward()
    eager(x).square().sum().backward()
    (grads,) = results
    weights = [g for g in grads if g is not None and g.dim() == 2]
    assert len(weights) == 2 and all(g.is_contiguous() for g in weights)
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_batched_product_gradient_is_contiguous():
    def fn(a, b):
        return torch.bmm(a, b).sin().sum()
    a, b = torch.randn(2, 3, 4), torch.randn(2, 4, 5, requires_grad=True)
    joint = differentiate(to_prims(kiln.ops.trace(fn, a, b)), [False, True])
    (grad_b,) = [g for g in joint.backward.output_value if g is not None]
    assert grad_b.target.name == "bmm" and grad_b.meta.strides == (20, 5, 1)
    # no gradient for `a`: only one product in the backward, and `b` is not saved for it
    assert sum(n.op == "call_prim" and n.target.name == "bmm" for n in joint.backward.nodes) == 1
    saved = [p.name for p in joint.backward.placeholders if p.name.startswith("saved")]
    assert "saved_a" in saved and "saved_b" not in saved
    bc = b.detach().clone().requires_grad_(True)
    kiln.reset()
    kiln.compile(fn)(a, bc).backward()
    fn(a, b).backward()
    torch.testing.assert_close(bc.grad, b.grad)


def _stolen(model, backward_results):
    returned = {g.data_ptr() for g in backward_results[-1] if isinstance(g, torch.Tensor)}
    return [p.grad.data_ptr() in returned for p in model.parameters()]


def test_gradients_become_grad_without_a_copy_and_stay_intact(monkeypatch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3))
    eager = copy.deepcopy(model)
    results = _backward_results(monkeypatch)
    kiln.reset()
    compiled = kiln.compile(model)
    x1, x2 = torch.randn(5, 12), torch.randn(5, 12)
    compiled(x1).square().sum().backward()
    eager(x1).square().sum().backward()
    assert all(_stolen(model, results))   # the backward's own buffers, not AccumulateGrad's copies
    held = [p.grad for p in model.parameters()]
    expected = [p.grad.clone() for p in eager.parameters()]
    model.zero_grad(set_to_none=True)
    compiled(x2).square().sum().backward()   # the wrapper must not reuse a buffer `held` still owns
    for g, e in zip(held, expected):
        torch.testing.assert_close(g, e)
    eager.zero_grad(set_to_none=True)
    eager(x2).square().sum().backward()
    for _ in range(2):   # accumulation into existing .grad (zero_grad(set_to_none=False) keeps them)
        compiled(x1).sum().backward()
        eager(x1).sum().backward()
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


class _TwoBranches(torch.nn.Module):
    """Two BatchNorms added: their biases' gradients are the same values, one buffer after CSE."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.BatchNorm1d(6), torch.nn.BatchNorm1d(6)

    def forward(self, x):
        return (self.a(x) + self.b(x * 2)).relu()


def test_equal_gradients_of_two_parameters_are_separate_tensors():
    # regression: both biases got the same buffer as `.grad`, so clip_grad_norm_'s in-place scaling reached
    # that memory twice and the clipped gradients differed from eager's
    torch.manual_seed(0)
    model = _TwoBranches()
    eager = copy.deepcopy(model)
    compiled = kiln.compile(model)
    x = torch.randn(8, 6)
    for m, fn in ((model, compiled), (eager, eager)):
        for _ in range(2):
            m.zero_grad(set_to_none=True)
            fn(x).square().sum().backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1e-2)
    assert model.a.bias.grad.untyped_storage().data_ptr() != model.b.bias.grad.untyped_storage().data_ptr()
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_distinct_gradients_copies_only_overlapping_memory():
    base = torch.arange(12.0)
    first, second, apart = base[:6], base[3:9], base[6:]
    out = aot._distinct_gradients([first, None, second, apart, first, torch.empty(0)])
    assert out[1] is None and out[0].data_ptr() == first.data_ptr()
    assert out[2].data_ptr() != second.data_ptr() and torch.equal(out[2], second)   # overlaps [0, 6)
    assert out[3].data_ptr() == apart.data_ptr()                                      # beside it: kept
    assert out[4].data_ptr() != first.data_ptr() and torch.equal(out[4], first)
