"""Grad-mode switches split a captured graph into segments compiled one by one: no backend graph holds a
`torch._C._set_grad_enabled` node, so passes (verify, cse, dce) and backends see only tensor ops, and
gradients equal eager's."""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln.graph import cse, dce, run, verify


def same_op_with_and_without_grad(x):
    with torch.no_grad():
        a = x * 2
    b = x * 2  # the same op with grad: cse must not merge it with `a`
    return a + b


def nested_modes(x):
    with torch.no_grad():
        y = x.exp()
        with torch.enable_grad():
            z = x * y
    return (z + y).sum()


def set_grad_enabled_block(x, w):
    with torch.set_grad_enabled(False):
        s = (x @ w).sum()
    return x @ w + s


def inplace_input_in_no_grad(x, buf):
    with torch.no_grad():
        buf.mul_(0.9).add_(x.detach().mean(0) * 0.1)
    return (x * buf).sum()


def recording_backend(seen):
    def backend(graph, example_inputs):
        assert not any(n.op == "call_torch" and n.target is torch._C._set_grad_enabled for n in graph.nodes)
        verify(graph)
        graph = dce(cse(graph))
        verify(graph)
        seen.append(graph)
        return lambda *inputs: run(graph, inputs, torch_level=True)
    return backend


@pytest.mark.parametrize("fn,shapes", [(same_op_with_and_without_grad, [(4, 8)]), (nested_modes, [(3, 5)]),
                                       (set_grad_enabled_block, [(4, 8), (8, 3)])])
def test_segments_gradients_equal_eager(fn, shapes):
    kiln.reset()
    torch.manual_seed(0)
    inputs = [torch.randn(*s, requires_grad=True) for s in shapes]
    ref_inputs = [t.detach().clone().requires_grad_() for t in inputs]
    seen = []
    compiled = kiln.compile(fn, backend=recording_backend(seen))
    out = compiled(*inputs)
    ref = fn(*ref_inputs)
    torch.testing.assert_close(out, ref)
    assert out.requires_grad == ref.requires_grad and torch.is_grad_enabled()
    out.sum().backward()
    ref.sum().backward()
    for a, b in zip(inputs, ref_inputs):
        torch.testing.assert_close(a.grad, b.grad)
    assert len(seen) >= 2  # one compiled graph per segment


def test_inplace_input_inside_no_grad():
    kiln.reset()
    x = torch.randn(4, 8, requires_grad=True)
    buf, ref_buf = torch.ones(8), torch.ones(8)
    compiled = kiln.compile(inplace_input_in_no_grad, backend="eager")
    for _ in range(2):
        torch.testing.assert_close(compiled(x, buf), inplace_input_in_no_grad(x, ref_buf))
        torch.testing.assert_close(buf, ref_buf)


@pytest.mark.parametrize("backend", ["eager", "prims", "cpp"])
def test_segments_on_backends(backend):
    kiln.reset()
    x = torch.randn(4, 8, requires_grad=True)
    compiled = kiln.compile(nested_modes, backend=backend)
    torch.testing.assert_close(compiled(x), nested_modes(x))
    assert torch.is_grad_enabled()


def test_grad_mode_restored_when_a_segment_raises():
    def failing_backend(graph, example_inputs):
        def call(*inputs):
            if not torch.is_grad_enabled():
                raise RuntimeError("segment failed")
            return run(graph, inputs, torch_level=True)
        return call
    kiln.reset()
    compiled = kiln.compile(nested_modes, backend=failing_backend)
    with pytest.raises(RuntimeError, match="segment failed"):
        compiled(torch.randn(3, 5))
    assert torch.is_grad_enabled()
