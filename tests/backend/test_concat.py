"""Concatenation on the cpp backend (kiln.lower.concat) against eager: prims.cat is never a fallback; inputs
computed by kiln are stored straight into their window of the result, values already in buffers (a
convolution's result, a graph input) are copied there once, and a cat of a run of another cat's inputs (a
DenseNet block's growing feature lists) is a window of that cat's buffer, computed by no kernel. Values,
dtypes and strides as eager's; structure from the loop IR and kiln.profile."""
import shutil

import pytest
import torch
import torch.nn.functional as F

import kiln
import kiln.ops
from kiln import config, profiler
from kiln.backends.cpp import compile_graph
from kiln.lower.ir import ComputedBuffer, ConcatBuffer, ExternNode
from kiln.testing.models import DenseBlock

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache_raising")]

FAKE_PEAKS = {"copy_gbps": 20.0, "matmul_gflops": 100.0, "threads": 1, "cpu": "test", "measured": "now"}


def compiled(fn, *inputs):
    return compile_graph(kiln.ops.trace(fn, *inputs), list(inputs))


def check(fn, *inputs):
    """Same values, dtypes and strides as eager (on the inputs, and on other values of the same layout)."""
    c = compiled(fn, *inputs)
    others = [x.clone().uniform_(0.5, 2) if x.is_floating_point() else x for x in inputs]
    for args in (inputs, others):
        expected, actual = fn(*args), c(*args)
        pairs = zip(actual, expected) if isinstance(expected, tuple) else [(actual, expected)]
        for a, e in pairs:
            torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-5)
            assert a.dtype == e.dtype and a.stride() == e.stride(), (a.stride(), e.stride())
    assert not [n for n in c.loop.nodes if isinstance(n, ExternNode) and n.kind == "fallback"], \
        c.loop.describe()
    return c


def concat_buffers(c):
    return [b for b in c.loop.buffers.values() if isinstance(b, ConcatBuffer)]


def parts(c):
    return [n for n in c.loop.nodes if isinstance(n, ComputedBuffer) and n.storage is not None]


def dense_block(layers, cin=16, growth=8):
    torch.manual_seed(0)
    block = DenseBlock(cin, layers, growth).eval()
    for m in block.modules():
        if isinstance(m, torch.nn.BatchNorm2d):  # statistics and affine parameters away from identity
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
            m.weight.data.uniform_(0.5, 2)
            m.bias.data.uniform_(-1, 1)
    return block


@pytest.mark.parametrize("layers, size", [(3, 8), (20, 4), (4, 32)])
def test_dense_block_matches_eager_without_a_cat_fallback(layers, size, counters):
    """Through kiln.compile, as a user runs it: 20 layers concatenate up to 21 tensors (the old limit was
    16); 32x32 at batch 2 lays the block out channels-last around oneDNN's convolutions."""
    block = dense_block(layers)
    x = torch.randn(2, 16, size, size)
    compiled_block = kiln.compile(block, backend="cpp")
    with torch.no_grad():
        for inputs in (x, x * 2 + 1):
            expected, actual = block(inputs), compiled_block(inputs)
            torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)
            assert actual.dtype == expected.dtype and actual.stride() == expected.stride()
    assert counters["captures"] and not counters["fallback"], dict(counters["fallback"])
    assert sum(counters["extern"].values()) > 0  # (the convolutions, counted where fallbacks would be)


def test_dense_block_concatenations_move_no_bytes():
    """Every cat of the block is a window of one buffer: no kernel computes a cat; each feature map is stored
    once (a convolution's result copied into its window, the block's input computed there), never once per
    cat that reads it."""
    layers = 5
    block = dense_block(layers)
    x = torch.randn(2, 16, 8, 8)
    with torch.no_grad():
        c = check(block, x)
    cats = concat_buffers(c)
    assert len(cats) == layers + 1  # one per torch.cat: the layers' and the block's result
    storage = {b.storage for b in cats}
    assert len(storage) == 1 and storage <= {b.name for b in cats}
    written = parts(c)
    assert len(written) == layers + 1 and {p.storage for p in written} == storage
    root = c.loop.buffers[storage.pop()]
    assert sorted(root.parts) == sorted(p.name for p in written)
    kernels_writing = {m.buffer.name for g in c.kernels for m in g.members}
    assert not kernels_writing & {b.name for b in cats}
    # the layers read the windows themselves (each layer's cat is one buffer read, no select chain)
    readers = [n for n in c.loop.nodes if isinstance(n, ComputedBuffer)
               and any(name in {b.name for b in cats} for name, _ in n.reads())]
    assert len(readers) >= layers


def test_pointwise_producers_are_computed_into_the_cat():
    """relu(a), sigmoid(b) and a * b are computed straight into the cat a convolution reads: one kernel
    reading a and b and writing the cat, which kiln.profile counts as those bytes exactly."""
    a, b = torch.randn(2, 4, 6, 6), torch.randn(2, 4, 6, 6)
    w = torch.randn(5, 12, 3, 3)

    def fn(a, b, w):
        return F.conv2d(torch.cat([a.relu(), b.sigmoid(), a * b], 1), w, padding=1)
    with config.patch(conv_gemm_max_macs=0, conv_depthwise_max_macs=0):  # the convolution as oneDNN's extern
        c = check(fn, a, b, w)
        real = profiler.machine_peaks
        profiler.machine_peaks = lambda remeasure=False: dict(FAKE_PEAKS, cached=True)
        try:
            report = kiln.profile(fn, a, b, w, repeat=1, warmup=0)
        finally:
            profiler.machine_peaks = real
    written = parts(c)
    assert len(written) == 3 and len(concat_buffers(c)) == 1
    for part in written:  # each reads only the graph inputs: no buffer of its own in between
        assert {name for name, _ in part.reads()} <= {"a", "b"}
    assert c.kernel_count == 1 and len(c.kernels[0].members) == 3
    conv = next(n for n in c.loop.nodes if isinstance(n, ExternNode))
    assert conv.reads()[0] == concat_buffers(c)[0].name
    kernels = [r for r in report.rows if r.kind == "kernel"]
    assert not [r for r in report.rows if r.kind == "fallback"]
    assert len(kernels) == 1 and kernels[0].bytes == (a.numel() + b.numel() + 3 * a.numel()) * 4


def test_inputs_in_buffers_concatenate_inline_when_nothing_shares_the_result():
    """A cat of values already in buffers, read by one kernel, stays a select inside that kernel."""
    a, b = torch.randn(3, 4), torch.randn(3, 2)
    c = check(lambda a, b: torch.cat([a, b], 1) * 2, a, b)
    assert c.kernel_count == 1 and not concat_buffers(c)


def many(x):
    return torch.cat([x * i for i in range(20)], 1)


def shared_part(x, y):
    r = x.relu()
    return torch.cat([r, y.exp(), r * 3, x], 1), r + 1, torch.cat([r, y.exp()], 1)


def part_returned(x, y):
    r, s = x.relu(), y.exp()
    return torch.cat([r, s, r * 3, x, s.transpose(1, 2).transpose(1, 2)], 1), r, s[:, 1:]


def repeated(x):
    e = x.exp()
    return torch.cat([e, e, x, e], 0)


def runs_out_of_order(x, y):
    small = torch.cat([x.tanh(), y], 1) * 2
    big = torch.cat([x, x.tanh(), y, y.sigmoid(), x.abs()], 1)
    return small, big


def nested(x, y):
    inner = torch.cat([x.sin(), y.cos()], 2)
    return torch.cat([inner, inner * 2, y.repeat(1, 1, 2)[:, :, :inner.shape[2]] + 1, x.repeat(1, 1, 2)], 0)


def with_empty(x, e):
    return torch.cat([x.exp(), e, x.neg(), e.exp(), x, x], 1)


def channels_last(x, y):
    return torch.cat([x.relu(), y * 2, x, y, x.sigmoid()], 1)


def mixed_dtypes(x, i):
    return torch.cat([x, i, x * 2, i + 1, x.neg()], -1)


def slices(x):
    return torch.cat([x[:, 1:3].exp(), x[:, :2], x[:, 3:5] * 2, x.t()[:2].t(), x[:, ::2][:, :2]], 1)


CASES = {
    "many": (many, lambda: [torch.randn(3, 2, 5)]),
    "shared_part": (shared_part, lambda: [torch.randn(2, 3, 4), torch.randn(2, 2, 4)]),
    "repeated": (repeated, lambda: [torch.randn(2, 7)]),
    "part_returned": (part_returned, lambda: [torch.randn(2, 3, 4), torch.randn(2, 2, 4)]),
    "runs_out_of_order": (runs_out_of_order, lambda: [torch.randn(2, 3, 5), torch.randn(2, 4, 5)]),
    "nested": (nested, lambda: [torch.randn(2, 3, 4), torch.randn(2, 3, 4)]),
    "with_empty": (with_empty, lambda: [torch.randn(2, 3, 4), torch.randn(2, 0, 4)]),
    "channels_last": (channels_last, lambda: [torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
                                              torch.randn(2, 6, 4, 5).to(memory_format=torch.channels_last)]),
    "mixed_dtypes": (mixed_dtypes, lambda: [torch.randn(2, 3, dtype=torch.float64),
                                            torch.randint(-5, 5, (2, 4))]),
    "int64": (many, lambda: [torch.randint(-9, 9, (2, 2, 3))]),
    "bfloat16": (channels_last, lambda: [torch.randn(2, 3, 4, 5, dtype=torch.bfloat16),
                                         torch.randn(2, 6, 4, 5, dtype=torch.bfloat16)]),
    "bool": (lambda p, q: torch.cat([p, q, p[:, :2] & q, ~p, q], 1),
             lambda: [torch.rand(3, 4) > 0.5, torch.rand(3, 2) > 0.5]),
    "slices": (slices, lambda: [torch.randn(4, 6)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_concatenations(case):
    fn, make = CASES[case]
    inputs = make()
    c = check(fn, *inputs)
    if case in ("many", "shared_part", "runs_out_of_order", "with_empty", "channels_last", "slices"):
        assert concat_buffers(c), c.loop.describe()  # computed in place
    if case == "runs_out_of_order":  # the smaller cat is a window of the larger (its inputs are a run of it)
        assert len({b.storage for b in concat_buffers(c)}) == 1 and len(concat_buffers(c)) == 2


def test_symbolic_sizes_concatenate_inline(counters):
    """Windows need static offsets: with a symbolic size every reader selects the input (never a fallback)."""
    fn = kiln.compile(many, backend="cpp", dynamic=True)
    for n in (3, 5, 7):
        x = torch.randn(n, 2, 3)
        torch.testing.assert_close(fn(x), many(x))
    assert not counters["fallback"], dict(counters["fallback"])


def test_training_a_dense_block_matches_eager():
    block = dense_block(3)
    block.train()
    x = torch.randn(2, 16, 8, 8, requires_grad=True)
    compiled_block = kiln.compile(block, backend="cpp")
    out = compiled_block(x)
    out.square().mean().backward()
    grads = [p.grad.clone() for p in block.parameters()] + [x.grad.clone()]
    block.zero_grad()
    x.grad = None
    torch.manual_seed(0)
    expected = dense_block(3).train()
    expected(x).square().mean().backward()
    torch.testing.assert_close(out, expected(x), atol=1e-4, rtol=1e-4)
    for got, want in zip(grads, [p.grad for p in expected.parameters()] + [x.grad]):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_numerics_check_runs_windows_kernel_by_kernel():
    """kiln.check runs each kernel alone on its own entry: windows reach their buffer's memory there too."""
    block = dense_block(3)
    with torch.no_grad():
        report = kiln.check(block, torch.randn(2, 16, 8, 8))
    assert report.first_bad is None, report


def test_a_linear_computed_into_a_cat_keeps_its_window():
    """`x @ w.t() + b` computed into its window of a cat is no `addmm` writing a buffer of its own."""
    x, w, b, y = torch.randn(2, 6), torch.randn(5, 6), torch.randn(5), torch.randn(3, 5)
    c = check(lambda x, w, b, y: torch.cat([F.linear(x, w, b), y.exp(), y, y, y.neg()], 0), x, w, b, y)
    assert len(parts(c)) == 5
