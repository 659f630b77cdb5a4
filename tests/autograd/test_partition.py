"""The partitioner (kiln.autograd.partition): it recomputes what saves bytes, and not what costs more to
recompute than it saves (a small reduction of a value saved anyway is saved); the gradients stay eager's."""
from __future__ import annotations

import shutil

import pytest
import torch

import kiln
import kiln.ops
from kiln import config
from kiln.autograd.joint import differentiate
from kiln.autograd.partition import partition
from kiln.graph import to_prims


pytestmark = pytest.mark.usefixtures("kiln_cache")


def exp_of_product(x, w):
    return torch.exp(x @ w).sum()   # the backward needs exp(x @ w): save it, or save x @ w and recompute it


def softmax_of_product(x, w):
    return (torch.softmax(x @ w, -1) * torch.arange(32.0)).sum()


def sin_times_cos(x, w):
    h = x @ w
    return (torch.sin(h) * torch.cos(h)).sum()   # needs sin(h), cos(h) and h: save h, recompute the others


def _saved_ops(fn):
    x, w = torch.randn(8, 16), torch.randn(16, 32, requires_grad=True)
    joint = partition(differentiate(to_prims(kiln.ops.trace(fn, x, w)), [False, True]))
    saved = list(joint.forward.output_value)[joint.user_leaves:]
    return [n.op if n.op == "placeholder" else n.target.name for n in saved]


def test_saves_the_value_itself_when_recomputing_it_saves_nothing():
    assert sorted(_saved_ops(exp_of_product)) == ["exp", "placeholder"]   # exp(x @ w) and x (for grad w)


def test_a_small_reduction_of_a_saved_value_is_saved_not_recomputed():
    # the backward reads exp(x @ w - max) (exp's gradient) and its row sums (the division's): the sums (seen
    # as (8, 1)) cost a few bytes against a pass over the rows. The maximum carries no gradient (softmax does
    # not depend on it), so neither x @ w nor the maxima are needed
    saved = _saved_ops(softmax_of_product)
    assert sorted(saved) == ["broadcast_in_dim", "exp", "placeholder"]


def test_recomputes_what_saves_bytes():
    assert sorted(_saved_ops(sin_times_cos)) == ["mm", "placeholder"]   # h and x; sin and cos recomputed


@pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler")
@pytest.mark.parametrize("fn", [exp_of_product, softmax_of_product, sin_times_cos])
def test_gradients_equal_eager(fn):
    x, w = torch.randn(8, 16), torch.randn(16, 32) * 0.1
    wk, we = w.clone().requires_grad_(True), w.clone().requires_grad_(True)
    kiln.reset()
    out = kiln.compile(fn)(x, wk)
    ref = fn(x, we)
    torch.testing.assert_close(out, ref)
    out.backward()
    ref.backward()
    torch.testing.assert_close(wk.grad, we.grad)


class _BufferUpdated(torch.nn.Module):
    """A buffer used in a differentiable computation, then updated in place in the same forward."""

    def __init__(self, view: bool):
        super().__init__()
        self.view = view
        self.register_buffer("buf", torch.full((2, 4), 2.0))
        self.w = torch.nn.Parameter(torch.linspace(0.5, 2.0, 4))

    def forward(self, x):
        y = x * (self.buf[0] if self.view else self.buf) * self.w
        self.buf.mul_(3)
        return y


class _ToggledBatchNorm(torch.nn.Module):
    """Train-mode BatchNorm (updates its running statistics), then eval mode on the updated statistics."""

    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(4)

    def forward(self, x):
        y = self.bn(x)
        self.bn.eval()
        z = self.bn(x)
        self.bn.train()
        return y + z


@pytest.mark.parametrize("recompute", [True, False], ids=["recompute", "no_recompute"])
@pytest.mark.parametrize("make", [lambda: _BufferUpdated(False), lambda: _BufferUpdated(True), _ToggledBatchNorm],
                         ids=["buffer", "buffer_view", "toggled_batchnorm"])
def test_the_backward_never_recomputes_from_an_input_updated_in_place(make, recompute):
    """The backward ran after the forward wrote the updated buffer back, and recomputed x * buf from the new
    values: a silently wrong gradient (3x for the buffer; BatchNorm's weight gradient used the statistics of
    a second update). Values from updated inputs are saved instead."""
    torch.manual_seed(0)
    model = make()
    twin = make()
    twin.load_state_dict(model.state_dict())
    kiln.reset()
    with config.patch(autograd_recompute=recompute):
        compiled = kiln.compile(twin)
        for _ in range(2):
            x = torch.randn(2, 4)
            model(x).sum().backward()
            compiled(x).sum().backward()
            for name, p in model.named_parameters():
                torch.testing.assert_close(twin.get_parameter(name).grad, p.grad)
            for name, b in model.named_buffers():
                torch.testing.assert_close(twin.get_buffer(name), b)
