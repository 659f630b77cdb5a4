"""Shared pytest setup for kiln's tests.

- Every test starts from the same torch random state (seed 0), so failures reproduce.
- `counters` fixture: kiln.counters, emptied for the test.
- The whole run writes nothing under the user's home: kiln's cache (`cache_dir`, and KILN_CACHE_DIR for the
  processes tests start), Triton's, Inductor's and matplotlib's are in a temporary directory, removed at
  the end (each xdist worker has its own).
- `kiln_cache` / `kiln_cache_raising` (module scope): the run's kiln cache directory, the second with
  internal compile errors raised.
- TRITON_INTERPRET=1 (unless set): the triton backend's kernels run on Triton's interpreter.
- `--opinfo-all-samples`: tests/test_opinfo.py runs every sample of each entry, not only the first.
"""
from __future__ import annotations

import os
import shutil
import tempfile

# the triton backend's tests run its kernels on Triton's interpreter (CPU tensors); Triton reads this when
# a kernel is defined, so it is set before anything imports triton
os.environ.setdefault("TRITON_INTERPRET", "1")

# where the run's caches go: set before kiln's config is imported (it reads KILN_CACHE_DIR once) and before
# any test module is collected, so that a module compiling at import writes there too
_CACHE_ROOT = tempfile.mkdtemp(prefix="kiln-tests-")
_CACHE_ENV = {"KILN_CACHE_DIR": os.path.join(_CACHE_ROOT, "kiln"),
              "TRITON_CACHE_DIR": os.path.join(_CACHE_ROOT, "triton"),
              "TORCHINDUCTOR_CACHE_DIR": os.path.join(_CACHE_ROOT, "inductor"),
              "MPLCONFIGDIR": os.path.join(_CACHE_ROOT, "matplotlib")}
_ENV_BEFORE = {name: os.environ.get(name) for name in _CACHE_ENV}
os.environ.update(_CACHE_ENV)


import pytest  # noqa: E402
import torch  # noqa: E402

from kiln.counters import counters as _counters  # noqa: E402


def pytest_unconfigure(config):
    for name, value in _ENV_BEFORE.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    shutil.rmtree(_CACHE_ROOT, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _temporary_kiln_cache():
    """kiln's cache is the run's temporary one, whatever an earlier import of kiln.config read."""
    from kiln import config
    with config.patch(cache_dir=_CACHE_ENV["KILN_CACHE_DIR"]):
        yield


def pytest_addoption(parser):
    parser.addoption("--opinfo-all-samples", action="store_true", default=False,
                     help="tests/test_opinfo.py: run every OpInfo sample (slow), not only the first")


@pytest.fixture(autouse=True)
def _seed_torch():
    torch.manual_seed(0)
    yield


# attributes kiln's modules give through a module __getattr__ (loaded on first use, or checked on each use:
# kiln.compile checks the Python version). A test that replaces one with monkeypatch.setattr leaves it in the
# module's dict on pytest < 9.2 (undo writes the looked-up value back), and from then on every test in the
# process sees a different kiln: no version check, or a "custom" pass list that turns the graph cache off.
# Replace them with monkeypatch.setitem(vars(module), name, value), which removes the entry after.
_LAZY_ATTRIBUTES = {"kiln": ("compile", "disable", "explain", "check", "report", "reset", "profile"),
                    "kiln.backends.cpp": ("PASSES", "CPP_TARGET")}


@pytest.fixture(autouse=True)
def _lazy_attributes_left_lazy():
    yield
    import sys
    for module, names in _LAZY_ATTRIBUTES.items():
        held = vars(sys.modules[module]) if module in sys.modules else {}
        left = [name for name in names if name in held]
        for name in left:  # (removed, so that only the test that left them fails)
            del held[name]
        assert not left, (f"this test left {module}.{', '.join(left)} in the module's dict (lazy attributes, "
                          f"see tests/conftest.py): replace them with monkeypatch.setitem(vars(module), ...)")


@pytest.fixture(scope="module")
def kiln_cache():
    """The run's kiln cache directory (kernels built once, the user's cache untouched); every test uses it,
    a module may still name it with `pytest.mark.usefixtures("kiln_cache")`."""
    from kiln import config
    with config.patch(cache_dir=_CACHE_ENV["KILN_CACHE_DIR"]):
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
