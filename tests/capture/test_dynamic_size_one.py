"""A dim automatic dynamic saw at size 1 gets a symbol that also stands for 1 (`SizeOrOne`): one graph then
serves batch 1 and larger batches, unless something asked whether the size is 1 (a fact, so a guard, so a
new capture at 1). Every program runs eagerly and compiled at a sequence of shapes starting at batch 1;
values, inputs after the call and exceptions are compared, and the captures counted."""
from __future__ import annotations

import pathlib
import sys

import pytest
import sympy
import torch
import torch.nn.functional as F

import kiln
from kiln import config
from kiln.graph.symbolic import SizeOrOne, holds_everywhere, min_size
from kiln.lower.sizes import known_le, nonnegative

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
from bench_dynamic import DecoderBlock  # noqa: E402

SHAPES = [(1, 5), (3, 7), (1, 9), (2, 4), (1, 5), (5, 6)]
W = torch.randn(16, 16, generator=torch.Generator().manual_seed(0))
BIAS = torch.randn(16, generator=torch.Generator().manual_seed(1))


def p_broadcast(x): return x * BIAS + x.mean(0, keepdim=True)
def p_column_sums(x): return (x * x).sum(0) + x.amax(0)
def p_split_heads(x):
    b, t, c = x.shape
    q, k = x.split(8, dim=2)
    return (q.reshape(b, t, 2, 4).transpose(1, 2) * k.reshape(b, t, 2, 4).transpose(1, 2)).sum(-1)
def p_attention_scores(x): return torch.softmax(x @ x.transpose(-1, -2), -1) @ x
def p_layer_norm_linear(x): return F.layer_norm(x, (16,)) @ W + BIAS
def p_expand(x): return x[:, :1].expand(-1, x.shape[1], -1) + x
def p_cat_batch(x): return torch.cat([x, x * 2], 0).mean(0)
def p_flatten(x): return x.flatten(0, 1).relu().unsqueeze(0)
def p_var(x): return x.var(0) + x.std(1, keepdim=True)
def p_index_tensor(x): return x[torch.tensor([0]), :, 3] + x.sum()
def p_bmm(x): return torch.bmm(x, x.transpose(1, 2)).tanh()
def p_linear(x): return F.linear(x, W, BIAS).sum(1)
def p_pad(x): return F.pad(x, (1, 2)).sum(0)
def p_arange(x): return x + torch.arange(x.shape[0]).view(-1, 1, 1)
def p_prod(x): return x.prod(0) + x.shape[0]
def p_sdpa(x):
    b, t, c = x.shape
    q = x.view(b, t, 2, 8).transpose(1, 2)
    return F.scaled_dot_product_attention(q, q, q, is_causal=True).transpose(1, 2).reshape(b, t, c)


# programs whose meaning changes at size 1: each asks, so a guard sends batch 1 to a capture of its own
def p_squeeze(x): return x.squeeze(0).cos()  # removes dim 0 only when it is 1
def p_branch(x): return x + 1 if x.shape[0] > 1 else x - 1
def p_reshape_view_or_copy(x):
    b, t, c = x.shape
    y = x.transpose(0, 1).reshape(t, b * c)  # a view of x at batch 1, a copy otherwise
    y.mul_(2)
    return y + 1


GENERIC = [p_broadcast, p_column_sums, p_split_heads, p_attention_scores, p_layer_norm_linear, p_expand,
           p_cat_batch, p_flatten, p_var, p_index_tensor, p_bmm, p_linear, p_pad, p_arange, p_prod, p_sdpa]
SIZE_ONE_MATTERS = [p_squeeze, p_branch, p_reshape_view_or_copy]


def _captures() -> int:
    return sum(kiln.counters["captures"].values())


def _run_shapes(fn, shapes=SHAPES):
    compiled = kiln.compile(fn)
    gen = torch.Generator().manual_seed(7)
    for b, t in shapes:
        x = torch.randn(b, t, 16, generator=gen)
        x_eager, x_kiln = x.clone(), x.clone()
        try:
            expected, eager_error = fn(x_eager), None
        except Exception as e:
            expected, eager_error = None, e
        with config.patch(raise_on_error=True, dynamic_compile_after=1):
            try:
                got, error = compiled(x_kiln), None
            except Exception as e:
                got, error = None, e
        assert type(error) is type(eager_error), (b, t, error, eager_error)
        if eager_error is None:
            torch.testing.assert_close(got, expected, equal_nan=True, msg=lambda m: f"at {(b, t)}: {m}")
        torch.testing.assert_close(x_kiln, x_eager, msg=lambda m: f"input at {(b, t)}: {m}")


@pytest.mark.parametrize("symbolic", [True, False], ids=["symbolic", "per_size"])
@pytest.mark.parametrize("fn", GENERIC, ids=lambda f: f.__name__)
def test_size_generic_programs_capture_twice(fn, symbolic):
    kiln.reset()
    with config.patch(dynamic_symbolic=symbolic):
        _run_shapes(fn)
    assert _captures() == 2, dict(kiln.counters["recompiles"])
    if symbolic:
        assert sum(kiln.counters["dynamic_symbolic_compiles"].values()) == 1
        assert not kiln.counters["dynamic_symbolic_failed"]


@pytest.mark.parametrize("fn", SIZE_ONE_MATTERS, ids=lambda f: f.__name__)
def test_a_question_about_size_one_is_guarded(fn):
    kiln.reset()
    _run_shapes(fn)
    assert _captures() == 3
    reasons = " ".join(kiln.counters["recompiles"])
    assert "!= 1" in reasons or "> 1" in reasons or "<" in reasons, reasons


def test_errors_match_at_batch_one():
    def mismatch(x):
        return x[:, -1] * 2 + x[0]  # (b, c) + (t, c): eager raises unless b == t (or one of them is 1)
    kiln.reset()
    _run_shapes(mismatch, [(1, 5), (3, 3), (1, 7), (2, 5)])


def test_decoder_block_from_batch_one_captures_twice():
    kiln.reset()
    torch.manual_seed(0)
    model = DecoderBlock(dim=32, heads=4).eval()  # bench_dynamic's block
    compiled = kiln.compile(model)
    shapes = [(1 + (i * 7) % 4, 8 + (i * 13) % 57) for i in range(12)]  # batch 1..4, the first one 1
    assert shapes[0][0] == 1 and any(b == 1 for b, _ in shapes[2:])
    with torch.no_grad(), config.patch(dynamic_compile_after=1):
        for b, t in shapes:
            x = torch.randn(b, t, 32)
            torch.testing.assert_close(compiled(x), model(x))
    assert _captures() == 2
    assert sum(kiln.counters["dynamic_symbolic_compiles"].values()) == 1
    text = str(kiln.explain(compiled, torch.randn(3, 8, 32)))
    assert "1 or more" in text


def test_marked_dims_still_specialize_one():
    kiln.reset()
    fn = kiln.compile(lambda x: x * 2, dynamic=True)
    fn(torch.randn(4, 3))
    fn(torch.randn(1, 3))
    assert _captures() == 2  # dynamic=True: symbols of 2 or more, as Dynamo's; 1 is its own capture


def test_dims_seen_only_at_two_or_more_exclude_one():
    kiln.reset()
    _run_shapes(p_broadcast, [(2, 5), (3, 7), (1, 9)])
    assert _captures() == 3  # batch went 2 -> 3: its symbol stands for 2 or more


# ---- the prover -------------------------------------------------------------------------------------------

def test_prover_splits_a_size_that_may_be_one():
    s0 = SizeOrOne("s0", integer=True, positive=True)
    s1 = sympy.Symbol("s1", integer=True, positive=True)
    assert min_size(s0) == 1 and min_size(s1) == 2
    assert holds_everywhere(sympy.Ne(s0, 1)) is None
    assert holds_everywhere(sympy.Ne(s1, 1)) is True
    assert holds_everywhere(sympy.Gt(64 * s0 * s1, 64)) is True
    assert holds_everywhere(sympy.Lt(s1, s0 * s1)) is None  # false at s0 = 1
    assert holds_everywhere(sympy.Or(sympy.Lt(s1, s0 * s1), sympy.Eq(s0, 1))) is True
    assert holds_everywhere(sympy.And(sympy.Ge(s0, 1), sympy.Ge(s1, 2))) is True
    assert holds_everywhere(sympy.Lt(s0 + s1, 3)) is False
    assert holds_everywhere(sympy.Eq(s0 * s1, 2)) is None


def test_kernel_facts_count_from_one():
    s0 = SizeOrOne("s0", integer=True, positive=True)
    s1 = sympy.Symbol("s1", integer=True, positive=True)
    assert nonnegative(s0 - 1) and not nonnegative(s0 - 2)
    assert nonnegative(s1 - 2)
    assert known_le(s1, s0 * s1) and not known_le(s1 + 1, s0 * s1)


@pytest.mark.parametrize("name", ["hf_gpt2", "hf_bert", "hf_llama"])
def test_hf_models_serve_batch_one_from_the_dynamic_capture(name):
    """transformers' defaults from configs: batch 1, then 2, then 1 and 3 again — two captures."""
    pytest.importorskip("transformers")
    from kiln.testing import models as zoo
    kiln.reset()
    torch.manual_seed(0)
    model = zoo.get(name).factory().eval()
    compiled = kiln.compile(model)
    with torch.no_grad(), config.patch(raise_on_error=True):
        for b, t in [(1, 8), (2, 12), (1, 16), (3, 9), (1, 20)]:
            ids = torch.randint(0, 1000, (b, t))
            torch.testing.assert_close(compiled(input_ids=ids).last_hidden_state,
                                       model(input_ids=ids).last_hidden_state)
    assert _captures() == 2, list(kiln.counters["recompiles"])


def test_exact_remainders_of_sizes_need_no_guard():
    from kiln.graph.symbolic import Mod
    s0 = SizeOrOne("s0", integer=True, positive=True)
    s1 = sympy.Symbol("s1", integer=True, positive=True)
    assert Mod(s0 * s1, s1) == 0 and Mod(768 * s0 * s1, 64 * s0 * s1) == 0 and Mod(s1, s1) == 0
    assert Mod(s0 * s1 + 1, s1) != 0 and Mod(64 * s0, 768 * s0) != 0  # (not exact: stays a remainder)
