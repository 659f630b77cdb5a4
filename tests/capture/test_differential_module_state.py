"""Differential modules for training state: frozen parameters, dropout, train/eval toggled inside forward,
BatchNorm statistics, buffers and `.data` updated in forward, RNG seeded inside forward, grad mode and
inference_mode around the call. Each runs eagerly and compiled; compared on results (values, dtype, shape,
strides, requires_grad, is_leaf, grad_fn, inference-ness), the module's state afterwards and the parameters'
gradients. ToggleEval's weight gradient was wrong before 75947cd (tests/autograd/test_partition.py)."""
from __future__ import annotations

import copy

import pytest
import torch
from diff_helpers import autograd_signature, tensor_values

import kiln



class Frozen(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 2)
        self.a.weight.requires_grad_(False)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class Drop(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.d = torch.nn.Dropout(0.5)
        self.l = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.d(self.l(x))


class ToggleEval(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(4)

    def forward(self, x):  # (the backward once recomputed from the updated statistics)
        y = self.bn(x)
        self.bn.eval()
        z = self.bn(x)
        self.bn.train()
        return y, z


class BNTrain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(4, momentum=None)

    def forward(self, x):
        return self.bn(x) * 2


class BufUpdate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        self.count += 1
        return x * self.count


class ParamData(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 4)

    def forward(self, x):
        self.l.weight.data = self.l.weight.data * 0.5
        return self.l(x)


class SeedInside(torch.nn.Module):

    def forward(self, x):
        torch.manual_seed(3)
        return x + torch.rand_like(x)


class RandNoSeed(torch.nn.Module):

    def forward(self, x):
        return x + torch.randn(x.shape)


class DefaultDtype(torch.nn.Module):

    def forward(self, x):
        return torch.arange(4.0) + x, torch.tensor(1.5) * x


class GradAccum(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.l(x).sum() if self.training else self.l(x)


class Detached(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.l(x)
        return h.detach() * h


class Inference(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.l(x) * 2


MODELS = {cls.__name__: cls for cls in (Frozen, Drop, ToggleEval, BNTrain, BufUpdate, ParamData, SeedInside,
                                        RandNoSeed, DefaultDtype, GradAccum, Detached, Inference)}


def _run(model, mode, call):
    torch.manual_seed(0)
    x = torch.randn(5, 4)
    torch.manual_seed(1)
    try:
        if mode == "inference_mode":
            with torch.inference_mode():
                result = call(x)
        elif mode == "no_grad":
            with torch.no_grad():
                result = call(x)
        else:
            result = call(x)
    except Exception as e:  # (eager's exception is part of the behaviour compared)
        result = e
    grads = None
    outs = [t for t in (result if isinstance(result, tuple) else (result,))
            if isinstance(t, torch.Tensor) and t.requires_grad]
    if outs:
        sum(t.sum() for t in outs).backward()
        grads = {n: p.grad for n, p in model.named_parameters()}
    return result, {k: v.detach().clone() for k, v in model.state_dict().items()}, grads


@pytest.mark.parametrize("mode", ["grad", "no_grad", "inference_mode"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_module_state_program(name, train, mode):
    torch.manual_seed(5)
    model = MODELS[name]()
    model.train(train)
    twin = copy.deepcopy(model)
    expected = _run(model, mode, model)
    kiln.reset()
    got = _run(twin, mode, kiln.compile(twin))
    assert autograd_signature(got[0], layout=True) == autograd_signature(expected[0], layout=True)
    for a, b in zip(tensor_values(got[0]), tensor_values(expected[0])):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(got[1], expected[1])
    assert (got[2] is None) == (expected[2] is None)
    if expected[2] is not None:
        torch.testing.assert_close(got[2], expected[2])


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) + 1


@pytest.mark.parametrize("where", ["submodule", "module", "through_the_wrapper"])
def test_forward_assigned_after_compiling_is_what_runs(where):
    """`module.forward = fn` after the first compiled call (a patch, a library's wrapper): the next call runs
    fn, as eagerly. Wrong before: the submodule's and the module's old forward kept running."""
    kiln.reset()
    torch.manual_seed(0)
    model = _Block()
    twin = copy.deepcopy(model)
    compiled = kiln.compile(twin)
    x = torch.randn(2, 4)
    torch.testing.assert_close(compiled(x), model(x))
    for target in ([model.fc, twin.fc] if where == "submodule" else [model, twin]):
        patched = (lambda x: x * 0 - 3) if where == "submodule" else (lambda x: x * 5)
        if where == "through_the_wrapper" and target is twin:
            compiled.forward = patched
        else:
            target.forward = patched
    torch.testing.assert_close(compiled(x), model(x))
    torch.testing.assert_close(compiled.forward(x), model.forward(x))
    for target in ([model.fc, twin.fc] if where == "submodule" else [model, twin]):
        del target.forward  # the class's again
    torch.testing.assert_close(compiled(x), model(x))
