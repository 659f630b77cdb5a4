"""Graph passes: verify catches broken graphs, dce and cse remove what they should, to_prims inlines."""
from __future__ import annotations

import pytest
import torch

import kiln.ops
from kiln import config, prims
from kiln.graph.pipeline import PassVerifyError
from kiln.graph import (Graph, GraphVerifyError, Node, TensorMeta, count_ops, cse, dce, run, run_passes,
                        to_prims, verify)
from kiln.prims import Prim

F32 = TensorMeta((2, 3), torch.float32)


def _small_graph():
    graph = Graph("small")
    x = graph.placeholder("x", F32)
    y = graph.placeholder("y", F32)
    a = graph.call_prim(prims.add, (x, y), {}, F32)
    b = graph.call_prim(prims.mul, (a, 2.0), {}, F32)
    graph.output(b)
    return graph, x, y, a, b


def test_verify_accepts_traced_and_decomposed_graphs():
    x = torch.randn(2, 3)
    graph = kiln.ops.trace(lambda x: torch.exp(x) + x * 2, x)
    verify(graph)
    verify(to_prims(graph))
    verify(_small_graph()[0])


def test_verify_catches_use_before_definition():
    graph, x, y, a, b = _small_graph()
    graph.nodes[2], graph.nodes[3] = graph.nodes[3], graph.nodes[2]
    with pytest.raises(GraphVerifyError, match=f"at node {b.name}: reads {a.name}, which is not defined"):
        verify(graph)


def test_verify_catches_duplicate_names_and_foreign_nodes():
    graph, x, y, a, b = _small_graph()
    b.name = a.name
    with pytest.raises(GraphVerifyError, match="duplicate node name"):
        verify(graph)
    graph, x, y, a, b = _small_graph()
    other, *_ = _small_graph()
    b.args = (other.nodes[0], 2.0)
    with pytest.raises(GraphVerifyError, match="not defined before it"):
        verify(graph)


def test_verify_catches_output_problems():
    graph, *_ = _small_graph()
    graph.nodes.pop()
    with pytest.raises(GraphVerifyError, match="no output node"):
        verify(graph)
    graph, x, y, a, b = _small_graph()
    graph.nodes.append(Node(graph, "late", "call_prim", prims.exp, (a,), {}, F32))
    with pytest.raises(GraphVerifyError, match="after the output node"):
        verify(graph)


def test_verify_catches_bad_getitem_missing_meta_and_bad_targets():
    graph = Graph("g")
    x = graph.placeholder("x", F32)
    node = graph.call_torch(torch.max, (x, 1), {}, (TensorMeta((2,), torch.float32),), None)
    bad = graph.getitem(node, 0)
    bad.args = (node, 5)
    graph.output(bad)
    with pytest.raises(GraphVerifyError, match=f"at node {bad.name}: getitem 5"):
        verify(graph)

    graph, x, y, a, b = _small_graph()
    a.meta = None
    with pytest.raises(GraphVerifyError, match=f"at node {a.name}: missing meta"):
        verify(graph)

    graph, x, y, a, b = _small_graph()
    a.target = torch.add
    with pytest.raises(GraphVerifyError, match="is not a prim"):
        verify(graph)


def test_verify_catches_decomposition_arity_and_bad_mutations():
    x = torch.randn(2, 3)
    graph = kiln.ops.trace(lambda x, y: torch.exp(x) * y, x, x)
    node = next(n for n in graph.nodes if n.op == "call_torch" and n.decomposition is not None)
    dec = node.decomposition
    dec.nodes.insert(0, Node(dec, "extra", "placeholder", "extra", (), {}, F32))
    with pytest.raises(GraphVerifyError, match="decomposition has 2 inputs"):
        verify(graph)
    graph, x_node, y, a, b = _small_graph()
    graph.mutated_inputs["nope"] = a
    with pytest.raises(GraphVerifyError, match="mutates nope, which is not an input"):
        verify(graph)


def test_verify_names_the_pass():
    graph, *_ = _small_graph()
    graph.nodes.pop()
    with pytest.raises(GraphVerifyError, match="after pass fuse"):
        verify(graph, after="fuse")


def test_dce_removes_dead_nodes_and_keeps_the_rest():
    def fn(x, y):
        unused = torch.exp(y) * 3  # noqa: F841
        return x + 1

    x, y = torch.randn(2, 3), torch.randn(2, 3)
    graph = to_prims(kiln.ops.trace(fn, x, y))
    before = count_ops(graph)
    assert before.get("prims.exp") == 1
    dce(graph)
    after = count_ops(graph)
    assert "prims.exp" not in after and after.get("prims.add") == 1
    assert [p.name for p in graph.placeholders] == ["x", "y"]  # inputs stay even when unused
    verify(graph)
    torch.testing.assert_close(run(graph, [x, y]), fn(x, y))


def test_dce_keeps_side_effects_and_mutations():
    graph = Graph("g")
    x = graph.placeholder("x", F32)
    inplace = graph.call_torch(torch.Tensor.add_, (x, 1.0), {}, F32, None)  # its name says in place
    mutation = graph.call_prim(prims.mul, (x, 3.0), {}, F32)
    dead = graph.call_prim(prims.exp, (x,), {}, F32)
    graph.output(None)
    graph.mutated_inputs["x"] = mutation
    dce(graph)
    assert inplace in graph.nodes and mutation in graph.nodes and dead not in graph.nodes


def test_cse_merges_repeated_pure_nodes():
    def fn(x):
        return torch.exp(x) + torch.exp(x) * torch.exp(x)

    x = torch.randn(4)
    graph = to_prims(kiln.ops.trace(fn, x))
    assert count_ops(graph)["prims.exp"] == 3
    nodes = len(graph)
    cse(graph)
    verify(graph)
    assert count_ops(graph)["prims.exp"] == 1
    assert len(graph) == nodes - 2
    torch.testing.assert_close(run(graph, [x]), fn(x))


def test_cse_distinguishes_arguments_and_keeps_random_prims():
    graph = Graph("g")
    x = graph.placeholder("x", F32)
    a = graph.call_prim(prims.mul, (x, 2.0), {}, F32)
    b = graph.call_prim(prims.mul, (x, 2), {}, F32)  # an int is not the same constant as a float
    c = graph.call_prim(prims.mul, (x, 3.0), {}, F32)
    noise = Prim("test_noise", lambda t: t, lambda t: torch.rand_like(t), tags=("random",))
    r1 = graph.call_prim(noise, (x,), {}, F32)
    r2 = graph.call_prim(noise, (x,), {}, F32)
    graph.output((a, b, c, r1, r2))
    cse(graph)
    assert {a, b, c, r1, r2} <= set(graph.nodes)


def test_cse_updates_users_and_mutations():
    graph = Graph("g")
    x = graph.placeholder("x", F32)
    a = graph.call_prim(prims.exp, (x,), {}, F32)
    b = graph.call_prim(prims.exp, (x,), {}, F32)
    c = graph.call_prim(prims.add, (a, b), {}, F32)
    graph.output(c)
    graph.mutated_inputs["x"] = b
    cse(graph)
    assert b not in graph.nodes and c.args == (a, a) and graph.mutated_inputs["x"] is a
    verify(graph)


def test_to_prims_inlines_decompositions_and_keeps_fallbacks():
    def fn(x):
        return torch.cumsum(torch.exp(x) * 2, 0)

    x = torch.randn(5)
    graph = kiln.ops.trace(fn, x)
    prim_graph = to_prims(graph)
    verify(prim_graph)
    torch_nodes = [n for n in prim_graph.nodes if n.op == "call_torch"]
    assert all(n.decomposition is None for n in torch_nodes)  # only fallbacks stay torch-level
    assert [n.target_name() for n in torch_nodes] == [n.target_name() for n in graph.fallbacks()]
    exp = next(n for n in prim_graph.nodes if n.op == "call_prim" and n.target is prims.exp)
    assert exp.origin == "torch.exp"
    torch.testing.assert_close(run(prim_graph, [x]), fn(x))
    torch.testing.assert_close(run(graph, [x]), fn(x))
    torch.testing.assert_close(run(graph, [x], torch_level=True), fn(x))


def test_run_passes_verifies_between_passes():
    def broken(graph):
        graph.nodes.pop()
        return graph

    graph, *_ = _small_graph()
    assert run_passes(graph, [dce, cse]) is graph
    with config.patch(verify=True):
        with pytest.raises(PassVerifyError, match="after pass broken"):
            run_passes(_small_graph()[0], [dce, broken])
