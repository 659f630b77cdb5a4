"""Compiled forward and backward (kiln.autograd + kiln.backends.aot) against eager autograd.

Every test runs the same program eagerly and through kiln.compile (cpp backend) and compares outputs,
gradients, and whatever else the program touches (optimizer state, running statistics), and checks with
the counters that kiln's kernels ran (graphs compiled with a backward, backward graphs compiled) rather
than a hand-back to torch.
"""
from __future__ import annotations

import copy
import shutil

import pytest
import torch
import torch.nn.functional as F

import kiln
import kiln.ops
from kiln import config

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache")]


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.norm, self.fc2 = torch.nn.Linear(12, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 5)

    def forward(self, x):
        return self.fc2(self.norm(F.gelu(self.fc1(x))))


def _pair(module):
    torch.manual_seed(0)
    eager = module()
    compiled_module = copy.deepcopy(eager)
    return eager, compiled_module, kiln.compile(compiled_module)


def _assert_grads_equal(a, b, **tol):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert q.grad is not None, name
        torch.testing.assert_close(q.grad, p.grad, msg=lambda m: f"{name}: {m}", **tol)


def _handed_to_torch(counters):
    return {k: v for k, v in counters["cpp"].items() if k.startswith("ran with torch")}


def test_mlp_backward_matches_eager(counters):
    eager, module, compiled = _pair(MLP)
    x = torch.randn(7, 12)
    out, ref = compiled(x), eager(x)
    torch.testing.assert_close(out, ref)
    assert out.requires_grad and out.grad_fn is not None
    out.pow(2).sum().backward()
    ref.pow(2).sum().backward()
    _assert_grads_equal(eager, module)
    assert not _handed_to_torch(counters), dict(counters["cpp"])
    assert counters["autograd"]["graphs compiled with a backward"] >= 1
    assert counters["autograd"]["backward graphs compiled"] >= 1


def test_grad_enabled_inference_runs_kernels_and_compiles_no_backward(counters):
    eager, module, compiled = _pair(MLP)
    eager.eval(), module.eval()
    x = torch.randn(3, 12)
    torch.testing.assert_close(compiled(x), eager(x))  # grad mode on, parameters require grad
    assert counters["autograd"]["graphs compiled with a backward"] >= 1
    assert counters["autograd"]["backward graphs compiled"] == 0
    assert not _handed_to_torch(counters), dict(counters["cpp"])


def test_no_grad_and_inference_mode_skip_the_backward(counters):
    eager, module, compiled = _pair(MLP)
    x = torch.randn(3, 12)
    with torch.no_grad():
        out = compiled(x)
    assert not out.requires_grad
    torch.testing.assert_close(out, eager(x).detach())
    with torch.inference_mode():
        torch.testing.assert_close(compiled(x), eager(x))
    assert counters["autograd"]["backward graphs compiled"] == 0


def test_autograd_grad_retain_graph_and_accumulation():
    eager, module, compiled = _pair(MLP)
    x1, x2 = torch.randn(4, 12), torch.randn(6, 12)
    for step_x in (x1, x2):  # gradients accumulate over two steps
        compiled(step_x).sum().backward()
        eager(step_x).sum().backward()
    _assert_grads_equal(eager, module)
    out = compiled(x1).tanh().sum()
    ref = eager(x1).tanh().sum()
    g1 = torch.autograd.grad(out, list(module.parameters()), retain_graph=True)
    g2 = torch.autograd.grad(out, list(module.parameters()))  # the graph was retained
    e1 = torch.autograd.grad(ref, list(eager.parameters()))
    for a, b, e in zip(g1, g2, e1):
        torch.testing.assert_close(a, e)
        torch.testing.assert_close(b, e)


def test_gradients_reach_inputs_and_hooks_run():
    eager, module, compiled = _pair(MLP)
    x = torch.randn(5, 12, requires_grad=True)
    xe = x.detach().clone().requires_grad_(True)
    seen = []
    module.fc1.weight.register_hook(lambda g: seen.append(g.shape) or g * 2)
    eager.fc1.weight.register_hook(lambda g: g * 2)
    compiled(x).sum().backward()
    eager(xe).sum().backward()
    assert seen == [module.fc1.weight.shape]
    torch.testing.assert_close(x.grad, xe.grad)
    _assert_grads_equal(eager, module)


def test_double_backward_recomputes_on_the_interpreter(counters):
    w = torch.randn(6, requires_grad=True)
    f = kiln.compile(lambda x: (torch.sin(x * w) * x).sum())
    x = torch.randn(6, requires_grad=True)
    xe = x.detach().clone().requires_grad_(True)
    (gx,) = torch.autograd.grad(f(x), x, create_graph=True)
    (ge,) = torch.autograd.grad((torch.sin(xe * w) * xe).sum(), xe, create_graph=True)
    torch.testing.assert_close(gx, ge)
    (ggx,) = torch.autograd.grad(gx.sum(), x)
    (gge,) = torch.autograd.grad(ge.sum(), xe)
    torch.testing.assert_close(ggx, gge)
    assert counters["autograd"]["create_graph: forward recomputed on the prim interpreter"] >= 1


def test_sgd_steps_match_eager():
    eager, module, compiled = _pair(MLP)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    opt_k = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(1)
    for _ in range(5):
        x, y = torch.randn(8, 12), torch.randint(0, 5, (8,))
        for model, opt in ((eager, opt_e), (compiled, opt_k)):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
    for p, q in zip(eager.parameters(), module.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)


class ConvBN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.head(F.relu(self.bn(self.conv(x))).mean((2, 3)))


def test_batchnorm_training_updates_running_stats_as_eager():
    eager, module, compiled = _pair(ConvBN)
    x = torch.randn(2, 3, 6, 6)
    compiled(x).sum().backward()
    eager(x).sum().backward()
    torch.testing.assert_close(module.bn.running_mean, eager.bn.running_mean)
    torch.testing.assert_close(module.bn.running_var, eager.bn.running_var)
    assert module.bn.num_batches_tracked == eager.bn.num_batches_tracked
    _assert_grads_equal(eager, module, rtol=1e-4, atol=1e-5)


def test_dropout_mask_is_the_forwards_in_the_backward():
    w = torch.randn(50, requires_grad=True)
    we = w.detach().clone().requires_grad_(True)
    f = kiln.compile(lambda x: F.dropout(x * w, 0.5, training=True).sum())
    x = torch.randn(50)
    torch.manual_seed(3)
    f(x).backward()
    torch.manual_seed(3)
    F.dropout(x * we, 0.5, training=True).sum().backward()
    torch.testing.assert_close(w.grad, we.grad)


def test_outputs_that_are_views_of_inputs_stay_views(counters):
    w = torch.randn(4, 6, requires_grad=True)
    f = kiln.compile(lambda w: (w.t(), (w * 2).sum(0)))
    view, total = f(w)
    assert view._base is w and view.shape == (6, 4)
    (view.sum() * 3 + total.sum()).backward()
    torch.testing.assert_close(w.grad, torch.full_like(w, 5.0))
    assert not _handed_to_torch(counters), dict(counters["cpp"])


def test_backward_of_a_transposed_output_runs_compiled(counters):
    # regression: the backward was traced with the output's strides for its gradient, the glue passes the
    # gradient contiguous, so every call ran the backward with torch (and a view in it failed there)
    w = torch.randn(6, 4, requires_grad=True)
    we = w.detach().clone().requires_grad_(True)
    f = kiln.compile(lambda x, w: torch.transpose(torch.tanh(x @ w), 0, 1))  # a [5, 3, 4] view of [3, 5, 4]
    x = torch.randn(3, 5, 6)
    weight = torch.arange(60.0).reshape(5, 3, 4)
    for _ in range(2):
        out = f(x, w)
        assert not out.is_contiguous()
        (out * weight).sum().backward()
        (torch.transpose(torch.tanh(x @ we), 0, 1) * weight).sum().backward()
    assert counters["cpp"]["input layout changed: ran the graph with torch"] == 0, dict(counters["cpp"])
    assert not _handed_to_torch(counters), dict(counters["cpp"])
    torch.testing.assert_close(w.grad, we.grad, rtol=1e-5, atol=1e-5)  # (float32 sums of 60 terms, reordered)


def test_random_fallback_op_replays_its_draws_in_the_backward(counters):
    # grouped-query attention with dropout runs as a torch op (a fallback); its opaque backward must see the
    # forward's mask
    q = torch.randn(2, 4, 8, 4, requires_grad=True)
    qe = q.detach().clone().requires_grad_(True)
    w = torch.randn(4, 4)

    def attention(q):
        k = q[:, :2] @ w
        return F.scaled_dot_product_attention(q, k, k, dropout_p=0.5, is_causal=True, enable_gqa=True).sum()
    f = kiln.compile(attention)
    torch.manual_seed(5)
    f(q).backward()
    torch.manual_seed(5)
    attention(qe).backward()
    torch.testing.assert_close(q.grad, qe.grad)
    assert counters["autograd"]["opaque backward of a fallback op"] >= 1


def test_gradients_flow_across_a_graph_break(counters):
    w = torch.randn(5, requires_grad=True)
    we = w.detach().clone().requires_grad_(True)

    def fn(x, w):
        y = torch.tanh(x * w)
        if y.sum() > 0:  # a branch on a value: the graph breaks here
            y = y * 2
        return (y.exp() * w).sum()
    f = kiln.compile(fn)
    for x in (torch.randn(5), -torch.ones(5)):
        w.grad = we.grad = None
        f(x, w).backward()
        fn(x, we).backward()
        torch.testing.assert_close(w.grad, we.grad)
    assert counters["autograd"]["graphs compiled with a backward"] >= 2
    assert not _handed_to_torch(counters), dict(counters["cpp"])


def test_multi_output_fallback_inside_the_graph_gets_its_gradient(counters):
    # regression: the outputs of a torch op kiln cannot decompose, with several outputs, got a zero gradient
    x = torch.randn(5, 4, requires_grad=True)
    xe = x.detach().clone().requires_grad_(True)

    def fn(x):
        q, r = torch.linalg.qr(x * 2)
        return (q.sin() * 3).sum() + r.cos().sum()
    kiln.compile(fn)(x).backward()
    fn(xe).backward()
    torch.testing.assert_close(x.grad, xe.grad)
    assert counters["autograd"]["opaque backward of a fallback op"] >= 1
    assert not _handed_to_torch(counters), dict(counters["cpp"])


def test_output_straight_from_a_torch_op_is_handed_to_torch_counted(counters):
    # its result may be a view of an input (tensor_split with tensor indices): autograd must see that
    x = torch.randn(5, 5, requires_grad=True)
    parts = kiln.compile(lambda x, i: torch.tensor_split(x, i))(x, torch.tensor([1, 3]))
    sum(p.sum() * (k + 1) for k, p in enumerate(parts)).backward()
    expected = torch.tensor([1.0, 2, 2, 3, 3]).unsqueeze(1).expand(5, 5)
    torch.testing.assert_close(x.grad, expected)
    assert any("straight from the torch op" in k for k in _handed_to_torch(counters)), dict(counters["cpp"])


def test_safe_softmax_fully_masked_rows_have_zero_gradient():
    # regression: rows that are entirely -inf gave NaN gradients through the where in the decomposition
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    x[1, :, :2] = float("-inf")  # softmax over dim 1: columns entirely -inf, and some partly
    x[0, 1, 0] = x[1, 0, 3] = float("-inf")
    x.requires_grad_(True)
    xe = x.detach().clone().requires_grad_(True)
    op = torch.ops.aten._safe_softmax.default
    w = torch.randn(2, 3, 4, dtype=torch.float64)
    from kiln.backends import lookup_backend
    fn = lambda x: op(x, 1)  # noqa: E731
    compiled = lookup_backend("cpp")(kiln.ops.trace(fn, x), [x])
    (compiled(x) * w).sum().backward()
    (fn(xe) * w).sum().backward()
    torch.testing.assert_close(x.grad, xe.grad)
    assert not x.grad.isnan().any()


def test_outputs_eager_marks_as_requiring_grad_do_too():
    # fill(x, v) reads x only nominally: eager's result requires grad (its gradient is zero)
    x = torch.randn(4, requires_grad=True)
    out = kiln.compile(lambda x: (torch.fill(x, 2.0), x * 3))(x)
    assert out[0].requires_grad == torch.fill(x, 2.0).requires_grad
    (out[0].sum() + out[1].sum()).backward()
    torch.testing.assert_close(x.grad, torch.full((4,), 3.0))
