"""Training with symbolic sizes: a graph whose inputs need gradients compiles its forward once for every
size, and its backward once on the first backward, on the cpp backend. Every step is compared with eager
autograd: outputs, gradients of inputs and parameters, and parameters after SGD steps."""
from __future__ import annotations

import copy
import shutil

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import config
from kiln.testing import models as zoo

pytestmark = pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler")

W = torch.randn(16, 16, generator=torch.Generator().manual_seed(0)).requires_grad_()
SHAPES = [(2, 5), (3, 7), (4, 9), (2, 6)]


def f_sum(x): return x.sum() * 2  # the backward has none of x's sizes: they reach it as an empty tensor's
def f_mean_weight(x): return (x * W.sum()).mean(0)
def f_layer_norm(x): return F.layer_norm(x, (16,)).tanh()
def f_softmax(x): return torch.softmax(x @ W, -1)
def f_view_out(x): return (x * 2).view(-1)
def f_broadcast(x): return x + W[0]
def f_expand(x): return x[:, :1].expand(-1, x.shape[1], -1) * 3
def f_sdpa(x):
    b, t = x.shape[:2]
    q = x.view(b, t, 2, 8).transpose(1, 2)
    return F.scaled_dot_product_attention(q, q, q, is_causal=True)
def f_input_view(x): return x.view(-1), (x @ W).sum(-1)  # an output that is a view of the input


@pytest.mark.parametrize("fn", [f_sum, f_mean_weight, f_layer_norm, f_softmax, f_view_out, f_broadcast,
                                f_expand, f_sdpa, f_input_view], ids=lambda f: f.__name__)
def test_gradients_match_eager_at_every_size(fn, counters):
    compiled = kiln.compile(fn, backend="cpp")
    gen = torch.Generator().manual_seed(3)
    for b, t in SHAPES:
        x = torch.randn(b, t, 16, generator=gen)
        xk, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
        with config.patch(raise_on_error=True, dynamic_compile_after=1):
            got = compiled(xk)
        expected = fn(xe)
        got, expected = (got if isinstance(got, tuple) else (got,)), \
            (expected if isinstance(expected, tuple) else (expected,))
        cot = [torch.randn(e.shape, generator=gen) for e in expected]
        gk = torch.autograd.grad(got, (xk, W), cot, allow_unused=True)
        ge = torch.autograd.grad(expected, (xe, W), cot, allow_unused=True)
        for a, e in zip(got, expected):
            torch.testing.assert_close(a, e)
        for a, e in zip(gk, ge):
            assert (a is None) == (e is None)
            if a is not None:
                torch.testing.assert_close(a, e, msg=lambda m: f"at {(b, t)}: {m}")
    assert sum(counters["dynamic_symbolic_compiles"].values()) == 1, dict(counters["dynamic_symbolic_failed"])
    assert counters["autograd"]["backward graphs compiled"] == 2  # the first capture's, the symbolic one's
    assert not counters["dynamic_backend_compiles"]


W64 = W.detach().double().requires_grad_()


def f_input_view64(x): return x.view(-1), (x @ W64).sum(-1)


def test_no_grad_and_create_graph_through_a_symbolic_graph(counters):
    compiled = kiln.compile(f_input_view64, backend="cpp")
    for b, t in SHAPES:
        x = torch.randn(b, t, 16, dtype=torch.float64)  # (float64: the sums' order does not show)
        with torch.no_grad(), config.patch(dynamic_compile_after=1):
            torch.testing.assert_close(compiled(x)[1], f_input_view64(x)[1])
        xk, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
        with config.patch(dynamic_compile_after=1):
            gk, = torch.autograd.grad(compiled(xk)[1].pow(2).sum(), xk, create_graph=True)
        ge, = torch.autograd.grad(f_input_view64(xe)[1].pow(2).sum(), xe, create_graph=True)
        torch.testing.assert_close(gk, ge)
        torch.testing.assert_close(torch.autograd.grad(gk.sum(), xk)[0], torch.autograd.grad(ge.sum(), xe)[0])
    assert counters["autograd"]["create_graph: forward recomputed on the prim interpreter"] == len(SHAPES)


def test_a_backward_that_cannot_compile_for_every_size_compiles_per_size(counters, monkeypatch):
    from kiln.backends import aot
    real = aot._State.run_backward

    def refuse_symbolic(self, inputs):
        if self.backward is None and self.sizes is not None:
            compile_graph = self.compile_graph

            def failing(graph, example, context):
                if graph is self.joint.backward:
                    raise NotImplementedError("refused for the test")
                return compile_graph(graph, example, context)
            self.compile_graph = failing
        return real(self, inputs)
    monkeypatch.setattr(aot._State, "run_backward", refuse_symbolic)

    def f_log_softmax(x):  # (a graph no other test compiles: none of its compiles is cached)
        return torch.log_softmax(x @ W64, -1) * 3
    compiled = kiln.compile(f_log_softmax, backend="cpp")
    for b, t in SHAPES:
        x = torch.randn(b, t, 16, dtype=torch.float64)
        xk, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
        with config.patch(dynamic_compile_after=1):
            compiled(xk).pow(2).sum().backward()
        f_log_softmax(xe).pow(2).sum().backward()
        torch.testing.assert_close(xk.grad, xe.grad)
    assert any("backward" in k and "refused for the test" in k for k in counters["dynamic_symbolic_failed"])
    assert counters["dynamic_backend_compiles"]["f_log_softmax backward"] == len(SHAPES) - 1


@pytest.mark.parametrize("name", ["mlp", "nanogpt_tiny"])
def test_sgd_steps_at_changing_sizes_match_eager(name, counters):
    spec = zoo.get(name)
    torch.manual_seed(0)
    model = spec.factory().train()
    ref = copy.deepcopy(model)
    compiled = kiln.compile(model)
    opt, opt_ref = (torch.optim.SGD(m.parameters(), lr=0.05) for m in (model, ref))
    for step, (b, t) in enumerate([(2, 8), (3, 12), (2, 16), (4, 10), (3, 9)]):
        gen = torch.Generator().manual_seed(step)
        if name == "mlp":
            args, kwargs = spec.make_inputs(b * t, gen)
        else:
            args, kwargs = (torch.randint(0, 256, (b, t), generator=gen),), {}
        with config.patch(raise_on_error=True, dynamic_compile_after=1):
            loss = compiled(*args, **kwargs).pow(2).mean()
            loss.backward()
        opt.step()
        opt.zero_grad()
        loss_ref = ref(*args, **kwargs).pow(2).mean()
        loss_ref.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        torch.testing.assert_close(loss, loss_ref)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q)
    assert sum(counters["dynamic_symbolic_compiles"].values()) == 1, dict(counters["dynamic_symbolic_failed"])
    assert not counters["dynamic_backend_compiles"]
    assert counters["autograd"]["backward graphs compiled"] == 2
