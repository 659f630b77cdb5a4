"""A mutated input's final value written into the input's own memory by its kernel (no write-back copy),
where the input is last read at the same index: optimizer updates, running statistics."""
from __future__ import annotations

import re
import shutil

import pytest
import torch

import kiln
from kiln import config

pytestmark = pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler")


def _momentum(ps, gs, bs, lr):
    for p, g, b in zip(ps, gs, bs):
        b.mul_(0.9).add_(g)
        p.add_(b * lr)  # reads the new b: computed once, stored into b, read back at the same index


def test_updates_are_written_into_the_inputs_and_equal_eager(tmp_path):
    torch.manual_seed(0)
    ps, gs, bs = ([torch.randn(64, 8) for _ in range(3)] for _ in range(3))
    lr = torch.tensor(-0.1)
    ref_p, ref_b = [p.clone() for p in ps], [b.clone() for b in bs]
    versions = [t._version for t in ps + bs]
    with config.patch(debug_dir=str(tmp_path)):
        f = kiln.compile(_momentum, backend="cpp")
        for _ in range(3):
            f(ps, gs, bs, lr)
            _momentum(ref_p, gs, ref_b, lr)
    for a, b in zip(ps + bs, ref_p + ref_b):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert all(t._version > v for t, v in zip(ps + bs, versions))  # as eager's in-place ops move them
    wrapper = next(tmp_path.glob("*/09_build.py")).read_text()
    for i in range(3):  # each new value is its input (or a view of it): the kernel stored into the input
        for name in (f"ps_{i}", f"bs_{i}"):
            assert re.search(rf"= {name}(\.as_strided\(|  #)", wrapper), wrapper


def test_an_input_read_after_its_update_at_another_index_is_not_overwritten():
    def f(x):
        y = x.flip(0)      # reads x at the mirrored index
        x.mul_(2)
        return y + x       # the old x (through y) and the new x
    torch.manual_seed(0)
    x = torch.randn(16)
    ref = x.clone()
    out = kiln.compile(f, backend="cpp")(x)
    torch.testing.assert_close(out, f(ref))
    torch.testing.assert_close(x, ref)
