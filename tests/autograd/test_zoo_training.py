"""The zoo under grad mode: inference with parameters requiring grad runs kiln's kernels (not torch), and a
few SGD steps in train mode (gradients clipped) match eager's, through kiln.compile's cpp backend."""
from __future__ import annotations

import copy
import shutil

import pytest
import torch

import kiln
from kiln import config
from kiln.testing import models as zoo

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache")]
MODELS = ["mlp", "resnet_tiny", "nanogpt_tiny", "resnet18", "mobilenet", "densenet", "poolformer", "efficientnet",
          "mobilevit", "bert", "nanogpt", "llama"]


def _handed_to_torch(counters):
    """Graphs run with torch: refused at compile time, or at a call whose input layout changed."""
    return {k: v for k, v in counters["cpp"].items() if k.startswith("ran with torch") or "with torch" in k}


@pytest.mark.parametrize("name", MODELS)
def test_grad_enabled_inference_runs_kiln_kernels(name, counters):
    model, (args, kwargs) = zoo.build(name, batch=2)
    compiled = kiln.compile(copy.deepcopy(model))
    expected = model(*args, **kwargs)
    actual = compiled(*args, **kwargs)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
    assert counters["autograd"]["graphs compiled with a backward"] >= 1, dict(counters["cpp"])
    assert not _handed_to_torch(counters), dict(counters["cpp"])
    assert counters["autograd"]["backward graphs compiled"] == 0


def _tensor_out(out):
    """The first tensor of a model's output (a Hugging Face output object's first field)."""
    if isinstance(out, torch.Tensor):
        return out
    return out[0] if isinstance(out, (tuple, list)) else out.to_tuple()[0]


@pytest.mark.parametrize("name", ["mlp", "resnet_tiny", "nanogpt_tiny", "llama", "hf_gpt2", "hf_bert", "hf_swin",
                                  "hf_resnet"])
def test_sgd_steps_match_eager(name, counters):
    spec = zoo.get(name)
    if not spec.available():
        pytest.skip(f"{name} needs {spec.requires}")
    model, (args, kwargs) = zoo.build(name, batch=2)
    model.train()  # dropout on: each step seeds both runs alike
    mine = copy.deepcopy(model)
    compiled = kiln.compile(mine)
    opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in (model, mine)]
    for step in range(3):
        losses = []
        for fn, opt in zip((model, compiled), opts):
            opt.zero_grad()
            torch.manual_seed(step)
            loss = (_tensor_out(fn(*args, **kwargs)).float() ** 2).mean()
            loss.backward()
            # in place on every gradient, as Hugging Face's Trainer does by default: a gradient sharing
            # memory with another would be scaled twice
            torch.nn.utils.clip_grad_norm_(opt.param_groups[0]["params"], 1e-2)
            opt.step()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=1e-5), (name, step, losses)
    for (n, p), q in zip(model.named_parameters(), mine.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name} {n}: {m}")
    for (n, b), c in zip(model.named_buffers(), mine.buffers()):
        torch.testing.assert_close(c, b, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name} buffer {n}: {m}")
    assert counters["autograd"]["backward graphs compiled"] >= 1
    assert not _handed_to_torch(counters), dict(counters["cpp"])
