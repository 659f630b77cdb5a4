"""Graphs with symbolic sizes compiled once for every size (cpp kernels taking sizes as int64 arguments).

Each program is compiled with dynamic=True and called at many sizes — small, odd, large enough to thread
and stream — against eager on values, and asserted to have been compiled symbolically (one compile, no
per-size compiles), so a kernel that is right only at the size it was compiled for fails here.
"""
from __future__ import annotations

import shutil

import pytest
import sympy
import torch
import torch.nn.functional as F

import kiln
from kiln import config
from kiln.graph.symbolic import MIN_SIZE
from kiln.lower.index import FloorDiv, ModularIndexing, index_var, simplify_index
from kiln.lower.sizes import decide_le, SizeDecision, known_le, known_lt, nonnegative

needs_cpp = pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler")

S0 = sympy.Symbol("s0", integer=True, positive=True)
S1 = sympy.Symbol("s1", integer=True, positive=True)


# ---- the prover ---------------------------------------------------------------------------------------

def test_facts_are_proved_for_every_size_or_not_at_all():
    assert MIN_SIZE == 2
    assert nonnegative(S0 - 2) and not nonnegative(S0 - 3)  # sizes are >= 2, nothing more is known
    assert nonnegative(S0 * S1 - S0 - S1) and not nonnegative(S0 * S1 - 2 * S0 - S1)
    assert known_lt(S0 - 1, S0) and not known_lt(S0, S0) and known_le(S0, S0)
    assert not nonnegative(FloorDiv(S0, 2) - 1)  # opaque: never assumed
    assert decide_le(2, S0, "t") is True and decide_le(S0 + 1, 2, "t") is False
    with pytest.raises(SizeDecision):
        decide_le(S0, 5, "a size question")


def test_divisions_go_only_where_every_size_allows():
    i, j = index_var("i", 0), index_var("i", 1)
    ranges = {i: S0, j: 64}
    # (i * 64 + j) // 64 == i and % 64 == j for every s0; // s0 of a value below s0 is 0
    assert simplify_index(FloorDiv(i * 64 + j, 64), ranges) == i
    assert simplify_index(ModularIndexing(i * 64 + j, 64), ranges) == j
    assert simplify_index(FloorDiv(i, S0), ranges) == 0
    assert simplify_index(ModularIndexing(i * S1 * 3 + j, S1 * 3), {i: S0, j: S1 * 3}) == j
    # j < 64 but not below s0 at every size: kept
    kept = simplify_index(FloorDiv(j, S0), ranges)
    assert isinstance(kept, FloorDiv)
    # (s0 - 1 + 2*i) % s0 keeps its non-negative base: (2*i - 1) % s0 is -1 in C at i = 0 (tensorfuzz 245)
    last = simplify_index(ModularIndexing(S0 - 1 + 2 * i, S0), {i: 1})
    assert last in (S0 - 1, ModularIndexing(S0 - 1 + 2 * i, S0)), last


# ---- programs at many sizes -------------------------------------------------------------------------

SIZES = [2, 3, 7, 16, 33, 130, 1000]


def _norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w[: x.shape[-1]], b[: x.shape[-1]])


PROGRAMS = {
    # pointwise and a row reduction over the symbolic dim
    "softmax_rows": (lambda x: torch.softmax(x * 2 - 1, dim=-1), lambda n: [torch.randn(3, n)]),
    # a column reduction over the symbolic dim, then a broadcast back
    "center_columns": (lambda x: x - x.mean(0, keepdim=True), lambda n: [torch.randn(n, 24)]),
    "var_both": (lambda x: (x.var(0), x.var(1, correction=0)), lambda n: [torch.randn(n, 5)]),
    # views: reshape across the symbolic dim, transpose, slices with symbolic ends
    "reshape_flatten": (lambda x: (x.reshape(-1, 4) * 3).sum(-1), lambda n: [torch.randn(n, 2, 4)]),
    "transpose_add": (lambda x, y: x.transpose(0, 1) + y, lambda n: [torch.randn(n, 6), torch.randn(6, n)]),
    "slices": (lambda x: x[1:] * x[:-1] + x[::2].sum(), lambda n: [torch.randn(n, 3)]),
    "cat_pad": (lambda x, y: F.pad(torch.cat([x, y], 0), (1, 2)) + 1,
                lambda n: [torch.randn(n, 4), torch.randn(n + 1, 4)]),
    # a size used as a number; arange over a symbolic length
    "scaled_by_size": (lambda x: (x * x.shape[0], torch.arange(x.shape[0]) * 2 + x.shape[0]),
                       lambda n: [torch.randn(n, 3)]),
    # extern calls on symbolic shapes (mm with a folded bias, sdpa), then an epilogue
    "linear_gelu": (lambda x, w, b: F.gelu(F.linear(x, w, b)).sum(-1),
                    lambda n: [torch.randn(2, n, 16), torch.randn(32, 16), torch.randn(32)]),
    "causal_attention": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2,
                         lambda n: [torch.randn(1, 2, n, 8) for _ in range(3)]),
    "layer_norm": (_norm, lambda n: [torch.randn(2, 5, 40), torch.randn(64), torch.randn(64)]),
    # sizes with floors: every third row, halves, a causal mask as HF builds it
    "strided_rows": (lambda x: x[::3] * 2 + x[1::3].sum(0), lambda n: [torch.randn(n, 5)]),
    "chunks": (lambda x: x.chunk(2, dim=0)[0] * 2 + x.chunk(2, dim=0)[-1].sum(), lambda n: [torch.randn(n, 3)]),
    "causal_mask": (lambda x: x.masked_fill(torch.arange(x.shape[-1])[None, :] > torch.arange(x.shape[-1])[:, None],
                                            float("-inf")).softmax(-1),
                    lambda n: [torch.randn(2, n, n)]),
    "scan_and_arg": (lambda x: (x.cumsum(0), x.argmax(0), x.amax(1)), lambda n: [torch.randn(n, 4)]),
    "embedding_rows": (lambda i, w: F.embedding(i, w).sum(1), lambda n: [torch.randint(0, 50, (2, n)),
                                                                           torch.randn(50, 8)]),
    # a big enough size to thread, and to stream its stores
    "big_pointwise": (lambda x: torch.exp(x) * 0.5 + x, lambda n: [torch.randn(n * 2048 + 5)]),
}


@needs_cpp
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_one_compile_serves_every_size(name, counters):
    fn, make = PROGRAMS[name]
    compiled = kiln.compile(fn, backend="cpp", dynamic=True)
    torch.manual_seed(0)
    before = dict(counters["cpp"])
    with config.patch(raise_on_error=True):
        for n in SIZES:
            args = make(n)
            torch.testing.assert_close(compiled(*args), fn(*args), msg=lambda m: f"size {n}: {m}")
    assert sum(counters["dynamic_symbolic_compiles"].values()) >= 1, dict(counters["dynamic_symbolic_failed"])
    assert not counters["dynamic_backend_compiles"], "a size was compiled on its own"
    assert not counters["dynamic_symbolic_failed"], dict(counters["dynamic_symbolic_failed"])
    assert counters["cpp"].get("input layout changed: ran the graph with torch", 0) == \
        before.get("input layout changed: ran the graph with torch", 0)


@needs_cpp
def test_two_symbols_batch_and_sequence(counters):
    def fn(x, w):
        h = F.layer_norm(x, (16,)) @ w
        return torch.softmax(h @ h.transpose(1, 2) / 4.0, dim=-1) @ h
    g = kiln.compile(fn, backend="cpp", dynamic=True)
    w = torch.randn(16, 16, dtype=torch.float64)  # float64: matmul blockings' rounding stays far below
    with config.patch(raise_on_error=True):
        for b, t in [(1, 5), (2, 5), (3, 9), (2, 17), (5, 2), (4, 40)]:
            x = torch.randn(b, t, 16, dtype=torch.float64)
            torch.testing.assert_close(g(x, w), fn(x, w), msg=lambda m: f"size {(b, t)}: {m}")
    assert sum(counters["dynamic_symbolic_compiles"].values()) >= 1
    assert not counters["dynamic_symbolic_failed"], dict(counters["dynamic_symbolic_failed"])


@needs_cpp
def test_kernels_take_sizes_as_arguments():
    import kiln.backends.cpp as cpp
    compiled_graphs = []
    real = cpp.compile_symbolic

    def spy(*a, **k):
        compiled_graphs.append(real(*a, **k))
        return compiled_graphs[-1]
    fn = lambda x: torch.softmax(x, -1).sum(0)  # noqa: E731
    g = kiln.compile(fn, backend="cpp", dynamic=True)
    old = cpp.cpp.symbolic
    cpp.cpp.symbolic = spy
    try:
        for n in (5, 9, 300):
            x = torch.randn(n, 7)
            torch.testing.assert_close(g(x), fn(x))
    finally:
        cpp.cpp.symbolic = old
    (graph,) = compiled_graphs
    assert "const int64_t s0" in graph.cpp_source and "xo < s0" in graph.cpp_source
    assert "kiln_s0 = x.shape[0]" in graph.wrapper_source


@needs_cpp
def test_a_new_layout_runs_with_torch_at_that_size(counters):
    fn = lambda x: (x * 2).sum(-1)  # noqa: E731
    g = kiln.compile(fn, backend="cpp", dynamic=True)
    for n in (4, 6, 8):
        x = torch.randn(n, 3)
        torch.testing.assert_close(g(x), fn(x))
    x = torch.randn(3, 10).t()  # same sizes' kind, other strides: the wrapper refuses, torch runs it
    torch.testing.assert_close(g(x), fn(x))


@needs_cpp
def test_off_switch_compiles_per_size(counters):
    fn = lambda x: x.cos() + 1  # noqa: E731
    g = kiln.compile(fn, backend="cpp", dynamic=True)
    with config.patch(dynamic_symbolic=False):
        for n in (4, 4, 6, 6):
            x = torch.randn(n)
            torch.testing.assert_close(g(x), fn(x))
    assert not counters["dynamic_symbolic_compiles"]
    assert sum(counters["dynamic_backend_compiles"].values()) == 2


@needs_cpp
def test_training_inputs_compile_once_for_every_size(counters):
    """Inputs requiring grad: the forward compiles once for every size, the backward once on the first
    backward (tests/autograd/test_symbolic_training.py covers more)."""
    lin = torch.nn.Linear(4, 4)
    g = kiln.compile(lambda x: lin(x).relu().sum(), backend="cpp", dynamic=True)
    for n in (3, 5, 7, 7):
        x = torch.randn(n, 4, requires_grad=True)
        loss = g(x)
        loss.backward()
        x2 = x.detach().clone().requires_grad_()
        expected = lin(x2).relu().sum()
        expected.backward()
        torch.testing.assert_close(loss, expected)
        torch.testing.assert_close(x.grad, x2.grad)
    assert sum(counters["dynamic_symbolic_compiles"].values()) == 1
    assert not counters["dynamic_symbolic_failed"] and not counters["dynamic_backend_compiles"]


@needs_cpp
@pytest.mark.parametrize("name", ["hf_gpt2", "hf_llama"])
def test_hf_decoders_compile_once_for_every_length(name, counters):
    """transformers' defaults from configs, through the cpp backend: one compile serves every length."""
    pytest.importorskip("transformers")
    from kiln.testing import models as zoo
    torch.manual_seed(0)
    model = zoo.get(name).factory().eval()
    compiled = kiln.compile(model)
    with torch.no_grad(), config.patch(raise_on_error=True):
        for length in (8, 12, 21, 40, 9):
            ids = torch.randint(0, 1000, (2, length))
            torch.testing.assert_close(compiled(input_ids=ids).last_hidden_state,
                                       model(input_ids=ids).last_hidden_state)
    assert sum(counters["dynamic_symbolic_compiles"].values()) == 1, dict(counters["dynamic_symbolic_failed"])
    assert not counters["dynamic_backend_compiles"]
    assert sum(counters["captures"].values()) <= 2
