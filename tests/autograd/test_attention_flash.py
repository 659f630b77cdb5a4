"""Attention without dropout while training: kiln calls torch's CPU flash kernel itself where eager's sdpa
would (aten._fused_sdp_choice decides, as in eager), keeps its logsumexp and runs the flash backward from
it, where before the backward ran the attention forward again under eager autograd. Compared with eager:
outputs and gradients bit for bit (the same kernels), and which prims ran."""
from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import config

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache")]


def _grads_of(fn, inputs, weight):
    leaves = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    out = fn(*leaves)
    out.backward(weight)
    return out.detach(), [x.grad for x in leaves if x.requires_grad]


def _compare(fn, inputs, weight, exact=False):
    """fn compiled against eager: output and input gradients, bit for bit with `exact`, else close."""
    got, grads = _grads_of(kiln.compile(fn), inputs, weight)
    want, grads_eager = _grads_of(fn, inputs, weight)
    same = torch.equal if exact else lambda a, b: torch.testing.assert_close(a, b) is None
    assert same(got, want)
    for g, w in zip(grads, grads_eager):
        assert same(g, w)


@pytest.mark.parametrize("case", ["plain", "causal", "float_mask", "bool_mask", "scale", "cross", "gqa"])
def test_flash_attention_forward_and_backward_match_eager(counters, case):
    torch.manual_seed(0)
    shape_kv = (2, 3, 9, 8) if case == "cross" else (2, 3, 6, 8)
    shape_kv = (2, 1, 6, 8) if case == "gqa" else shape_kv  # (HF LLaMA passes enable_gqa=True)
    q, k, v = (torch.randn(*s, requires_grad=True) for s in ((2, 3, 6, 8), shape_kv, shape_kv))
    mask = {"float_mask": torch.randn(6, 6), "bool_mask": torch.rand(2, 1, 6, 6) > 0.3}.get(case)
    kw = {"is_causal": case == "causal", "scale": 0.3 if case == "scale" else None, "enable_gqa": case == "gqa"}

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
    weight = torch.randn(2, 3, 6, 8)
    _compare(fn, (q, k, v), weight, exact=True)
    assert counters["extern"]["prims.sdpa_flash"] == 1
    assert counters["extern"]["prims.sdpa_flash_backward"] == 1
    assert counters["extern"]["prims.sdpa_backward"] == 0
    assert not counters["fallback"]


def test_attention_eager_runs_on_its_math_path_keeps_the_sdpa_prim(counters):
    # 3-d operands: eager's choice is its math path, so kiln keeps prims.sdpa (which calls eager's sdpa)
    q, k, v = (torch.randn(4, 6, 8, requires_grad=True) for _ in range(3))
    weight = torch.randn(4, 6, 8)
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
    _compare(fn, (q, k, v), weight)
    assert counters["extern"]["prims.sdpa"] == 1 and counters["extern"]["prims.sdpa_flash"] == 0


def test_learned_mask_gets_its_gradient_through_the_flash_prim(counters):
    # a float mask computed from a parameter: the flash backward gives it no gradient, so the rule takes
    # the eager-autograd backward for this one (as eager itself runs such an attention on its math path)
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 2, 5, 4, requires_grad=True) for _ in range(3))
    table = torch.randn(5, 5, requires_grad=True)
    weight = torch.randn(2, 2, 5, 4)
    fn = lambda q, k, v, t: F.scaled_dot_product_attention(q, k, v, t * 2)  # noqa: E731
    _compare(fn, (q, k, v, table), weight)
    assert counters["extern"]["prims.sdpa_backward"] == 1


def test_grouped_heads_with_a_learned_mask_compile(counters):
    # regression: the eager-autograd backward of a learned mask was asked without enable_gqa
    torch.manual_seed(2)
    q = torch.randn(2, 4, 6, 8, requires_grad=True)
    k, v = (torch.randn(2, 2, 6, 8, requires_grad=True) for _ in range(2))
    table = torch.randn(6, 6, requires_grad=True)
    weight = torch.randn(2, 4, 6, 8)
    fn = lambda q, k, v, t: F.scaled_dot_product_attention(q, k, v, t * 2, enable_gqa=True)  # noqa: E731
    _compare(fn, (q, k, v, table), weight)
    assert not counters["cpp"]["ran with torch: the graph could not be compiled"], dict(counters["cpp"])
    assert not [k for k in counters["cpp"] if k.startswith("ran with torch")], dict(counters["cpp"])


@pytest.mark.parametrize("case", ["broadcast_batch", "mask_3d"])
def test_the_flash_choice_is_eagers_on_the_users_operands(counters, case):
    # regression: kiln asked torch about the operands after broadcasting them, and took the flash kernel
    # where eager takes its math path (a broadcast batch, a 3-d mask): now kiln keeps prims.sdpa there
    # (which calls eager's sdpa on the broadcast operands: equal up to rounding, not bit for bit)
    torch.manual_seed(3)
    q = torch.randn(2, 3, 6, 8, requires_grad=True)
    kv_shape = (1, 3, 6, 8) if case == "broadcast_batch" else (2, 3, 6, 8)
    k, v = (torch.randn(*kv_shape, requires_grad=True) for _ in range(2))
    mask = torch.randn(1, 6, 6) if case == "mask_3d" else None
    assert torch.ops.aten._fused_sdp_choice(q, k, v, mask) == 0  # eager: math
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # noqa: E731
    weight = torch.randn(2, 3, 6, 8)
    _compare(fn, (q, k, v), weight)
    assert counters["extern"]["prims.sdpa_flash"] == 0 and counters["extern"]["prims.sdpa"] == 1


@pytest.mark.parametrize("layout", ["fused_qkv", "contiguous", "heads_outermost"])
def test_flash_output_is_laid_out_as_eagers(layout):
    """Eager's flash kernel writes into empty_like(q): for q split out of a fused qkv projection and
    transposed, [B, L, H, E] in memory, so the transpose + reshape after the attention is a view. kiln's
    output has eager's strides (compiled output returned as such) and the fused-qkv block compiles to no
    kernel of its own (no copy of the attention's output, neither in the extern nor after it)."""
    from kiln.backends.cpp import compile_graph
    import kiln.ops
    torch.manual_seed(1)
    b, t, h, e = 2, 5, 3, 4
    w = torch.randn(3 * h * e, h * e)

    def make(x):
        if layout == "fused_qkv":
            q, k, v = (x @ w.t()).split(h * e, dim=-1)
            return [z.reshape(b, t, h, e).transpose(1, 2) for z in (q, k, v)]
        y = x @ w.t()  # views of it only: an elementwise result's strides are another matter
        if layout == "contiguous":
            return [y.reshape(3, b, h, t, e)[i] for i in range(3)]
        return [y.reshape(b, t, 3, h, e)[:, :, i].permute(1, 0, 2, 3) for i in range(3)]

    def attention(x):
        return F.scaled_dot_product_attention(*make(x), is_causal=True)

    def block(x):
        return attention(x).transpose(1, 2).reshape(b, t, h * e)
    x = torch.randn(b, t, h * e)
    with torch.no_grad():
        want, got = attention(x), kiln.compile(attention)(x)
        assert torch.equal(got, want) and got.stride() == want.stride()
        if layout == "fused_qkv":
            compiled = compile_graph(kiln.ops.trace(block, x), [x])
            assert torch.equal(compiled(x), block(x))
            assert compiled.kernel_count == 0
