"""BatchNorm in training mode through kiln.compile (cpp backend), against eager.

Training-mode batch_norm decomposes into prims, running statistics included: its gradient comes from the
prims' VJP rules (no fallback node, no opaque backward), and the running mean/variance are in-place
updates of the module's buffers that the compiled graph writes back as eager does (the unbiased variance,
momentum or the cumulative average), with grad on or off.
"""
from __future__ import annotations

import copy
import shutil

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import config

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache")]


def _assert_decomposed(counters):
    """batch_norm ran as kiln kernels: no fallback node, no opaque backward, no hand-back to torch."""
    fallbacks = {k: v for k, v in counters["fallback"].items() if "batch_norm" in k}
    refused = {k: v for k, v in counters["no_decomposition"].items() if "batch_norm" in k}
    assert not fallbacks and not refused, (dict(counters["fallback"]), dict(counters["no_decomposition"]))
    assert counters["autograd"]["opaque backward of a fallback op"] == 0, dict(counters["autograd"])
    assert not {k: v for k, v in counters["cpp"].items() if k.startswith("ran with torch")}, \
        dict(counters["cpp"])


def _assert_state_equal(eager, mine, **tol):
    """Parameters, gradients and buffers (running_mean, running_var, num_batches_tracked) of two modules."""
    for (name, p), q in zip(eager.named_parameters(), mine.parameters()):
        torch.testing.assert_close(q, p, msg=lambda m: f"{name}: {m}", **tol)
        if p.grad is not None or q.grad is not None:
            assert p.grad is not None and q.grad is not None, name
            torch.testing.assert_close(q.grad, p.grad, msg=lambda m: f"{name}.grad: {m}", **tol)
    for (name, b), c in zip(eager.named_buffers(), mine.buffers()):
        assert c.dtype == b.dtype, name
        torch.testing.assert_close(c, b, msg=lambda m: f"{name}: {m}", **tol)


_SHAPES = {"1d_nc": (torch.nn.BatchNorm1d, (6, 4)), "1d_ncl": (torch.nn.BatchNorm1d, (3, 4, 7)),
           "2d": (torch.nn.BatchNorm2d, (3, 4, 5, 6)), "3d": (torch.nn.BatchNorm3d, (2, 4, 3, 4, 5))}


def _forward_backward(module_cls, shape, dtype, affine, track, counters):
    torch.manual_seed(0)
    eager = module_cls(4, affine=affine, track_running_stats=track, dtype=dtype)
    if affine:
        with torch.no_grad():  # not the default ones and zeros: the gradients of both are exercised
            eager.weight.uniform_(0.5, 1.5)
            eager.bias.uniform_(-0.5, 0.5)
    mine = copy.deepcopy(eager)
    compiled = kiln.compile(mine)
    x = torch.randn(shape, dtype=dtype) * 2 + 0.5
    x_eager, x_mine = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    for step in range(2):
        grad_out = torch.randn(shape, dtype=dtype)
        out_eager, out_mine = eager(x_eager), compiled(x_mine)
        torch.testing.assert_close(out_mine, out_eager, msg=lambda m: f"step {step} output: {m}")
        out_eager.backward(grad_out)
        out_mine.backward(grad_out)
        torch.testing.assert_close(x_mine.grad, x_eager.grad, msg=lambda m: f"step {step} input grad: {m}")
        _assert_state_equal(eager, mine)
    assert counters["autograd"]["graphs compiled with a backward"] >= 1, dict(counters["autograd"])
    assert counters["autograd"]["backward graphs compiled"] >= 1, dict(counters["autograd"])
    _assert_decomposed(counters)


@pytest.mark.parametrize("track", [True, False], ids=["stats", "no_stats"])
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("kind", list(_SHAPES))
def test_forward_backward_and_running_stats_match_eager(kind, affine, track, counters):
    module_cls, shape = _SHAPES[kind]
    _forward_backward(module_cls, shape, torch.float32, affine, track, counters)


@pytest.mark.parametrize("kind", list(_SHAPES))
def test_forward_backward_float64(kind, counters):
    module_cls, shape = _SHAPES[kind]
    _forward_backward(module_cls, shape, torch.float64, True, True, counters)


def test_momentum_none_is_the_cumulative_average(counters):
    torch.manual_seed(0)
    eager = torch.nn.BatchNorm2d(3, momentum=None)
    mine = copy.deepcopy(eager)
    compiled = kiln.compile(mine)
    for step in range(4):
        x = torch.randn(4, 3, 5, 5) * (step + 1) + step
        torch.testing.assert_close(compiled(x), eager(x), msg=lambda m: f"step {step}: {m}")
        _assert_state_equal(eager, mine)
    assert int(mine.num_batches_tracked) == 4
    assert not {k: v for k, v in counters["fallback"].items() if "batch_norm" in k}, dict(counters["fallback"])


def test_momentum_zero_and_one(counters):
    torch.manual_seed(0)
    for momentum in (0.0, 1.0):
        eager = torch.nn.BatchNorm1d(5, momentum=momentum)
        mine = copy.deepcopy(eager)
        compiled = kiln.compile(mine)
        x = torch.randn(8, 5, 3)
        torch.testing.assert_close(compiled(x), eager(x))
        _assert_state_equal(eager, mine)


def test_channels_last_input(counters):
    torch.manual_seed(0)
    eager = torch.nn.BatchNorm2d(6)
    mine = copy.deepcopy(eager)
    compiled = kiln.compile(mine)
    x = (torch.randn(3, 6, 5, 4) * 3 + 1).to(memory_format=torch.channels_last)
    x_eager, x_mine = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    grad_out = torch.randn(3, 6, 5, 4).to(memory_format=torch.channels_last)
    out_eager, out_mine = eager(x_eager), compiled(x_mine)
    torch.testing.assert_close(out_mine, out_eager)
    out_eager.backward(grad_out)
    out_mine.backward(grad_out)
    torch.testing.assert_close(x_mine.grad, x_eager.grad)
    _assert_state_equal(eager, mine)
    _assert_decomposed(counters)


def test_no_grad_train_mode_updates_running_stats(counters):
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    mine = copy.deepcopy(eager)
    compiled = kiln.compile(mine)
    with torch.no_grad():
        for step in range(3):
            x = torch.randn(2, 3, 7, 7) + step
            torch.testing.assert_close(compiled(x), eager(x), msg=lambda m: f"step {step}: {m}")
    _assert_state_equal(eager, mine)
    assert int(mine[1].num_batches_tracked) == 3
    _assert_decomposed(counters)


def test_inference_mode_train_mode_updates_running_stats(counters):
    torch.manual_seed(0)
    eager = torch.nn.BatchNorm1d(4)
    mine = copy.deepcopy(eager)
    compiled = kiln.compile(mine)
    x = torch.randn(5, 4, 3)
    with torch.inference_mode():
        out_mine = compiled(x)
    with torch.inference_mode():
        out_eager = eager(x)
    torch.testing.assert_close(out_mine, out_eager)
    _assert_state_equal(eager, mine)


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)
        self.conv2, self.bn2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)) + y)
        return self.head(y.mean((2, 3)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sgd_steps_of_a_convnet_match_eager(dtype, counters):
    torch.manual_seed(0)
    eager = ConvNet().to(dtype)
    mine = copy.deepcopy(eager)
    compiled = kiln.compile(mine)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (eager, mine)]
    for step in range(5):
        x, target = torch.randn(4, 3, 8, 8, dtype=dtype), torch.randint(0, 5, (4,))
        losses = []
        for fn, opt in zip((eager, compiled), opts):
            opt.zero_grad()
            loss = F.cross_entropy(fn(x), target)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], msg=lambda m: f"step {step} loss: {m}")
        _assert_state_equal(eager, mine, rtol=1e-4, atol=1e-5)
    assert int(mine.bn1.num_batches_tracked) == 5
    _assert_decomposed(counters)
    assert counters["autograd"]["graphs compiled with a backward"] == 1, dict(counters["autograd"])

    # eval after training: the running statistics the compiled steps left, used by a new graph
    eager.eval()
    mine.eval()
    x = torch.randn(2, 3, 8, 8, dtype=dtype)
    torch.testing.assert_close(compiled(x), eager(x), rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), eager(x), rtol=1e-4, atol=1e-5)
    _assert_state_equal(eager, mine, rtol=1e-4, atol=1e-5)


def test_functional_batch_norm_on_user_tensors(counters):
    """F.batch_norm called directly with tensors the function closes over (globals of the program)."""
    torch.manual_seed(0)
    stats = [torch.zeros(4), torch.ones(4)]
    expected_stats = [t.clone() for t in stats]
    w = torch.randn(4, requires_grad=True)
    w_eager = w.detach().clone().requires_grad_(True)

    def step(x, rm, rv, weight):
        return F.batch_norm(x * 2, rm, rv, weight, None, training=True, momentum=0.2).square().sum()

    compiled = kiln.compile(step)
    for i in range(3):
        x = torch.randn(6, 4, 3)
        compiled(x, *stats, w).backward()
        step(x, *expected_stats, w_eager).backward()
        for a, e in zip(stats, expected_stats):
            torch.testing.assert_close(a, e, msg=lambda m: f"call {i}: {m}")
        torch.testing.assert_close(w.grad, w_eager.grad, msg=lambda m: f"call {i}: {m}")
    _assert_decomposed(counters)
