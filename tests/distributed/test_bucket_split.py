"""The bucket split on one process (no process group): kiln.backends.ddp cuts a zoo model's graph into
pieces at a small bucket cap; SGD steps through the pieces equal eager's, parameters and buffers (BatchNorm's
running stats updated in place inside a piece) included, and nothing is handed to torch."""
from __future__ import annotations

import copy
import shutil
import types

import pytest
import torch

from kiln import config
from kiln.backends import compiler_for
from kiln.backends.ddp import BucketSplitCompiler
from kiln.capture.cache import CompiledFunction
from kiln.testing import models as zoo

pytestmark = [pytest.mark.distributed,
              pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache")]


def _like_ddp(module: torch.nn.Module, cap: int) -> types.SimpleNamespace:
    """What the splitter reads of a DDP module: its module and bucket sizes."""
    return types.SimpleNamespace(module=module, bucket_bytes_cap=cap,
                                 _bucket_config=types.SimpleNamespace(first_bucket_bytes_cap=cap))


@pytest.mark.parametrize("name,cap,pieces", [("llama", 20000, 12), ("resnet_tiny", 20000, 2),
                                             ("mlp", 20000, 3)])
def test_split_pieces_train_like_eager(name, cap, pieces, counters):
    model, (args, kwargs) = zoo.build(name, batch=2)
    model.train()
    mine = copy.deepcopy(model)
    splitter = BucketSplitCompiler(compiler_for("auto"), _like_ddp(mine, cap))
    compiled = CompiledFunction(type(mine).forward, splitter, bound_self=mine)
    opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in (model, mine)]
    for step in range(2):
        losses = []
        for fn, opt in zip((model, compiled), opts):
            opt.zero_grad()
            loss = (fn(*args, **kwargs).float() ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=1e-5), (name, step, losses)
    for (n, p), q in zip(model.named_parameters(), mine.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name} {n}: {m}")
    for (n, b), c in zip(model.named_buffers(), mine.buffers()):
        torch.testing.assert_close(c, b, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name} buffer {n}: {m}")
    [plan] = splitter.splits
    assert len(plan.pieces) == pieces, str(plan)
    assert counters["ddp"]["pieces"] == pieces
    names = sorted(n for n, _ in model.named_parameters())
    assert sorted(p for piece in plan.pieces for p in piece.params) == names
    handed = {k: v for k, v in counters["cpp"].items() if k.startswith("ran with torch")}
    assert not handed, dict(counters["cpp"])
