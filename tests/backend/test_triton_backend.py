"""The triton backend under Triton's interpreter (CPU tensors), against eager and against the cpp backend.

- The cpp backend's fusion and layout tests run again through `triton` (same kernel counts asserted:
  the same schedule), with the size heuristics and with tiny tiles (many programs, looped reductions,
  scans carried across blocks, masks on every tail).
- Kernel counts through `triton` equal those through `cpp` on those programs.
- Generated kernels compile for a CUDA GPU (sm_90) without one: what the interpreter accepts but Triton's
  compiler would refuse fails here.
Skipped where triton is not installed. tests/conftest.py sets TRITON_INTERPRET=1 before triton is imported.
"""
import pytest
import torch

pytest.importorskip("triton")

import kiln  # noqa: E402
import kiln.ops  # noqa: E402
from kiln import config, prims  # noqa: E402
from kiln.backends import cpp as cpp_backend  # noqa: E402
from kiln.backends import triton as triton_backend  # noqa: E402
from kiln.codegen.triton import launch_config  # noqa: E402
from kiln.runtime import tritonlib  # noqa: E402

import test_cpp_backend as cpp_tests  # noqa: E402

pytestmark = [pytest.mark.skipif(not tritonlib.interpreting(), reason="needs TRITON_INTERPRET=1 (CPU tensors)"),
              pytest.mark.usefixtures("kiln_cache_raising")]

# the cpp tests that are about the shared stages (fusion, layouts, dtypes, the plan), not about C++
SHARED = """
test_fusion_kernel_counts_on_prim_graphs test_pointwise_chain_and_reduction_is_one_kernel
test_softmax_last_dim_is_one_kernel test_layer_norm_is_one_kernel test_size_one_dims_do_not_split_kernels
test_gelu_mul_add_sum test_simd_tails test_non_contiguous_and_sliced_inputs test_broadcast
test_zero_size_and_zero_dim test_int64_and_bool test_float64 test_reductions
test_full_reduction_split_across_threads test_views_fold_into_indices test_view_output_aliases_input
test_matmul_is_extern_with_fused_epilogue test_prim_graph_directly test_layout_change_falls_back
test_buffers_are_reused test_creation_prims
test_contiguous_dims_collapse_into_one_loop test_scans test_size_one_dims_with_odd_strides
test_linear_and_attention_pass_views_to_externs test_bias_add_folds_into_addmm_only_when_materialized
test_inputs_and_constants_that_are_views_with_a_storage_offset test_half_precision
test_horizontal_fusion_of_siblings test_cat_rev_and_pad test_pad test_bool_buffers_in_kernels
test_float_max_reduction_nan_and_signed_zero test_pointwise_written_in_place_of_its_last_input
test_no_in_place_for_a_transposed_read test_no_in_place_when_read_again_later
test_no_in_place_over_outputs_and_inputs
""".split()
# not here: test_outputs_recycled_only_when_dropped — Triton's interpreter keeps a reference to the storage
# of the tensors a launch wrote, so the wrapper's pool never sees its output free (a GPU launch keeps none)
# with tiles of 64 elements (fast enough under the interpreter only on small inputs)
TINY_TILES = """
test_fusion_kernel_counts_on_prim_graphs test_pointwise_chain_and_reduction_is_one_kernel
test_layer_norm_is_one_kernel test_gelu_mul_add_sum test_simd_tails test_non_contiguous_and_sliced_inputs
test_broadcast test_zero_size_and_zero_dim test_int64_and_bool test_reductions test_views_fold_into_indices
test_scans test_size_one_dims_with_odd_strides test_half_precision test_cat_rev_and_pad test_pad
test_float_max_reduction_nan_and_signed_zero test_pointwise_written_in_place_of_its_last_input
""".split()


@pytest.fixture
def through_triton(monkeypatch):
    monkeypatch.setattr(cpp_tests, "compile_graph", triton_backend.compile_graph)


@pytest.mark.parametrize("name", SHARED)
def test_cpp_test_through_triton(name, request, through_triton):
    test = getattr(cpp_tests, name)
    _call(test, request)


@pytest.mark.parametrize("name", TINY_TILES)
def test_cpp_test_through_triton_tiny_tiles(name, request, through_triton):
    with config.patch(triton_tile=64):
        _call(getattr(cpp_tests, name), request)


def _call(test, request):
    """Run a (possibly parametrized) cpp test function: every parameter set it declares."""
    marks = [m for m in getattr(test, "pytestmark", []) if m.name == "parametrize"]
    if not marks:
        return test()
    (argnames, values), = [m.args for m in marks]
    for value in values:
        test(value)


KERNEL_PROGRAMS = [
    (lambda x: torch.softmax(x, -1), (torch.randn(33, 257),)),
    (lambda x, w, b: torch.nn.functional.layer_norm(x, (100,), w, b),
     (torch.randn(17, 100), torch.randn(100), torch.randn(100))),
    (lambda a, b: torch.nn.functional.gelu(a * b + 1).sum(-1), (torch.randn(64, 301), torch.randn(64, 301))),
    (lambda x: (x - x.mean(0)) / x.std(0), (torch.randn(40, 24),)),
    (lambda x: torch.cumsum(x * 2, -1) + 1, (torch.randn(6, 70),)),
    (lambda x: x.permute(0, 2, 1, 3) * 3, (torch.randn(4, 6, 5, 3),)),
    (lambda x, w: torch.relu(x @ w + 1).amax(-1), (torch.randn(16, 32), torch.randn(32, 24))),
    (cpp_tests.softmax_prims, (torch.randn(9, 31),)),
]


@pytest.mark.parametrize("case", range(len(KERNEL_PROGRAMS)))
def test_kernel_counts_equal_cpp(case):
    fn, inputs = KERNEL_PROGRAMS[case]
    graph = kiln.ops.trace(fn, *inputs)
    c = cpp_backend.compile_graph(graph, list(inputs))
    t = triton_backend.compile_graph(graph, list(inputs))
    assert t.kernel_count == c.kernel_count, (t.cpp_source, c.loop.describe())
    assert [k.describe() for k in t.kernels] == [k.describe() for k in c.kernels]
    torch.testing.assert_close(t(*inputs), fn(*inputs), atol=1e-5, rtol=1e-5)


def test_kiln_compile_backend_triton(counters):
    x = torch.randn(8, 40)
    f = kiln.compile(lambda x: torch.softmax(x * 2, -1) + 1, backend="triton")
    torch.testing.assert_close(f(x), torch.softmax(x * 2, -1) + 1)
    assert counters["triton"]["graphs compiled"] == 1
    assert counters["triton"]["graphs run with torch"] == 0


def test_backward_through_triton_kernels(counters):
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 5)
    w = lin.weight.detach().clone().requires_grad_(True)
    b = lin.bias.detach().clone().requires_grad_(True)
    f = kiln.compile(lambda x: torch.nn.functional.layer_norm(torch.tanh(lin(x)), (5,)).sum(), backend="triton")
    x = torch.randn(3, 6)
    f(x).backward()
    torch.nn.functional.layer_norm(torch.tanh(torch.nn.functional.linear(x, w, b)), (5,)).sum().backward()
    torch.testing.assert_close(lin.weight.grad, w.grad)
    torch.testing.assert_close(lin.bias.grad, b.grad)
    assert counters["triton"]["graphs compiled"] == 2  # the forward, then the backward
    assert counters["triton"]["graphs run with torch"] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_math_functions_match_eager(dtype):
    x = (torch.rand(5, 37) * 1.8 - 0.9).to(dtype)
    y = (torch.rand(5, 37) + 0.5).to(dtype)
    fns = [torch.tanh, torch.expm1, torch.log1p, torch.asin, torch.atan, torch.erf, torch.erfc, torch.lgamma,
           torch.sinh, torch.sigmoid, torch.rsqrt, torch.reciprocal, torch.round, torch.trunc, torch.sign,
           torch.signbit, torch.isfinite, lambda v: torch.nn.functional.gelu(v, approximate="tanh")]
    for fn in fns:
        a = y if fn in (torch.rsqrt, torch.lgamma) else x
        graph = kiln.ops.trace(fn, a)
        t = triton_backend.compile_graph(graph, [a])
        torch.testing.assert_close(t(a), fn(a), equal_nan=True)
    for fn in (torch.atan2, torch.remainder, torch.fmod, torch.pow, torch.hypot, torch.maximum, torch.fmin):
        graph = kiln.ops.trace(fn, x, y)
        t = triton_backend.compile_graph(graph, [x, y])
        torch.testing.assert_close(t(x, y), fn(x, y), equal_nan=True)


def test_integer_division_and_shifts_match_eager():
    a = torch.randint(-50, 50, (7, 9))
    b = torch.randint(1, 9, (7, 9)) * (torch.randint(0, 2, (7, 9)) * 2 - 1)
    for fn in (lambda a, b: torch.div(a, b, rounding_mode="trunc"), lambda a, b: torch.div(a, b, rounding_mode="floor"),
               torch.remainder, torch.fmod, lambda a, b: a << (b.abs() % 5), lambda a, b: a >> (b.abs() % 5),
               lambda a, b: a // b, lambda a, b: (a & b) ^ (a | 3)):
        graph = kiln.ops.trace(fn, a, b)
        t = triton_backend.compile_graph(graph, [a, b])
        torch.testing.assert_close(t(a, b), fn(a, b))


COMPILE_PROGRAMS = [
    (lambda x: torch.softmax(x, -1), (torch.randn(33, 257),)),
    (lambda x: torch.tanh(x).argmax(-1) + torch.cumsum(x, -1)[:, -1].long(), (torch.randn(8, 70),)),
    (lambda h: (h * h + 1).sum(0), (torch.randn(9, 40).to(torch.bfloat16),)),
    (lambda a, b: (a // b) + (a % b) + (a << 2), (torch.randint(-9, 9, (5, 6)), torch.randint(1, 5, (5, 6)))),
    (lambda p, x: torch.where(p, x.erf(), float("nan")).amax(1), (torch.rand(6, 20) > 0.5, torch.randn(6, 20))),
]


def test_kernels_compile_for_a_gpu():
    pytest.importorskip("triton.backends.nvidia")
    jobs = []
    for fn, inputs in COMPILE_PROGRAMS:
        graph = kiln.ops.trace(fn, *inputs)
        t = triton_backend.compile_graph(graph, list(inputs))
        torch.testing.assert_close(t(*inputs), fn(*inputs), equal_nan=True)
        assert triton_backend.launch_configs(t)
        for seg in t.segments.values():
            path = tritonlib.load_module(seg.source).__file__
            for k in seg.kernels:
                cfg = launch_config(k, "device")  # the tiles a GPU would run
                jobs.append({"path": path, "kernel": k.name, "signature": k.signature,
                             "constants": {"XBLOCK": cfg["XBLOCK"], "RBLOCK": cfg["RBLOCK"]}})
    assert len(jobs) >= len(COMPILE_PROGRAMS)
    assert tritonlib.compile_check_in_subprocess(jobs) == []


def test_max_autotune_times_configs_once_and_reads_them_back(counters):
    x = torch.randn(24, 300)

    def fn(x):
        return torch.softmax(x, -1) * 2, (x * 3).t() + 1
    f = kiln.compile(fn, backend="triton", mode="max-autotune")
    for a, b in zip(f(x), fn(x)):
        torch.testing.assert_close(a, b)
    assert counters["triton"]["kernels autotuned"] == 2
    kiln.reset()
    g = kiln.compile(fn, backend="triton", mode="max-autotune")
    for a, b in zip(g(x), fn(x)):
        torch.testing.assert_close(a, b)
    # kiln.reset() emptied the counters: the second compile timed nothing, it read the choices from disk
    assert counters["triton"]["kernels autotuned"] == 0
    assert counters["triton"]["autotune choices read from disk"] == 1


def test_auto_backend_runs_cpu_on_cpp(counters):
    f = kiln.compile(lambda x: x * 2 + 1)
    x = torch.randn(5)
    torch.testing.assert_close(f(x), x * 2 + 1)
    assert counters["cpp"]["graphs compiled"] == 1 and counters["triton"]["graphs compiled"] == 0


def test_int64_indices_where_sizes_need_them(monkeypatch):
    # a buffer or iteration space past 2**30 elements indexes in int64; planted here by lowering the limit
    import kiln.codegen.triton as emitter
    x = torch.randn(6, 50)

    def fn(x):
        return torch.softmax(x, -1) + x.sum(0), torch.cumsum(x, 1)
    graph = kiln.ops.trace(fn, x)
    small = triton_backend.compile_graph(graph, [x])
    assert "tl.int64)" not in small.cpp_source.split("rindex")[0]
    monkeypatch.setattr(emitter, "INT32_LIMIT", 64)
    wide = triton_backend.compile_graph(graph, [x])
    assert "tl.program_id(0).to(tl.int64)" in wide.cpp_source, wide.cpp_source
    for a, b in zip(wide(x), fn(x)):
        torch.testing.assert_close(a, b)
