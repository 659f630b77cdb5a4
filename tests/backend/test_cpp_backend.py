"""The cpp backend against eager: fusion (kernel counts), layouts, dtypes, sizes that exercise SIMD tails."""
import dataclasses
import shutil

import pytest
import torch
import torch.nn.functional as F

import kiln.ops
from kiln import config, prims
from kiln.backends.cpp import compile_graph
from kiln.codegen.cpp import CPP_TARGET
from kiln.runtime import find_compiler
from kiln.testing import accuracy
from kiln.testing.tolerance import model_tol

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache_raising")]


def compiled(fn, *inputs):
    graph = kiln.ops.trace(fn, *inputs)
    return compile_graph(graph, list(inputs))


def check(fn, *inputs, kernels=None, fallbacks=None, **tol):
    """Compare with eager; with `kernels`, assert the kernel count. Every op must decompose to prims:
    an op that runs with torch fails the test, unless `fallbacks` ({op name: why}) names it, which is then
    asserted to fall back (a structural assertion never skips itself)."""
    c = compiled(fn, *inputs)
    torch.testing.assert_close(c(*inputs), fn(*inputs), equal_nan=True, **tol)
    assert_fallbacks(c, fallbacks or {})
    if kernels is not None:
        assert c.kernel_count == kernels, c.loop.describe()
    return c


def assert_fallbacks(c, expected):
    """The ops of `c`'s graph that run with torch are exactly `expected`'s keys (each given with a reason)."""
    names = sorted({n.target_name() for n in c.graph.fallbacks()})
    assert names == sorted(expected), f"ops ran with torch: {names}, expected {sorted(expected)}"


def softmax_prims(x):
    m = prims.broadcast_in_dim(prims.amax(x, (1,)), x.shape, (0,))
    e = prims.exp(prims.sub(x, m))
    return prims.div(e, prims.broadcast_in_dim(prims.sum(e, (1,)), x.shape, (0,)))


def layer_norm_prims(x, w, b):
    n = x.shape[1]
    mean = prims.broadcast_in_dim(prims.div(prims.sum(x, (1,)), float(n)), x.shape, (0,))
    var = prims.broadcast_in_dim(prims.var(x, (1,), 0), x.shape, (0,))
    y = prims.mul(prims.sub(x, mean), prims.rsqrt(prims.add(var, 1e-5)))
    return prims.add(prims.mul(y, prims.broadcast_in_dim(w, x.shape, (1,))),
                     prims.broadcast_in_dim(b, x.shape, (1,)))


def test_fusion_kernel_counts_on_prim_graphs():
    x = torch.randn(33, 257)
    c = check(softmax_prims, x, kernels=1)
    assert c.kernel_count == 1 and c.allocations == 1  # only the output: max and sum stay in the kernel
    w, b = torch.randn(257), torch.randn(257)
    c = check(layer_norm_prims, x, w, b, kernels=1)
    assert c.kernel_count == 1
    c = check(lambda x: prims.sum(prims.maximum(prims.add(x, 1.0), 0.0), (0, 1)), x, kernels=1)
    assert c.kernel_count == 1


def test_pointwise_chain_and_reduction_is_one_kernel():
    x = torch.randn(37, 129)
    check(lambda x: (x + 1).relu().sum(), x, kernels=1)


def test_softmax_last_dim_is_one_kernel():
    x = torch.randn(33, 257)
    c = check(lambda x: torch.softmax(x, -1), x, kernels=1)
    assert not c.externs


def test_layer_norm_is_one_kernel():
    x = torch.randn(17, 100)
    w, b = torch.randn(100), torch.randn(100)
    check(lambda x, w, b: torch.nn.functional.layer_norm(x, (100,), w, b), x, w, b, kernels=1)


@pytest.mark.parametrize("shape", [(1, 17, 100), (17, 1, 100), (1, 1, 100)])
def test_size_one_dims_do_not_split_kernels(shape):
    # a batch of 1: the size-1 loop variable is 0 whether or not an index mentions it
    x = torch.randn(shape)
    w, b = torch.randn(100), torch.randn(100)
    check(lambda x, w, b: torch.nn.functional.layer_norm(x, (100,), w, b), x, w, b, kernels=1)
    check(lambda x: torch.softmax(x, -1), x, kernels=1)


def test_gelu_mul_add_sum():
    a, b = torch.randn(64, 301), torch.randn(64, 301)
    check(lambda a, b: torch.nn.functional.gelu(a * b + 1).sum(-1), a, b, kernels=1)


@pytest.mark.parametrize("n", [1, 7, 15, 16, 17, 1023])
def test_simd_tails(n):
    x, y = torch.randn(3, n), torch.randn(3, n)
    check(lambda x, y: torch.exp(x) * y - x, x, y, kernels=1)


def test_non_contiguous_and_sliced_inputs():
    base = torch.randn(20, 30)
    x = base.t()  # transposed
    y = base[2:12:2, 5:25]  # sliced with a step
    check(lambda x: x * 2 + 1, x)
    check(lambda y: (y * y).sum(0), y)


def test_broadcast():
    x, y = torch.randn(5, 1, 7), torch.randn(3, 1)
    check(lambda x, y: x + y, x, y, kernels=1)


def test_zero_size_and_zero_dim():
    check(lambda x: x * 2, torch.randn(0, 4))
    check(lambda x: (x + 1).sum(-1), torch.randn(3, 0))
    check(lambda x: x * 3 + 1, torch.tensor(2.5))
    check(lambda x: x.sum(), torch.randn(()))
    check(lambda x: (x * 2).reshape(0, 4, 2).sum(-1), torch.randn(0, 8))  # unravel over an empty dim


def test_int64_and_bool():
    a = torch.randint(-50, 50, (6, 9))
    b = torch.randint(-50, 50, (6, 9))
    check(lambda a, b: a * b - a, a, b)
    check(lambda a: a.sum(-1), a)
    check(lambda a, b: a < b, a, b)
    p, q = torch.rand(5, 5) > 0.5, torch.rand(5, 5) > 0.5
    check(lambda p, q: p & q | ~p, p, q)


def test_float64():
    x = torch.randn(9, 11, dtype=torch.float64)
    check(lambda x: torch.tanh(x) * torch.sigmoid(x), x)


def test_reductions():
    x = torch.randn(8, 33)
    x[2, 5] = float("nan")
    check(lambda x: x.amax(-1), x)
    check(lambda x: x.amin(0), x)
    check(lambda x: x.argmax(-1), x)
    check(lambda x: x.argmin(0), x)
    check(lambda x: x.var(-1), torch.randn(8, 33))
    check(lambda x: x.prod(-1), torch.rand(8, 33) + 0.5)


def test_full_reduction_split_across_threads():
    x = torch.randn(300, 300)
    check(lambda x: (x * x).sum(), x, kernels=1)
    check(lambda x: x.argmax(), x)
    check(lambda x: torch.softmax(x.reshape(-1), 0), x)
    x[250, 9] = float("nan")
    check(lambda x: x.amax(), x)
    check(lambda x: x.argmin(), x)
    check(lambda x: prims.argmax(prims.view(x, (90000,)), (0,)), x)  # one inner loop, chunked by hand


def test_views_fold_into_indices():
    x = torch.randn(4, 6, 8)
    c = check(lambda x: (x.permute(2, 0, 1).reshape(8, 24) * 2).sum(-1), x)
    assert c.kernel_count == 1
    check(lambda x: x.reshape(24, 8).t() + 1, x)


def test_view_output_aliases_input():
    x = torch.randn(4, 6)
    c = compiled(lambda x: x.t(), x)
    out = c(x)
    assert out.stride() == x.t().stride()
    torch.testing.assert_close(out, x.t())


def test_matmul_is_extern_with_fused_epilogue():
    a, w = torch.randn(16, 32), torch.randn(32, 24)
    c = check(lambda a, w: torch.relu(a @ w + 1), a, w, atol=1e-5, rtol=1e-5)
    assert len(c.externs) == 1
    assert c.kernel_count == 1


def test_prim_graph_directly():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    check(lambda x, y: prims.sum(prims.exp(prims.mul(x, y)), (1,)), x, y, kernels=1)


def test_layout_change_falls_back():
    x = torch.randn(6, 6)
    c = compiled(lambda x: x + 1, x)
    y = torch.randn(6, 6).t()
    torch.testing.assert_close(c(y), y + 1)


def test_buffers_are_reused():
    x, w = torch.randn(32, 32), torch.randn(32, 32)

    def fn(x, w):
        a = torch.tanh(x) @ w  # tanh(x) is materialized for the matmul, dead after it
        return torch.tanh(a) @ w  # tanh(a) takes its memory
    c = check(fn, x, w, atol=1e-5, rtol=1e-5)
    reused = [(name, r) for s in c.plan.steps for name, r in s.allocs if r is not None]
    assert reused, c.wrapper_source


def test_compiler_is_found():
    assert find_compiler(config.get("cxx"))


def test_creation_prims():
    x = torch.randn(4, 5)
    check(lambda x: prims.add(x, prims.full((4, 5), 2.5, torch.float32)), x, kernels=1)
    n = torch.randint(0, 9, (7,))
    check(lambda n: prims.mul(n, prims.iota(7, 3, 2, torch.int64)), n, kernels=1)


def test_outputs_recycled_only_when_dropped():
    x = torch.randn(256, 256)  # 256 KiB: at least wrapper.POOL_MIN_BYTES, so the wrapper keeps it
    c = compiled(lambda x: x * 2, x)
    held = c(x)
    second = c(x + 1)  # `held` is still referenced: it must not be overwritten
    torch.testing.assert_close(held, x * 2)
    torch.testing.assert_close(second, (x + 1) * 2)
    view = second[1:]
    third = c(x + 2)  # `second` is referenced through a view only
    torch.testing.assert_close(view, ((x + 1) * 2)[1:])
    del held, second, view, third
    y = c(x)
    y_ptr = y.data_ptr()
    del y
    assert c(x).data_ptr() == y_ptr  # a dropped output's memory is reused


def test_contiguous_dims_collapse_into_one_loop():
    x, b = torch.randn(4, 6, 5, 3), torch.randn(6, 1, 1)
    c = check(lambda x: x * 2 + 1, x, kernels=1)
    assert c.kernels[0].outer == () and c.kernels[0].inner == (360,)
    check(lambda x, b: x + b, x, b)  # broadcast: only the trailing (5, 3) merge
    check(lambda x: x.permute(0, 2, 1, 3) * 3, x)


def test_scans():
    x = torch.randn(6, 70)
    check(lambda x: torch.cumsum(x * 2, -1) + 1, x, kernels=1)
    check(lambda x: torch.cumsum(x, 0), x)
    check(lambda x: torch.cumprod(x, 1), torch.rand(5, 9) + 0.5)
    check(lambda n: torch.cumsum(n, -1), torch.randint(-9, 9, (4, 33)))
    check(lambda x: prims.mul(prims.cumsum(x, 1), 3.0), x, kernels=1)


def test_size_one_dims_with_odd_strides():
    base = torch.randn(5, 8)
    x = base[:, 2:3]  # [5, 1], strides (8, 1)
    y = torch.randn(1, 5).t()  # [5, 1], strides (1, 5)
    check(lambda x, y: x * y + 1, x, y)
    z = torch.randn(3, 1, 4, 1)
    check(lambda z: torch.exp(z) - z, z)
    check(lambda x: x * 2, torch.randn(1, 1, 1))


def test_linear_and_attention_pass_views_to_externs():
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 96)
    x = torch.randn(2, 8, 32)

    def attention(x):
        q, k, v = lin(x).split(32, dim=-1)
        q, k, v = (z.reshape(2, 8, 4, 8).transpose(1, 2) for z in (q, k, v))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    with torch.no_grad():
        c = check(attention, x, atol=1e-5, rtol=1e-5)
    # the weight's transpose and q, k, v reach the externs as views; the bias joins the matmul (addmm)
    assert c.kernel_count == 0, c.loop.describe()
    assert [e.target_name for e in c.externs] == ["torch.addmm", "prims.sdpa_flash"]  # (eager's kernel)


def test_bias_add_folds_into_addmm_only_when_materialized():
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 24)
    x = torch.randn(3, 5, 32)
    with torch.no_grad():
        c = compiled(lin, x)
        # eager's F.linear calls addmm: the same call gives the same bits
        assert torch.equal(c(x), lin(x))
        assert c.kernel_count == 0 and [e.target_name for e in c.externs] == ["torch.addmm"]
        # a pointwise op after the bias add: the add stays inlined in that op's kernel
        c = check(lambda x: torch.relu(lin(x)), x, atol=1e-5, rtol=1e-5)
        assert c.kernel_count == 1 and [e.target_name for e in c.externs] == ["prims.mm"]
        # the product read twice (no single reader): no fold
        c = check(lambda x: (lambda m: (m + lin.bias, m * 2))(x @ lin.weight.t()), x, atol=1e-5, rtol=1e-5)
        assert [e.target_name for e in c.externs] == ["prims.mm"]
        # a bias that is not a row vector over the last dim: no fold
        col = torch.randn(3, 5, 1)
        c = check(lambda x, col: x @ lin.weight.t() + col, x, col, atol=1e-5, rtol=1e-5)
        assert [e.target_name for e in c.externs] == ["prims.mm"]
        # float64 and a bias that is a slice of a larger tensor
        big = torch.randn(40, dtype=torch.float64)
        w = torch.randn(24, 32, dtype=torch.float64)
        x64 = x.double()
        c = check(lambda x: torch.nn.functional.linear(x, w, big[7:31]), x64)
        assert [e.target_name for e in c.externs] == ["torch.addmm"]


def test_products_run_as_eager_linear_calls_without_views():
    """The wrapper calls a product as eager's F.linear does: mm(a, w.t()) is F.linear(a, w), addmm(b, a,
    w.t()) is F.linear(a, w, b), on the 3-d input itself where it is row-major; no view of the weight, the
    bias or the input is built per call. Same bits as eager. (With native runs, the default, float32
    products are BLAS calls from C++ instead: tests/backend/test_native_runs.py.)"""
    with config.patch(native_runs=False):
        _products_as_linear_calls()


def _products_as_linear_calls():
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 24)
    x = torch.randn(3, 5, 32)
    with torch.no_grad():
        c = compiled(lin, x)
        assert torch.equal(c(x), lin(x))
        src = c.wrapper_source
        assert "_linear(arg0, " in src and "_view(" not in src and "as_strided" not in src, src
        # no bias (a kernel applies relu after the product): F.linear(a, w) on the flattened input
        c = compiled(lambda x: torch.relu(lin(x)), x)
        assert torch.equal(c(x), torch.relu(lin(x)))
        assert "_linear(" in c.wrapper_source and "_view(" not in c.wrapper_source
        # a 4-d input: F.linear of the flattened [m, k] view, reshaped to the graph's shape
        x4 = torch.randn(2, 3, 5, 32)
        c = compiled(lin, x4)
        assert torch.equal(c(x4), lin(x4))
        assert "_linear(" in c.wrapper_source
        # an operand that is no transpose of a row-major weight: a direct torch.mm / torch.addmm call
        y = torch.randn(32, 24)
        b = torch.randn(24)
        for fn in (lambda x, y: x @ y, lambda x, y: (x @ y).relu(), lambda x, y: x @ y + b):
            c = compiled(fn, x, y)
            assert torch.equal(c(x, y), fn(x, y))
            assert "_linear(" not in c.wrapper_source and "_view(" not in c.wrapper_source
        # a bias sliced from a larger tensor still reaches addmm as that view
        big = torch.randn(40)
        fn = lambda x: torch.nn.functional.linear(x, lin.weight, big[7:31])  # noqa: E731
        c = compiled(fn, x)
        assert torch.equal(c(x), fn(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_sdpa_bool_mask_becomes_additive_in_a_kernel(dtype):
    """A bool attention mask reaches sdpa as the additive mask torch itself would make of it (0 where True,
    -inf where False, in the query's dtype), computed by the kernel that builds the mask, at its own shape
    (broadcast over heads as a view): the same bits as eager, fully masked rows included."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 16, 8, dtype=dtype) for _ in range(3))
    keep = torch.rand(2, 16) > 0.3
    keep[1] = False  # every key masked for the second batch element

    def attention(q, k, v, keep):
        mask = keep[:, None, None, :] & torch.ones(16, 16, dtype=torch.bool).tril()
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with torch.no_grad():
        c = compiled(attention, q, k, v, keep)
        got, want = c(q, k, v, keep), attention(q, k, v, keep)
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())
    (sdpa_node,) = [e for e in c.externs if e.target_name in ("prims.sdpa", "prims.sdpa_flash")]
    mask_ref = sdpa_node.args[3]
    assert c.loop.buffers[mask_ref.name].dtype == dtype
    assert mask_ref.strides[1] == 0  # the heads share one mask
    assert c.kernel_count == 1, c.loop.describe()


@pytest.mark.parametrize("simd", [False, True])
def test_broadcast_int64_to_float_is_computed_apart_without_a_vector_conversion(simd):
    """BERT's mask bias `(1 - mask.float()) * -1e4`, broadcast over heads and rows into the softmax: where
    the target cannot vectorize an int64 -> float conversion (x86 without AVX-512DQ), it is computed into
    a small buffer of its own first, so the softmax's loops (exp included) vectorize; elsewhere it stays
    inlined. The same values either way."""
    torch.manual_seed(0)
    scores = torch.randn(2, 4, 64, 64)
    mask = (torch.rand(2, 64) > 0.2).long()

    def fn(s, m):
        return torch.softmax(s / 4.0 + (1.0 - m[:, None, None, :].to(s.dtype)) * -1e4, -1)
    target = dataclasses.replace(CPP_TARGET, wide_int_to_float_simd=simd)
    c = compile_graph(kiln.ops.trace(fn, scores, mask), [scores, mask], target=target)
    torch.testing.assert_close(c(scores, mask), fn(scores, mask))
    small = [b for b in c.loop.buffers.values() if b.dtype == torch.float32 and b.numel() == 2 * 64]
    assert bool(small) != simd, c.loop.describe()
    # a broadcast of no conversion, or into a small kernel, stays inlined
    c = compile_graph(kiln.ops.trace(fn, scores[:1, :1, :8], mask[:1]), [scores[:1, :1, :8], mask[:1]],
                      target=dataclasses.replace(CPP_TARGET, wide_int_to_float_simd=False))
    assert c.kernel_count == 1, c.loop.describe()


def test_inputs_and_constants_that_are_views_with_a_storage_offset():
    # extern arguments and output views are strided views counted from the tensor's first element
    torch.manual_seed(0)
    weights, biases = torch.randn(10, 8), torch.randn(10)
    w, b = weights[2:8], biases[3:9]
    x = torch.randn(4, 8)
    offset_x = torch.randn(5, 8)[1:]
    assert offset_x.storage_offset() == 8
    fns = [lambda x: torch.nn.functional.linear(x, w, b), lambda x: torch.nn.functional.linear(x, w).relu(),
           lambda x: x.t() @ x, lambda x: x[1:], lambda x: x.t(), lambda x: (x[1:] @ w.t()).sum(0)]
    with torch.no_grad():
        for fn in fns:
            c = compiled(fn, x)
            for inp in (x, offset_x):
                torch.testing.assert_close(c(inp), fn(inp), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision(dtype):
    """Rounded after every op: eager's values; rounded once (where stored or converted): by the accuracy
    rule against float64 (a half-precision op's tolerance: the models')."""
    x, y = torch.randn(7, 37, dtype=dtype), torch.randn(7, 37, dtype=dtype)
    cases = [(lambda x, y: torch.tanh(x * y + 1) - x, 1), (lambda x, y: torch.softmax(x, -1), None),
             (lambda x, y: x.sum(-1), None), (lambda x, y: x.amax(0), None), (lambda x, y: x.float() * 3, None),
             (lambda x, y: (x > 0).to(dtype) + x, None)]
    with config.patch(bfloat16_rounding="op", float16_rounding="op"):
        for fn, kernels in cases:
            check(fn, x, y, kernels=kernels)
    with config.patch(bfloat16_rounding="store", float16_rounding="store"):
        for fn, kernels in cases:
            c = compiled(fn, x, y)
            verdict = accuracy.check(c(x, y), fn(x, y), fn(x.double(), y.double()), tol=model_tol(dtype))
            assert verdict.passed, verdict.reason
            assert kernels is None or c.kernel_count == kernels


def test_horizontal_fusion_of_siblings():
    x = torch.randn(16, 40)

    def fn(x):
        # two row reductions separated by an unrelated pointwise kernel of another shape
        a = prims.sum(x, (1,))
        b = prims.mul(prims.view(x, (640,)), 2.0)
        c = prims.amax(x, (1,))
        return a, b, c
    c = check(fn, x, kernels=2)
    assert c.kernel_count == 2


def test_cat_rev_and_pad():
    a, b, e = torch.randn(3, 4), torch.randn(3, 2), torch.randn(3, 0)
    check(lambda a, b: prims.mul(prims.cat([a, b], 1), 2.0), a, b, kernels=1)
    check(lambda a, b, e: prims.cat([a, e, b], 1), a, b, e, kernels=1)
    check(lambda a: prims.rev(prims.exp(a), (0, 1)), a, kernels=1)
    check(lambda a: torch.cat([a, a * 2], 0).sum(0), a)
    check(lambda a: torch.nn.functional.pad(a, (1, 2)) * 3, a)


def test_pad():
    a = torch.randn(3, 5)
    check(lambda a: prims.mul(prims.pad(a, 0.5, ((1, 2, 0), (0, 0, 0))), 2.0), a, kernels=1)
    check(lambda a: prims.pad(a, -1.0, ((-1, 1, 0), (2, -2, 0))), a, kernels=1)
    check(lambda a: torch.nn.functional.pad(a, (1, 2, 0, 1), value=3.0), a)


def test_bool_buffers_in_kernels():
    p = torch.rand(3, 40000) > 0.5
    check(lambda p: prims.amax(p, (0, 1)), p)  # a bool max split across threads
    x = torch.randn(1, 2, 3)
    check(lambda x: torch.nn.functional.max_pool1d(x, 3, 2, ceil_mode=True, return_indices=True), x)


def test_large_outputs_stream_through_tiles():
    # outputs of >= 16 MB go through a stack tile and non-temporal stores: unaligned rows, tile tails,
    # per-thread chunk edges, other dtypes, and a row with NaN and one with -inf
    x = torch.randn(4100, 1030)
    x[7, 3] = float("nan")
    x[9] = float("-inf")
    x[11, 1029] = float("inf")
    check(lambda x: torch.softmax(x, -1), x, kernels=1)
    check(lambda x: x.amax(-1) + x.amin(-1), x)
    a, b = torch.randn(2099, 2101), torch.randn(2099, 2101)
    check(lambda a, b: torch.tanh(a * b + 1) * a - b, a, b, kernels=1)
    check(lambda a: a.double() * 3, a)
    h = torch.randn(4111, 2053).to(torch.bfloat16)
    check(lambda h: h * h + 1, h)
    w = torch.randn(2101)
    check(lambda a, w: a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6) * w, a, w)
    # two inner loops (rows of a sliced input cannot collapse), threads on the outer or the inner loops
    for x in (torch.randn(20, 400, 1400)[:, :, :1300], torch.randn(2, 2000, 1400)[:, :, :1300]):
        check(lambda x: x - x.amax((1, 2), keepdim=True), x, kernels=1)


def test_float_max_reduction_nan_and_signed_zero():
    x = torch.tensor([[0.0, -0.0, -1.0], [float("nan"), 1.0, 2.0], [3.0, float("nan"), float("-inf")],
                      [float("-inf"), float("-inf"), float("-inf")]])
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        check(lambda x: x.amax(-1), x.to(dtype))
        check(lambda x: x.amin(0), x.to(dtype))
        check(lambda x: torch.softmax(x, -1), x.to(dtype))


def test_fresh_large_buffers_kept_by_the_caller():
    # buffers of >= 4 MB are allocated through _fresh (huge-page advice); outputs the caller keeps are not
    # recycled, so every call writes a new one
    from kiln.codegen.wrapper_runtime import HUGE_BYTES, _fresh
    t = _fresh((1100, 1001), (1, 1100), torch.float32)
    assert t.shape == (1100, 1001) and t.stride() == (1, 1100) and t.untyped_storage().nbytes() >= HUGE_BYTES
    x = torch.randn(1100, 1100)
    c = compiled(lambda x: torch.softmax(x * 2, -1), x)
    first = c(x)
    second = c(x + 1)
    assert first.data_ptr() != second.data_ptr()
    torch.testing.assert_close(first, torch.softmax(x * 2, -1))
    torch.testing.assert_close(second, torch.softmax((x + 1) * 2, -1))


def _in_place_pairs(c):
    return [(name, src) for s in c.plan.steps for name, src in s.inplace.items()]


def _without_in_place(fn, *inputs):
    with config.patch(cpp_in_place=False):
        return compiled(fn, *inputs)


def test_pointwise_written_in_place_of_its_last_input():
    torch.manual_seed(0)
    x = torch.randn(64, 48)

    def fn(x):
        a = torch.sigmoid(x) * 2  # materialized: the column sums read it across rows
        s = a.sum(0)
        b = torch.exp(a) / s  # last reader of `a`, same index: overwrites it
        t = b.sum(0)
        return torch.tanh(b) + t  # last reader of `b`: overwrites it (so `a`'s memory) again
    c = check(fn, x)
    plain = _without_in_place(fn, x)
    assert _in_place_pairs(c) and not _in_place_pairs(plain), c.wrapper_source
    assert c.allocations < plain.allocations, (c.wrapper_source, plain.wrapper_source)
    assert torch.equal(c(x), plain(x))
    torch.testing.assert_close(c(x + 1), fn(x + 1))  # a second call with other values


def test_no_in_place_for_a_transposed_read():
    torch.manual_seed(0)
    x = torch.randn(48, 48)

    def fn(x):
        a = torch.sigmoid(x) * 2
        s = a.sum(0)
        return a.t() / s  # same size and layout, but element (i, j) reads a[j, i]
    c = check(fn, x)
    assert not _in_place_pairs(c), c.wrapper_source


def test_no_in_place_when_read_again_later():
    torch.manual_seed(0)
    x, w = torch.randn(48, 48), torch.randn(48, 48)

    def later_kernel(x):
        a = torch.sigmoid(x) * 2
        s = a.sum(0)
        b = torch.exp(a) / s
        return b, (a * b).amax(0)  # `a` is read again (by a reduction) after `b` is written
    c = check(later_kernel, x)
    assert not _in_place_pairs(c), c.wrapper_source

    def later_extern(x, w):
        a = torch.sigmoid(x) * 2
        s = a.sum(0)
        return torch.exp(a) / s, a @ w  # the matmul reads `a` after the pointwise
    c = check(later_extern, x, w, atol=1e-5, rtol=1e-5)
    assert not _in_place_pairs(c), c.wrapper_source


def test_no_in_place_over_outputs_and_inputs():
    torch.manual_seed(0)
    x = torch.randn(64, 48)

    def output(x):
        a = torch.sigmoid(x) * 2
        s = a.sum(0)
        return a, torch.exp(a) / s  # `a` is returned: never overwritten
    c = check(output, x)
    assert not _in_place_pairs(c), c.wrapper_source
    a, b = c(x)
    torch.testing.assert_close(a, output(x)[0])

    def over_input(x):
        return torch.exp(x) / (x * x).sum(0)  # `x` is the caller's: never overwritten
    x0 = x.clone()
    c = check(over_input, x)
    assert not _in_place_pairs(c) and torch.equal(x, x0), c.wrapper_source


def test_kernel_count_is_never_skipped_for_a_fallback():
    """An op that runs with torch fails `check` unless it is declared with a reason; declared, the kernel
    count is still asserted."""
    x = torch.randn(8, 5)

    def fn(x):  # torch.unique has no decomposition: it runs with torch between two kernels
        return torch.unique((x * 2).round()).exp()
    with pytest.raises(AssertionError, match="ran with torch"):
        check(fn, x, kernels=2)
    c = check(fn, x, kernels=2, fallbacks={"torch.unique": "its output size depends on the values"})
    assert c.kernel_count == 2


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("pool", ["avg", "max"])
def test_pooling_taps_read_one_padded_buffer(layout, pool):
    """A padded value read by a pooling window's taps is computed once into a padded buffer, so the taps are
    plain loads (g++ leaves an inner loop with four or more bounds-tested loads scalar: PoolFormer's 3x3
    average pools ran at 6-8% of the copy bandwidth); values and strides as eager's, also where the
    padding is read (the borders)."""
    x = torch.randn(2, 16, 8, 8)
    if layout == "nhwc":
        x = x.contiguous(memory_format=torch.channels_last)

    def fn(x):
        if pool == "avg":
            return F.avg_pool2d(x, 3, 1, 1, count_include_pad=False) - x
        return F.max_pool2d(x, 3, 1, 1) * 2

    c = compile_graph(kiln.ops.trace(fn, x), [x])
    for args in ([x], [-x.abs()]):  # (max over negative values: the padding's -inf must never win)
        out, expected = c(*args), fn(*args)
        torch.testing.assert_close(out, expected)
        assert out.stride() == expected.stride()
    padded = [name for name, b in c.loop.buffers.items() if sorted(b.layout.shape) == [2, 10, 10, 16]]
    assert len(padded) == 1, {n: b.layout for n, b in c.loop.buffers.items()}
    reads = c.cpp_source.count(f"p_{padded[0]}[")
    assert reads >= 9 and f"? p_{padded[0]}[" not in c.cpp_source, c.cpp_source  # (9 taps, none bounds-tested)
