"""Shape and view prims against eager: values, shapes, and the exact strides of views."""
import itertools

import pytest
import torch

from kiln import prims
from kiln.graph import TensorMeta
from kiln.graph.layout import dense_strides_like, is_non_overlapping_and_dense
from kiln.prims.shape import view_strides


def check_prim(p, *args, **kwargs):
    """Meta agrees with the reference on shape, strides and dtype; views alias their input."""
    out = p(*args, **kwargs)
    metas = tuple(TensorMeta.of(a) if isinstance(a, torch.Tensor) else a for a in args)
    if p.name == "cat":
        metas = ([TensorMeta.of(t) for t in args[0]],) + metas[1:]
    meta = p.meta(*metas, **kwargs)
    assert tuple(meta.shape) == tuple(out.shape), (p.name, meta, out.shape)
    assert meta.dtype == out.dtype
    if out.numel() > 1:
        assert tuple(meta.strides) == tuple(out.stride()), (p.name, meta.strides, out.stride())
    if "view" in p.tags and out.numel() > 0:
        assert out.untyped_storage().data_ptr() == args[0].untyped_storage().data_ptr()
    return out


def layouts():
    """Tensors with assorted layouts: contiguous, transposed, sliced with steps, expanded, size-1 dims."""
    base = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4)
    yield base
    yield base.transpose(0, 2)
    yield base.permute(1, 0, 2)
    yield base[:, ::2, 1:]
    yield torch.arange(4.0).reshape(1, 4, 1).expand(3, 4, 2)
    yield torch.arange(6.0).reshape(6, 1, 1)
    yield torch.arange(12.0).reshape(3, 4)[:, 1::2]


VIEW_SHAPES = [(24,), (2, 12), (6, 4), (4, 6), (2, 3, 4), (1, 24, 1), (3, 8), (2, 2, 6), (4, 3, 2)]


def test_view_strides_match_eager():
    for x in layouts():
        for shape in VIEW_SHAPES + [(x.numel(),), tuple(x.shape) + (1,), (1,) + tuple(x.shape)]:
            if torch.Size(shape).numel() != x.numel():
                continue
            try:
                expected = x.view(shape)
            except RuntimeError:
                assert view_strides(x.shape, x.stride(), shape) is None
                with pytest.raises(RuntimeError, match="view size is not compatible"):
                    prims.view.meta(TensorMeta.of(x), shape)
                continue
            out = check_prim(prims.view, x, shape)
            assert out.stride() == expected.stride()
            torch.testing.assert_close(out, expected)


def test_view_zero_dim_and_empty():
    check_prim(prims.view, torch.tensor(3.0), (1, 1))
    check_prim(prims.view, torch.ones(1, 1), ())
    check_prim(prims.view, torch.ones(0, 3), (3, 0))
    check_prim(prims.view, torch.ones(0, 3).t(), (3, 0))
    with pytest.raises(RuntimeError, match="is invalid for input of size"):
        prims.view.meta(TensorMeta((2, 3), torch.float32), (4, 2))


def test_permute_squeeze_expand_dims():
    for x in layouts():
        for perm in itertools.permutations(range(x.ndim)):
            torch.testing.assert_close(check_prim(prims.permute, x, perm), x.permute(perm))
        ones = tuple(d for d in range(x.ndim) if x.shape[d] == 1)
        torch.testing.assert_close(check_prim(prims.squeeze, x, ones), x.squeeze(ones) if ones else x)
        for dims in [(0,), (x.ndim,), (0, 2), (1, x.ndim + 1)]:
            out = check_prim(prims.expand_dims, x, dims)
            expected = x
            for d in sorted(dims):
                expected = expected.unsqueeze(d)
            assert out.stride() == expected.stride()
    with pytest.raises(RuntimeError):
        prims.squeeze.meta(TensorMeta((2, 3), torch.float32), (0,))
    with pytest.raises(RuntimeError):
        prims.permute.meta(TensorMeta((2, 3), torch.float32), (0, 0))


def test_slice_with_steps():
    for x in layouts():
        for step in (1, 2, 3):
            start = tuple(min(1, s) for s in x.shape)
            limit = tuple(x.shape)
            out = check_prim(prims.slice, x, start, limit, (step,) * x.ndim)
            expected = x[tuple(slice(a, b, step) for a, b in zip(start, limit))]
            torch.testing.assert_close(out, expected)
            assert out.stride() == expected.stride()
    check_prim(prims.slice, torch.ones(4, 5), (2, 0), (2, 5))
    with pytest.raises(IndexError):
        prims.slice.meta(TensorMeta((4,), torch.float32), (0,), (5,))


def test_diagonal_and_as_strided():
    for x in [torch.arange(20.0).reshape(4, 5), torch.arange(60.0).reshape(3, 4, 5).transpose(0, 2)]:
        for offset in (-3, -1, 0, 1, 2, 7):
            for d1, d2 in [(0, 1), (1, 0)] + ([(0, 2), (2, 1)] if x.ndim == 3 else []):
                out = check_prim(prims.diagonal, x, offset, d1, d2)
                torch.testing.assert_close(out, torch.diagonal(x, offset, d1, d2))
    x = torch.arange(30.0)
    out = check_prim(prims.as_strided, x, (3, 4), (5, 1), 2)
    torch.testing.assert_close(out, x.as_strided((3, 4), (5, 1), 2))


def test_broadcast_in_dim():
    x = torch.arange(3.0).reshape(3, 1)
    out = check_prim(prims.broadcast_in_dim, x, (2, 3, 4), (1, 2))
    torch.testing.assert_close(out, x.expand(2, 3, 4))


def test_rev_cat_clone():
    for x in layouts():
        for dims in [(0,), (x.ndim - 1,), tuple(range(x.ndim))]:
            torch.testing.assert_close(check_prim(prims.rev, x, dims), torch.flip(x, dims))
        torch.testing.assert_close(check_prim(prims.cat, [x, x * 2], 1), torch.cat([x, x * 2], 1))
        for fmt in (torch.contiguous_format, torch.preserve_format):
            out = check_prim(prims.clone, x, memory_format=fmt)
            assert out.stride() == torch.clone(x, memory_format=fmt).stride()
    x = torch.randn(2, 3, 4, 5)
    out = check_prim(prims.clone, x, memory_format=torch.channels_last)
    assert out.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(TypeError):
        prims.cat.meta([TensorMeta((2,), torch.float32), TensorMeta((2,), torch.int64)], 0)
    with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
        prims.cat.meta([TensorMeta((2, 3), torch.float32), TensorMeta((2, 4), torch.float32)], 0)


def test_dense_strides_like_matches_empty_like():
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        ndim = int(torch.randint(1, 5, (1,), generator=gen))
        shape = [int(s) for s in torch.randint(1, 4, (ndim,), generator=gen)]
        x = torch.empty(shape)
        perm = torch.randperm(ndim, generator=gen).tolist()
        y = x.permute(perm)
        if int(torch.randint(0, 2, (1,), generator=gen)):
            d = int(torch.randint(0, ndim, (1,), generator=gen))
            y = y.narrow(d, 0, max(1, y.shape[d] - 1))
        if int(torch.randint(0, 2, (1,), generator=gen)):
            d = int(torch.randint(0, ndim, (1,), generator=gen))
            y = y.unsqueeze(d).expand(*y.shape[:d], 3, *y.shape[d:])
        expected = torch.empty_like(y, memory_format=torch.preserve_format).stride()
        if is_non_overlapping_and_dense(y.shape, y.stride()):
            assert tuple(y.stride()) == expected
        else:
            assert dense_strides_like(y.shape, y.stride()) == expected, (y.shape, y.stride())


def test_pad():
    x = torch.arange(12.0).reshape(3, 4)
    configs = [[(1, 2, 0), (0, 0, 0)], [(0, 0, 1), (2, 1, 2)], [(-1, 0, 0), (1, -2, 0)],
               [(-2, -1, 1), (0, 0, 0)], [(0, 0, 0), (-4, 0, 0)]]
    for config in configs:
        out = check_prim(prims.pad, x, -1.0, config)
        # an independent eager construction: dilate by scattering into a filled tensor, then pad/crop
        grown = [s + (s - 1) * c[2] for s, c in zip(x.shape, config)]
        dilated = torch.full(grown, -1.0)
        dilated[::config[0][2] + 1, ::config[1][2] + 1] = x
        pads = []
        for c in reversed(config):
            pads += [c[0], c[1]]
        expected = torch.nn.functional.pad(dilated, pads, value=-1.0)
        torch.testing.assert_close(out, expected)
    with pytest.raises(RuntimeError):
        prims.pad.meta(TensorMeta((3,), torch.float32), 0.0, [(-2, -2, 0)])


def test_broadcast_in_dim_strides_match_expand():
    cases = [((3, 1), (2, 3, 4)), ((1,), (1, 1, 3)), ((), (1, 1)), ((3, 1), (1, 3, 1)), ((3, 1), (1, 3, 2)),
             ((1, 3), (1, 1, 3)), ((2, 1, 4), (5, 2, 3, 4)), ((0, 1), (2, 0, 3))]
    for shape, target in cases:
        flipped = torch.randn(tuple(reversed(shape))).permute(tuple(reversed(range(len(shape)))))
        for x in [torch.randn(shape), flipped]:
            dims = tuple(range(len(target) - x.ndim, len(target)))
            out = check_prim(prims.broadcast_in_dim, x, target, dims)
            assert out.stride() == x.expand(target).stride(), (shape, target, out.stride())


def test_unfold():
    for x in [torch.arange(30.0).reshape(5, 6), torch.arange(30.0).reshape(6, 5).t()[:, ::2]]:
        for dim, size, step in [(0, 2, 1), (1, 3, 2), (1, 1, 5), (0, x.shape[0], 1)]:
            out = check_prim(prims.unfold, x, dim, size, step)
            torch.testing.assert_close(out, x.unfold(dim, size, step))
    with pytest.raises(RuntimeError):
        prims.unfold.meta(TensorMeta((3,), torch.float32), 0, 4, 1)


def test_metas_accept_symbolic_sizes():
    import sympy
    s = sympy.Symbol("s0", integer=True, positive=True)
    m = TensorMeta((s, 4), torch.float32)
    assert prims.view.meta(m, (s * 4,)).shape == (4 * s,)
    assert prims.permute.meta(m, (1, 0)).strides == (1, 4)
    assert prims.expand_dims.meta(m, (0,)).strides == (4 * s, 4, 1)
    assert prims.slice.meta(m, (0, 1), (s, 4), (1, 2)).shape == (s, 2)
    assert prims.broadcast_in_dim.meta(m, (3, s, 4), (1, 2)).strides == (0, 4, 1)
    assert prims.cat.meta([m, m], 0).shape == (2 * s, 4)
    assert prims.pad.meta(m, 0.0, [(1, 1, 0), (0, 0, 0)]).shape == (s + 2, 4)
    assert prims.diagonal.meta(m, 1, 0, 1).shape == (sympy.Min(s, 3),)
