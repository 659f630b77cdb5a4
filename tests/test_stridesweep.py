"""The OpInfo stride sweep in CI: each float32 entry's first sample with its tensors transposed (and
channels-last when 4-d), traced and compiled with the cpp backend; a decomposed entry's outputs must have
eager's strides and values (kiln.testing.stridesweep). Entries known to differ are listed with a reason in
kiln/testing/stridesweep_expected.py; a listed entry that now matches fails, so the list only shrinks. The
full sweep (four layouts, `--all-samples`) is `python -m kiln.testing.stridesweep`, and `-m slow` here."""
from __future__ import annotations

import shutil
import warnings

import pytest
import torch

from kiln import config
from kiln.testing import opinfo, stridesweep

OPS = opinfo.op_database()
EXPECTED = stridesweep.expected_mismatches()

pytestmark = pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler")


def _sweep(op, layouts, all_samples=False):
    import kiln.ops  # noqa: F401  (registers the decompositions)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return stridesweep.sweep_op(op, layouts=layouts, all_samples=all_samples)


@pytest.mark.parametrize("op", OPS, ids=[opinfo.op_id(op) for op in OPS])
def test_strides_match_eager(op):
    result = _sweep(op, stridesweep.CI_LAYOUTS)
    name = opinfo.op_id(op)
    reason = EXPECTED.get(name)
    if not result.decomposed:
        assert reason is None, f"{name} is listed ({reason}) but no longer decomposes: delete its entry"
        pytest.skip(result.skipped or "not decomposed (a fallback node)")
    if reason is None:
        assert result.matched, (f"{name}: {result.message} (fix it, or list it with a reason in "
                                f"kiln/testing/stridesweep_expected.py)")
    elif result.matched:
        pytest.fail(f"UNEXPECTED PASS: {name} is listed ({reason}) but now has eager's strides; delete its "
                    f"entry from kiln/testing/stridesweep_expected.py")
    else:
        pytest.xfail(reason)


def test_expected_entries_are_op_db_entries():
    known = {opinfo.op_id(op) for op in OPS}
    for name, reason in EXPECTED.items():
        assert name in known, name
        assert isinstance(reason, str) and reason.strip(), name


def test_sweep_catches_a_wrong_layout(monkeypatch):
    """The harness fails an op whose compiled output is laid out otherwise than eager's."""
    op = next(op for op in OPS if op.name == "sin")  # its first sample is 2-d
    assert _sweep(op, ("transposed",)).matched
    from kiln.prims import elementwise
    monkeypatch.setattr(elementwise, "_strides", lambda operands: kiln_contiguous(operands))
    result = _sweep(op, ("transposed",))
    assert result.decomposed and not result.matched and "strides" in result.message, result


def kiln_contiguous(operands):
    from kiln.graph.layout import contiguous_strides
    from kiln.prims.registry import is_tensor, meta_of
    return contiguous_strides(next(meta_of(a) for a in operands if is_tensor(a)).shape)


@pytest.mark.slow
@pytest.mark.parametrize("op", OPS, ids=[opinfo.op_id(op) for op in OPS])
def test_full_sweep(op, request):
    """Every layout of the first sample (every sample with --opinfo-all-samples)."""
    name = opinfo.op_id(op)
    all_samples = request.config.getoption("--opinfo-all-samples")
    result = _sweep(op, tuple(stridesweep.LAYOUTS), all_samples=all_samples)
    reason = EXPECTED.get(name) or stridesweep.FULL_SWEEP_EXPECTED.get(name)
    if not result.decomposed:
        pytest.skip(result.skipped or "not decomposed (a fallback node)")
    if reason is not None:
        assert not result.matched, f"UNEXPECTED PASS: {name} ({reason}); delete its entry"
        pytest.xfail(reason)
    assert result.matched, result.message
