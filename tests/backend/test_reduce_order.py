"""A reduction over several dims walks its input in memory order (kiln.lower.reduce_order): values against
eager, and the innermost reduced loop reading with stride 1 (PoolFormer's GroupNorm statistics over a
channels-last buffer read it through W's stride C, at 1 GB/s)."""
import re
import shutil

import pytest
import torch
import torch.nn.functional as F

import kiln.ops
from kiln import config
from kiln.backends.cpp import compile_graph
from kiln.lower.index import index_var
from kiln.lower.ir import ComputedBuffer, Reduction
from kiln.lower.reduce_order import _stride

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache_raising")]


def compiled(fn, *inputs):
    return compile_graph(kiln.ops.trace(fn, *inputs), list(inputs))


def _innermost_strides(c):
    """Per reduction reading a graph input or buffer: the stride of its innermost reduced index."""
    strides = []
    for buf in c.loop.buffers.values():
        if isinstance(buf, ComputedBuffer) and isinstance(buf.data, Reduction) and \
                len(buf.data.reduction_ranges) > 1:
            last = index_var("r", len(buf.data.reduction_ranges) - 1)
            loads = [index for _, index in buf.reads() if index.has(last)]
            strides.append(_stride(loads[0], last))
    return strides


@pytest.mark.parametrize("rtype", ["sum", "amax", "mean"])
def test_reduction_of_a_channels_last_input_walks_channels_innermost(rtype):
    x = torch.randn(2, 8, 5, 6).to(memory_format=torch.channels_last)
    fn = {"sum": lambda x: x.sum((1, 2, 3)), "amax": lambda x: x.amax((1, 2, 3)),
          "mean": lambda x: (x * 2).mean((1, 3))}[rtype]
    c = compiled(fn, x)
    torch.testing.assert_close(c(x), fn(x))
    strides = _innermost_strides(c)
    assert strides and all(abs(s) == 1 for s in strides), (strides, c.loop.describe())


def test_arg_reductions_keep_their_order():
    x = torch.randint(0, 3, (2, 4, 3, 3)).float().to(memory_format=torch.channels_last)   # ties
    fn = lambda x: torch.argmax(x.reshape(2, -1), 1)   # noqa: E731
    torch.testing.assert_close(compiled(fn, x)(x), fn(x))


@pytest.mark.parametrize("groups,shape,channels_last", [(1, (2, 16, 6, 5), True), (4, (3, 16, 6, 5), True),
                                                        (4, (3, 16, 6, 5), False), (2, (2, 8, 7), False),
                                                        (2, (2, 4, 3, 4, 5), False)])
def test_group_norm_matches_eager(groups, shape, channels_last):
    torch.manual_seed(0)
    x = torch.randn(shape) * 3 + 1
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    w, b = torch.randn(shape[1]), torch.randn(shape[1])

    def fn(x, w, b):
        return F.group_norm(x, groups, w, b) * 2
    c = compiled(fn, x, w, b)
    got, want = c(x, w, b), fn(x, w, b)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got.stride() == want.stride()
    if channels_last:
        strides = _innermost_strides(c)
        assert strides and all(abs(s) == 1 for s in strides), (strides, c.loop.describe())


@pytest.mark.parametrize("groups", [1, 4])
def test_group_norm_of_a_channels_last_buffer_is_normalized_channels_last(groups):
    # PoolFormer's token mixer reads its GroupNorm's result nine times (a 3x3 pool), so that result is a
    # buffer. Over a convolution's result that kiln lays out channels-last (the model's input row-major), it
    # was written row-major (the normalization of the (N, G, C/G, H, W) reshape, reshaped back) and read
    # back with stride H*W along the channels. Every 4-D buffer inside the graph is channels-last now.
    x = torch.randn(4, 3, 32, 32)
    k, w, b, s = torch.randn(32, 3, 3, 3), torch.randn(32), torch.randn(32), torch.randn(32)

    def mixer(x, k, w, b, s):
        x = F.conv2d(x, k, padding=1)
        y = F.group_norm(x, groups, w, b)
        return x + s[:, None, None] * (F.avg_pool2d(y, 3, 1, 1, count_include_pad=False) - y)
    c = compiled(mixer, x, k, w, b, s)
    out, expected = c(x, k, w, b, s), mixer(x, k, w, b, s)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert out.stride() == expected.stride()
    outputs = set(re.findall(r"\bbuf\d+\b", repr(c.loop.output)))
    inside = [buf for buf in c.loop.buffers.values() if isinstance(buf, ComputedBuffer)
              and len(buf.layout.strides) == 4 and buf.name not in outputs]
    assert inside and all(buf.layout.strides[1] == 1 for buf in inside), \
        [(buf.name, buf.layout.strides) for buf in inside]
