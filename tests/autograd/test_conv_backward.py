"""Convolution's backward computes only the gradients some input needs (eager's output_mask): no input
gradient for a first convolution whose input needs none, no weight or bias gradient for frozen ones; and
the gradients it does compute equal eager autograd's."""
from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

import kiln
import kiln.ops
from kiln import config
from kiln.autograd.joint import differentiate
from kiln.graph import to_prims


pytestmark = pytest.mark.usefixtures("kiln_cache")


@pytest.fixture(autouse=True)
def onednn_convolutions():
    """These convolutions are small enough for kiln.ops.conv_gemm (gather + mm, differentiated by its own
    prims); this module is about the extern's backward, so they keep the extern (tests/ops/test_conv_gemm.py
    covers the other path)."""
    with config.patch(conv_gemm_max_macs=0, conv_depthwise_max_macs=0):
        yield


def conv_block(x, w, b):
    return F.relu(F.conv2d(x, w, b, padding=1)).pow(2).sum()


def conv_no_bias(x, w):
    return F.conv2d(x, w, stride=2).tanh().sum()


# (name, function, which of its inputs require grad, the output_mask the backward must use)
CASES = [
    ("first conv: input needs no gradient", conv_block, (False, True, True), (False, True, True)),
    ("everything", conv_block, (True, True, True), (True, True, True)),
    ("frozen weight and bias", conv_block, (True, False, False), (True, False, False)),
    ("frozen bias", conv_block, (False, True, False), (False, True, False)),
    ("no bias, input only", conv_no_bias, (True, False), (True, False, False)),
]


def _inputs(n, requires):
    shapes = [(2, 3, 8, 8), (4, 3, 3, 3), (4,)][:n]
    return [torch.randn(s, dtype=torch.float64).requires_grad_(r) for s, r in zip(shapes, requires)]


def _masks(graph):
    return [n.args[-1] for n in graph.nodes if n.op == "call_prim" and n.target.name == "convolution_backward"]


@pytest.mark.parametrize("name, fn, requires, mask", CASES, ids=[c[0] for c in CASES])
def test_backward_graph_asks_only_for_the_needed_gradients(name, fn, requires, mask):
    inputs = _inputs(len(requires), requires)
    joint = differentiate(to_prims(kiln.ops.trace(fn, *inputs)), list(requires))
    assert [tuple(m) for m in _masks(joint.backward)] == [mask]
    grads = list(joint.backward.output_value)
    assert [g is not None for g in grads] == list(requires)


@pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler")
@pytest.mark.parametrize("name, fn, requires, mask", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compiled_gradients_equal_eager(name, fn, requires, mask, dtype, counters):
    inputs = [t.detach().to(dtype).requires_grad_(r) for t, r in zip(_inputs(len(requires), requires), requires)]
    eager_inputs = [t.detach().clone().requires_grad_(r) for t, r in zip(inputs, requires)]
    kiln.reset()
    compiled = kiln.compile(fn)
    out, ref = compiled(*inputs), fn(*eager_inputs)
    torch.testing.assert_close(out, ref)
    out.backward()
    ref.backward()
    for t, e, r in zip(inputs, eager_inputs, requires):
        assert (t.grad is not None) == r
        if r:
            torch.testing.assert_close(t.grad, e.grad)
    assert counters["autograd"]["backward graphs compiled"] >= 1
    assert not {k: v for k, v in counters["cpp"].items() if k.startswith("ran with torch")}
