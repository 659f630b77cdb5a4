"""The layout rules against eager's own answers, on ints, and on symbolic sizes where they compute with them."""
import itertools

import sympy
import torch

from kiln.graph import layout


def strided_tensors():
    """Assorted layouts: contiguous, permuted, stepped, sliced, expanded, size-1 and size-0 dims."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        ndim = int(torch.randint(0, 5, (1,), generator=gen))
        shape = [int(s) for s in torch.randint(0, 4, (ndim,), generator=gen)]
        t = torch.empty([s * 2 for s in shape])
        t = t[tuple(slice(0, s * 2, int(torch.randint(1, 3, (1,), generator=gen))) for s in shape)]
        t = t[tuple(slice(0, s) for s in shape)]
        if ndim:
            t = t.permute(*torch.randperm(ndim, generator=gen).tolist())
        yield t
    yield torch.empty(4, 1, 3).expand(4, 5, 3)
    yield torch.empty(0, 3).as_strided((0, 3), (5, 2))
    yield torch.empty(12).as_strided((3, 2), (1, 3))
    yield torch.empty(12).as_strided((3, 2), (2, 1))  # overlapping


def test_contiguous_strides_match_eager():
    for shape in [(), (0,), (3,), (2, 3, 4), (2, 0, 4), (1, 1), (3, 0), (0, 1, 5)]:
        assert layout.contiguous_strides(shape) == torch.empty(shape).stride(), shape


def test_is_contiguous_matches_eager():
    for t in strided_tensors():
        assert layout.is_contiguous(t.shape, t.stride()) == t.is_contiguous(), (t.shape, t.stride())


def test_non_overlapping_and_dense_matches_eager():
    # empty_like keeps the strides of a non-overlapping and dense tensor, and makes up dense ones otherwise
    for t in strided_tensors():
        eager = torch.empty_like(t).stride() == t.stride()
        assert layout.is_non_overlapping_and_dense(t.shape, t.stride()) == eager, (t.shape, t.stride())


def test_dense_strides_like_matches_empty_like():
    for t in strided_tensors():
        if not layout.is_non_overlapping_and_dense(t.shape, t.stride()):
            assert layout.dense_strides_like(t.shape, t.stride()) == torch.empty_like(t).stride(), \
                (t.shape, t.stride())


def test_preserve_strides_matches_empty_like():
    for t in strided_tensors():
        assert layout.preserve_strides(t.shape, t.stride()) == torch.empty_like(t).stride(), (t.shape, t.stride())


def test_strides_in_order_is_a_memory_format():
    x = torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last)
    assert layout.strides_in_order((2, 3, 4, 5), (1, 3, 2, 0)) == x.stride()
    assert layout.strides_in_order((2, 3, 4, 5), (3, 2, 1, 0)) == layout.contiguous_strides((2, 3, 4, 5))


def test_is_non_overlapping():
    assert layout.is_non_overlapping((3, 4), (8, 2))  # stepped: gaps, no collisions
    assert layout.is_non_overlapping((2, 3), (1, 2))
    assert not layout.is_non_overlapping((3, 4), (0, 1))  # expanded
    assert not layout.is_non_overlapping((3, 4), (2, 1))  # rows overlap
    assert layout.is_non_overlapping((1, 4), (0, 1))
    assert layout.is_non_overlapping((2, 5, 0), (5, 1, 5))  # empty (eager's strides of a batched solve)


def test_storage_size_matches_eager_allocation():
    for t in strided_tensors():
        for offset in (0, 3):
            fresh = torch.empty_strided(t.shape, t.stride())
            expected = fresh.untyped_storage().nbytes() // fresh.element_size()
            want = expected + offset if t.numel() else 0
            assert layout.storage_size(t.shape, t.stride(), offset) == want, (t.shape, t.stride())


def test_symbolic_sizes():
    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    shape = (s0, s1, 4)
    strides = layout.contiguous_strides(shape)
    assert strides == (4 * s1, 4, 1)
    assert layout.is_contiguous(shape, strides)
    assert not layout.is_contiguous((s0, s1), (1, s0))
    assert layout.numel(shape) == 4 * s0 * s1
    assert sympy.expand(layout.storage_size(shape, strides)) == 4 * s0 * s1
    assert sympy.expand(layout.storage_size((s0, 2), (2, 1), 5)) == 2 * s0 + 5
    assert layout.strides_in_order((s0, s1), (0, 1)) == (1, s0)


def test_every_rule_agrees_with_itself_on_permutations():
    # a permuted contiguous layout is dense, and dense_strides_like gives it back
    shape = (2, 3, 4)
    for perm in itertools.permutations(range(3)):
        strides = layout.strides_in_order(shape, perm)
        assert layout.is_non_overlapping_and_dense(shape, strides)
        assert layout.is_non_overlapping(shape, strides)
        assert layout.dense_strides_like(shape, strides) == strides
        assert layout.is_contiguous(shape, strides) == (perm == (2, 1, 0))
