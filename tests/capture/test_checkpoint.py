"""torch.utils.checkpoint.checkpoint under kiln: eager's values and gradients (None where eager gives None).

torch's own checkpoint code runs the function, unseen by capture. A closure's parameters used to become
constants of the graph without gradients, and a global tensor it read an unguarded constant (wrong results);
now a torch function that would call a user's function breaks the graph (kiln/capture/calls.py), and a
parameter reaching an op without a source is refused (kiln.ops.record._lift): torch runs the checkpointed
call, keeping its memory savings. (A
stand-in that inlined the function compiled the layers but saved every activation for backward: HF LLaMA
training with checkpointing peaked 48% higher than without the stand-in, so it was not kept.)"""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.utils.checkpoint as ckpt

import kiln
from kiln.counters import counters


def _sequential():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _closure(m, x, reentrant):
    def inner(t):
        return m[1](m[0](t))
    return m[2](ckpt.checkpoint(inner, x, use_reentrant=reentrant)).sum()


def _module(m, x, reentrant):
    return m[2](m[1](ckpt.checkpoint(m[0], x, use_reentrant=reentrant))).sum()


def _outputs_and_grads(fn, x):
    m = _sequential()
    out = fn(m, x)
    if out.requires_grad:
        out.backward()
    return out.detach(), [p.grad for p in m.parameters()]


@pytest.mark.parametrize("program", [_closure, _module])
@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("input_grad", [False, True])
def test_checkpoint_gives_eagers_values_and_gradients(program, reentrant, input_grad):
    x = torch.randn(3, 4).requires_grad_(input_grad)

    def fn(m, x):
        return program(m, x, reentrant)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (reentrant checkpoint warns when no input requires grad)
        expected, expected_grads = _outputs_and_grads(fn, x)
        kiln.reset()
        counters.clear()
        got, grads = _outputs_and_grads(kiln.compile(fn), x)
    torch.testing.assert_close(got, expected)
    for g, e in zip(grads, expected_grads):  # (reentrant, no input requiring grad: None, as in eager)
        assert (g is None) == (e is None)
        if e is not None:
            torch.testing.assert_close(g, e)


@pytest.mark.parametrize("reentrant", [False, True])
def test_hf_llama_gradient_checkpointing_trains_as_eager(reentrant):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                                      num_attention_heads=4, num_key_value_heads=4, vocab_size=100)
    torch.manual_seed(0)
    base = transformers.AutoModelForCausalLM.from_config(config)
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    base.train()
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1))
    results = []
    for compiled in (False, True):
        model = copy.deepcopy(base)
        kiln.reset()
        counters.clear()
        loss = (kiln.compile(model) if compiled else model)(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        results.append((loss.detach(), [p.grad for p in model.parameters()]))
    (loss, grads), (kiln_loss, kiln_grads) = results
    torch.testing.assert_close(kiln_loss, loss)
    for g, e in zip(kiln_grads, grads):
        torch.testing.assert_close(g, e)


_scale = torch.tensor(2.0)


def _scaled(x):
    return torch.utils.checkpoint.checkpoint(lambda t: t * _scale, x, use_reentrant=False)


def test_a_global_read_inside_checkpoint_is_seen_when_reassigned():
    """Regression: torch's checkpoint ran the lambda for real at capture, so the global tensor became an
    unguarded constant of the graph; reassigning it left kiln computing with the old value."""
    global _scale
    x = torch.randn(4, 3)
    fn = kiln.compile(_scaled)
    try:
        torch.testing.assert_close(fn(x), x * 2)
        _scale = torch.tensor(5.0)
        torch.testing.assert_close(fn(x), x * 5)
    finally:
        _scale = torch.tensor(2.0)
