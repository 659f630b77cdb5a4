"""Shared pytest setup for kiln's tests.

- Every test starts from the same torch random state (seed 0), so failures reproduce.
- `counters` fixture: kiln.counters, emptied for the test.
- `kiln_cache` / `kiln_cache_raising` (module scope): a shared kiln cache directory in pytest's temporary
  directory, the second with internal compile errors raised.
- TRITON_INTERPRET=1 (unless set): the triton backend's kernels run on Triton's interpreter.
- `--opinfo-all-samples`: tests/test_opinfo.py runs every sample of each entry, not only the first.
"""
from __future__ import annotations

import os

# the triton backend's tests run its kernels on Triton's interpreter (CPU tensors); Triton reads this when
# a kernel is defined, so it is set before anything imports triton
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch

from kiln.counters import counters as _counters


def pytest_addoption(parser):
    parser.addoption("--opinfo-all-samples", action="store_true", default=False,
                     help="tests/test_opinfo.py: run every OpInfo sample (slow), not only the first")


@pytest.fixture(autouse=True)
def _seed_torch():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="module")
def kiln_cache(tmp_path_factory):
    """One kiln cache directory for the run, in pytest's temporary directory (kernels built once, the
    user's cache untouched). A module opts in with `pytest.mark.usefixtures("kiln_cache")`."""
    from kiln import config
    with config.patch(cache_dir=str(tmp_path_factory.getbasetemp() / "kiln_cache")):
        yield


@pytest.fixture(scope="module")
def kiln_cache_raising(kiln_cache):
    """`kiln_cache`, and kiln's internal compile errors raised instead of run eagerly (a test sees them)."""
    from kiln import config
    with config.patch(raise_on_error=True):
        yield


@pytest.fixture
def counters():
    """kiln.counters, cleared before the test."""
    _counters.clear()
    return _counters
