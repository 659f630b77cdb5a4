"""Graphs print as runnable Python: executing the printed code gives the interpreter's and eager's result."""
from __future__ import annotations

import math
import weakref

import pytest
import torch

import kiln.ops
from kiln import prims
from kiln.graph import Graph, TensorMeta, compile_python, run, to_prims


def _inputs(*shapes):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(*s, generator=gen) for s in shapes]


def _check_printed_runs(graph, inputs, expected):
    source, _ = graph.python_code()
    compiled = compile_python(graph)
    got = compiled(*[t.clone() for t in inputs])
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(run(graph, [t.clone() for t in inputs]), expected)
    return source


def test_traced_graph_prints_runnable_python():
    def fn(x, y):
        return torch.exp(x) * y + x

    x, y = _inputs((2, 3), (2, 3))
    graph = kiln.ops.trace(fn, x, y)
    source = _check_printed_runs(graph, [x, y], fn(x, y))
    assert source.startswith("def fn(x, y):")
    assert "# x: f32[2, 3]" in source
    assert "torch.exp(x)" in source
    prim_source = _check_printed_runs(to_prims(graph), [x, y], fn(x, y))
    assert "prims.exp(x)" in prim_source and "from torch.exp" in prim_source


def test_header_shapes_and_strides_in_comments():
    x = torch.randn(4, 3).t()
    graph = kiln.ops.trace(lambda x: x * 2, x)
    source, _ = graph.python_code("after trace (1 ms)")
    assert source.splitlines()[0] == "# after trace (1 ms)"
    assert "f32[3, 4] strides=(1, 3)" in source


def test_constants_dtypes_and_special_floats_print():
    graph = Graph("special")
    x = graph.placeholder("x", TensorMeta((3,), torch.float32))
    const = torch.tensor([1.0, 2.0, 3.0])
    c = graph.constant(const, "weights")
    a = graph.call_prim(prims.add, (x, c), {}, TensorMeta((3,), torch.float32))
    b = graph.call_prim(prims.maximum, (a, -math.inf), {}, TensorMeta((3,), torch.float32))
    d = graph.call_prim(prims.minimum, (b, math.inf), {}, TensorMeta((3,), torch.float32))
    e = graph.call_prim(prims.convert_element_type, (d, torch.float64), {}, TensorMeta((3,), torch.float64))
    graph.output((e, None, 3))
    source, env = graph.python_code()
    assert "-inf" in source and "torch.float64" in source
    assert f"return ({e.name}, None, 3)" in source
    x_val = torch.tensor([0.5, float("nan"), -1.0])
    expected = (torch.maximum(x_val + const, torch.tensor(-math.inf)).double(), None, 3)
    got = compile_python(graph)(x_val)
    torch.testing.assert_close(got[0], expected[0], equal_nan=True)
    assert got[1:] == (None, 3)


def test_fallback_nodes_print_and_run():
    graph = Graph("fb")
    x = graph.placeholder("x", TensorMeta((5,), torch.float32))
    node = graph.call_torch(torch.cumsum, (x, 0), {}, TensorMeta((5,), torch.float32), None)
    graph.output(node)
    source = _check_printed_runs(graph, [torch.arange(5.0)], torch.cumsum(torch.arange(5.0), 0))
    assert "torch.cumsum(x, 0)" in source and "(fallback)" in source


def test_multi_output_nodes_print_getitems():
    graph = Graph("multi")
    x = graph.placeholder("x", TensorMeta((2, 4), torch.float32))
    metas = (TensorMeta((2,), torch.float32), TensorMeta((2,), torch.int64))
    node = graph.call_torch(torch.max, (x, 1), {}, metas, None)
    values, indices = graph.getitem(node, 0), graph.getitem(node, 1)
    graph.output([values, indices])
    (x_val,) = _inputs((2, 4))
    source = _check_printed_runs(graph, [x_val], list(torch.max(x_val, 1)))
    assert f"{values.name} = {node.name}[0]" in source


def test_mutated_inputs_print_a_write_back():
    graph = Graph("mut")
    x = graph.placeholder("x", TensorMeta((3,), torch.float32))
    new = graph.call_prim(prims.add, (x, 1.0), {}, TensorMeta((3,), torch.float32))
    graph.output(None)
    graph.mutated_inputs["x"] = new
    source, _ = graph.python_code()
    assert "_write_back(x, t0)" in source  # (copy_ under no_grad when x requires grad)
    a = torch.zeros(3)
    compile_python(graph)(a)
    torch.testing.assert_close(a, torch.ones(3))
    b = torch.zeros(3)
    run(graph, [b])
    torch.testing.assert_close(b, torch.ones(3))


def test_odd_names_stay_valid_python():
    graph = Graph("odd")
    x = graph.placeholder("input-0", TensorMeta((2,), torch.float32))
    y = graph.placeholder("torch", TensorMeta((2,), torch.float32))  # a reserved name
    z = graph.placeholder("1x", TensorMeta((2,), torch.float32))
    s = graph.call_prim(prims.add, (x, y), {}, TensorMeta((2,), torch.float32))
    graph.output(graph.call_prim(prims.mul, (s, z), {}, TensorMeta((2,), torch.float32)))
    a, b, c = _inputs((2,), (2,), (2,))
    _check_printed_runs(graph, [a, b, c], (a + b) * c)


# ---- the eager backend's function and the interpreter free each value after its last use ---------------

_alive: list = []


def _remember(t):
    """A torch-level target that keeps a weak reference to its result."""
    out = t * 2
    _alive.append(weakref.ref(out))
    return out


def _alive_count(t):
    """How many of the values _remember made are still held (by anything: the function's locals)."""
    return t + sum(r() is not None for r in _alive)


@pytest.mark.parametrize("runner", ["printed", "interpreter"])
def test_a_run_holds_no_dead_value(runner):
    _alive.clear()
    graph = Graph("g")
    meta = TensorMeta((3,), torch.float32)
    x = graph.placeholder("x", meta)
    a = graph.call_torch(_remember, (x,), {}, meta)  # read by b only: dead after b
    b = graph.call_torch(_remember, (a,), {}, meta)  # read by c and returned: held to the end
    c = graph.call_torch(_alive_count, (b,), {}, meta)
    graph.output((c, b))
    fn = compile_python(graph) if runner == "printed" else lambda *a: run(graph, a, torch_level=True)
    count, kept = fn(torch.zeros(3))
    assert count.tolist() == [1.0, 1.0, 1.0]  # b alone: a was freed after its last use
    assert torch.equal(kept, torch.zeros(3))
    assert "del" not in graph.python_code()[0]  # (the printed graph stays as it was)
