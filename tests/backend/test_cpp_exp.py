"""exp in generated C++: eager's values at every special input, and masked softmaxes whose loops vectorize.

glibc's SIMD exp gives a whole vector to scalar exp when one lane is far below zero; a causal softmax's
masked lanes are all -inf (or -3.4e38), so exp cost 5-7x its vector price there and nanoGPT's attention
softmax took 116 us of a 700 us call. kiln_exp sends those lanes to exp as 0 and returns +0 for them. A bool
mask is read as its byte and the build passes -fno-trapping-math, without which g++ left such loops scalar.

Also masked loads (padding): g++ 12 left a padding kernel scalar when a masked branch read an address the
inner loop does not move (a BatchNorm parameter) or combined flags with &&; MobileNet's padded
BatchNorm kernels ran ~10x slower than vectorized."""
import re
import shutil
import subprocess

import pytest
import torch

import kiln.ops
from kiln import config
from kiln.backends.cpp import compile_graph
from kiln.runtime.build import find_compiler, flags

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache_raising")]

SPECIAL = [float("-inf"), -3.4e38, -1e30, -800.0, -745.5, -700.0, -200.0, -105.0, -104.0, -103.9, -95.0,
           -87.5, -50.0, -1.0, 0.0, 1.0, 50.0, 88.5, 89.0, 700.0, 710.0, float("inf"), float("nan"),
           # near 0 (kiln_exp gives 0 to exp below 2^-26, 2^-55 in double: the result rounds to 1)
           -1e-3, -2.0 ** -24, -2.0 ** -25, -2.0 ** -26, -1e-9, -1e-30, -1e-40, -0.0, 1e-40, 1e-30, 1e-9,
           2.0 ** -26, 2.0 ** -25, 2.0 ** -24, 1e-3, -2.0 ** -54, -2.0 ** -55, 2.0 ** -55, 2.0 ** -54]


def compiled(fn, *inputs):
    return compile_graph(kiln.ops.trace(fn, *inputs), list(inputs))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_exp_and_sigmoid_match_eager_at_special_inputs(dtype):
    # every special value in every lane position of a vector, beside ordinary values
    values = torch.tensor(SPECIAL, dtype=torch.float64)
    x = torch.cat([values.roll(i) for i in range(16)] + [torch.linspace(-120, 90, 301, dtype=torch.float64)])
    x = x.to(dtype)
    for fn in (torch.exp, torch.sigmoid, lambda t: torch.exp(t * 0.5 - 1.0)):
        got, want = compiled(fn, x)(x), fn(x)
        torch.testing.assert_close(got, want, equal_nan=True)
        # zeros, infinities and NaNs exactly where eager has them (the tolerance would pass a denormal for 0)
        for test in (lambda t: t == 0, torch.isinf, torch.isnan):
            assert torch.equal(test(got), test(want)), (fn, x[test(got) != test(want)])


def _scalar_exp_loops(source: str, tmp_path, marker=lambda line: "kiln_exp(" in line) -> list[int]:
    """Compile `source` with kiln's flags and g++'s vectorizer report: the lines of the innermost loops
    around a `marker` line (a kiln_exp call) that g++ did not vectorize (it reports a loop at a line of its
    body)."""
    path = tmp_path / "kernels.cpp"
    path.write_text(source)
    cmd = [find_compiler(config.get("cxx")), *flags(), "-fopt-info-vec-optimized", "-c", str(path),
           "-o", str(tmp_path / "kernels.o")]
    report = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    vectorized = {int(m.group(1)) for m in re.finditer(r"kernels\.cpp:(\d+):\d+: optimized: loop vectorized",
                                                       report)}
    lines = source.splitlines()
    calls = [n for n, line in enumerate(lines, 1) if marker(line) and "static inline" not in line]
    assert calls, source
    scalar = []
    for call in calls:
        start = next(i for i in range(call - 1, 0, -1) if lines[i - 1].lstrip().startswith("for ("))
        depth, end = 0, start
        for end in range(start, len(lines) + 1):
            depth += lines[end - 1].count("{") - lines[end - 1].count("}")
            if depth == 0 and end > start:
                break
        if not any(start <= n <= end for n in vectorized):
            scalar.append(start)
    return scalar


@pytest.mark.parametrize("mask_kind", ["bool", "additive"])
def test_masked_softmax_matches_eager_and_its_exp_loops_vectorize(mask_kind, tmp_path):
    torch.manual_seed(0)
    t = 64
    scores = torch.randn(2, 4, t, t)
    keep = torch.ones(t, t, dtype=torch.bool).tril()
    keep[5] = False  # a row with every position masked: eager's softmax gives NaN there

    if mask_kind == "bool":
        def fn(s, keep):
            return (s * 0.25).masked_fill(~keep, float("-inf")).softmax(-1)
    else:
        def fn(s, keep):
            bias = torch.zeros(keep.shape, dtype=s.dtype).masked_fill(~keep, torch.finfo(s.dtype).min)
            return torch.softmax(s * 0.25 + bias, -1)
    c = compiled(fn, scores, keep)
    got, want = c(scores, keep), fn(scores, keep)
    torch.testing.assert_close(got, want, equal_nan=True)
    assert torch.equal(got == 0, want == 0) and torch.equal(got.isnan(), want.isnan())
    if "-DKILN_MVEC" not in flags():
        pytest.skip("no libmvec: exp is scalar here")
    assert not _scalar_exp_loops(c.cpp_source, tmp_path), c.cpp_source


def test_padding_kernel_matches_eager_and_its_masked_loads_vectorize(tmp_path):
    """BatchNorm (eval) + ReLU6 + zero padding in one kernel: a masked load of the input, unmasked loads
    of the per-channel parameters; values against eager (the padding's zeros included), and every inner
    loop with a conditional load vectorized."""
    torch.manual_seed(0)
    x, mean, var = torch.randn(2, 16, 20, 20), torch.randn(16), torch.rand(16) + 0.5
    weight, bias = torch.randn(16), torch.randn(16)

    def fn(x, mean, var, weight, bias):
        y = torch.nn.functional.batch_norm(x, mean, var, weight, bias, False, 0.0, 1e-5)
        return torch.nn.functional.pad(torch.nn.functional.relu6(y), (1, 1, 1, 1))
    c = compiled(fn, x, mean, var, weight, bias)
    torch.testing.assert_close(c(x, mean, var, weight, bias), fn(x, mean, var, weight, bias))
    kernels = c.cpp_source.split('extern "C" int ', 1)[1]  # (the header's helpers use && freely)
    assert " ? p_" in kernels and "&&" not in kernels, kernels
    assert not _scalar_exp_loops(c.cpp_source, tmp_path, marker=lambda line: " ? p_" in line), c.cpp_source


def test_exp_near_zero_is_exactly_one_and_its_loops_vectorize(tmp_path):
    """SiLU over activations near 1e-9 (a deep EfficientNet-style net at its random init): the SIMD exp's
    polynomial in such inputs has denormal terms, each a microcode assist, and the kernel ran 10x slower.
    kiln_exp gives exp 0 there: exactly 1, as the correctly rounded exp of every input that near 0."""
    x = torch.cat([torch.logspace(-45, -3, 400), -torch.logspace(-45, -3, 400)]).float()
    near = x.abs() < 2.0 ** -26
    for fn in (torch.exp, torch.nn.functional.silu, torch.sigmoid):
        c = compiled(fn, x)
        got, want = c(x), fn(x)
        torch.testing.assert_close(got, want)
        assert torch.equal(got[near], want[near]), fn   # bit for bit where the inputs are that small
    tiny = x.abs() < 2.0 ** -26
    assert torch.equal(compiled(torch.exp, x)(x)[tiny], torch.ones(int(tiny.sum())))
    if "-DKILN_MVEC" in flags():
        assert not _scalar_exp_loops(compiled(torch.exp, x).cpp_source, tmp_path)
