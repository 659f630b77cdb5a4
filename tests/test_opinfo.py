"""OpInfo coverage in CI: each entry of torch's op_db through kiln against eager, per dtype.

Entries run their first sample (all samples with `--opinfo-all-samples`). Known failures are listed with a
reason in kiln/testing/opinfo_expected.py: such an entry runs the sample recorded there and must still fail
(it is reported as xfail); when it passes the test fails, so that the entry is deleted and the list only
shrinks. A known error that now gives a wrong result fails loudly. The full sweep with a table is
`python -m kiln.testing.opinfo`; regenerate the list with `--write-expected`.
"""
from __future__ import annotations

import warnings

import pytest

from kiln.testing import opinfo

DTYPES = ["float32", "int64", "bool"]
OPS = opinfo.op_database()
EXPECTED = opinfo.expected_failures()
SAMPLE_TIMEOUT = 60.0


def _entries():
    ids = [opinfo.op_id(op) for op in OPS]
    assert len(set(ids)) == len(ids), "OpInfo ids are not unique"
    for dtype in DTYPES:
        for op, name in zip(OPS, ids):
            yield pytest.param(op, dtype, id=f"{dtype}-{name}")


@pytest.mark.parametrize("op, dtype", list(_entries()))
def test_opinfo(op, dtype, request):
    import kiln.ops  # noqa: F401  (registers the decompositions)

    name = opinfo.op_id(op)
    if opinfo.DTYPES[dtype] not in op.supported_dtypes("cpu"):
        pytest.skip(f"{name} does not support {dtype} on the CPU")
    entry = EXPECTED.get(dtype, {}).get(name)
    all_samples = request.config.getoption("--opinfo-all-samples")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if entry is None:
            result = opinfo.run_op(op, dtype, first_sample=not all_samples, sample_timeout=SAMPLE_TIMEOUT)
        elif entry.get("sample") is not None and not all_samples:
            result = opinfo.run_op(op, dtype, only_sample=entry["sample"], sample_timeout=SAMPLE_TIMEOUT)
        else:
            result = opinfo.run_op(op, dtype, first_sample=not all_samples, sample_timeout=SAMPLE_TIMEOUT)
    if result.status == "not applicable":
        pytest.skip(result.message)
    where = f"sample {result.failed_sample}" if result.failed_sample is not None else "samples"
    if entry is None:
        assert result.passed, (f"{name} {dtype} {where}: {result.status.upper()}: {result.message}\n"
                               f"(fix it, or list it with a reason in kiln/testing/opinfo_expected.py)")
        return
    if result.passed:
        pytest.fail(f"UNEXPECTED PASS: {name} {dtype} is listed as an expected failure ({entry['reason']}) "
                    f"but now passes; delete its entry from kiln/testing/opinfo_expected.py")
    if result.status == "mismatch" and entry["kind"] != "mismatch":
        pytest.fail(f"{name} {dtype} now gives a WRONG RESULT ({where}: {result.message}); it was listed as "
                    f"{entry['kind']}: {entry['reason']}")
    pytest.xfail(entry["reason"])


def test_expected_failures_are_well_formed():
    known = {opinfo.op_id(op) for op in OPS}
    for dtype, table in EXPECTED.items():
        assert dtype in opinfo.DTYPES, dtype
        for name, entry in table.items():
            assert name in known, f"{name} ({dtype}) is not an OpInfo entry"
            assert entry["kind"] in ("mismatch", "error"), (name, entry)
            assert isinstance(entry["reason"], str) and entry["reason"].strip(), (name, entry)
            assert entry["sample"] is None or isinstance(entry["sample"], int), (name, entry)


class _FakeOpInfo:
    """Just what run_sample reads from an OpInfo entry."""

    def __init__(self, name, op):
        self.name, self.op, self.variant_test_name = name, op, ""
        self.has_nondeterministic_output = False

    def __call__(self, *args, **kwargs):
        return self.op(*args, **kwargs)


def _sample(*args, **kwargs):
    from torch.testing._internal.opinfo.core import SampleInput
    return SampleInput(args[0], args=args[1:], kwargs=kwargs)


def test_harness_reports_a_wrong_decomposition(monkeypatch):
    import torch

    import kiln.ops
    x = torch.randn(3, 4)
    good = opinfo.run_sample(_FakeOpInfo("sinh", torch.sinh), _sample(x))
    assert good.status == "ok" and not good.fallbacks
    monkeypatch.setitem(kiln.ops.DECOMPOSITIONS, torch.sinh, lambda a: torch.cosh(a))
    bad = opinfo.run_sample(_FakeOpInfo("sinh", torch.sinh), _sample(x))
    assert bad.status == "mismatch" and "not close" in bad.message
    # trace checks a decomposition's output metadata against eager: a wrong dtype becomes a fallback
    monkeypatch.setitem(kiln.ops.DECOMPOSITIONS, torch.sinh, lambda a: torch.cosh(a).double())
    fallback = opinfo.run_sample(_FakeOpInfo("sinh", torch.sinh), _sample(x))
    assert fallback.status == "ok" and fallback.fallbacks == ("torch.sinh",)


def test_harness_checks_view_strides_and_mutated_inputs(monkeypatch):
    import torch

    import kiln.ops
    x = torch.randn(3, 4)
    monkeypatch.setitem(kiln.ops.DECOMPOSITIONS, torch.t, lambda a: torch.transpose(a, 0, 1).contiguous())
    bad = opinfo.run_sample(_FakeOpInfo("t", torch.t), _sample(x))
    assert bad.status == "mismatch" and "strides" in bad.message
    monkeypatch.undo()

    def mutate(a, b):
        a.add_(b)
        return a * 1
    ok = opinfo.run_sample(_FakeOpInfo("mutate", mutate), _sample(x, torch.ones(3, 4)))
    assert ok.status == "ok", ok


def test_harness_classifies_eager_errors_and_kiln_errors(monkeypatch):
    import torch

    import kiln.ops
    both = opinfo.run_sample(_FakeOpInfo("mm", torch.mm), _sample(torch.randn(2, 3), torch.randn(4, 5)))
    assert both.status == "ok" and both.eager_raised

    def broken(a):
        raise kiln.ops.UnsupportedError("not today")
    monkeypatch.setitem(kiln.ops.DECOMPOSITIONS, torch.sinh, broken)
    monkeypatch.setattr(kiln.ops.record, "run_on", lambda *a, **k: (_ for _ in ()).throw(
        kiln.ops.UnsupportedError("no eager either")))
    # a clean refusal to trace is a graph break under kiln.compile (eager runs the call): a fallback
    brk = opinfo.run_sample(_FakeOpInfo("sinh", torch.sinh), _sample(torch.randn(3)))
    assert brk.status == "ok" and any(f.startswith("graph break: ") for f in brk.fallbacks), brk

    def internal(*args, **kwargs):
        raise KeyError("kiln bug")
    monkeypatch.setattr(opinfo, "_kiln_call", internal)
    err = opinfo.run_sample(_FakeOpInfo("sinh", torch.sinh), _sample(torch.randn(3)))
    assert err.status == "error" and "KeyError" in err.message


def test_harness_summary_line():
    results = [opinfo.OpResult("a", "float32", "decomposed"), opinfo.OpResult("b", "float32", "fallback"),
               opinfo.OpResult("c", "float32", "mismatch"), opinfo.OpResult("d", "float32", "error"),
               opinfo.OpResult("e", "float32", "error", expected="known"),
               opinfo.OpResult("f", "float32", "not applicable")]
    assert opinfo.summary_line(results, "float32", 99) == (
        "opinfo float32: 1 decomposed, 1 fallback, 1 expected-fail, 1 wrong, 1 error of 5 ops, 99 prims")


def test_write_expected_round_trip(tmp_path):
    results = [opinfo.OpResult("abs", "float16", "error", message="UnsupportedError: no float16 today",
                               failed_sample=3),
               opinfo.OpResult("cos", "float16", "mismatch", message="out: " + "x" * 200, failed_sample=0),
               opinfo.OpResult("sin", "float16", "decomposed")]
    path = opinfo.write_expected(results, str(tmp_path / "expected.py"))
    text = open(path).read()
    assert all(len(line) <= 110 for line in text.splitlines())
    namespace: dict = {}
    exec(compile(text, path, "exec"), namespace)
    table = namespace["EXPECTED_FAILURES"]
    assert table["float16"]["abs"] == {"kind": "error", "sample": 3,
                                       "reason": "error: kiln cannot trace it: no float16 today"}
    assert table["float16"]["cos"]["reason"].startswith("mismatch (WRONG RESULT): out: xxx")
    assert "sin" not in table["float16"]
    for dtype, entries in EXPECTED.items():  # other dtypes are kept as they are
        assert table[dtype] == entries
