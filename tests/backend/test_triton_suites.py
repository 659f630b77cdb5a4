"""The triton backend's CI sweeps under Triton's interpreter (CPU tensors, small sizes), against eager:

- the OpInfo subset: the first sample of every entry that supports float32 on the CPU (the cpp run of the
  same harness is tests/test_opinfo.py; its expected failures are the prims backend's and apply here too);
- the tensor fuzzer's programs (kiln.testing.tensorfuzz), seeds 0..FUZZ_SEEDS-1;
- the memory-bound cases of bench/bench_kernels.py at a small size.
Every graph must compile: a graph the backend hands back to torch fails the test unless its dtype is one
Triton does not compute (complex, uint64). Skipped where triton is not installed.
"""
from __future__ import annotations

import os
import sys
import warnings

import pytest
import torch

pytest.importorskip("triton")

from kiln.counters import counters  # noqa: E402
from kiln.runtime import tritonlib  # noqa: E402
from kiln.testing import opinfo, tensorfuzz  # noqa: E402

pytestmark = [pytest.mark.skipif(not tritonlib.interpreting(), reason="needs TRITON_INTERPRET=1"),
              pytest.mark.triton,
              pytest.mark.usefixtures("kiln_cache")]

OPS = opinfo.op_database()
EXPECTED = opinfo.expected_failures().get("float32", {})
FUZZ_SEEDS, CHUNK = 120, 20
UNSUPPORTED = ("complex", "uint64")  # dtypes the Target does not compute: those graphs run with torch


def _ran_with_torch() -> list[str]:
    return [k for k, v in counters["triton"].items()
            if k.startswith("ran with torch:") and v and not any(u in k for u in UNSUPPORTED)]


@pytest.mark.parametrize("op", OPS, ids=[opinfo.op_id(op) for op in OPS])
def test_opinfo_first_sample_float32(op):
    import kiln.ops  # noqa: F401  (registers the decompositions)
    name = opinfo.op_id(op)
    if torch.float32 not in op.supported_dtypes("cpu"):
        pytest.skip(f"{name} does not support float32 on the CPU")
    entry = EXPECTED.get(name)
    counters.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if entry is not None and entry.get("sample") is not None:
            result = opinfo.run_op(op, "float32", only_sample=entry["sample"], backend="triton")
        else:
            result = opinfo.run_op(op, "float32", first_sample=True, backend="triton")
    if result.status == "not applicable":
        pytest.skip(result.message)
    assert not _ran_with_torch(), dict(counters["triton"])
    if entry is None:
        assert result.passed, f"{name}: {result.status.upper()}: {result.message}"
    elif result.passed:
        pytest.fail(f"UNEXPECTED PASS: {name} is listed in kiln/testing/opinfo_expected.py ({entry['reason']})")
    elif result.status == "mismatch" and entry["kind"] != "mismatch":
        pytest.fail(f"{name} now gives a WRONG RESULT through triton: {result.message}")
    else:
        pytest.xfail(entry["reason"])


@pytest.mark.parametrize("start", range(0, FUZZ_SEEDS, CHUNK), ids=lambda s: f"seeds{s}-{s + CHUNK - 1}")
def test_fuzz_programs(start):
    counters.clear()
    problems = []
    for seed in range(start, start + CHUNK):
        problems += [f"seed {seed}: {p}" for p in tensorfuzz.check_seed(seed, backends=("triton",))]
    assert problems == []
    assert not _ran_with_torch(), dict(counters["triton"])


def test_memory_bound_cases_at_a_small_size():
    import kiln
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
    from bench_kernels import cases
    counters.clear()
    for name, (fn, inputs, _) in cases(48).items():
        compiled = kiln.compile(fn, backend="triton")
        if "dropout" in name:  # random: same seed, same draws
            torch.manual_seed(3)
            expected = fn(*inputs)
            torch.manual_seed(3)
            actual = compiled(*inputs)
        else:
            expected, actual = fn(*inputs), compiled(*inputs)
        torch.testing.assert_close(actual, expected, msg=lambda m: f"{name}: {m}")
    assert counters["triton"]["graphs run with torch"] == 0
