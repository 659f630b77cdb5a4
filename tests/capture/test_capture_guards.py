"""Guards and recapture: what changes a captured graph's validity, the recompile limit, the logs."""
from __future__ import annotations

import logging
import warnings

import pytest
import torch

import kiln
from kiln import config

SCALE = 2.0


def entries(compiled):
    return compiled.cache.entries


def scaled(x):
    return x * SCALE


def test_shape_change_recaptures():
    kiln.reset()
    f = kiln.compile(lambda x: x.sum(0) * 2, backend="eager")
    for shape in [(2, 3), (2, 3), (4, 3), (2, 3)]:
        x = torch.randn(shape)
        torch.testing.assert_close(f(x), x.sum(0) * 2)
    assert len(entries(f)) == 2
    assert any("x.shape" in k or "x: Tensor" in k for k in kiln.counters["recompiles"])


def test_dtype_change_recaptures():
    kiln.reset()
    f = kiln.compile(lambda x: x + 1, backend="eager")
    a = torch.arange(4)
    b = a.double()
    assert f(a).dtype == torch.int64 and f(b).dtype == torch.float64
    assert len(entries(f)) == 2


def test_strides_guarded():
    kiln.reset()
    f = kiln.compile(lambda x: x.view(-1) if x.is_contiguous() else x.reshape(-1), backend="eager")
    x = torch.randn(3, 4)
    torch.testing.assert_close(f(x), x.view(-1))
    torch.testing.assert_close(f(x.t()), x.t().reshape(-1))
    assert len(entries(f)) == 2


def test_requires_grad_guarded():
    kiln.reset()
    f = kiln.compile(lambda x: x * 2, backend="eager")
    x = torch.randn(3)
    f(x)
    y = f(x.clone().requires_grad_())
    assert y.requires_grad
    assert len(entries(f)) == 2


def test_global_change_recaptures():
    global SCALE
    kiln.reset()
    f = kiln.compile(scaled, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(f(x), x * 2.0)
    SCALE = 3.0
    try:
        torch.testing.assert_close(f(x), x * 3.0)
    finally:
        SCALE = 2.0
    assert len(entries(f)) == 2


def test_constant_argument_recaptures():
    kiln.reset()
    # (dynamic=False: an int that changed is not made symbolic by automatic dynamic, it stays a constant)
    f = kiln.compile(lambda x, n: x * n, backend="eager", dynamic=False)
    x = torch.randn(3)
    for n in [1, 2, 2, 3]:
        torch.testing.assert_close(f(x, n), x * n)
    assert len(entries(f)) == 3


def test_list_length_recaptures():
    kiln.reset()
    f = kiln.compile(lambda xs: sum(xs), backend="eager")
    a = [torch.ones(2)] * 2
    b = [torch.ones(2)] * 3
    torch.testing.assert_close(f(a), torch.full((2,), 2.0))
    torch.testing.assert_close(f(b), torch.full((2,), 3.0))
    assert len(entries(f)) == 2


def test_training_flag_recaptures():
    kiln.reset()
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
    cm = kiln.compile(m, backend="eager")
    x = torch.randn(8, 4)
    m.eval()
    torch.testing.assert_close(cm(x), m(x))
    m.train()
    torch.manual_seed(0)
    expected = m(x)
    torch.manual_seed(0)
    torch.testing.assert_close(cm(x), expected)
    assert len(cm._compiled_forward.cache.entries) == 2
    assert any("training" in k for k in kiln.counters["recompiles"])


def test_grad_mode_recaptures():
    kiln.reset()
    f = kiln.compile(lambda x: x * 2, backend="eager")
    x = torch.randn(3, requires_grad=True)
    assert f(x).requires_grad
    with torch.no_grad():
        assert not f(x).requires_grad
    assert len(entries(f)) == 2


def test_parameter_identity_guard():
    kiln.reset()
    m = torch.nn.Linear(3, 3)
    cm = kiln.compile(m, backend="eager")
    x = torch.randn(2, 3)
    cm(x)
    with torch.no_grad():
        m.weight.mul_(2)  # in place: same parameter object, no recapture, new values used
    torch.testing.assert_close(cm(x), m(x))
    assert len(cm._compiled_forward.cache.entries) == 1
    m.weight = torch.nn.Parameter(torch.randn(3, 3))  # a new object: recapture
    torch.testing.assert_close(cm(x), m(x))
    assert len(cm._compiled_forward.cache.entries) == 2


def test_recompile_limit_warns_once_and_runs_eagerly():
    kiln.reset()
    f = kiln.compile(lambda x, n: x + n, backend="eager", dynamic=False)  # (n stays a guarded constant)
    x = torch.randn(3)
    with config.patch(recompile_limit=3), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(6):
            torch.testing.assert_close(f(x, n), x + n)
    limit = [w for w in caught if "recompile_limit" in str(w.message)]
    assert len(limit) == 1
    assert "n == " in str(limit[0].message)  # names the guard that kept failing
    assert len(entries(f)) == 3
    assert f.cache.eager


def test_guards_log_channel():
    kiln.reset()
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
    handler = Keep()
    logger = logging.getLogger("kiln.guards")
    logger.addHandler(handler)
    try:
        with config.patch(logs="guards,recompiles"):
            config.refresh_channels()
            f = kiln.compile(lambda x: x + 1, backend="eager")
            f(torch.randn(2))
    finally:
        logger.removeHandler(handler)
        config.refresh_channels()
    assert any("guards of" in r and "x: Tensor" in r for r in records)


def test_entry_shared_per_code_and_reset():
    kiln.reset()

    def g(x):
        return x - 1
    f1 = kiln.compile(g, backend="eager")
    f2 = kiln.compile(g, backend="eager")
    x = torch.randn(2)
    f1(x)
    f2(x)
    assert len(f1.cache.entries) == 1 and f1.cache is f2.cache
    kiln.reset()
    assert not f1.cache.entries
    torch.testing.assert_close(f1(x), x - 1)


def test_aliased_inputs_guarded():
    kiln.reset()

    def f(a, b):
        a.add_(1)
        return b * 2
    cf = kiln.compile(f, backend="eager")
    x = torch.zeros(3)
    y = torch.zeros(3)
    torch.testing.assert_close(cf(x, y), torch.zeros(3))
    same = torch.zeros(3)
    expected = torch.zeros(3)
    out = cf(same, same)
    ref = f(expected, expected)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(same, expected)
    assert len(cf.cache.entries) == 2  # the aliasing guard failed and kiln captured again


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32])
def test_guard_hits_after_capture(dtype):
    kiln.reset()
    f = kiln.compile(lambda x: x * 3, backend="eager")
    x = torch.ones(5, dtype=dtype)
    for _ in range(3):
        torch.testing.assert_close(f(x), x * 3)
    assert len(entries(f)) == 1
    assert kiln.counters["cache_hits"][f.name] >= 2


def test_closures_of_one_code_do_not_share_entries():
    def make_adder(k):
        def add(t):
            return t + k
        return add
    kiln.reset()
    x = torch.zeros(3)
    add3 = kiln.compile(make_adder(3), backend="eager")
    add5 = kiln.compile(make_adder(5), backend="eager")
    torch.testing.assert_close(add3(x), x + 3)
    torch.testing.assert_close(add5(x), x + 5)  # its own cache: the guards of add3 read add3's cell
