"""Mixed-precision training through kiln's joint graph: the forward under torch.autocast, the backward
compiled from it, and torch.amp.GradScaler (float16) around it, against the same loop in eager.

A GradScaler loop is judged by what the scaler decides: the scale after every step, and so which steps
were skipped for an inf/NaN gradient, must equal eager's; the losses and final weights are within float16's
rounding of eager's. bfloat16 training runs without a scaler; its gradients are judged by the accuracy rule
against an fp64 reference, as eager autocast's are."""
from __future__ import annotations

import copy
import shutil

import pytest
import torch

import kiln
from kiln import config
from kiln.testing import models as zoo
from kiln.testing.accuracy import check, to_fp64
from kiln.testing.tolerance import model_tol

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache")]


def _scaler_loop(model, fn, args, kwargs, steps):
    """`steps` SGD steps under fp16 autocast with a GradScaler whose first scale overflows the gradients
    (and which grows every second step, so that later steps overflow again): per step (scale after the
    update, loss), and the final weights."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 18, growth_interval=2)
    trace = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = fn(*args, **kwargs).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        trace.append((scaler.get_scale(), loss.item()))
    return trace, [p.detach() for p in model.parameters()]


@pytest.mark.parametrize("name", ["mlp", "nanogpt_tiny"])
def test_grad_scaler_loop_skips_the_steps_eager_skips(name):
    kiln.reset()
    model, (args, kwargs) = zoo.build(name, batch=4)
    model.train()
    compiled_model = copy.deepcopy(model)
    eager_trace, eager_weights = _scaler_loop(model, model, args, kwargs, steps=8)
    trace, weights = _scaler_loop(compiled_model, kiln.compile(compiled_model, backend="cpp"), args, kwargs,
                                  steps=8)
    assert [scale for scale, _ in trace] == [scale for scale, _ in eager_trace]
    scales = [2.0 ** 18] + [scale for scale, _ in eager_trace]
    skipped = [after < before for before, after in zip(scales, scales[1:])]
    assert any(skipped) and not all(skipped), scales   # the loop both skips and steps
    torch.testing.assert_close([loss for _, loss in trace], [loss for _, loss in eager_trace],
                               rtol=1e-3, atol=1e-5)
    for got, expected in zip(weights, eager_weights):
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("name", ["mlp", "nanogpt_tiny"])
def test_bf16_training_without_a_scaler(name):
    """Three SGD steps under bf16 autocast: each step's gradients by the accuracy rule (bfloat16's
    tolerance) against eager autocast's and an fp64 model trained alike."""
    kiln.reset()
    model, (args, kwargs) = zoo.build(name, batch=4)
    model.train()
    compiled_model, ref = copy.deepcopy(model), copy.deepcopy(model).double()
    fns = {"eager": model, "kiln": kiln.compile(compiled_model, backend="cpp"), "fp64": ref}
    modules = {"eager": model, "kiln": compiled_model, "fp64": ref}
    opts = {label: torch.optim.SGD(m.parameters(), lr=1e-2) for label, m in modules.items()}
    for step in range(3):
        grads = {}
        for label, fn in fns.items():
            opts[label].zero_grad(set_to_none=True)
            inputs = to_fp64(args) if label == "fp64" else args
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=label != "fp64"):
                loss = fn(*inputs, **kwargs).float().pow(2).mean()
            loss.backward()
            grads[label] = [p.grad for p in modules[label].parameters()]
            opts[label].step()
        verdict = check(grads["kiln"], grads["eager"], grads["fp64"], tol=model_tol(torch.bfloat16))
        assert verdict.passed, f"step {step}: {verdict.reason}"
        assert [g.dtype for g in grads["kiln"]] == [g.dtype for g in grads["eager"]]


def test_convolution_backward_under_autocast_is_an_extern(counters):
    """Under autocast the zoo's convolutions stay oneDNN externs (not gather + mm), so their backward is
    oneDNN's convolution_backward: a library extern like the forward, no fallback."""
    kiln.reset()
    model, (args, kwargs) = zoo.build("resnet_tiny", batch=2)
    model.train()
    compiled_model, ref = copy.deepcopy(model), copy.deepcopy(model).double()
    compiled = kiln.compile(compiled_model, backend="cpp")
    for fn, on in ((model, True), (compiled, True), (ref, False)):
        inputs = args if on else to_fp64(args)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=on):
            loss = fn(*inputs, **kwargs).float().pow(2).mean()
        loss.backward()
    grads = [[p.grad for p in m.parameters()] for m in (compiled_model, model, ref)]
    verdict = check(*grads, tol=model_tol(torch.bfloat16))
    assert verdict.passed, verdict.reason
    assert counters["extern"]["prims.convolution_backward"] > 0 and not counters["fallback"], \
        (dict(counters["extern"]), dict(counters["fallback"]))
