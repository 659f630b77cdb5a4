"""Shape and view decompositions against eager: values, shapes, dtypes, and the strides of views."""
import pytest
import torch

import kiln.ops
from kiln import graph as kg
from kiln.counters import counters


def check_op(fn, *inputs, strides=True, fallbacks=0):
    """Trace fn, decompose to prims, run; compare with eager (values, dtypes, strides of outputs)."""
    before = sum(counters["fallback"].values())
    g = kiln.ops.trace(fn, *inputs)
    p = kg.to_prims(g)
    kg.verify(p)
    assert len(p.fallbacks()) == fallbacks, [n.target_name() for n in p.fallbacks()]
    assert sum(counters["fallback"].values()) - before == fallbacks
    got = kg.run(p, list(inputs))
    expected = fn(*inputs)
    got_leaves = list(kg.flatten(got))
    exp_leaves = list(kg.flatten(expected))
    assert len(got_leaves) == len(exp_leaves)
    for a, b in zip(got_leaves, exp_leaves):
        if isinstance(b, torch.Tensor):
            assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
            torch.testing.assert_close(a, b, equal_nan=True)
            if strides and b.numel() > 1:
                assert a.stride() == b.stride(), (a.stride(), b.stride())
        else:
            assert a == b
    return g, p


def layouts():
    base = torch.randn(2, 3, 4)
    return [base, base.transpose(0, 2), base[:, ::2, 1:], torch.randn(4, 1).expand(4, 3),
            torch.randn(1, 3, 1), torch.randn(6, 4).t()]


@pytest.mark.parametrize("x", layouts(), ids=lambda x: f"{list(x.shape)}-{list(x.stride())}")
def test_reshape_family(x):
    n = x.numel()
    check_op(lambda a: a.reshape(-1), x)
    check_op(lambda a: torch.reshape(a, (n // x.shape[-1], -1)), x)
    check_op(lambda a: a.flatten(), x)
    check_op(lambda a: a.flatten(1), x)
    check_op(lambda a: torch.flatten(a, 0, -2), x)
    check_op(lambda a: a.ravel(), x)
    check_op(lambda a: a.unflatten(0, (x.shape[0], 1)), x)
    check_op(lambda a, b: a.reshape_as(b), x, torch.zeros(n))
    if x.is_contiguous():
        check_op(lambda a: a.view(-1, x.shape[-1]), x)
        check_op(lambda a: a.view(n), x)
        check_op(lambda a, b: a.view_as(b), x, torch.zeros(1, n))


@pytest.mark.parametrize("x", layouts(), ids=lambda x: f"{list(x.shape)}-{list(x.stride())}")
def test_permute_family(x):
    nd = x.ndim
    check_op(lambda a: a.permute(*reversed(range(nd))), x)
    check_op(lambda a: torch.permute(a, list(range(nd))), x)
    check_op(lambda a: a.transpose(0, -1), x)
    check_op(lambda a: torch.swapaxes(a, 0, 1), x)
    check_op(lambda a: a.swapdims(-1, 0), x)
    check_op(lambda a: a.mT, x)
    check_op(lambda a: torch.movedim(a, 0, -1), x)
    check_op(lambda a: a.moveaxis((0, 1), (1, 0)), x)
    check_op(lambda a: a.squeeze(), x)
    check_op(lambda a: a.squeeze(0), x)
    check_op(lambda a: a.squeeze((0, -1)), x)
    check_op(lambda a: a.unsqueeze(0).unsqueeze(-1).unsqueeze(2), x)
    check_op(lambda a: torch.unsqueeze(a, nd), x)
    check_op(lambda a: a.contiguous(), x)
    check_op(lambda a: a.clone(), x)
    check_op(lambda a: torch.clone(a, memory_format=torch.contiguous_format), x)


def test_t_and_T():
    x = torch.randn(3, 4)
    check_op(lambda a: a.t(), x)
    check_op(lambda a: a.T, x)
    check_op(lambda a: a.mH, x)
    check_op(lambda a: a.H, x)
    check_op(lambda a: torch.t(a), torch.randn(5))
    with pytest.raises(RuntimeError, match="t\\(\\) expects"):
        kiln.ops.trace(lambda a: a.t(), torch.randn(2, 3, 4))


def test_expand_family():
    x = torch.randn(3, 1)
    check_op(lambda a: a.expand(2, 3, 4), x)
    check_op(lambda a: a.expand(-1, 5), x)
    check_op(lambda a: a.expand(1, 1, 3, 1), x)
    check_op(lambda a, b: a.expand_as(b), x, torch.zeros(2, 3, 3))
    check_op(lambda a: torch.broadcast_to(a, (3, 3)), x)
    check_op(lambda a: a.expand(1, 3), torch.randn(()))
    check_op(lambda a, b: torch.broadcast_tensors(a, b), x, torch.randn(2, 1, 5))
    with pytest.raises(RuntimeError, match="must match the existing size"):
        kiln.ops.trace(lambda a: a.expand(3, 4), torch.randn(2, 1).t())


def test_errors_match_eager():
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        kiln.ops.trace(lambda a: a.view(-1), torch.randn(3, 4).t())
    with pytest.raises(RuntimeError, match="is invalid for input of size"):
        kiln.ops.trace(lambda a: a.reshape(5, -1), torch.randn(3, 4))
    with pytest.raises(IndexError):
        kiln.ops.trace(lambda a: a.transpose(0, 2), torch.randn(3, 4))
    with pytest.raises(RuntimeError, match="duplicate dims"):
        kiln.ops.trace(lambda a: a.permute(0, 0), torch.randn(3, 4))


def wide_layouts():
    return [x for x in layouts() if min(x.shape) >= 2]


@pytest.mark.parametrize("x", wide_layouts(), ids=lambda x: f"{list(x.shape)}-{list(x.stride())}")
def test_slicing_family(x):
    check_op(lambda a: a.narrow(0, x.shape[0] - 1, 1), x)
    check_op(lambda a: torch.narrow(a, -1, -2, 2), x)
    check_op(lambda a: a.select(0, -1), x)
    check_op(lambda a: torch.select(a, 1, 0), x)
    check_op(lambda a: a.split(1), x)
    check_op(lambda a: torch.split(a, 2, dim=-1), x)
    check_op(lambda a: a.split([1, x.shape[1] - 1], 1), x)
    check_op(lambda a: a.split_with_sizes([x.shape[-1] - 1, 1], -1), x)
    check_op(lambda a: a.chunk(2), x)
    check_op(lambda a: torch.chunk(a, 3, -1), x)
    check_op(lambda a: a.unbind(1), x)
    check_op(lambda a: torch.unbind(a), x)
    check_op(lambda a: a.tensor_split(3, -1), x)
    check_op(lambda a: torch.tensor_split(a, [1, -1, 10], dim=0), x)
    check_op(lambda a: torch.hsplit(a, [1]), x)
    check_op(lambda a: torch.vsplit(a, [1, 1]), x)
    check_op(lambda a: a.diagonal(), x)
    check_op(lambda a: torch.diagonal(a, -1, 1, 0), x)
    check_op(lambda a: torch.diagonal(a, 1, -1, 0), x)


def test_split_edge_cases():
    x = torch.randn(5, 0)
    check_op(lambda a: a.split(0, 1), x)
    check_op(lambda a: a.chunk(3, 1), x)
    check_op(lambda a: torch.dsplit(a, 2), torch.randn(2, 3, 4))
    with pytest.raises(RuntimeError, match="not divisible"):
        kiln.ops.trace(lambda a: torch.hsplit(a, 2), torch.randn(3, 5))
    with pytest.raises(IndexError):
        kiln.ops.trace(lambda a: a.select(0, 5), torch.randn(3, 5))
    with pytest.raises(RuntimeError, match="exceeds dimension size"):
        kiln.ops.trace(lambda a: a.narrow(0, 2, 2), torch.randn(3, 5))


def test_joining():
    a, b = torch.randn(2, 3), torch.randn(3, 2).t()
    check_op(lambda x, y: torch.cat([x, y]), a, torch.randn(1, 3))
    check_op(lambda x, y: torch.cat((x, y), dim=-1), a, torch.randn(2, 5))
    check_op(lambda x, y: torch.cat([x, y], 1), a, torch.randint(0, 5, (2, 2)))
    check_op(lambda x, y: torch.concat([x, y]), a.double(), a)
    check_op(lambda x, y: torch.concatenate([x, y], axis=1), a, a.bool())
    check_op(lambda x, y: torch.cat([x, y]), a, torch.randn(0))
    check_op(lambda x, y: torch.cat([x, y]), torch.randn(0), torch.randn(0, dtype=torch.float64))
    check_op(lambda x, y: torch.stack([x, y]), a, b)
    cl = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    check_op(lambda x, y: torch.cat([x, y], 1), cl, cl * 2)
    check_op(lambda x, y: torch.cat([x, y], -1), cl, cl)
    check_op(lambda x, y: torch.cat([x, y], 0), cl, torch.randn(2, 3, 4, 5))
    check_op(lambda x, y: torch.stack((x, y), -1), a, b)
    check_op(lambda x, y: torch.hstack([x, y]), a, b)
    check_op(lambda x, y: torch.hstack([x, y]), torch.randn(3), torch.randn(2))
    check_op(lambda x, y: torch.vstack([x, y]), torch.randn(3), torch.randn(3))
    check_op(lambda x, y: torch.dstack([x, y]), a, b)
    check_op(lambda x, y: torch.column_stack([x, y]), torch.randn(3), torch.randn(3, 2))
    check_op(lambda x: torch.atleast_3d(x), torch.randn(4))
    check_op(lambda x, y: torch.atleast_2d(x, y), torch.randn(()), torch.randn(4))
    with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
        kiln.ops.trace(lambda x, y: torch.cat([x, y]), a, torch.randn(2, 4))
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        kiln.ops.trace(lambda x, y: torch.stack([x, y]), a, torch.randn(2, 4))
    with pytest.raises(RuntimeError, match="zero-dimensional"):
        kiln.ops.trace(lambda x, y: torch.cat([x, y]), torch.randn(()), torch.randn(()))


@pytest.mark.parametrize("x", wide_layouts(), ids=lambda x: f"{list(x.shape)}-{list(x.stride())}")
def test_reordering_and_repetition(x):
    check_op(lambda a: a.flip(0), x)
    check_op(lambda a: torch.flip(a, (0, -1)), x)
    check_op(lambda a: torch.fliplr(a), x)
    check_op(lambda a: torch.flipud(a), x)
    check_op(lambda a: torch.roll(a, 1), x)
    check_op(lambda a: torch.roll(a, (2, -1), (0, 1)), x)
    check_op(lambda a: a.roll(-5, -1), x)
    for k in range(-1, 5):
        check_op(lambda a: torch.rot90(a, k, (0, 1)), x)
    check_op(lambda a: a.rot90(1, (-1, 0)), x)
    check_op(lambda a: a.repeat(2, 1, 3), x)
    check_op(lambda a: a.repeat(1, 2, *([1] * (x.ndim - 1))), x)
    check_op(lambda a: a.tile((2,)), x)
    check_op(lambda a: torch.tile(a, (2, 1, 1, 2)), x)
    check_op(lambda a: a.repeat_interleave(2), x)
    check_op(lambda a: torch.repeat_interleave(a, 3, dim=1), x)
    check_op(lambda a: torch.repeat_interleave(a, 0, -1), x)


@pytest.mark.parametrize("x", [torch.randn(4, 5), torch.randn(2, 3, 4).transpose(1, 2), torch.randn(3, 3) > 0,
                               torch.randint(-9, 9, (5, 2)), torch.randn(0, 3)])
def test_triangles_and_diagonals(x):
    for k in (-2, -1, 0, 1, 3):
        check_op(lambda a: a.tril(k), x, strides=False)
        check_op(lambda a: torch.triu(a, k), x, strides=False)
        check_op(lambda a: torch.diag_embed(a, k), x)
        check_op(lambda a: torch.diag_embed(a, k, 0, -1), x)
        if x.ndim == 2:
            check_op(lambda a: torch.diag(a, k), x)
            if x.shape[0] > 0:
                check_op(lambda a: torch.diag(a[0], k), x)
    check_op(lambda a: a.tril(), x)
    check_op(lambda a: a.diag_embed(0, 2, 0), x)


GETITEM = [
    lambda a: a[1], lambda a: a[-1], lambda a: a[:, 1], lambda a: a[:, ::2], lambda a: a[1:3, ..., ::3],
    lambda a: a[None, ..., 1:4:2], lambda a: a[-1, None, 2:, ::3], lambda a: a[...], lambda a: a[:],
    lambda a: a[0, 0, 0], lambda a: a[..., None], lambda a: a[:, None, :, None], lambda a: a[-100:100],
    lambda a: a[3:1], lambda a: a[::5, -2:], lambda a: a[(slice(None), 1)], lambda a: a[..., -1],
]


@pytest.mark.parametrize("x", [torch.randn(4, 5, 6), torch.randn(6, 5, 4).permute(2, 1, 0),
                               torch.randn(4, 10, 6)[:, ::2], torch.randn(4, 1, 6).expand(4, 5, 6)],
                         ids=["contiguous", "permuted", "strided", "expanded"])
def test_getitem_basic_views(x):
    for fn in GETITEM:
        check_op(fn, x)


def test_getitem_errors_and_advanced():
    x = torch.randn(4, 5)
    with pytest.raises(IndexError):
        kiln.ops.trace(lambda a: a[4], x)
    with pytest.raises(IndexError):
        kiln.ops.trace(lambda a: a[0, 0, 0], x)
    with pytest.raises(ValueError, match="step must be greater than zero"):
        kiln.ops.trace(lambda a: a[::-1], x)
    # advanced indices go through kiln.ops.indexing (or fall back): values and shapes still match eager
    for fn in [lambda a: a[:, [1, 3]], lambda a: a[True], lambda a: a[None, [0, 2], 1:]]:
        g = kiln.ops.trace(fn, x)
        got = kg.run(kg.to_prims(g), [x])
        torch.testing.assert_close(got, fn(x))


SETITEM = [
    (lambda a, v: a.__setitem__((1, slice(None, None, 2), slice(1, 5, 3)), v[:3, :2]), (3, 2)),
    (lambda a, v: a.__setitem__(0, v[0, 0]), ()),
    (lambda a, v: a.__setitem__((Ellipsis, -1), v[:4, :5]), (4, 5)),
    (lambda a, v: a.__setitem__((slice(None), None, 2), v[:1, :6]), (1, 6)),
    (lambda a, v: a.__setitem__(slice(3, 1), v[0, 0]), ()),
    (lambda a, v: a.__setitem__((slice(None), 1), 2.5), None),
    (lambda a, v: a.__setitem__((slice(1, None, 2), slice(None, None, 4), 0), 7), None),
]


@pytest.mark.parametrize("case", range(len(SETITEM)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_setitem_basic(case, dtype):
    update, _ = SETITEM[case]

    def fn(a, v):
        update(a, v)
        return a + 0

    x = torch.randn(4, 5, 6).mul(10).to(dtype)
    v = torch.randn(6, 6).mul(10)
    g = kiln.ops.trace(fn, x.clone(), v)
    p = kg.to_prims(g)
    kg.verify(p)
    assert not p.fallbacks(), [n.target_name() for n in p.fallbacks()]
    ours, theirs = x.clone(), x.clone()
    torch.testing.assert_close(kg.run(p, [ours, v]), fn(theirs, v))
    torch.testing.assert_close(ours, theirs)


def test_scatters_grids_and_copies():
    x = torch.randn(3, 4, 5)
    check_op(lambda a, b: torch.select_scatter(a, b, 1, -1), x, torch.randn(3, 5))
    check_op(lambda a, b: torch.slice_scatter(a, b, 1, 1, None, 2), x, torch.randn(3, 2, 5))
    check_op(lambda a, b: torch.slice_scatter(a, b), x, torch.randn(3, 4, 5))
    check_op(lambda a, b: torch.diagonal_scatter(a, b, 1, 2, 0), x, torch.randn(4, 2))
    check_op(lambda a, b: torch.diagonal_scatter(a, b, -1), torch.randn(3, 4), torch.randn(2))
    check_op(lambda a, b: torch.meshgrid(a, b, indexing="xy"), torch.randn(3), torch.randn(4))
    check_op(lambda a, b, c: torch.meshgrid(a, b, c, indexing="ij"), torch.randn(3), torch.randn(4),
             torch.randn(()))
    check_op(lambda a, b: torch.cartesian_prod(a, b), torch.randn(3), torch.randn(4))
    check_op(lambda a, b: torch.block_diag(a, b), torch.randn(2, 3), torch.randint(0, 4, (4,)))
    check_op(lambda a: torch.diagflat(a, -1), torch.randn(2, 3))
    check_op(lambda a: torch.view_copy(a, (12, 5)), x)
    check_op(lambda a: torch.permute_copy(a, (2, 0, 1)), x)
    check_op(lambda a: torch.expand_copy(a, (2, 3, 4, 5)), x)
    check_op(lambda a: torch.unbind_copy(a, 1), x)
    check_op(lambda a: torch.transpose_copy(a, 0, 2), x)
    check_op(lambda a: torch.narrow_copy(a, 2, 1, 3), x)
    check_op(lambda a: torch.split_with_sizes_copy(a, [1, 3], 1), x)


def test_unfold_and_aliases():
    x = torch.randn(3, 7)[:, ::2]
    check_op(lambda a: a.unfold(1, 2, 1), x)
    check_op(lambda a: a.unfold(0, 2, 2), x)
    check_op(lambda a: a.unfold(0, 1, 1), torch.randn(()))
    check_op(lambda a: torch.unfold_copy(a, -1, 3, 1), x)
    check_op(lambda a: torch.alias_copy(a), x)
    check_op(lambda a: torch.unsafe_split(a, 2, 0), x)
    check_op(lambda a: torch.unsafe_chunk(a, 2, 1), x)
    check_op(lambda a: torch.linalg.diagonal(a, offset=1), torch.randn(2, 3, 4))
    with pytest.raises(RuntimeError, match="maximum size for tensor"):
        kiln.ops.trace(lambda a: a.unfold(1, 5, 1), x)


def test_getitem_with_index_tensor_inputs():
    x, i = torch.randn(5, 6, 7), torch.tensor([0, 4, 2])
    for fn in [lambda a, j: a[j], lambda a, j: a[:, j], lambda a, j: a[1:, None, j, ::2],
               lambda a, j: a[..., j]]:
        g = kiln.ops.trace(fn, x, i)
        got = kg.run(kg.to_prims(g), [x, i])
        torch.testing.assert_close(got, fn(x, i))


@pytest.mark.parametrize("case", [
    (lambda t, i, v, m: t.__setitem__((slice(1, None), i), 5.0)),
    (lambda t, i, v, m: t.__setitem__((None, 1, [0, 2]), v[0, :2])),
    (lambda t, i, v, m: t.__setitem__((slice(None), i), 3.0)),
    (lambda t, i, v, m: t.__setitem__((Ellipsis, i), v)),
    (lambda t, i, v, m: t.__setitem__(m, 1.0)),
    (lambda t, i, v, m: t.__setitem__((slice(None, None, 2), i), v[:2])),
])
def test_setitem_advanced(case):
    def fn(t, i, v, m):
        case(t, i, v, m)
        return t * 1
    x = torch.randn(3, 4)
    args = [torch.tensor([3, 1]), torch.randn(3, 2), torch.tensor([True, False, True])]
    g = kiln.ops.trace(fn, x.clone(), *args)
    p = kg.to_prims(g)
    kg.verify(p)
    ours, theirs = x.clone(), x.clone()
    torch.testing.assert_close(kg.run(p, [ours, *args]), fn(theirs, *args))
    torch.testing.assert_close(ours, theirs)


ODD_LAYOUTS = [torch.randn(1, 3).t(), torch.randn(2, 1, 3, 1).permute(3, 2, 1, 0)]


@pytest.mark.parametrize("x", layouts() + ODD_LAYOUTS, ids=lambda x: f"{list(x.shape)}-{list(x.stride())}")
def test_flip_keeps_layout(x):
    for dims in [(0,), (-1,), tuple(range(x.ndim))]:
        check_op(lambda a: a.flip(dims), x)


def test_keyword_spellings():
    x = torch.randn(2, 3, 4)
    for fn in [lambda a: a.permute(dims=(2, 0, 1)), lambda a: torch.swapaxes(a, axis0=0, axis1=2),
               lambda a: a.expand(size=(2, 2, 3, 4)), lambda a: a.split(split_size=2, dim=2),
               lambda a: torch.tensor_split(a, sections=2, dim=1), lambda a: a.tile(dims=(2,)),
               lambda a: a.repeat(repeats=(1, 2, 1)), lambda a: torch.tensor_split(a, indices=[1], dim=1),
               lambda a: a.flip(dims=(0, 2)), lambda a: a.reshape(shape=(6, 4)), lambda a: a.view(size=(4, 6))]:
        check_op(fn, x)


def test_inplace_after_contiguous_copy_and_identity():
    def copy_then_update(x):
        y = x.transpose(0, 1).contiguous()  # a new tensor: updating it leaves x alone
        y.add_(1)
        return y, x * 1

    def identity_then_update(x):
        y = x.contiguous()  # x itself: updating y updates x
        y.add_(1)
        return x * 1

    for fn in (copy_then_update, identity_then_update):
        x = torch.randn(3, 4)
        g = kiln.ops.trace(fn, x.clone())
        p = kg.to_prims(g)
        ours, theirs = x.clone(), x.clone()
        for a, b in zip(kg.flatten(kg.run(p, [ours])), kg.flatten(fn(theirs))):
            assert torch.equal(a, b)
        assert torch.equal(ours, theirs)
