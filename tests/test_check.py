"""kiln.check: each compiled kernel against the fp64 reference; a planted wrong kernel is named, with the user
line lowered into it, and a correct model reports every kernel within the accuracy rule."""
import inspect
import shutil

import pytest
import torch

import kiln
from kiln import config
from kiln.codegen import cpp as codegen_cpp

pytestmark = pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler")


@pytest.fixture(autouse=True)
def private_cache(tmp_path):
    with config.patch(cache_dir=str(tmp_path / "cache")):
        yield


def three_kernels(x, w):
    a = torch.relu(x * 2 + 1)  # kernel0
    b = a @ w
    c = torch.softmax(b, -1)  # kernel1
    d = c @ w
    return torch.tanh(d) + 1  # kernel2


def _line_of(fn, text):
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def test_a_correct_model_is_within_the_rule():
    x, w = torch.randn(16, 32), torch.randn(32, 32)
    report = kiln.check(three_kernels, x, w)
    assert report.passed and report.first_bad is None
    assert [k.kernel for k in report.kernels] == ["kernel0", "kernel1", "kernel2"]
    assert all(k.passed for k in report.kernels)
    assert all(k.rmse <= 1e-5 for k in report.kernels), report
    assert report.graphs[0].outputs_passed
    assert "every kernel is within the accuracy rule" in str(report)
    module = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64))
    assert kiln.check(module, x).passed


def test_a_planted_wrong_kernel_is_named(monkeypatch):
    real_kernel = codegen_cpp.KernelWriter.kernel

    def planted(writer, group):
        """kernel1's last member is emitted negated; its loop IR (the reference's meaning) is left as is."""
        if group.name != "kernel1":
            return real_kernel(writer, group)
        data = group.members[-1].buffer.data
        body = data.fn
        data.fn = lambda h, *index: h.op("neg", body(h, *index))
        try:
            return real_kernel(writer, group)
        finally:
            data.fn = body
    monkeypatch.setattr(codegen_cpp.KernelWriter, "kernel", planted)
    x, w = torch.randn(16, 32), torch.randn(32, 32)
    report = kiln.check(three_kernels, x, w)
    bad = report.first_bad
    assert bad is not None and (bad.graph, bad.kernel) == ("three_kernels", "kernel1"), report
    assert "RMSE" in bad.reason and bad.max_error > 0.1
    # judged on the inputs the compiled program gave them: the kernels around it are right
    assert [k.passed for k in report.kernels] == [True, False, True]
    line = _line_of(three_kernels, "torch.softmax")
    assert bad.origins == [f"{__file__}:{line}: c = torch.softmax(b, -1)  # kernel1"]
    text = str(report)
    assert "first kernel outside the accuracy rule: graph three_kernels, kernel1" in text
    assert f"from {__file__}:{line}" in text
    assert report.graphs[0].outputs_passed is False and not report.passed
