"""Modules torch.export builds, compiled whole: `torch.export.unflatten`'s module tree (its forward flattens
the inputs with a TreeSpec and calls InterpreterModules) and the stage modules torch.distributed.pipelining's
`pipeline()` cuts from one. Each was graph breaks ("InterpreterModule.forward on a InterpreterModule kiln does
not track", "tree_flatten_spec on a TreeSpec"), and exported code's `aten.alias` a fallback."""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln.counters import counters
from kiln.testing.models import NanoGPT


def _model_and_tokens():
    torch.manual_seed(0)
    model = NanoGPT(vocab=64, dim=16, heads=2, layers=2, max_len=8)
    return model, torch.randint(0, 64, (2, 8))


def _compiles_and_matches(module, x, breaks=0):
    kiln.reset()
    compiled = kiln.compile(module)
    out = compiled(x)
    expected = module(x)
    torch.testing.assert_close(out, expected)
    out.pow(2).mean().backward()
    grads = {n: p.grad for n, p in module.named_parameters()}
    module.zero_grad(set_to_none=True)
    expected.pow(2).mean().backward()
    assert any(g is not None for g in grads.values())
    for n, p in module.named_parameters():  # (a stage's copy of a tied weight it does not use: None both ways)
        assert (grads[n] is None) == (p.grad is None), n
        if p.grad is not None:
            torch.testing.assert_close(grads[n], p.grad, msg=n)
    report = kiln.explain(compiled, x)
    assert (report.graph_count, report.graph_break_count) == (1, breaks), str(report)
    # the one fallback: the embedding's gradient (index_put accumulating rows at the token ids, a scatter the
    # loop IR does not write), as in any training graph with an embedding
    assert dict(counters.get("fallback", {})) == {"prims.index_put": 1}, dict(counters["fallback"])
    return str(report)


def test_an_unflattened_exported_module_compiles_as_one_graph_after_its_disabled_input_step():
    model, x = _model_and_tokens()
    unflat = torch.export.unflatten(torch.export.export(model, (x,)))
    # its input processing is marked torch.compiler.disable (torch.compile breaks there too): named
    report = _compiles_and_matches(unflat, x, breaks=1)
    assert "process_forward_inputs, disabled by torch.compiler.disable" in report, report


def test_a_stage_cut_by_pipeline_compiles_as_one_graph():
    pipelining = pytest.importorskip("torch.distributed.pipelining")
    model, x = _model_and_tokens()
    pipe = pipelining.pipeline(model, mb_args=(x,), split_spec={"blocks.1": pipelining.SplitPoint.BEGINNING})
    first = pipe.split_gm.submod_pp_0  # (embeddings and block 0; builds without a process group)
    _compiles_and_matches(first, x)


def test_pytree_helpers_are_traced_through():
    """torch.utils._pytree (what exported code and libraries flatten with) is Python capture follows, user
    functions of tree_map included."""
    import torch.utils._pytree as pytree

    def f(d):
        flat, spec = pytree.tree_flatten(d)
        out = pytree.tree_unflatten([t * 2 for t in flat], spec)
        return pytree.tree_map(lambda t: t + 1, out)

    d = {"a": torch.randn(3), "b": (torch.randn(2), [torch.randn(4)])}
    compiled = kiln.compile(f)
    got, expected = compiled(d), f(d)
    assert pytree.tree_structure(got) == pytree.tree_structure(expected)
    for a, b in zip(pytree.tree_leaves(got), pytree.tree_leaves(expected)):
        torch.testing.assert_close(a, b)
    report = kiln.explain(compiled, d)
    assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
