"""Every parameter eager gives a gradient gets kiln's too: found by training Hugging Face's Swin, whose
relative position bias (a parameter gathered into a float attention mask) got no gradient at all: the sdpa
rule differentiated only query, key and value, and its guard read `requires_grad` off a traced meta, which
an intermediate value does not carry. Its table stayed at its initial value through training."""
from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import config
from kiln.prims import extern

from test_training import _assert_grads_equal, _handed_to_torch, _pair

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache")]


class BiasedAttention(torch.nn.Module):
    """Swin's pattern: a learned table gathered by a buffer of indices, added to the attention as its mask."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)
        self.table = torch.nn.Parameter(torch.randn(9, 2) * 0.1)
        self.register_buffer("index", torch.randint(0, 9, (16,)), persistent=False)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 2, 4).permute(2, 0, 3, 1, 4)
        bias = self.table[self.index].view(4, 4, 2).permute(2, 0, 1).unsqueeze(0)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias).sum(1)


def test_a_learned_attention_mask_gets_its_gradient(counters):
    eager, module, compiled = _pair(BiasedAttention)
    x = torch.randn(3, 4, 8)
    out, ref = compiled(x), eager(x)
    torch.testing.assert_close(out, ref)
    out.pow(2).sum().backward()
    ref.pow(2).sum().backward()
    assert module.table.grad is not None and module.table.grad.abs().sum() > 0
    _assert_grads_equal(eager, module)
    assert not _handed_to_torch(counters), dict(counters["cpp"])
    assert counters["autograd"]["backward graphs compiled"] == 1


def test_a_rule_dropping_a_needed_gradient_hands_the_graph_to_torch(counters, monkeypatch):
    """A vjp rule that gives None for a float value an input's gradient depends on is refused (the graph
    runs with torch, counted with the reason), never a short .grad."""
    rules = extern.mm.rules
    real = rules["vjp"]

    def drops_b(grads, outputs, a, b):
        return (real(grads, outputs, a, b)[0], None)
    monkeypatch.setitem(rules, "vjp", drops_b)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(5, 3))

        def forward(self, x):
            return torch.tanh(x @ self.w)

    eager, module, compiled = _pair(Net)
    x = torch.randn(4, 5)
    compiled(x).sum().backward()
    eager(x).sum().backward()
    _assert_grads_equal(eager, module)
    reasons = _handed_to_torch(counters)
    assert any("gives no gradient" in r for r in reasons), dict(counters["cpp"])
