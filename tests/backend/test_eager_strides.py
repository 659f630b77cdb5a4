"""Compiled outputs have eager's strides: elementwise results follow TensorIterator's layout rule
(kiln.graph.layout.elementwise_strides), and the cpp backend writes its buffers in the declared layout, so
code that reads strides (as_strided, view, empty_strided(x.stride())) sees eager's memory."""
import random
import shutil

import pytest
import torch
import torch.nn.functional as F

import kiln
import kiln.ops
from kiln import config
from kiln.backends.cpp import compile_graph
from kiln.graph.layout import elementwise_strides
from kiln.lower.ir import ConcatBuffer

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache_raising")]


def compiled(fn, *inputs):
    return compile_graph(kiln.ops.trace(fn, *inputs), list(inputs))


def same_as_eager(fn, *inputs):
    """Values and strides of every output equal eager's, traced and compiled."""
    want = fn(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    graph = kiln.ops.trace(fn, *inputs)
    got = compile_graph(graph, list(inputs))(*inputs)
    got = got if isinstance(got, tuple) else (got,)
    metas = [n.meta for n in kiln.graph.flatten(graph.output_value)]
    for g, w, m in zip(got, want, metas):
        torch.testing.assert_close(g, w)
        assert g.stride() == w.stride(), (g.stride(), w.stride())
        assert tuple(m.strides) == w.stride(), (m.strides, w.stride())
    return got


def test_as_strided_of_an_elementwise_result_reads_eagers_memory():
    # eager and torch.compile: [[1, 3, 5], [2, 4, 6]]; kiln wrote x + 1 row-major: [[1, 2, 3], [4, 5, 6]]
    def g(x):
        return torch.as_strided(x + 1, (2, 3), (1, 2), 0)
    x = torch.arange(6.).view(2, 3).t()
    same_as_eager(g, x)
    assert kiln.compile(g, backend="cpp")(x).tolist() == [[1, 3, 5], [2, 4, 6]]


def test_permuted_operand_decides_the_layout():
    a, b = torch.randn(2, 4, 4, 4), torch.randn(2, 4, 4, 4)
    out = same_as_eager(lambda a, b: a.permute(0, 2, 3, 1) + b, a, b)[0]
    assert out.stride() == (64, 4, 1, 16)
    same_as_eager(lambda a, b: a.permute(0, 2, 3, 1) + b, a, torch.randn(4))  # a broadcast operand
    same_as_eager(lambda a, b: b + a.permute(0, 2, 3, 1), a, torch.randn(2, 4, 4, 4))  # the first decides
    same_as_eager(lambda a: (a.t() * 2).exp(), torch.randn(5, 7))  # unary chains keep it
    same_as_eager(lambda a: a[:, ::2].t() + 1, torch.randn(6, 8))  # a non-dense operand: dense in its order


def test_view_after_a_layout_preserving_op():
    x = torch.randn(4, 6)
    same_as_eager(lambda x: (x.t() + 1).t().reshape(-1), x)
    same_as_eager(lambda x: (x.t() * 3).contiguous().view(-1), x)


def test_empty_strided_copy_of_a_sliced_view():
    def f(x):
        y = x[:, 1:5] * 2
        out = torch.empty_strided(y.size(), y.stride())
        out.copy_(y)
        return out
    same_as_eager(f, torch.randn(3, 8).t())


def test_channels_last_stays_channels_last_between_kernels():
    w1, w2 = torch.randn(8, 4, 3, 3), torch.randn(8, 8, 1, 1)

    def f(x):
        y = F.relu(F.conv2d(x, w1, padding=1)) + 1
        z = torch.sigmoid(F.conv2d(y, w2)) * y
        return torch.cat([z, F.max_pool2d(y, 1)], 1), y * 2
    x = torch.randn(2, 4, 8, 8).contiguous(memory_format=torch.channels_last)
    c = compiled(f, x)
    for got, want in zip(c(x), f(x)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert got.stride() == want.stride()
        assert got.is_contiguous(memory_format=torch.channels_last)
    # (the cat of channels-last tensors joins them in (N, H, W, C) order: its buffer and the windows its
    # inputs are computed into are (N, H, W, C) arrays, C innermost)
    joined = {b.name for b in c.loop.buffers.values() if isinstance(b, ConcatBuffer) or
              getattr(b, "storage", None) is not None}
    for name in joined:
        assert c.loop.buffers[name].layout.strides[-1] == 1, (name, c.loop.buffers[name].layout)
    nchw = [b for b in c.loop.buffers.values() if tuple(b.layout.shape) in ((2, 8, 8, 8), (2, 16, 8, 8))
            and b.name not in joined]
    assert len(nchw) >= 3, c.loop.describe()
    for buf in nchw:  # every (N, C, H, W) buffer between the kernels is NHWC
        assert buf.layout.strides[1] == 1, (buf.name, buf.layout)


def test_contiguous_inputs_keep_contiguous_results():
    a, b = torch.randn(3, 5), torch.randn(5)
    graph = kiln.ops.trace(lambda a, b: torch.where(a > 0, a * b, -a).to(torch.float64), a, b)
    assert graph.output_value.meta.is_contiguous()


def _random_operand(rng, shape):
    kind = rng.choice(["contiguous", "permuted", "sliced", "channels_last", "broadcast"])
    if kind == "permuted":
        order = list(range(len(shape)))
        rng.shuffle(order)
        return torch.randn([shape[i] for i in order]).permute([order.index(i) for i in range(len(shape))])
    if kind == "sliced":
        return torch.randn(*shape[:-1], 2 * shape[-1])[..., ::2]
    if kind == "channels_last" and len(shape) == 4:
        return torch.randn(shape).contiguous(memory_format=torch.channels_last)
    if kind == "broadcast":
        sizes = list(shape)
        sizes[rng.randrange(len(shape))] = 1
        return torch.randn(sizes)
    return torch.randn(shape)


def test_elementwise_rule_matches_tensoriterator():
    rng = random.Random(0)
    for _ in range(1500):
        shape = [rng.choice([1, 2, 3, 4]) for _ in range(rng.randint(1, 4))]
        operands = [_random_operand(rng, shape) for _ in range(rng.randint(1, 3))]
        scalar = len(operands) == 1 and rng.random() < 0.3
        if len(operands) == 1:
            out = operands[0] * 2 if scalar else operands[0].exp()
        elif len(operands) == 2:
            out = operands[0] + operands[1]
        else:
            out = torch.addcmul(*operands)
        strides = [tuple(t.expand(out.shape).stride()) for t in operands]
        assert elementwise_strides(tuple(out.shape), strides, scalars=scalar) == out.stride(), \
            ([(tuple(t.shape), t.stride()) for t in operands], scalar, out.stride())


_X4 = torch.randn(2, 3, 6, 6)
_LAYOUTS4 = {"channels_last": _X4.contiguous(memory_format=torch.channels_last),
             "transposed": _X4.transpose(2, 3)}
_KERNEL_OPS = {  # ops whose eager kernels allocate their result contiguous or in the input's memory format
    "softmax": lambda a: a.softmax(1),
    "log_softmax": lambda a: F.log_softmax(a, -1),
    "layer_norm": lambda a: F.layer_norm(a, (6,)),
    "batch_norm": lambda a: F.batch_norm(a, torch.zeros(3), torch.ones(3)),
    "max_pool2d": lambda a: F.max_pool2d(a, 2),
    "max_pool2d_indices": lambda a: F.max_pool2d(a, 2, return_indices=True),
    "avg_pool2d": lambda a: F.avg_pool2d(a, 3, 1, 1),
    "adaptive_avg_pool2d": lambda a: F.adaptive_avg_pool2d(a, 4),
    "adaptive_max_pool2d": lambda a: F.adaptive_max_pool2d(a, 3),
    "bilinear": lambda a: F.interpolate(a, scale_factor=2, mode="bilinear"),
    "nearest": lambda a: F.interpolate(a, scale_factor=2),
    "masked_fill": lambda a: a.masked_fill(a > 0, 1.0),
    "renorm": lambda a: a.renorm(2, 0, 1.0),
    "addmm": lambda a: torch.addmm(a[0, 0], a[0, 1], a[1, 0]),
    "conv2d": lambda a: F.conv2d(a, torch.ones(4, 3, 3, 3)),
    "pixel_shuffle": lambda a: F.pixel_shuffle(a[:, :1].expand(2, 4, 6, 6).contiguous(), 2),
    "channel_shuffle": lambda a: F.channel_shuffle(torch.cat([a, a], 1), 2),
    "slice_scatter": lambda a: torch.slice_scatter(a, a[:, :, :2] * 2, 2, 0, 2),
    "index_put": lambda a: a.index_put((torch.tensor([0, 1]),), a[0, 0]),
}


@pytest.mark.parametrize("layout", list(_LAYOUTS4))
@pytest.mark.parametrize("name", list(_KERNEL_OPS))
def test_kernel_results_have_eagers_layout(name, layout):
    same_as_eager(_KERNEL_OPS[name], _LAYOUTS4[layout])


@pytest.mark.parametrize("pool", [lambda a: F.avg_pool1d(a, 2), lambda a: F.adaptive_avg_pool1d(a, 4),
                                  lambda a: F.max_pool1d(a, 2), lambda a: F.adaptive_max_pool1d(a, 3),
                                  lambda a: F.max_pool1d(a, 2, return_indices=True)])
def test_one_dim_pools_of_a_transposed_input(pool):
    # eager runs most 1-d pools as 2-d ones over input.unsqueeze(-2): a transposed input stays transposed
    same_as_eager(pool, torch.randn(2, 6, 3).transpose(1, 2))


def test_one_dim_convolutions_follow_the_weights_layout():
    # eager runs them as 2-d ones over a contiguous copy of the input and an unsqueezed weight: a transposed
    # weight gives an (N, L, C)-ordered result, a transposed input alone a contiguous one
    x, w = torch.randn(2, 3, 8), torch.randn(4, 3, 3)
    t = lambda a: a.transpose(1, 2).contiguous().transpose(1, 2)  # noqa: E731
    for xs, ws in [(x, t(w)), (t(x), w), (t(x), t(w))]:
        same_as_eager(lambda x, w: F.conv1d(x, w), xs, ws)
        same_as_eager(lambda x, w: F.conv_transpose1d(x, w.transpose(0, 1)), xs, ws)


def test_conj_physical_of_a_real_tensor_is_the_tensor():
    x = torch.randn(4, 6)[:, ::2]
    same_as_eager(torch.conj_physical, x)


def test_advanced_indexing_rule_matches_eager():
    from kiln.graph import TensorMeta
    from kiln.prims.indexing import _index_strides
    rng = random.Random(1)
    torch.manual_seed(1)
    for _ in range(600):
        shape = [rng.choice([1, 2, 3, 4]) for _ in range(rng.randint(1, 4))]
        x = _random_operand(rng, shape).expand(shape)
        positions = sorted(rng.sample(range(len(shape)), rng.randint(1, len(shape))))
        index_shape = [rng.choice([1, 2, 3]) for _ in range(rng.randint(1, 2))]
        indices = [None] * (positions[-1] + 1)
        for d in positions:
            index = torch.randint(0, shape[d], index_shape)
            indices[d] = index.t().contiguous().t() if index.ndim == 2 and rng.random() < 0.3 else index
        out = torch.ops.aten.index.Tensor(x, indices)
        got = _index_strides(TensorMeta.of(x), [None if i is None else TensorMeta.of(i) for i in indices],
                             tuple(out.shape))
        placed = [(n, s) for n, s in zip(out.shape, got) if n > 1]
        assert out.numel() == 0 or placed == [(n, s) for n, s in zip(out.shape, out.stride()) if n > 1], \
            (tuple(x.shape), x.stride(), positions, got, out.stride())


def test_advanced_indexing_of_a_transposed_input():
    x = torch.randn(5, 6, 7).transpose(1, 2)
    same_as_eager(lambda x: x[[1, 2]], x)
    same_as_eager(lambda x: x[:, torch.tensor([[0, 2], [1, 1]])], x)
    same_as_eager(lambda x: x[torch.tensor([0, 3]), :, torch.tensor([1, 5])], x)


# (threads, batch, kernel, stride, dtype): torch runs a 3-d convolution with oneDNN (channels-last result for a
# channels-last input) or with its own kernel (contiguous result), by its ConvParams::use_mkldnn rule
CONV3D = [
    (1, 2, 1, 1, torch.float32),   # 1x1, unstrided, batch under 16, one thread: torch's own (contiguous)
    (2, 2, 1, 1, torch.float32),   # the same on two threads: oneDNN
    (1, 2, 3, 1, torch.float32),   # 3x3x3 over two images: oneDNN
    (1, 1, 3, 1, torch.float32),   # one small image, 3-wide kernel: torch's own
    (1, 2, 1, 2, torch.float32),   # strided 1x1: oneDNN
    (1, 2, 3, 1, torch.float64),   # float64: never oneDNN
    (1, 2, 1, 1, torch.bfloat16),  # bfloat16: always oneDNN
]


@pytest.mark.parametrize("case", CONV3D, ids=[f"t{c[0]}-n{c[1]}-k{c[2]}-s{c[3]}-{c[4]}" for c in CONV3D])
def test_conv3d_of_a_channels_last_input_has_eagers_layout(case):
    """A channels-last 3-d convolution's result is channels-last only where oneDNN runs it (found by the
    differential stride check: a 1x1 one at batch 2 on one thread returned contiguous, kiln channels-last)."""
    threads, batch, k, stride, dtype = case
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.randn(batch, 8, 4, 5, 6, dtype=dtype).contiguous(memory_format=torch.channels_last_3d)
        w = torch.randn(12, 8, k, k, k, dtype=dtype)
        def fn(x, w):
            return F.conv3d(x, w, stride=stride) * 2
        with config.patch(conv_gemm_max_macs=0):  # (torch's convolution, as the prim)
            same_as_eager(fn, x, w)
        # kiln's gather + product (kiln.ops.conv_gemm): the same strides; its values are another summation
        # order's (tests/ops/test_conv_gemm.py judges them against float64)
        got, want = compiled(fn, x, w)(x, w), fn(x, w)
        assert got.stride() == want.stride()
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    finally:
        torch.set_num_threads(previous)
