"""Attention with dropout while training, compiled by kiln against eager under the same seed.

Eager's CPU runs scaled_dot_product_attention with dropout_p > 0 on its math path, one bernoulli draw over
the attention weights; kiln decomposes it op for op, so the same seed must drop the same weights. Each test
compares the output, the gradients and the generator's state afterwards, and checks with the counters that
nothing was handed to torch (before, the attention ran as a fallback with an opaque backward).
"""
from __future__ import annotations

import copy
import shutil

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import config

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache")]


def _torch_ran(counters):
    """Graphs handed to torch, torch ops in the graph (but the draws: the bernoulli prim is a wrapper call,
    as for every dropout) and opaque backwards."""
    ran = {k: v for k, v in counters["cpp"].items() if k.startswith("ran with torch")}
    ops = {k: v for k, v in counters["fallback"].items() if k != "prims.bernoulli"}
    return ran, ops, counters["autograd"]["opaque backward of a fallback op"]


def _run(fn, inputs, seed):
    """fn's output, the gradients of the inputs that require grad, and the generator's next draw."""
    leaves = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    torch.manual_seed(seed)
    out = fn(*leaves)
    (out * torch.linspace(-1, 1, out.shape[-1], dtype=out.dtype)).sum().backward()
    return out.detach(), [x.grad for x in leaves if x.requires_grad], torch.rand(3)


def _compare(fn, inputs, counters, seed=0):
    compiled = kiln.compile(fn)
    got, grads, after = _run(compiled, inputs, seed)
    want, grads_eager, after_eager = _run(fn, inputs, seed)
    assert (got == 0).sum() == (want == 0).sum()
    torch.testing.assert_close(got, want)
    for g, w in zip(grads, grads_eager):
        torch.testing.assert_close(g, w)
    assert torch.equal(after, after_eager)  # the same number of draws
    assert _torch_ran(counters) == ({}, {}, 0)


def _qkv(*shape_q, kv=None, dtype=torch.float32):
    kv = kv or shape_q
    return [torch.randn(*s, dtype=dtype, requires_grad=True) for s in (shape_q, kv, kv)]


@pytest.mark.parametrize("kw", [{}, {"is_causal": True}, {"scale": 0.3}, {"dropout_p": 0.9}])
def test_sdpa_dropout_matches_eager(counters, kw):
    p = kw.pop("dropout_p", 0.2)
    _compare(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=p, **kw),
             _qkv(2, 3, 6, 8), counters)


def test_sdpa_dropout_masks_and_ranks(counters):
    fmask = torch.randn(6, 9)
    _compare(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, fmask, dropout_p=0.3),
             _qkv(2, 3, 6, 8, kv=(2, 3, 9, 8)), counters, seed=1)
    bmask = torch.rand(2, 1, 6, 9) > 0.3
    bmask[0, 0, 2] = False  # a row with every key masked: safe softmax gives zeros, not NaN
    _compare(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, bmask, dropout_p=0.3),
             _qkv(2, 3, 6, 8, kv=(2, 3, 9, 8)), counters, seed=2)
    _compare(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.5),
             _qkv(5, 6, 8, kv=(5, 7, 8)), counters, seed=3)
    _compare(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.5),
             _qkv(2, 3, 6, 8, kv=(1, 7, 8)), counters, seed=4)
    _compare(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True),
             _qkv(2, 2, 5, 4, dtype=torch.float64), counters, seed=5)


def test_sdpa_dropout_learned_mask_gets_its_gradient(counters):
    table = torch.randn(6, 6, requires_grad=True)
    q, k, v = _qkv(2, 2, 6, 4)
    _compare(lambda q, k, v, t: F.scaled_dot_product_attention(q, k, v, t * 2, dropout_p=0.25),
             [q, k, v, table], counters, seed=6)


def test_sdpa_dropout_bad_probability_raises_as_eager():
    q = torch.randn(2, 4, 3)
    fn = kiln.compile(lambda q: F.scaled_dot_product_attention(q, q, q, dropout_p=1.5))
    with pytest.raises(RuntimeError, match="dropout probability has to be between 0 and 1"):
        F.scaled_dot_product_attention(q, q, q, dropout_p=1.5)
    with pytest.raises(RuntimeError, match="dropout probability has to be between 0 and 1"):
        fn(q)


@pytest.mark.parametrize("need_weights", [False, True])
def test_multihead_attention_dropout_while_training(counters, need_weights):
    torch.manual_seed(0)
    eager = torch.nn.MultiheadAttention(16, 4, dropout=0.2, batch_first=True).train()
    module = copy.deepcopy(eager)
    compiled = kiln.compile(module)
    x = torch.randn(3, 7, 16)
    mask = torch.rand(3, 7) > 0.8
    outs = []
    for m in (compiled, eager):
        torch.manual_seed(11)
        out, weights = m(x, x, x, key_padding_mask=mask, need_weights=need_weights)
        (out.sum() + (0 if weights is None else weights.sum())).backward()
        outs.append((out, weights, torch.rand(2)))
    (out, weights, after), (out_e, weights_e, after_e) = outs
    torch.testing.assert_close(out, out_e)
    torch.testing.assert_close(weights, weights_e)
    assert torch.equal(after, after_e)
    for (name, p), pe in zip(module.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, pe.grad, msg=name)
    assert _torch_ran(counters) == ({}, {}, 0)
