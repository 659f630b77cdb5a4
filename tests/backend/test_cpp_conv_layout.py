"""NHWC layout around 2-D convolutions on the cpp backend (kiln/lower/conv_layout.py) against eager: values
between convolutions are laid out channels-last, kernels walk them contiguously, outputs keep eager's
strides; odd channel counts, size-1 dims, strided and sliced inputs, user channels-last inputs, dtypes,
grouped, strided, dilated and 1x1 convolutions, shared weights, and the torch behaviour the layout relies
on."""
import shutil

import pytest
import torch
import torch.nn.functional as F

import kiln
import kiln.ops
from kiln import config
from kiln.backends.cpp import compile_graph
from kiln.lower.conv_layout import channels_last_strides
from kiln.lower.ir import ComputedBuffer, ExternNode

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache_raising")]


@pytest.fixture(autouse=True)
def onednn_convolutions():
    """These shapes are small enough for kiln.ops.conv_gemm (gather + mm); the layout is about the
    convolution extern, so they keep it (tests/ops/test_conv_gemm.py covers the other path)."""
    with config.patch(conv_gemm_max_macs=0, conv_depthwise_max_macs=0):
        yield


def compiled(fn, *inputs):
    return compile_graph(kiln.ops.trace(fn, *inputs), list(inputs))


def check(fn, *inputs, atol=1e-5, rtol=1e-5):
    """Same values and output strides as eager, on the inputs and on fresh (positive: BatchNorm's variances
    stay valid) values."""
    c = compiled(fn, *inputs)
    for args in (inputs, [x.clone().uniform_(0.25, 2) if x.is_floating_point() else x for x in inputs]):
        expected, actual = fn(*args), c(*args)
        pairs = zip(actual, expected) if isinstance(expected, tuple) else [(actual, expected)]
        for a, e in pairs:
            torch.testing.assert_close(a, e, atol=atol, rtol=rtol)
            assert a.stride() == e.stride()
    return c


def nhwc_buffers(c):
    """Names of the computed buffers and convolution results laid out NHWC."""
    names = []
    for name, buf in c.loop.buffers.items():
        shape = buf.layout.shape
        if len(shape) == 4 and shape[1] > 1 and shape[2] * shape[3] > 1 and \
                tuple(buf.layout.strides) == channels_last_strides(tuple(shape)):
            names.append(name)
    return names


def conv_results(c):
    return [n.outputs[0].name for n in c.loop.nodes
            if isinstance(n, ExternNode) and n.target_name == "prims.convolution"]


def bn(x, p):
    mean, var, w, b = p
    return F.batch_norm(x, mean, var, w, b, training=False, eps=1e-5)


def bn_params(c, dtype=torch.float32):
    return [torch.randn(c, dtype=dtype), torch.rand(c, dtype=dtype) + 0.5, torch.randn(c, dtype=dtype),
            torch.randn(c, dtype=dtype)]


def block(x, w1, w2, w3, m1, v1, g1, b1, m2, v2, g2, b2):
    """conv -> BN -> relu -> depthwise conv -> BN -> relu6 + residual -> 1x1 conv -> global mean."""
    y = F.relu(bn(F.conv2d(x, w1, padding=1), (m1, v1, g1, b1)))
    z = F.relu6(bn(F.conv2d(y, w2, padding=1, groups=w2.shape[0]), (m2, v2, g2, b2))) + y
    return F.conv2d(z, w3).mean((2, 3))


def block_inputs(n, c_in, c, h, w, c_out, dtype=torch.float32):
    torch.manual_seed(0)
    return [torch.randn(n, c_in, h, w, dtype=dtype), torch.randn(c, c_in, 3, 3, dtype=dtype),
            torch.randn(c, 1, 3, 3, dtype=dtype), torch.randn(c_out, c, 1, 1, dtype=dtype),
            *bn_params(c, dtype), *bn_params(c, dtype)]


def test_values_between_convolutions_are_nhwc():
    c = check(block, *block_inputs(2, 3, 16, 12, 12, 8))
    convs = conv_results(c)
    assert len(convs) == 3
    laid_out = nhwc_buffers(c)
    # every convolution returns NHWC: the first one through an NHWC copy of its weight
    assert all(name in laid_out for name in convs), (convs, laid_out)
    kernels = [k for k in c.kernels if any(len(m.buffer.shape) == 4 and m.buffer.name in laid_out
                                           for m in k.members)]
    assert kernels
    # the NHWC elementwise kernels loop over the channels innermost (contiguous along the inner loop)
    for k in kernels:
        store = k.store_index(k.members[0])
        r = k.inner_vars()[-1]
        assert store.coeff(r) == 1, k.describe()
    assert_no_restride_copies(c, block_inputs(2, 3, 16, 12, 12, 8))


def assert_no_restride_copies(c, inputs):
    """Every extern returned the strides kiln expected: the wrapper copied none of their results."""
    c(*inputs)  # the first call swaps in the generated wrapper
    wrapper_globals = c.call.__globals__
    restride = wrapper_globals["_restride"]
    copies = []

    def counting(t, strides):
        if tuple(t.stride()) != strides and t.numel() > 1:
            copies.append((tuple(t.shape), tuple(t.stride()), strides))
        return restride(t, strides)
    wrapper_globals["_restride"] = counting
    try:
        c(*inputs)
    finally:
        wrapper_globals["_restride"] = restride
    assert not copies


@pytest.mark.parametrize("weight, groups, kw", [((8, 8, 3, 3), 1, {}), ((8, 1, 3, 3), 8, dict(stride=2)),
                                                ((6, 8, 1, 1), 1, {}), ((8, 4, 3, 3), 2, dict(dilation=2)),
                                                ((8, 1, 5, 5), 8, dict(padding=2))])
def test_torch_keeps_an_nhwc_operands_layout(weight, groups, kw):
    """What the layout relies on (for speed only: a mismatch is copied): torch returns NHWC for an NHWC
    input, and for an NCHW input with an NHWC weight (one with more than one input channel per group and
    more than one tap: kiln copies no other weight)."""
    x, w = torch.randn(2, 8, 9, 9), torch.randn(weight)
    cl = torch.channels_last
    pairs = [(x.contiguous(memory_format=cl), w)]
    if weight[1] > 1 and weight[2] * weight[3] > 1:
        pairs.append((x, w.contiguous(memory_format=cl)))
    for a, b in pairs:
        out = F.conv2d(a, b, groups=groups, **kw)
        assert out.stride() == channels_last_strides(tuple(out.shape))


@pytest.mark.parametrize("shape", [(1, 3, 7, 5, 5), (3, 5, 7, 9, 3), (2, 1, 6, 1, 1), (1, 2, 2, 1, 3),
                                   (4, 3, 1, 4, 1)])
def test_odd_sizes(shape):
    n, c_in, c, h, w = shape
    check(block, *block_inputs(n, c_in, c, h, w, 5))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_dtypes(dtype):
    tol = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float64 else dict(atol=0.1, rtol=0.05)
    check(block, *block_inputs(2, 3, 8, 6, 6, 4, dtype), **tol)


def test_sliced_and_channels_last_inputs():
    inputs = block_inputs(2, 3, 8, 10, 10, 4)
    x = torch.randn(2, 3, 14, 12)[:, :, 2:12, 1:11]
    assert_no_restride_copies(check(block, x, *inputs[1:]), [x, *inputs[1:]])
    check(block, inputs[0].contiguous(memory_format=torch.channels_last), *inputs[1:])

    def conv_out(x, w):
        return F.conv2d(x, w, padding=1)  # eager returns NHWC for an NHWC input: so does kiln
    check(conv_out, inputs[0].contiguous(memory_format=torch.channels_last), inputs[1])


def test_outputs_keep_eager_strides():
    inputs = block_inputs(2, 3, 8, 6, 6, 4)

    def fn(x, w1, w2, w3, m1, v1, g1, b1, m2, v2, g2, b2):
        y = F.relu(bn(F.conv2d(x, w1, padding=1), (m1, v1, g1, b1)))
        z = F.conv2d(y, w2, padding=1, groups=8)
        return y, z, F.conv2d(torch.sigmoid(z), w3), z.transpose(1, 3)
    check(fn, *inputs)


@pytest.mark.parametrize("kw", [dict(stride=2), dict(dilation=2, padding=2), dict(groups=2),
                                dict(stride=(2, 1), padding=(0, 1)), dict(bias=True)])
def test_convolution_variants(kw):
    kw = dict(kw)
    bias = kw.pop("bias", False)
    groups = kw.get("groups", 1)
    torch.manual_seed(1)
    x, w1, w2 = torch.randn(2, 4, 9, 11), torch.randn(6, 4, 3, 3), torch.randn(4, 6 // groups, 3, 3)
    b = torch.randn(4)

    def fn(x, w1, w2, b, dw):
        y = torch.tanh(F.conv2d(x, w1, padding=1) * 0.5)
        y = F.conv2d(y, dw, padding=1, groups=6) - y  # a depthwise convolution: the graph is NHWC
        return F.conv2d(y, w2, b if bias else None, **kw) + 1
    c = check(fn, x, w1, w2, b, torch.randn(6, 1, 3, 3))
    assert conv_results(c)[1] in nhwc_buffers(c)


def test_shared_weight_and_views_of_nhwc_values():
    torch.manual_seed(2)
    x, w = torch.randn(2, 4, 8, 8), torch.randn(4, 4, 3, 3)

    def fn(x, w):
        y = F.relu(F.conv2d(x, w, padding=1))
        z = F.relu(F.conv2d(y, w, padding=1)) + F.conv2d(y, w[:, :1], padding=1, groups=4)
        flat = z.flatten(2).transpose(1, 2)  # (N, HW, C): contiguous over an NHWC buffer
        return F.conv2d(z, w).sum((1, 2, 3)), flat.softmax(-1).sum(1), z.reshape(2, -1).mean(1)
    check(fn, x, w)


def test_batchnorm_scale_is_computed_once_per_channel():
    def vectors(c):
        return [b for b in c.loop.buffers.values() if isinstance(b, ComputedBuffer) and b.numel() == 16]
    # large kernels read the per-channel scale and shift from buffers of C elements
    c = check(block, *block_inputs(2, 3, 16, 32, 32, 4))
    assert len(vectors(c)) >= 4
    # small ones recompute them (cheaper than the buffers' allocation in the wrapper)
    c = check(block, *block_inputs(1, 3, 16, 8, 8, 4))
    assert not vectors(c)


def test_module_through_kiln_compile():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = torch.nn.Conv2d(3, 16, 3, padding=1, bias=False)
            self.bn1 = torch.nn.BatchNorm2d(16)
            self.dw = torch.nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=16, bias=False)
            self.bn2 = torch.nn.BatchNorm2d(16)
            self.head = torch.nn.Linear(16, 10)

        def forward(self, x):
            x = F.relu(self.bn1(self.conv1(x)))
            x = F.hardswish(self.bn2(self.dw(x)))
            return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))
    torch.manual_seed(3)
    net = Net()
    for m in (net.bn1, net.bn2):
        m.running_mean.uniform_(-1, 1)
        m.running_var.uniform_(0.5, 2)
    net.eval()
    x = torch.randn(3, 3, 15, 15)
    compiled_net = kiln.compile(net, backend="cpp", options={"raise_on_error": True})
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(compiled_net(x), net(x), atol=1e-5, rtol=1e-5)


def test_dense_convolutions_alone_keep_eager_layout():
    torch.manual_seed(5)
    x, w = torch.randn(2, 4, 8, 8), torch.randn(4, 4, 3, 3)

    def fn(x, w):
        return F.conv2d(F.relu(F.conv2d(x, w, padding=1)), w, padding=1)
    c = check(fn, x, w)
    assert not nhwc_buffers(c)


def test_symbolic_sizes_keep_their_layout():
    """Shapes with symbolic sizes are left in eager's layout (the choice needs static sizes)."""
    def fn(x, w):
        return F.relu(F.conv2d(F.relu(F.conv2d(x, w, padding=1)), w[:, :1], padding=1, groups=4))
    torch.manual_seed(4)
    w = torch.randn(4, 4, 3, 3)
    c = kiln.compile(fn, backend="cpp", dynamic=True, options={"raise_on_error": True})
    for h in (6, 9, 7):
        x = torch.randn(2, 4, h, h + 1)
        torch.testing.assert_close(c(x, w), fn(x, w), atol=1e-5, rtol=1e-5)


def resnet_stages(x, w1, w2, w3, wd, m, v, g, b):
    """A large-image stage (NHWC), then a strided stage whose results are small (NCHW), with a shortcut."""
    y = F.relu(bn(F.conv2d(x, w1, padding=1), (m, v, g, b)))
    y = F.relu(F.conv2d(y, w2, padding=1) + y)
    z = F.relu(F.conv2d(y, w3, stride=2, padding=1) + F.conv2d(y, wd, stride=2))
    return F.conv2d(z, w3, padding=1).mean((2, 3))


def stage_inputs(n, h):
    torch.manual_seed(6)
    return [torch.randn(n, 3, h, h), torch.randn(16, 3, 3, 3), torch.randn(16, 16, 3, 3),
            torch.randn(16, 16, 3, 3), torch.randn(16, 16, 1, 1), *bn_params(16)]


def test_dense_convolutions_on_large_images_are_nhwc():
    """Dense convolutions whose results have NHWC_MIN_PIXELS pixels or more run NHWC (the image's through
    an NHWC weight copy); the strided ones after them, with small results, read NCHW inputs: the value
    feeding them is written NCHW once, and no extern result is copied to other strides."""
    from kiln.lower.conv_layout import NHWC_MIN_PIXELS
    n, h = 2, 48
    assert n * h * h >= NHWC_MIN_PIXELS > n * (h // 2) ** 2
    inputs = stage_inputs(n, h)
    c = check(resnet_stages, *inputs, atol=1e-4, rtol=1e-4)
    convs = conv_results(c)
    assert len(convs) == 5
    laid_out = nhwc_buffers(c)
    assert [name in laid_out for name in convs] == [True, True, False, False, False], (convs, laid_out)
    assert_no_restride_copies(c, inputs)


def test_dense_convolutions_on_small_images_keep_eager_layout():
    n, h = 1, 32
    c = check(resnet_stages, *stage_inputs(n, h), atol=1e-4, rtol=1e-4)
    assert not nhwc_buffers(c)


def test_one_input_of_an_nhwc_and_an_nchw_convolution():
    """A value read by a convolution that wants NHWC (large result) and by a strided one that does not:
    it is laid out NHWC, and torch's NHWC result of the strided one is declared so (no copy)."""
    torch.manual_seed(7)
    x, w1, w2 = torch.randn(2, 3, 40, 40), torch.randn(8, 3, 3, 3), torch.randn(8, 8, 3, 3)

    def fn(x, w1, w2):
        y = torch.sigmoid(F.conv2d(x, w1, padding=1))
        return F.conv2d(y, w2, padding=1).sum((2, 3)), F.conv2d(y, w2, stride=4).amax((2, 3))
    c = check(fn, x, w1, w2)
    assert all(name in nhwc_buffers(c) for name in conv_results(c))
    assert_no_restride_copies(c, [x, w1, w2])


def test_padded_input_of_kilns_depthwise_convolution_is_nhwc():
    """A depthwise convolution kiln computes itself (windows of a padded input) after an NHWC value: the pad
    is written NHWC (a contiguous copy, not a transposing gather)."""
    torch.manual_seed(8)
    x, w, dw = torch.randn(2, 3, 40, 40), torch.randn(8, 3, 3, 3), torch.randn(8, 1, 3, 3)

    def fn(x, w, dw):
        y = F.relu6(F.conv2d(x, w, padding=1))
        return torch.sigmoid(F.conv2d(y, dw, stride=2, padding=1, groups=8)).mean((2, 3))
    with config.patch(conv_depthwise_max_macs=1 << 30):
        c = check(fn, x, w, dw)
    assert len(conv_results(c)) == 1   # the dense one; the depthwise one is kiln's kernels
    padded = [name for name in nhwc_buffers(c) if tuple(c.loop.buffers[name].layout.shape) == (2, 8, 42, 42)]
    assert padded, nhwc_buffers(c)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_convolutions_are_nhwc_on_small_images(dtype):
    """Half-precision convolutions run NHWC whatever their size (oneDNN's NCHW half paths are 1.5-2x slower,
    conv_layout.HALF_DTYPES), where float32 ones on these small images keep eager's layout; outputs keep
    eager's strides, and no extern result is copied to other strides."""
    inputs = [t.to(dtype) for t in stage_inputs(1, 32)]
    c = check(resnet_stages, *inputs, atol=0.1, rtol=0.05)   # (test_dtypes' half tolerance)
    convs = conv_results(c)
    assert len(convs) == 5 and all(name in nhwc_buffers(c) for name in convs), (convs, nhwc_buffers(c))
    assert_no_restride_copies(c, inputs)
