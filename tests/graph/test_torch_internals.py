"""kiln.graph.torch_internals: each private read of torch works on the installed torch, and a missing one
fails with the torch version and what kiln needed it for (never a quiet change of behaviour)."""
from __future__ import annotations

import re

import pytest
import torch

import kiln
from kiln.graph import torch_internals as ti


def test_autocast_registrations_name_the_autocast_ops():
    names = ti.autocast_registrations("AutocastCPU")
    assert "aten::mm" in names and "aten::conv2d" in names


def test_any_autocast_enabled_follows_autocast():
    assert not ti.any_autocast_enabled()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert ti.any_autocast_enabled()


def test_forward_ad_active_follows_dual_levels():
    import torch.autograd.forward_ad as fwAD
    assert not ti.forward_ad_active()
    with fwAD.dual_level():
        assert ti.forward_ad_active()
    assert not ti.forward_ad_active()


def test_resolve_overload_is_the_dispatchers_choice():
    a = torch.empty(2, device="meta")
    assert ti.resolve_overload(torch.ops.aten.add, (a, a), {}) == "Tensor"
    assert ti.resolve_overload(torch.ops.aten.sum, (a,), {}) == "default"
    assert ti.resolve_overload(torch.ops.aten.sum, (a, [0]), {}) == "dim_IntList"


def test_fused_sdp_choice_picks_flash_for_plain_cpu_attention():
    q = torch.empty(1, 2, 8, 16)
    assert ti.fused_sdp_choice(q, q, q, None, False, None, False) == ti.FLASH_ATTENTION


def test_a_missing_read_names_the_torch_version(monkeypatch):
    monkeypatch.delattr(torch._C, "_dispatch_get_registrations_for_dispatch_key")
    with pytest.raises(ti.TorchInternalsError, match=r"for the ops autocast casts.*torch " + re.escape(torch.__version__)):
        ti.autocast_registrations("AutocastCPU")


def test_a_missing_read_during_compile_is_reported_not_wrong(monkeypatch):
    # the overload of a torch.ops call is asked of the dispatcher; without it the frame runs eagerly and
    # the capture error says why
    monkeypatch.delattr(torch._C, "_jit_resolve_packet")

    def f(x):
        return torch.ops.aten.add(x, x) * 2
    x = torch.randn(3)
    report = kiln.explain(f, x)
    assert "_jit_resolve_packet" in str(report) or "_jit_resolve_packet" in repr(report.breaks) or \
        any("_jit_resolve_packet" in k for k in kiln.counters["capture_errors"]), str(report)
    torch.testing.assert_close(kiln.compile(f)(x), x * 4)
