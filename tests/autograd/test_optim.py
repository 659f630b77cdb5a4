"""kiln.compile(opt.step): SGD, Adam and AdamW steps as one compiled update, state equal to eager's."""
from __future__ import annotations

import shutil
import warnings

import pytest
import torch

import kiln
from kiln import config
from kiln.counters import counters

pytestmark = pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler")

CASES = [
    ("sgd", torch.optim.SGD, dict(lr=0.05)),
    ("sgd_momentum", torch.optim.SGD, dict(lr=0.05, momentum=0.9)),
    ("sgd_nesterov_wd", torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("sgd_dampening_maximize", torch.optim.SGD, dict(lr=0.05, momentum=0.5, dampening=0.3, maximize=True)),
    ("adam", torch.optim.Adam, dict(lr=1e-2)),
    ("adam_wd_amsgrad", torch.optim.Adam, dict(lr=1e-2, weight_decay=0.1, amsgrad=True)),
    ("adamw", torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.05)),
]


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _train(model, opt, step, steps=5, scheduler=None):
    torch.manual_seed(1)
    for _ in range(steps):
        x = torch.randn(4, 6)
        model(x).pow(2).mean().backward()
        step()
        opt.zero_grad()
        if scheduler is not None:
            scheduler.step()


def _same_state(a, b, oa, ob):
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
        sa, sb = oa.state[p], ob.state[q]
        assert set(sa) == set(sb)
        for k in sa:
            assert type(sa[k]) is type(sb[k])
            if isinstance(sa[k], torch.Tensor):
                assert sa[k].dtype == sb[k].dtype and sa[k].shape == sb[k].shape
                torch.testing.assert_close(sa[k], sb[k], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name,cls,kw", CASES, ids=[c[0] for c in CASES])
def test_compiled_step_equals_eager(name, cls, kw):
    model, ref = _model(), _model()
    opt, ref_opt = cls(model.parameters(), **kw), cls(ref.parameters(), **kw)
    step = kiln.compile(opt.step)
    _train(model, opt, step)
    _train(ref, ref_opt, ref_opt.step)
    _same_state(model, ref, opt, ref_opt)
    assert counters["optimizer_compiled"][cls.__name__] == 5 and not counters["optimizer_native"]
    assert sum(counters["captures"].values()) <= 2  # (SGD with momentum: a first step makes the buffers)
    assert not counters["graph_breaks"] and not counters["frames_run_natively"] and not counters["fallback"]
    assert opt.state_dict()["state"].keys() == ref_opt.state_dict()["state"].keys()


def test_changing_learning_rate_does_not_recapture():
    model, ref = _model(), _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    step = kiln.compile(opt.step)
    sched, ref_sched = (torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.5) for o in (opt, ref_opt))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (the scheduler's order check sees the compiled step called)
        _train(model, opt, step, 6, sched)
        _train(ref, ref_opt, ref_opt.step, 6, ref_sched)
    _same_state(model, ref, opt, ref_opt)
    assert sum(counters["captures"].values()) == 1


def test_parameters_without_gradients_are_skipped_and_groups_kept():
    model, ref = _model(), _model()
    groups = lambda m: [{"params": m[0].parameters(), "lr": 0.1}, {"params": m[2].parameters()}]  # noqa: E731
    opt = torch.optim.SGD(groups(model), lr=0.01, momentum=0.9)
    ref_opt = torch.optim.SGD(groups(ref), lr=0.01, momentum=0.9)
    model[2].bias.requires_grad_(False)
    ref[2].bias.requires_grad_(False)
    step = kiln.compile(opt.step)
    _train(model, opt, step)
    _train(ref, ref_opt, ref_opt.step)
    assert model[2].bias not in opt.state and ref[2].bias not in ref_opt.state
    _same_state(model, ref, opt, ref_opt)


def test_closure_and_hooks_run_torch_s_step_counted():
    model, ref = _model(), _model()
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    step = kiln.compile(opt.step)
    x = torch.randn(4, 6)

    def closure(m, o):
        def run():
            o.zero_grad()
            loss = m(x).pow(2).mean()
            loss.backward()
            return loss
        return run
    assert torch.equal(step(closure(model, opt)), ref_opt.step(closure(ref, ref_opt)))
    _same_state(model, ref, opt, ref_opt)
    assert counters["optimizer_native"]["SGD.step: a closure"] == 1
    seen = []
    opt.register_step_post_hook(lambda *a: seen.append(1))
    model(x).sum().backward()
    step()
    assert seen == [1] and counters["optimizer_native"]["SGD.step: step hooks"] == 1
