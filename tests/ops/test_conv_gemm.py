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


# ---- 1x1 convolutions: a product of the pixels' rows (kiln.ops.conv_gemm), chosen by timing above the limit
# (kiln.ops.conv_choice) ------------------------------------------------------------------------------------

# (input shape, weight shape, memory format of the input or None, of the weight or None)
POINTWISE = [
    ((2, 8, 5), (12, 8, 1), None, None),                 # conv1d
    ((2, 8, 3, 3), (12, 8, 1, 1), None, None),
    ((3, 16, 2, 2), (24, 16, 1, 1), torch.channels_last, None),   # a channels-last input: NHWC result
    ((3, 16, 2, 4), (24, 16, 1, 1), None, torch.channels_last),   # a channels-last weight, too
    ((2, 4, 3, 2, 3), (6, 4, 1, 1, 1), None, None),      # conv3d
]


def _pointwise_inputs(xs, ws, x_format, w_format):
    x, w = torch.randn(xs), torch.randn(ws)
    return (x if x_format is None else x.contiguous(memory_format=x_format),
            w if w_format is None else w.contiguous(memory_format=w_format))


@pytest.mark.parametrize("case", POINTWISE, ids=[f"{c[0]}-{c[2] or c[3]}" for c in POINTWISE])
def test_pointwise_product_form(case):
    """A small 1x1 convolution over channels-last images (2-d) is a product of the pixels' rows (no gather),
    over NCHW images the channels-first product of gathered columns; a large one timed faster as a product
    takes the rows either way (kiln.ops.conv_gemm._rows_first)."""
    x, w = _pointwise_inputs(*case)
    rows = x.ndim == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()

    def names(**flags):
        with config.patch(**flags):
            graph = to_prims(kiln.ops.trace(lambda x, w: CONV[x.ndim](x, w), x, w))
        return [n.target.name for n in graph.nodes if n.op == "call_prim"]
    small = names()
    assert "mm" in small and "convolution" not in small and ("im2col" in small) != rows, small
    timed = names(conv_gemm_max_macs=1, conv_pointwise="gemm")
    assert "mm" in timed and "im2col" not in timed and "convolution" not in timed, timed


@needs_cpp
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("case", POINTWISE, ids=[f"{c[0]}-{c[2] or c[3]}" for c in POINTWISE])
def test_pointwise_values_strides_and_gradients(case, bias, counters):
    """Forced through the product above the limit too (conv_pointwise='gemm'): eager's values and strides
    (an NHWC result for a channels-last input or weight), and gradients by the accuracy rule."""
    x, w = _pointwise_inputs(*case)
    b = torch.randn(w.shape[0]) if bias else None

    def fn(x, w, b):
        return F.gelu(CONV[x.ndim](x, w, b)) * 2

    with config.patch(conv_gemm_max_macs=1, conv_pointwise="gemm"):
        kiln.reset()
        if x.ndim == 5 and case[2] is not None:
            pytest.skip("unreachable: no 3-d memory format in POINTWISE")
        actual = kiln.compile(fn)(x, w, b)
        expected = fn(x, w, b)
        _judge(actual, expected, fn(x.double(), w.double(), None if b is None else b.double()), "forward")
        assert actual.stride() == expected.stride()
        assert counters["captures"] and not counters["fallbacks"]
        if not bias:
            _judge_loss_and_gradients(lambda x, w, b: fn(x, w, b).pow(2).sum(), case[0], case[1])


def _answer(monkeypatch, tmp_path, conv_us, product_us):
    """conv_choice with its timing replaced (conv_us, product_us per call) and its disk cache in tmp_path;
    returns the list of shapes timed."""
    from kiln.ops import conv_choice
    timed = []

    def measure(*shape):
        timed.append(shape)
        return conv_us * 1e-6, product_us * 1e-6
    monkeypatch.setattr(conv_choice, "measure", measure)
    monkeypatch.setattr(conv_choice, "_answers", {})
    return timed


def test_pointwise_choice_takes_the_product_only_when_clearly_faster(monkeypatch, tmp_path, counters):
    from kiln.ops.conv_choice import MARGIN, gemm_faster
    with config.patch(cache_dir=str(tmp_path)):
        timed = _answer(monkeypatch, tmp_path, 100.0, 100.0 / MARGIN * 0.95)
        assert gemm_faster(8, 96, (2, 2), 384, torch.float32)
        timed = _answer(monkeypatch, tmp_path, 100.0, 100.0 / MARGIN * 1.05)
        assert not gemm_faster(8, 96, (3, 3), 384, torch.float32)  # (a close call keeps oneDNN's)
        assert len(timed) == 1 and counters["conv_choice"]["1x1 convolutions timed"] == 2
        # the flag overrides the timing; above the size limit nothing is timed (oneDNN's)
        assert gemm_faster(8, 96, (5, 5), 384, torch.float32, choice="gemm")
        assert not gemm_faster(8, 96, (2, 2), 384, torch.float32, choice="conv")
        assert not gemm_faster(8, 96, (5, 5), 384, torch.float32, max_macs=1000)
        assert len(timed) == 1


def test_pointwise_choice_is_timed_once_per_machine_and_shape(monkeypatch, tmp_path):
    from kiln.ops import conv_choice
    with config.patch(cache_dir=str(tmp_path)):
        timed = _answer(monkeypatch, tmp_path, 200.0, 20.0)
        assert conv_choice.gemm_faster(8, 96, (2, 2), 384, torch.float32)
        assert conv_choice.gemm_faster(8, 96, (2, 2), 384, torch.float32)  # (this process's answer)
        assert len(timed) == 1
        # another process: the answer comes from the disk cache, the timing says otherwise and is not run
        timed = _answer(monkeypatch, tmp_path, 10.0, 200.0)
        assert conv_choice.gemm_faster(8, 96, (2, 2), 384, torch.float32) and not timed
        assert not conv_choice.gemm_faster(8, 96, (2, 2), 384, torch.float64) and len(timed) == 1
        saved = (tmp_path / conv_choice.FILE).read_text()
        assert "8x96x2x2->384" in saved and "threads=" in saved


def test_pointwise_choice_timing_runs_on_the_real_kernels():
    from kiln.ops.conv_choice import measure
    with torch.autocast("cpu", dtype=torch.bfloat16):  # (times float32 kernels even under autocast)
        conv_s, product_s = measure(2, 8, (2, 2), 16, torch.float32)
    assert 0 < conv_s < 1 and 0 < product_s < 1


@needs_cpp
def test_pointwise_products_keep_channels_last_images_without_a_transpose():
    """In a graph whose convolutions run NHWC (depthwise ones), a 1x1 convolution's product rows are NHWC
    images (kiln.lower.conv_layout follows them): the values computed from them stay NHWC (the copy into eager's
    layout after each product too), so no kernel between the convolutions transposes."""
    from kiln.backends.cpp import compile_graph
    from kiln.lower.conv_layout import channels_last_strides
    from kiln.lower.ir import ExternNode
    x, w = torch.randn(2, 8, 6, 6), torch.randn(16, 8, 3, 3)  # (NCHW: eager's values are NCHW)
    dw, pw1, pw2, dw2 = torch.randn(16, 1, 3, 3), torch.randn(16, 16, 1, 1), torch.randn(16, 16, 1, 1), \
        torch.randn(16, 1, 3, 3)

    def fn(x, w, dw, pw1, pw2, dw2):
        a = F.relu(F.conv2d(F.conv2d(F.conv2d(x, w, padding=1), dw, padding=1, groups=16), pw1))  # (read twice)
        b = F.relu(F.conv2d(a, pw2)) + a
        return F.conv2d(b, dw2, padding=1, groups=16).sum(dim=(2, 3))

    inputs = [x, w, dw, pw1, pw2, dw2]
    with config.patch(conv_gemm_max_macs=1, conv_pointwise="gemm", conv_depthwise_max_macs=0):  # (oneDNN's 3x3s)
        c = compile_graph(kiln.ops.trace(fn, *inputs), inputs)
        torch.testing.assert_close(c(*inputs), fn(*inputs), atol=1e-4, rtol=1e-4)
    products = [n for n in c.loop.nodes if isinstance(n, ExternNode) and n.target_name == "prims.mm"]
    assert len(products) == 2
    # every image-shaped buffer is NHWC, or (N, H, W, C) rows in the same order: nothing is NCHW, so no
    # kernel between the convolutions transposes
    for name, buf in c.loop.buffers.items():
        shape, strides = tuple(buf.layout.shape), tuple(buf.layout.strides)
        if shape == (2, 16, 6, 6):
            assert strides == channels_last_strides(shape), (name, buf.layout)
