"""Runs (kiln/codegen/cpp_native.py): consecutive segments and float32 products called as one C++ entry,
the products through BLAS's sgemm_ with the arguments torch derives, intermediates in a per-run arena.

Each case compares with eager: values (bit for bit where torch itself calls sgemm_ on the same operands),
shape, strides and dtype; and asserts the structure: no torch call for the product, one entry call."""
import re
import shutil
import threading

import pytest
import torch
import torch.nn.functional as F

import kiln
import kiln.ops
from kiln import config
from kiln.backends.cpp import compile_graph
from kiln.codegen.wrapper_runtime import blas_sgemm

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.skipif(blas_sgemm() is None, reason="torch's library exports no sgemm_"),
              pytest.mark.usefixtures("kiln_cache_raising")]


def compiled(fn, *inputs):
    return compile_graph(kiln.ops.trace(fn, *inputs), list(inputs))


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _calls(source: str) -> list[str]:
    """The entry and torch calls of a wrapper's body (after its input checks)."""
    body = source.split("def kiln_call", 1)[1]
    return re.findall(r"\b(run\d+_\d+|segment\d+_\d+|_linear|mm_\d+|addmm_\d+|extern_\d+)\(", body)


def _same(got, want, exact=True):
    assert got.shape == want.shape and got.dtype == want.dtype and got.stride() == want.stride()
    if exact:
        assert torch.equal(got, want), (got - want).abs().max()
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


B = torch.randn(24, generator=_gen(9))
CASES = {  # name: (fn, input shapes, bitwise): products torch also computes with one sgemm_ call
    "linear": (lambda x, w: F.linear(x, w), [(5, 32), (24, 32)], True),
    "biased linear of a 3-d input": (lambda x, w, b: F.linear(x, w, b), [(3, 5, 32), (24, 32), (24,)], True),
    "biased linear of a 4-d input": (lambda x, w, b: F.linear(x, w, b), [(2, 3, 5, 32), (24, 32), (24,)], True),
    "matmul": (lambda x, y: x @ y, [(5, 32), (32, 24)], True),
    "transposed left operand": (lambda x, y: x.t() @ y, [(32, 5), (32, 24)], True),
    "both transposed": (lambda x, y: x.t() @ y.t(), [(32, 5), (24, 32)], True),
    "product then bias then relu": (lambda x, y: (x @ y + B).relu(), [(5, 32), (32, 24)], True),
    # (kiln's tanh is not eager's bit for bit)
    "a product of products": (lambda x, y, z: (x @ y).tanh() @ z, [(5, 32), (32, 24), (24, 7)], False),
    "one row": (lambda x, y: x @ y, [(1, 8), (8, 16)], True),
    "one column": (lambda x, y: x @ y, [(6, 8), (8, 1)], False),  # (torch: a matrix-vector routine)
    # a column slice: rows strided by 2 elements, no leading dimension BLAS takes (a loop in C++ instead)
    "strided operand": (lambda x, y: x[:, ::2] @ y, [(5, 64), (32, 24)], False),
    "batched": (lambda a, b: torch.bmm(a, b), [(4, 5, 16), (4, 16, 7)], False),
    "attention": (lambda q, k, v: ((q @ k.transpose(-2, -1)) * 0.25).softmax(-1) @ v,
                  [(2, 3, 6, 16), (2, 3, 6, 16), (2, 3, 6, 16)], False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_products_run_inside_one_entry_with_eager_values(name, counters):
    fn, shapes, exact = CASES[name]
    inputs = [torch.randn(s, generator=_gen(k)) for k, s in enumerate(shapes)]
    with torch.no_grad():
        c = compiled(fn, *inputs)
        for _ in range(3):  # (the arena and the pooled buffers reused)
            _same(c(*inputs), fn(*inputs), exact)
    calls = _calls(c.wrapper_source)
    assert len(calls) == 1 and calls[0].startswith("run"), (calls, c.wrapper_source)
    assert "kiln_gemm(" in c.cpp_source


def test_off_the_products_are_torch_calls_again():
    x, w = torch.randn(5, 32), torch.randn(24, 32)
    with config.patch(native_runs=False), torch.no_grad():
        c = compiled(lambda x, w: F.linear(x, w).relu() @ w, x, w)
        _same(c(x, w), F.linear(x, w).relu() @ w)
    assert "run" not in " ".join(_calls(c.wrapper_source)) and "kiln_gemm(" not in c.cpp_source


def test_other_dtypes_stay_torch_calls():
    for dtype in (torch.float64, torch.bfloat16):
        x, w = torch.randn(5, 32, dtype=dtype), torch.randn(24, 32, dtype=dtype)
        with torch.no_grad():
            c = compiled(lambda x, w: F.linear(x, w).relu(), x, w)
            _same(c(x, w), F.linear(x, w).relu())
        assert "kiln_gemm(" not in (c.cpp_source or ""), dtype


@pytest.mark.parametrize("shapes", [[(0, 32), (24, 32)], [(5, 0), (24, 0)]], ids=["no rows", "empty sum"])
def test_empty_products(shapes):
    x, w = (torch.randn(s) for s in shapes)
    fn = lambda x, w: F.linear(x, w, B) * 2  # noqa: E731
    with torch.no_grad():
        _same(compiled(fn, x, w)(x, w), fn(x, w))


def test_every_length_one_compile(counters):
    """Symbolic sizes reach the products and the arena's size: one capture for every length."""
    torch.manual_seed(0)
    lin1, lin2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)
    fn = lambda x: lin2(torch.relu(lin1(x)) @ torch.ones(32, 32) / 32) + x  # noqa: E731
    cf = kiln.compile(fn, dynamic=True)
    with torch.no_grad():
        for n in (3, 9, 2, 40, 9):  # (a length of 1 is a size of its own, as in torch.compile)
            x = torch.randn(n, 16)
            torch.testing.assert_close(cf(x), fn(x), rtol=1e-5, atol=1e-5)
    assert sum(counters["captures"].values()) == 1, dict(counters["captures"])


def test_bad_index_inside_a_run_raises_eagers_error():
    """A lookup through a computed index inside a run: the run stops at the kernel that found it, and the
    wrapper raises eager's error from the index (kept a tensor, not carved from the arena)."""
    emb, lin = torch.nn.Embedding(10, 16), torch.nn.Linear(16, 16)
    fn = lambda ids, x: emb((ids * 3) % 13) @ lin(x).t()  # noqa: E731
    ids, x = torch.tensor([1, 2, 3]), torch.randn(3, 16)
    with torch.no_grad():
        c = compiled(fn, ids, x)
        _same(c(ids, x), fn(ids, x))
        bad = torch.tensor([1, 4, 3])  # 12 is out of range
        with pytest.raises(IndexError, match="index out of range in self"):
            fn(bad, x)
        with pytest.raises(IndexError, match="index out of range in self"):
            c(bad, x)
        _same(c(ids, x), fn(ids, x))


def test_threads_calling_one_graph_each_get_their_own_arena():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32)).eval()
    x = torch.randn(8, 32)
    with torch.no_grad():
        c = compiled(model, x)
        want = c(x)
    errors = []

    inputs = [torch.randn(8, 32, generator=_gen(seed)) for seed in range(4)]
    with torch.no_grad():
        expected = [c(inp) for inp in inputs]  # (one thread at a time)

    def work(seed):
        inp, expect = inputs[seed], expected[seed]
        with torch.no_grad():
            for _ in range(50):
                got = c(inp)
                if not torch.equal(got, expect):
                    errors.append((seed, (got - expect).abs().max()))
                    return
    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with torch.no_grad():
        _same(c(x), want)
        _same(c(x), model(x), exact=False)


def test_training_step_equals_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    ref.load_state_dict(model.state_dict())
    cm = kiln.compile(model)
    x = torch.randn(6, 16)
    cm(x).square().sum().backward()
    ref(x).square().sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)


def test_profile_times_each_product_inside_a_run():
    x, w = torch.randn(64, 128), torch.randn(128, 128)
    fn = lambda x, w: (x @ w).relu() @ w  # noqa: E731
    with torch.no_grad():
        report = kiln.profile(fn, x, w, repeat=3, warmup=1)
    products = [r for r in report.rows if r.kind == "extern"]
    assert len(products) == 2 and all(r.time_us > 0 for r in products), report
    torch.testing.assert_close(report.result, fn(x, w))
