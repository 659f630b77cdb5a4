"""glibc's malloc thresholds (kiln.runtime.malloc): set once by the first compiled graph, not where the flag is
off or the user tuned malloc in the environment, and what they are for: a compiled model's calls fault in
next to no fresh pages (the zoo's DenseNet at batch 8, one thread: 736 a call with glibc's defaults here)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from kiln import config
from kiln.runtime import malloc

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# One process: the zoo's DenseNet compiled (batch 8, one thread), warmed up, then its calls' minor faults
PROGRAM = r"""
import json, resource, sys, torch, kiln
from kiln.counters import counters
from kiln.testing.models import build
torch.set_num_threads(1)
model, (args, kwargs) = build("densenet")
with torch.no_grad():
    compiled = kiln.compile(model)
    for _ in range(4):
        compiled(*args)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        compiled(*args)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10
print(json.dumps({"faults": faults, "set": dict(counters["runtime"])}))
"""


def _run(tmp_path, **environment):
    env = {k: v for k, v in os.environ.items() if k not in malloc.USER_SETTINGS and k != "GLIBC_TUNABLES"}
    env.update(environment, KILN_CACHE_DIR=str(tmp_path), PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", PROGRAM], env=env, cwd=ROOT, text=True, capture_output=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler")
def test_compiled_calls_fault_in_no_fresh_pages(tmp_path):
    tuned = _run(tmp_path)
    assert tuned["set"] == {malloc.SET: 1}
    assert tuned["faults"] < 50, tuned
    # the user's own glibc settings stand: nothing is set (the faults are then glibc's business)
    theirs = _run(tmp_path, GLIBC_TUNABLES="glibc.malloc.trim_threshold=1048576")
    assert theirs["set"] == {}
    off = _run(tmp_path, KILN_MALLOC_THRESHOLDS="0")
    assert off["set"] == {}


def test_settle_once_and_only_where_asked(monkeypatch, counters):
    monkeypatch.setattr(malloc, "_settled", None)
    with config.patch(malloc_thresholds=False):
        assert not malloc.settle()
    assert malloc.settle() is False  # (decided once per process)
    monkeypatch.setattr(malloc, "_settled", None)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1048576")
    assert not malloc.settle() and not counters["runtime"]
