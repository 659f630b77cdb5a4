"""Views lowered from their nodes' meta: offsets composed with the buffers', against eager; the lowering table
keyed by prims."""
import shutil

import pytest
import torch

import kiln.ops
from kiln import config, prims
from kiln.backends.cpp import compile_graph
from kiln.lower import LOWERINGS, lower
from kiln.lower.lowering import lowering
from kiln.codegen.cpp import CPP_TARGET
from kiln.graph.passes import to_prims

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache_raising")]


def same_as_eager(fn, *inputs):
    c = compile_graph(kiln.ops.trace(fn, *inputs), list(inputs))
    got, want = c(*inputs), fn(*inputs)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(g, w)
        if any(w.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() for t in inputs):
            # a view of an input: the same view (strides, first element) of the same memory
            assert (g.stride(), g.data_ptr()) == (w.stride(), w.data_ptr())
    return c


def offset_inputs():
    """An input that is itself a view with a nonzero storage offset, and its transposed sibling."""
    base = torch.arange(300.0).reshape(10, 30)
    yield base[2:8, 3:23]
    yield base[2:8, 3:23].t()
    yield base[1:, 5:]


def test_views_of_offset_inputs():
    for x in offset_inputs():
        same_as_eager(lambda x: x[1:, 2:].t() + 1, x)
        same_as_eager(lambda x: x[1:3, ::2], x)  # an output view aliases the input at eager's offset
        same_as_eager(lambda x: x.diagonal(2).unsqueeze(0), x)
        same_as_eager(lambda x: (x[2:].unfold(1, 3, 2) * 2, x[1:, 4:].diagonal(-1)), x)


def test_views_of_computed_values():
    for x in offset_inputs():
        same_as_eager(lambda x: (x.exp().t().unsqueeze(0)[:, 1:, 2:] * 2).sum(1), x)
        same_as_eager(lambda x: (x * 2).t()[1:, None, ::3].expand(-1, 4, -1).permute(2, 0, 1) + 1, x)
        same_as_eager(lambda x: (x + 1).reshape(-1)[3:].reshape(-1, 1).diagonal(), x[:, :4])


def test_as_strided_counts_from_the_storage_start():
    def fn(x):
        return prims.mul(prims.as_strided(x, (2, 2), (1, 2), 5), 2.0), prims.as_strided(x, (3,), (2,), 4)
    x = torch.arange(20.0)[3:]
    c = same_as_eager(fn, x)
    for other in (torch.arange(20.0), torch.arange(30.0)[7:24]):  # another storage offset, same layout
        for got, want in zip(c(other), fn(other)):
            torch.testing.assert_close(got, want)


def test_views_do_not_run_torch_while_lowering(monkeypatch):
    graph = to_prims(kiln.ops.trace(lambda x: (x[1:, 2:].t().exp()[None] + 1).sum(0), torch.randn(5, 6)))
    for p in prims.PRIMS.values():
        if "view" in p.tags:
            monkeypatch.setattr(p, "ref", None)
    lower(graph, CPP_TARGET)  # would call None if a view were derived by running its reference


def test_lowerings_are_keyed_by_prims():
    assert all(isinstance(p, prims.Prim) for p in LOWERINGS)
    assert LOWERINGS[prims.where] is not None and prims.exp in LOWERINGS and prims.sum in LOWERINGS
    with pytest.raises(TypeError, match="takes prims"):
        lowering("where")


def test_overlapping_fallback_output_stays_a_view():
    # torch.as_strided with repeated strides runs as a fallback; its result must stay eager's view (it was
    # restrided into a row-major copy: the output no longer aliased its input)
    from kiln.backends.cpp import compile_graph
    x = torch.randn(16)

    def fn(x):
        y = x * 2
        return y.as_strided((2, 2, 2, 2), (1, 1, 1, 1)), torch.as_strided(x, (3, 3), (1, 1)) + 1
    c = compile_graph(kiln.ops.trace(fn, x), [x])
    got, want = c(x), fn(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert got[0].stride() == want[0].stride() == (1, 1, 1, 1)



def test_view_eager_allows_over_a_channels_last_buffer():
    """MobileViT's unfold: `reshape(B * C * nh, p, nw, p)` of a convolution's result is a view of eager's NCHW
    tensor, but no strides give it over the NHWC buffer kiln computes the convolution into (depthwise
    convolutions in the graph make every one NHWC): it reads that buffer through an index map instead of
    refusing the graph."""
    from kiln.testing import models as zoo
    model, _ = zoo.build("mobilevit")
    blocks = model.features[3:6]   # MV2 (24 -> 24), MV2 (24 -> 48, stride 2), MobileViT block
    x = torch.randn(8, 24, 16, 16)
    with torch.no_grad():
        got = kiln.compile(blocks, options={"raise_on_error": True})(x)
        torch.testing.assert_close(got, blocks(x), rtol=1e-4, atol=1e-4)
