"""torch.ops overloads called directly (kiln/ops/aten.py): traced as their torch-level names, vs eager."""
import copy

import pytest
import torch

import kiln
from kiln.testing import aten_overloads

aten = torch.ops.aten


def compiled_run(fn, *args, backend="eager"):
    """(eager result, eager args after, compiled result, compiled args after, counters)."""
    kiln.reset()
    kiln.counters.clear()
    eager_args, kiln_args = copy.deepcopy(args), copy.deepcopy(args)
    expected = fn(*eager_args)
    got = kiln.compile(fn, backend=backend)(*kiln_args)
    return expected, eager_args, got, kiln_args, kiln.counters


def assert_close(got, expected):
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor)
        assert got.shape == expected.shape and got.dtype == expected.dtype, (got, expected)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    else:
        assert type(got) is type(expected), (type(got), type(expected))
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert_close(g, e)


def assert_traced(counters, graphs=1):
    assert sum(counters["graphs"].values()) == graphs, dict(counters)
    assert not counters["graph_breaks"] and not counters["frames_run_natively"], dict(counters)
    assert not counters["fallback"], dict(counters["fallback"])


def graph_ops(fn, *args):
    kiln.reset()
    report = kiln.explain(fn, *args)
    assert report.graph_count == 1 and report.graph_break_count == 0, report
    return [n.target_name() for n in report.graphs[0].nodes if n.op == "call_torch"]


def test_overload_compiles_as_its_torch_name():
    def with_aten(x):
        return aten.add.Tensor(x, 1).relu()

    def with_torch(x):
        return torch.add(x, 1).relu()
    x = torch.randn(4, 8)
    assert graph_ops(with_aten, x) == graph_ops(with_torch, x) == ["torch.add", "torch.Tensor.relu"]
    expected, _, got, _, counters = compiled_run(with_aten, x, backend="cpp")
    assert_close(got, expected)
    assert_traced(counters)
    assert kiln.counters["cpp"]["graphs compiled"] == 1


@pytest.mark.parametrize("fn", [
    lambda x, w: aten.sum.dim_IntList(x, [1], True),
    lambda x, w: aten.sum(x, [0]),  # the packet: torch picks sum.dim_IntList
    lambda x, w: aten.sum.default(x),
    lambda x, w: aten.mm.default(x, w),
    lambda x, w: aten.addmm.default(x[0], x, w, beta=0.5),
    lambda x, w: aten._softmax.default(x, 1, False),
    lambda x, w: aten._log_softmax.default(x, 0, False),
    lambda x, w: aten.native_layer_norm.default(x, [8], w[0], w[1], 1e-5),
    lambda x, w: aten.view.default(x, [2, 16]) * 2,
    lambda x, w: aten.t.default(x),
    lambda x, w: aten.expand.default(x[:1], [3, 8]) + 1,
    lambda x, w: aten.permute.default(x, [1, 0]) + 1,
    lambda x, w: aten.clone.default(x.t(), memory_format=torch.contiguous_format),
    lambda x, w: aten._to_copy.default(x, dtype=torch.float64),
    lambda x, w: aten.max.dim(x, 1),  # a plain tuple, as the overload returns (torch.max's is named)
    lambda x, w: aten.split.Tensor(x, 3),  # a list
    lambda x, w: aten.var.correction(x, [1], correction=0, keepdim=True),
    lambda x, w: aten.where.self(x > 0, x, w[0]),
    lambda x, w: aten.gelu.default(x, approximate="tanh"),
    lambda x, w: aten.leaky_relu.default(x, 0.2),  # F.leaky_relu's decomposition
    lambda x, w: aten.convolution.default(x[None, None], w[None, None, :3, :3], None, [1, 1], [0, 0],
                                          [1, 1], False, [0, 0], 1),
], ids=lambda fn: "")
def test_overloads_traced(fn):
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    expected, _, got, _, counters = compiled_run(fn, x, w, backend="prims")
    assert_close(got, expected)
    assert_traced(counters)


def test_inplace_overload_updates_input_and_views():
    def f(x):
        v = aten.view.default(x, [8])
        aten.add_.Tensor(v, 1)  # through a view: x sees it
        aten.mul_.Scalar(x, 2)
        return v.sum()

    def with_torch(x):
        v = x.view(8)
        v.add_(1)
        x.mul_(2)
        return v.sum()
    expected, eager_args, got, kiln_args, counters = compiled_run(f, torch.randn(2, 4))
    assert_close(got, expected)
    assert_close(kiln_args, eager_args)
    fallbacks = dict(counters["fallback"])
    assert fallbacks == dict(compiled_run(with_torch, torch.randn(2, 4))[4]["fallback"])  # (view_update's)
    assert graph_ops(f, torch.randn(2, 4)) == graph_ops(with_torch, torch.randn(2, 4))


def test_out_overload_writes_its_out_tensor():
    def f(x, out):
        r = aten.add.out(x, 1, out=out)
        return r * 2, aten.max.dim_max(x, 1, max=torch.empty(2), max_values=torch.empty(2, dtype=torch.long))
    expected, eager_args, got, kiln_args, counters = compiled_run(f, torch.randn(2, 4), torch.zeros(2, 4))
    assert_close(got, expected)
    assert_close(kiln_args, eager_args)
    assert not counters["graph_breaks"] and not counters["frames_run_natively"], dict(counters)


def test_unmapped_inplace_overload_is_a_fallback_on_a_copy():
    def f(x, y):
        aten.fill_diagonal_.default(x, 2.0)  # kiln has no decomposition of fill_diagonal_: a fallback updating x
        return x + y
    expected, eager_args, got, kiln_args, counters = compiled_run(f, torch.randn(3, 3), torch.randn(3))
    assert_close(got, expected)
    assert_close(kiln_args, eager_args)
    assert dict(counters["fallback"]) == {"torch.ops.aten.fill_diagonal_.default": 1}
    assert not counters["graph_breaks"]


def test_overload_writing_other_arguments_runs_eagerly():
    def f(x, mean, var):
        out = aten._native_batch_norm_legit.default(x, None, None, mean, var, True, 0.1, 1e-5)
        return out[0] + 1
    args = torch.randn(4, 3), torch.zeros(3), torch.ones(3)
    expected, eager_args, got, kiln_args, counters = compiled_run(f, *args)
    assert_close(got, expected)
    assert_close(kiln_args, eager_args)  # the running statistics, updated once
    assert counters["graph_breaks"] or counters["frames_run_natively"]


def test_unmapped_view_overload_aliases_its_input():
    def f(x):
        a = aten.alias.default(x)
        x.add_(1)
        return a * 1
    expected, eager_args, got, kiln_args, _ = compiled_run(f, torch.randn(3))
    assert_close(got, expected)
    assert_close(kiln_args, eager_args)


def test_overload_is_guarded_by_identity():
    def f(x, op):
        return op(x, 2)
    compiled = kiln.compile(f, backend="eager")
    x = torch.ones(3)
    for op in (aten.add.Tensor, aten.mul.Tensor, aten.sub):
        assert_close(compiled(x, op), op(x, 2))


@torch.library.custom_op("kilntest::scaled", mutates_args=())
def _scaled(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


@_scaled.register_fake
def _(x, factor):
    return torch.empty_like(x)


def test_custom_op_is_a_graph_node_counted_as_a_custom_op():
    """A library's operator is an extern of the graph by design: counted under custom_op, not as a fallback
    (an op kiln should have lowered), and kiln.explain lists it apart."""
    def f(x):
        return torch.ops.kilntest.scaled(x + 1, 3.0).relu()
    expected, _, got, _, counters = compiled_run(f, torch.randn(5), backend="prims")
    assert_close(got, expected)
    assert sum(counters["graphs"].values()) == 1 and not counters["graph_breaks"], dict(counters)
    assert dict(counters["custom_op"]) == {"torch.ops.kilntest.scaled.default": 1}
    assert not counters["fallback"], dict(counters["fallback"])
    import kiln
    kiln.reset()
    report = kiln.explain(f, torch.randn(5))
    assert report.custom_ops == [{"torch.ops.kilntest.scaled.default": 1}] and report.fallbacks == [{}]


def test_opinfo_overloads_match_eager():
    """The first sample of every OpInfo entry with an aten operator, called as its overload."""
    results = aten_overloads.sweep()
    mismatches = [(c.name, str(c.op), d) for c, d in results["mismatch"]]
    assert not mismatches, mismatches
    # 468 cases on torch 2.13: 346 traced, 111 fallback (no decomposition: linalg, fft, ...), 11 eager
    # (numbers computed from values, writes of running statistics, data-dependent shapes)
    assert len(results["traced"]) >= 340, len(results["traced"])
    assert len(results["eager"]) <= 12, [(c.name, d) for c, d in results["eager"]]


@pytest.mark.slow
def test_opinfo_overloads_match_eager_all_samples():
    for dtype in (torch.float32, torch.int64):
        results = aten_overloads.sweep(dtype, first_only=False)
        mismatches = [(c.name, str(c.op), d) for c, d in results["mismatch"]]
        assert not mismatches, mismatches


def test_detach_overload_result_does_not_require_grad():
    def f(x):
        y = aten.detach.default(x * 2)  # a fallback node: its result's requires_grad is eager's
        return y.requires_grad, y + 1
    x = torch.randn(3, requires_grad=True)
    expected = f(x)
    got = kiln.compile(f, backend="eager")(x)
    assert got[0] is expected[0] is False
    assert_close(got[1], expected[1])


def test_overload_first_used_in_compiled_code():
    aten.hardshrink.__dict__.pop("default", None)  # the packet makes the overload on its first use

    def f(x):
        return aten.hardshrink.default(x, 0.5) + 1
    expected, _, got, _, counters = compiled_run(f, torch.randn(6))
    assert_close(got, expected)
    assert_traced(counters)


@pytest.mark.parametrize("fn", [
    lambda x: x * int(torch.equal(x, torch.ones(3))),  # a fallback returning a number
    lambda x: x * int(aten.equal.default(x, torch.ones(3))),
    lambda x: (x + 1) * aten.item.default(x.sum()),
    lambda x: x * aten.allclose.default(x, torch.ones(3)),
], ids=["torch.equal", "aten.equal", "aten.item", "aten.allclose"])
def test_numbers_computed_from_values_are_not_kept_in_the_graph(fn):
    kiln.reset()
    compiled = kiln.compile(fn, backend="eager")
    for x in (torch.ones(3), torch.full((3,), 2.0)):
        assert_close(compiled(x), fn(x))


@pytest.mark.parametrize("fn", [
    lambda x: x * aten.sym_size.int(x, 0),
    lambda x: x * aten.size.int(x, -1),
    lambda x: x * aten.sym_numel.default(x),
    lambda x: x * aten.dim.default(x),
    lambda x: x * aten.sym_stride.int(x, 0),
], ids=["sym_size", "size", "sym_numel", "dim", "sym_stride"])
def test_metadata_queries_are_traced(fn):
    kiln.reset()
    kiln.counters.clear()
    compiled = kiln.compile(fn, backend="eager")
    for x in (torch.ones(3), torch.full((4,), 2.0), torch.ones(5)):
        assert_close(compiled(x), fn(x))
    assert not kiln.counters["graph_breaks"] and not kiln.counters["fallback"], dict(kiln.counters)
