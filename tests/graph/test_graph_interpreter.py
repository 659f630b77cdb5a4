"""The reference interpreter: results equal eager; an error keeps its type and gets a note naming its node."""
from __future__ import annotations

import pytest
import torch

import kiln.ops
from kiln import prims
from kiln.graph import Graph, TensorMeta, run, to_prims

F32 = TensorMeta((2, 3), torch.float32)


def _notes(error):
    return "\n".join(getattr(error, "__notes__", []))


def test_run_matches_eager_at_both_levels():
    def fn(x, y):
        return torch.softmax(x * y + 1, dim=-1), torch.cumsum(x, 0)

    x, y = torch.randn(2, 3), torch.randn(2, 3)
    graph = kiln.ops.trace(fn, x, y)
    expected = fn(x, y)
    torch.testing.assert_close(run(graph, [x, y]), expected)
    torch.testing.assert_close(run(graph, [x, y], torch_level=True), expected)
    torch.testing.assert_close(run(to_prims(graph), [x, y]), expected)


def test_wrong_number_of_inputs():
    graph = Graph("two")
    graph.placeholder("x", F32)
    graph.placeholder("y", F32)
    graph.output(None)
    with pytest.raises(TypeError, match="graph two takes 2 inputs, got 1"):
        run(graph, [torch.randn(2, 3)])


def test_prim_error_note_names_the_node():
    graph = Graph("broken")
    x = graph.placeholder("x", F32)
    y = graph.placeholder("y", F32)
    bad = graph.call_prim(prims.add, (x, y), {}, F32, origin="model.py:12")
    graph.output(bad)
    with pytest.raises(RuntimeError) as info:  # the inputs do not have the shapes the graph was built for
        run(graph, [torch.randn(2, 3), torch.randn(4, 5)])
    note = f"while kiln ran node {bad.name} = prims.add (from model.py:12) of graph broken"
    assert note in _notes(info.value)


def test_fallback_error_keeps_its_type_and_names_the_node():
    graph = Graph("chol")
    x = graph.placeholder("x", TensorMeta((2, 2), torch.float32))
    node = graph.call_torch(torch.linalg.cholesky, (x,), {}, TensorMeta((2, 2), torch.float32), None)
    graph.output(node)
    not_positive_definite = -torch.eye(2)
    with pytest.raises(torch.linalg.LinAlgError) as info:
        run(graph, [not_positive_definite])
    assert f"node {node.name} = torch.linalg.cholesky" in _notes(info.value)


def test_nested_graphs_note_once():
    x = torch.randn(2, 3)
    graph = kiln.ops.trace(lambda x, y: torch.exp(x) + y, x, x)
    with pytest.raises(RuntimeError) as info:
        run(graph, [torch.randn(2, 3), torch.randn(5, 7)])  # wrong shapes at run time
    notes = getattr(info.value, "__notes__", [])
    assert len(notes) == 1 and "while kiln ran node" in notes[0]


def test_getitem_and_constants():
    graph = Graph("g")
    x = graph.placeholder("x", TensorMeta((2, 4), torch.float32))
    metas = (TensorMeta((2,), torch.float32), TensorMeta((2,), torch.int64))
    node = graph.call_torch(torch.max, (x, 1), {}, metas, None)
    c = graph.constant(torch.tensor([10.0, 20.0]))
    total = graph.call_prim(prims.add, (graph.getitem(node, 0), c), {}, metas[0])
    graph.output((total, graph.getitem(node, 1)))
    x_val = torch.randn(2, 4)
    values, indices = torch.max(x_val, 1)
    got = run(graph, [x_val])
    torch.testing.assert_close(got[0], values + torch.tensor([10.0, 20.0]))
    torch.testing.assert_close(got[1], indices)


def test_mutated_inputs_are_written_back():
    graph = Graph("m")
    x = graph.placeholder("x", F32)
    new = graph.call_prim(prims.mul, (x, 2.0), {}, F32)
    graph.output(new)
    graph.mutated_inputs["x"] = new
    a = torch.ones(2, 3)
    out = run(graph, [a])
    torch.testing.assert_close(a, torch.full((2, 3), 2.0))
    torch.testing.assert_close(out, a)
