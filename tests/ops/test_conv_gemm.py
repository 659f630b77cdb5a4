"""Small CPU convolutions as gather + matrix product (kiln.ops.conv_gemm, prims im2col / col2im): values
and gradients against eager by the accuracy rule (fp64 reference; the summation order differs from
oneDNN's), which convolutions take the path, and the window prims' reference, meta and adjointness."""
from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

import kiln
import kiln.ops
from kiln import config, prims
from kiln.graph import to_prims
from kiln.testing.tolerance import OP_TOL, accuracy_rule

needs_cpp = pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler")
pytestmark = pytest.mark.usefixtures("kiln_cache")

# (input shape, weight shape, stride, padding, dilation)
SHAPES = [
    ((4, 3, 16, 16), (8, 3, 3, 3), 1, 1, 1),
    ((4, 8, 16, 16), (16, 8, 3, 3), 2, 1, 1),   # strided: col2im's multiples of the stride
    ((4, 8, 16, 16), (16, 8, 1, 1), 2, 0, 1),   # a 1x1 shortcut
    ((2, 4, 9, 9), (5, 4, 3, 3), 2, 2, 2),      # dilated, padded past the kernel's reach
    ((1, 3, 7, 9), (2, 3, 2, 3), (1, 2), (0, 1), 1),  # rectangular kernel, per-dim stride and padding
    ((2, 4, 11), (6, 4, 3), 2, 1, 1),           # conv1d
    ((1, 2, 5, 6, 7), (3, 2, 2, 3, 2), 1, 1, 1),  # conv3d
]
CONV = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}


def _conv(x, w, b, stride, padding, dilation):
    return CONV[x.ndim](x, w, b, stride, padding, dilation)


def _judge(actual, eager, fp64, what):
    result = accuracy_rule(actual, eager, fp64, tol=OP_TOL)
    assert result.passed, f"{what}: {result.reason}"


def _judge_loss_and_gradients(loss, xs, ws):
    """kiln's loss and gradients of (x, w, b) against eager's, by the accuracy rule (fp64 reference)."""
    torch.manual_seed(0)
    x64, w64, b64 = torch.randn(xs, dtype=torch.float64), torch.randn(ws, dtype=torch.float64), \
        torch.randn(ws[0], dtype=torch.float64)

    def grads(fn, dtype):
        inputs = [t.detach().to(dtype).requires_grad_() for t in (x64, w64, b64)]
        out = fn(*inputs)
        out.backward()
        return [out.detach()] + [t.grad for t in inputs]

    kiln.reset()
    actual = grads(kiln.compile(loss), torch.float32)
    eager, exact = grads(loss, torch.float32), grads(loss, torch.float64)
    for what, a, e, r in zip(("loss", "grad x", "grad w", "grad b"), actual, eager, exact):
        _judge(a, e, r, what)
    return x64, w64, b64


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{s[0]}x{s[1]}" for s in SHAPES])
def test_takes_the_gemm_path(shape):
    xs, ws, stride, padding, dilation = shape
    x, w = torch.randn(xs), torch.randn(ws)
    graph = to_prims(kiln.ops.trace(lambda x, w: _conv(x, w, None, stride, padding, dilation), x, w))
    names = [n.target.name for n in graph.nodes if n.op == "call_prim"]
    assert "im2col" in names and "mm" in names and "convolution" not in names, names


@needs_cpp
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{s[0]}x{s[1]}" for s in SHAPES])
def test_values_and_gradients_against_eager(shape, counters):
    xs, ws, stride, padding, dilation = shape

    def loss(x, w, b):
        return F.relu(_conv(x, w, b, stride, padding, dilation)).pow(2).sum()

    _judge_loss_and_gradients(loss, xs, ws)
    assert counters["extern"]["prims.mm"] >= 1 and not counters["extern"]["prims.convolution"]
    assert not {k: v for k, v in counters["cpp"].items() if k.startswith("ran with torch")}


@needs_cpp
def test_large_and_grouped_convolutions_keep_onednn():
    x = torch.randn(8, 64, 32, 32)
    big = to_prims(kiln.ops.trace(lambda x, w: F.conv2d(x, w, padding=1), x, torch.randn(64, 64, 3, 3)))
    grouped = to_prims(kiln.ops.trace(lambda x, w: F.conv2d(x, w, groups=64), x, torch.randn(64, 1, 3, 3)))
    for graph in (big, grouped):
        assert "convolution" in [n.target.name for n in graph.nodes if n.op == "call_prim"]
    with config.patch(conv_gemm_max_macs=0):
        small = to_prims(kiln.ops.trace(lambda x, w: F.conv2d(x, w), torch.randn(1, 2, 4, 4),
                                        torch.randn(2, 2, 3, 3)))
    assert "convolution" in [n.target.name for n in small.nodes if n.op == "call_prim"]


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{s[0]}x{s[1]}" for s in SHAPES])
def test_window_prims_reference_and_adjoint(shape):
    xs, ws, stride, padding, dilation = shape
    n = len(ws) - 2
    expand = (lambda v: (v,) * n if isinstance(v, int) else tuple(v))
    window = (tuple(ws[2:]), expand(stride), expand(padding), expand(dilation))
    x = torch.randn(xs, dtype=torch.float64)
    w = torch.randn(ws, dtype=torch.float64)
    cols = prims.im2col(x, *window)
    # im2col + mm is the convolution
    out = (w.reshape(ws[0], -1) @ cols.reshape(cols.shape[0] * torch.Size(ws[2:]).numel(), -1))
    expected = _conv(x, w, None, stride, padding, dilation)
    torch.testing.assert_close(out.reshape(ws[0], xs[0], *expected.shape[2:]).transpose(0, 1), expected)
    # col2im is im2col's adjoint: <im2col(x), g> == <x, col2im(g)>
    g = torch.randn_like(cols)
    torch.testing.assert_close((cols * g).sum(), (x * prims.col2im(g, xs, *window)).sum())


# depthwise: (input shape, weight shape, stride, padding, dilation); groups = input channels
DEPTHWISE = [
    ((2, 8, 16, 16), (8, 1, 3, 3), 1, 1, 1),    # MobileNet's 3x3
    ((2, 8, 16, 16), (16, 1, 3, 3), 2, 1, 1),   # two outputs per channel, strided
    ((1, 4, 9, 9), (4, 1, 3, 3), 1, 2, 2),      # dilated, padded past the kernel's reach
    ((1, 6, 7, 9), (6, 1, 2, 3), (1, 2), (0, 1), 1),  # rectangular kernel, per-dim stride and padding
    ((2, 4, 11), (4, 1, 5), 1, 2, 1),           # conv1d
    ((1, 3, 5, 6, 7), (3, 1, 2, 3, 2), 1, 1, 1),  # conv3d
]


def _depthwise(x, w, b, stride, padding, dilation):
    return CONV[x.ndim](x, w, b, stride, padding, dilation, groups=x.shape[1])


@pytest.mark.parametrize("shape", DEPTHWISE, ids=[f"{s[0]}x{s[1]}" for s in DEPTHWISE])
def test_depthwise_takes_the_gather_path(shape):
    xs, ws, stride, padding, dilation = shape
    x, w = torch.randn(xs), torch.randn(ws)
    graph = to_prims(kiln.ops.trace(lambda x, w: _depthwise(x, w, None, stride, padding, dilation), x, w))
    names = [n.target.name for n in graph.nodes if n.op == "call_prim"]
    assert "im2col" in names and "mm" not in names and "convolution" not in names, names


@needs_cpp
@pytest.mark.parametrize("shape", DEPTHWISE, ids=[f"{s[0]}x{s[1]}" for s in DEPTHWISE])
def test_depthwise_values_and_gradients_against_eager(shape, counters):
    xs, ws, stride, padding, dilation = shape

    def loss(x, w, b):
        return F.relu6(_depthwise(x, w, b, stride, padding, dilation)).pow(2).sum()

    x64, w64, b64 = _judge_loss_and_gradients(loss, xs, ws)
    assert not counters["extern"]["prims.convolution"]
    assert not {k: v for k, v in counters["cpp"].items() if k.startswith("ran with torch")}
    with torch.no_grad():     # inference: one kernel's masked loads for the padding
        x = x64.float()
        _judge(kiln.compile(_depthwise)(x, w64.float(), b64.float(), stride, padding, dilation),
               _depthwise(x, w64.float(), b64.float(), stride, padding, dilation),
               _depthwise(x64, w64, b64, stride, padding, dilation), "inference")


def test_other_grouped_convolutions_keep_onednn():
    x = torch.randn(2, 8, 8, 8)
    for w, groups in ((torch.randn(8, 4, 3, 3), 2), (torch.randn(8, 2, 3, 3), 4)):
        graph = to_prims(kiln.ops.trace(lambda x, w: F.conv2d(x, w, groups=groups), x, w))
        assert "convolution" in [n.target.name for n in graph.nodes if n.op == "call_prim"]


@needs_cpp
def test_depthwise_kernel_indexes_without_division():
    """Each tap's load is its input's index plus a constant: a view merging im2col's window dims made the
    loads index through `/` and `%`, which g++ does not vectorize (MobileNet at batch 1 ran 2.7x slower)."""
    from kiln.backends.cpp import compile_graph
    x, w = torch.randn(1, 16, 32, 32), torch.randn(16, 1, 3, 3)

    def fn(x, w):
        return F.relu6(F.conv2d(x, w, padding=1, groups=16))
    compiled = compile_graph(kiln.ops.trace(fn, x, w), [x, w])
    torch.testing.assert_close(compiled(x, w), fn(x, w), rtol=1e-5, atol=1e-5)
    loads = [line for line in compiled.cpp_source.splitlines() if line.strip().startswith("float t") and "[" in line]
    assert len(loads) >= 9, compiled.cpp_source
    for line in loads:
        index = line.split("[", 1)[1]
        assert "/" not in index and "%" not in index, line


def test_compile_options_reach_capture():
    """kiln.compile(options=) sets the limits for that compile's capture: with conv_gemm_max_macs=0 the
    convolution keeps oneDNN's prim, and the process-wide flag is left as it was."""
    def conv(x, w):
        return F.conv2d(x, w, padding=1)

    def prim_names(options):
        seen = []

        def recording(graph, example_inputs):
            seen.extend(n.target.name for n in to_prims(graph).nodes if n.op == "call_prim")
            return kiln.graph.torch_callable(graph)
        x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
        out = kiln.compile(conv, backend=recording, options=options)(x, w)
        torch.testing.assert_close(out, conv(x, w))
        return seen

    kiln.reset()
    default = prim_names(None)
    assert "im2col" in default and "convolution" not in default, default
    off = prim_names({"conv_gemm_max_macs": 0})
    assert "convolution" in off and "im2col" not in off, off
    assert config.get("conv_gemm_max_macs") > 0
    with config.patch(conv_gemm_max_macs=0):  # and an option overrides the flag the other way
        on = prim_names({"conv_gemm_max_macs": 1 << 30})
    assert "im2col" in on and "convolution" not in on, on
