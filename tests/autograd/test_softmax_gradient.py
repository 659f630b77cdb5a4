"""The maximum softmax, log_softmax and logsumexp subtract carries no gradient (prims.stop_gradient).

Softmax does not depend on the shift, so eager's backward reads only the output; kiln's decompositions
subtract the maximum of a stop_gradient of the input, so the backward built from the prims' VJP rules
never compares the input with its maximum and the forward does not keep the pre-softmax scores for it.
Gradients are compared with eager's through kiln.compile (cpp backend) on float32 and float64.
"""
from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

import kiln
import kiln.ops
from kiln import config, prims
from kiln import graph as kg
from kiln.autograd.joint import differentiate

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache")]


FUNCTIONS = {
    "softmax": lambda x: F.softmax(x * 1.5, -1),
    "softmax_dim0": lambda x: torch.softmax(x, 0),
    "log_softmax": lambda x: F.log_softmax(x - 0.5, 1),
    "softmin": lambda x: F.softmin(x, -1),
    "logsumexp": lambda x: torch.logsumexp(x * 2, -1),
    "cross_entropy": lambda x: F.cross_entropy(x.reshape(-1, x.shape[-1]), torch.arange(x.shape[0] * x.shape[1])
                                               .remainder(x.shape[-1])),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_gradient_matches_eager(name, dtype, counters):
    fn = FUNCTIONS[name]
    torch.manual_seed(0)
    x = torch.randn(3, 5, 7, dtype=dtype) * 4  # large enough that the maximum matters for exp
    x_eager, x_mine = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    compiled = kiln.compile(fn)
    out_eager, out_mine = fn(x_eager), compiled(x_mine)
    torch.testing.assert_close(out_mine, out_eager)
    grad_out = torch.randn_like(out_eager)
    out_eager.backward(grad_out)
    out_mine.backward(grad_out)
    torch.testing.assert_close(x_mine.grad, x_eager.grad)
    assert counters["autograd"]["backward graphs compiled"] == 1, dict(counters["autograd"])
    # no torch op ran as a fallback, and the prims of the shift lowered into kernels (cross_entropy's
    # gather and integer remainder run in the wrapper, which is not this test's business)
    ran_whole = {k for k in counters["fallback"] if not k.startswith("prims.")} | \
        {k for k in counters["fallback"] if k in ("prims.stop_gradient", "prims.amax", "prims.exp")}
    assert not ran_whole, dict(counters["fallback"])


def test_ties_in_the_maximum_share_no_gradient(counters):
    """Several elements equal to the row maximum: amax's own rule would split a gradient between them."""
    x = torch.tensor([[2.0, 2.0, 1.0, 2.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    x_eager, x_mine = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    compiled = kiln.compile(lambda t: F.log_softmax(t, -1))
    grad_out = torch.tensor([[1.0, -2.0, 0.5, 3.0], [1.0, 2.0, 3.0, 4.0]], dtype=torch.float64)
    compiled(x_mine).backward(grad_out)
    F.log_softmax(x_eager, -1).backward(grad_out)
    torch.testing.assert_close(x_mine.grad, x_eager.grad)


def _joint(fn, x):
    prim_graph = kg.to_prims(kiln.ops.trace(fn, x))
    return prim_graph, differentiate(prim_graph, [True])


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "logsumexp"])
def test_backward_does_not_differentiate_the_maximum(name):
    x = torch.randn(4, 6, requires_grad=True)
    prim_graph = kg.to_prims(kiln.ops.trace(FUNCTIONS[name], x))
    joint = differentiate(prim_graph, [True])
    stops = [n for n in prim_graph.nodes if n.op == "call_prim" and n.target is prims.stop_gradient]
    assert len(stops) == 1
    scores = stops[0].args[0]  # the pre-softmax scores (the scaled or shifted input)
    assert scores.op == "call_prim"
    backward_prims = {n.target.name for n in joint.backward.nodes if n.op == "call_prim"}
    assert not backward_prims & {"eq", "amax", "where"}, joint.backward
    # the backward reads neither the scores nor their maximum (the forward's copies carry the names)
    saved = {n.name for n in joint.forward.output_value[joint.user_leaves:]}
    maxima = {n.name for n in prim_graph.nodes if n.op == "call_prim" and n.target is prims.amax}
    assert scores.name not in saved and not saved & maxima, (saved, joint.backward)


def test_stop_gradient_prim():
    x = torch.randn(3, 4, requires_grad=True)
    y = prims.stop_gradient(x)
    assert torch.equal(y, x) and not y.requires_grad
    rule = prims.stop_gradient.rules["vjp"]
    assert rule((torch.ones(3, 4),), (y,), x) == (None,)
    t = torch.randn(4, 6).t()
    assert prims.stop_gradient.meta(kg.TensorMeta.of(t)) == kg.TensorMeta.of(t)
