"""Random tensor programs (kiln.testing.tensorfuzz) through every backend, against eager.

- CI checks seeds 0..CI_SEEDS-1 in chunks (about a minute on two cores, with the C++ compiles);
  `python -m pytest -m slow tests/backend/test_tensorfuzz.py -n 2` sweeps SWEEP_SEEDS and reports every
  failing seed of a chunk at once. `python -m kiln.testing.tensorfuzz --seeds 0:5000 --backends cpp` does
  the same from a shell; `--show SEED` prints a program, ready to paste into a repro.
- REGRESSIONS: seeds the sweep found failing, each fixed in kiln; they run whatever CI's range.
- KNOWN: seeds failing because of an open bug (strict xfail with the reason: a fix makes them pass, and
  then they move to REGRESSIONS); each bug also has a minimized strict-xfail test at the end.
"""
from __future__ import annotations

import re
import shutil

import pytest
import torch

from kiln import config
from kiln.testing import tensorfuzz

BACKENDS = tuple(b for b in tensorfuzz.BACKENDS if b != "cpp" or shutil.which(config.get("cxx")))
CI_SEEDS, CHUNK, SWEEP_SEEDS, SWEEP_CHUNK = 320, 20, 5000, 250

# seed -> what it found (fixed)
REGRESSIONS: dict[int, str] = {
    47: "x[x > 0] is a fallback whose output shape depends on the values: the graph after it was built for "
        "the first call's count (cpp read past the result or dropped elements; prims failed a broadcast); "
        "such fallbacks now break the graph",
    163: "a[:].zero_() of an expanded input: the eager backend copied the result back into it (eager "
         "refuses the copy); an update through a view of a tensor whose elements share memory now breaks",
    482: "a[5, -6, :].fill_(3) of an expanded input: eager's write shows in every row sharing the memory, "
         "kiln's functional update in one",
    1866: "v = a.mT.contiguous() of a transposed input is a view of it (a.mT is contiguous already); an "
          "update of v was written back into a copy of a's new value laid out row-major, where contiguous() "
          "copied: the update was lost (prims, cpp); the copy is now laid out as eager's base",
    2695: "a.fill_(3) then a.masked_fill_(...) of an expanded input: the second update's target carried the "
          "first's dense meta, so the shared memory went unnoticed (the eager backend copied the result back "
          "into the expanded input, which eager refuses); an updated input is judged by its placeholder",
    4393: "as 2695, through a.reshape(-1) of an expanded input",
    456: "a float16 var was summed in float16 (2x eager's RMSE; a long row overflowed): now in float32",
    3146: "as 456",
    985: "a pure pointwise kernel whose dims were all size 1 gave its 'outer' members no index (the C++ read "
         "an undeclared loop variable): FusedGroup.member_index applies the collapse's expand to them",
    1575: "as 985",
    4979: "as 985",
    3347: "the C++ sign of NaN was NaN; eager's torch.sign(nan) is 0",
}

# seed -> the open bug it finds (strict xfail with the reason; none open)
KNOWN: dict[int, str] = {}


pytestmark = pytest.mark.usefixtures("kiln_cache")


def _failures(seeds) -> dict[int, list[str]]:
    found = {}
    for seed in seeds:
        if seed in KNOWN:
            continue
        problems = tensorfuzz.check_seed(seed, BACKENDS)
        if problems:
            found[seed] = problems
    return found


def _report(failures: dict[int, list[str]]) -> str:
    lines = [f"seed {s}:\n    " + "\n    ".join(p[:6]) for s, p in failures.items()]
    return (f"{len(failures)} seeds differ from eager (python -m kiln.testing.tensorfuzz --show SEED):\n"
            + "\n".join(lines))


@pytest.mark.parametrize("start", range(0, CI_SEEDS, CHUNK), ids=lambda s: f"seeds{s}-{s + CHUNK - 1}")
def test_seeds(start):
    failures = _failures(range(start, start + CHUNK))
    assert not failures, _report(failures)


@pytest.mark.parametrize("seed", sorted(REGRESSIONS))
def test_regression_seed(seed):
    failures = _failures([seed])
    assert not failures, _report(failures)


@pytest.mark.parametrize("seed", [pytest.param(s, marks=pytest.mark.xfail(strict=True, reason=r))
                                  for s, r in KNOWN.items()])
def test_known_failing_seed(seed):
    assert not tensorfuzz.check_seed(seed, BACKENDS)


@pytest.mark.slow
@pytest.mark.parametrize("start", range(0, SWEEP_SEEDS, SWEEP_CHUNK),
                         ids=lambda s: f"seeds{s}-{s + SWEEP_CHUNK - 1}")
def test_sweep(start):
    failures = _failures(range(start, start + SWEEP_CHUNK))
    assert not failures, _report(failures)


# ---- the generator and the comparison themselves

@pytest.mark.filterwarnings("ignore")
def test_programs_are_deterministic_and_run_eagerly():
    for seed in range(40):
        source = tensorfuzz.generate(seed)
        assert source == tensorfuzz.generate(seed)
        env = tensorfuzz.load(source, seed)
        assert [t.shape for t in env["inputs"](0)] == [t.shape for t in env["inputs"](1)]
        try:
            env["program"](*env["inputs"](0))
            raised = False
        except Exception:
            raised = True
        # only a program that ends in a statement eager rejects, on purpose, raises
        assert raised == tensorfuzz.Generator(seed).ends_in_error, seed


COVERAGE = {
    "comparison": r"[<>]=? |==|!=", "where": r"torch\.where\(", "clamp": r"\.clamp\(",
    "sum": r"\.sum\(", "mean": r"\.mean\(", "amax": r"\.amax\(", "argmax": r"\.arg(max|min)\(",
    "var": r"\.var\(", "keepdim": r"keepdim=True", "transpose": r"\.transpose\(", "permute": r"\.permute\(",
    "stepped slice": r"\[[^]]*:\d*:[23]", "reshape": r"\.reshape\(", "view": r"\.view\(",
    "expand": r"\.expand\(", "unsqueeze": r"\.unsqueeze\(", "squeeze": r"\.squeeze\(",
    "None index": r"\[[^]]*None", "bool mask": r"\[\w+ > 0\]|\[v\d+\]", "index tensor": r"\[torch\.tensor\(",
    "index_select": r"\.index_select\(", "gather": r"\.gather\(", "add_": r"\.add_\(", "mul_": r"\.mul_\(",
    "copy_": r"\.copy_\(", "masked_fill_": r"\.masked_fill_\(", "setitem": r"\] = ",
    "float16": r"F16", "bfloat16": r"BF16", "float64": r"F64", "int64": r"I64", "bool": r"B8|> 0\)",
    "transposed input": r"a\d = a\d\.permute", "sliced input": r"a\d = a\d\[",
    "zero-size dim": r"\(0,|, 0[,)]",
    "NaN/inf input": r"float\('(nan|inf)'\)",
}


def test_generator_covers_the_program_space():
    sources = "\n".join(tensorfuzz.generate(seed) for seed in range(300))
    missing = [name for name, pattern in COVERAGE.items() if not re.search(pattern, sources)]
    assert not missing, f"300 programs never use: {missing}"
    # updates of views of intermediates, not only of whole values
    assert re.search(r"^    v\d+(\[.*\]|\.\w+\(.*\))\.(add_|mul_|copy_|masked_fill_)\(", sources, re.M)


def test_compare_finds_differences():
    x = torch.linspace(-1, 1, 12).reshape(3, 4)
    assert not tensorfuzz.compare((x,), (x.clone(),), (x.double(),), "out")
    assert tensorfuzz.compare((x + 1e-3,), (x,), (x.double(),), "out")  # beyond float32's tolerance
    assert tensorfuzz.compare((x.double(),), (x,), (x.double(),), "out")  # dtype
    assert tensorfuzz.compare((x.t(),), (x,), (x.double(),), "out")  # shape
    assert tensorfuzz.compare((torch.tensor([1, 2]),), (torch.tensor([1, 3]),), (None,), "out")
    nan = x.clone()
    nan[0, 0] = float("nan")
    assert tensorfuzz.compare((nan,), (x,), (x.double(),), "out")
    # low precision: a result nearer the float64 value than eager's passes by the accuracy rule
    exact = torch.linspace(-1, 1, 101, dtype=torch.float64) / 3
    eager = (exact.to(torch.float16) * 3).to(torch.float16) / 3
    assert not tensorfuzz.compare((exact.to(torch.float16),), (eager,), (exact,), "out")


def test_check_seed_reports_a_wrong_backend():
    import kiln.backends

    def wrong(graph, example_inputs):
        run = kiln.backends.lookup_backend("eager")(graph, example_inputs)

        def call(*inputs):
            return tuple(o + 1 if isinstance(o, torch.Tensor) and o.dtype.is_floating_point else o
                         for o in run(*inputs))
        return call
    kiln.backends.register_backend("tensorfuzz_wrong", wrong)
    wrong_seeds = [s for s in range(12) if tensorfuzz.check_seed(s, ("tensorfuzz_wrong",))]
    assert len(wrong_seeds) >= 6, wrong_seeds


# ---- bugs the sweep found, minimized (all fixed; an open one would carry a strict xfail with its reason)

def _update_through_contiguous_view(a):
    a.add_(1)
    v = a.mT.contiguous()  # a view of a: a.mT is contiguous already
    v.view(-1)[:5].mul_(2)
    return v + 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_update_through_a_contiguous_view(backend, counters):
    import kiln
    x = torch.arange(12.0).reshape(3, 4).t()  # (4, 3), strides (1, 4)
    eager_x, kiln_x = x.clone().t().contiguous().t(), x.clone().t().contiguous().t()
    expected = _update_through_contiguous_view(eager_x)
    with config.patch(raise_on_error=True):
        actual = kiln.compile(_update_through_contiguous_view, backend=backend)(kiln_x)
    assert torch.equal(actual, expected) and torch.equal(kiln_x, eager_x)
    assert not counters["graph_errors"]


def _cpp(fn, *args):
    import kiln
    with config.patch(raise_on_error=True):
        return kiln.compile(fn, backend="cpp")(*args)


needs_cpp = pytest.mark.skipif("cpp" not in BACKENDS, reason="no C++ compiler")


@needs_cpp
def test_half_var_of_a_long_row():
    x = (torch.randn(3, 2000) + 40).to(torch.float16)
    fn = lambda x: x.var(-1)  # noqa: E731
    torch.testing.assert_close(_cpp(fn, x), fn(x))


@needs_cpp
def test_pointwise_sliced_to_one_element():
    x = torch.randn(1, 5)
    fn = lambda x: x.abs()[:, :1] * 2  # noqa: E731
    torch.testing.assert_close(_cpp(fn, x), fn(x))


@needs_cpp
def test_sign_of_nan():
    x = torch.tensor([float("nan"), -2.0, 0.0, 3.0])
    fn = lambda x: torch.sign(x) + 1  # noqa: E731
    torch.testing.assert_close(_cpp(fn, x), fn(x), equal_nan=True)


DYNAMIC_SEEDS = 80
# seeds the dynamic sweep found failing (fixed): a size expression with a fractional part (FloorDiv took
# (s + 2) / 3 for exact), a view chain replayed on an input with symbolic sizes; with kernels compiled for
# every size: C's truncating / for a floored size (125), a remainder left with a negative base (195, 245),
# a broadcast dim `s1 - 2` guarded to be 1 (271), stores into empty buffers (114, 141), ceil sizes (24)
DYNAMIC_REGRESSIONS = [24, 65, 114, 125, 141, 186, 195, 245, 271, 348, 1100]


@pytest.mark.parametrize("start", range(0, DYNAMIC_SEEDS, CHUNK), ids=lambda s: f"seeds{s}-{s + CHUNK - 1}")
def test_seeds_with_symbolic_sizes(start):
    """dynamic=True: every input dim a symbolic size, each size compiled on its first call."""
    seeds = list(range(start, start + CHUNK)) + (DYNAMIC_REGRESSIONS if start == 0 else [])
    failures = {s: p for s in seeds if (p := tensorfuzz.check_seed(s, ("eager", "cpp"), dynamic=True))}
    assert not failures, _report(failures)
