"""The view prims' meta rules give eager's exact shape, strides and storage offset — also for empty tensors
and size-1 dims, which lowering relies on (a view is lowered from its node's meta alone)."""
import itertools

import torch

from kiln import prims
from kiln.graph import TensorMeta


def inputs():
    """Contiguous, transposed, sliced with a nonzero offset, stepped, size-1 dims, expanded, empty."""
    base = torch.arange(24.0).reshape(2, 3, 4)
    yield base
    yield base.transpose(0, 2)
    yield torch.arange(200.0).reshape(5, 8, 5)[1:3, 2:5, 1:5]
    yield torch.arange(100.0).reshape(10, 10)[2::3, 1::2]
    yield torch.arange(100.0).reshape(10, 10)[3:7, 4:9].t()
    yield torch.arange(7.0)[1:].reshape(6, 1, 1)
    yield torch.arange(4.0).reshape(1, 4, 1).expand(3, 4, 2)
    yield torch.arange(3.0)[2:].reshape(1, 1)
    yield torch.arange(12.0).reshape(3, 4)[:, 1:1]
    yield torch.ones(2, 0, 3)
    yield torch.tensor(5.0)


def view_cases(x):
    n = x.numel()
    for shape in [(n,), (1, n), (n, 1), (2, n // 2), (n // 2, 2), (3, n // 3), (2, 2, n // 4), (0, 3), ()]:
        if torch.Size(shape).numel() == n:
            try:
                x.view(shape)
            except RuntimeError:
                continue
            yield (shape,)


def permute_cases(x):
    for perm in itertools.permutations(range(x.ndim)):
        yield (perm,)


def squeeze_cases(x):
    ones = [d for d in range(x.ndim) if x.shape[d] == 1]
    for k in range(len(ones) + 1):
        for dims in itertools.combinations(ones, k):
            yield (dims,)


def expand_dims_cases(x):
    for dims in [(), (0,), (x.ndim,), (0, x.ndim + 1), (1, 2)]:
        if all(d <= x.ndim + len(dims) - 1 for d in dims):
            yield (dims,)


def slice_cases(x):
    yield (tuple(0 for _ in x.shape), tuple(x.shape), (1,) * x.ndim)
    yield (tuple(min(1, s) for s in x.shape), tuple(x.shape), (2,) * x.ndim)
    yield (tuple(s // 2 for s in x.shape), tuple(s for s in x.shape), (3,) * x.ndim)
    yield (tuple(s for s in x.shape), tuple(s for s in x.shape), (1,) * x.ndim)  # empty, offset at the end
    yield (tuple(min(1, s) for s in x.shape), tuple(max(s - 1, min(1, s)) for s in x.shape), None)


def diagonal_cases(x):
    for d1, d2 in itertools.permutations(range(x.ndim), 2):
        for offset in (-3, -1, 0, 1, 2, 9):
            yield (offset, d1, d2)


def as_strided_cases(x):
    room = x.untyped_storage().nbytes() // x.element_size()
    for shape, strides, offset in [((2, 2), (1, 2), 1), ((3,), (2,), 0), ((0, 4), (4, 1), 5), ((), (), 3),
                                   ((1, 2), (7, 1), 0)]:
        if offset + 1 + sum((s - 1) * st for s, st in zip(shape, strides)) <= room:
            yield (shape, strides, offset)


def unfold_cases(x):
    for dim in range(max(x.ndim, 1)):
        size_d = x.shape[dim] if x.ndim else 1
        for size, step in [(1, 1), (min(2, size_d), 1), (min(2, size_d), 2), (size_d, 3), (0, 1)]:
            yield (dim, size, step)


def broadcast_in_dim_cases(x):
    yield (tuple(x.shape), tuple(range(x.ndim)))
    yield ((2,) + tuple(x.shape), tuple(range(1, x.ndim + 1)))
    yield (tuple(x.shape) + (1,), tuple(range(x.ndim)))
    yield (tuple(3 if s == 1 else s for s in x.shape), tuple(range(x.ndim)))


CASES = {
    "view": view_cases, "permute": permute_cases, "squeeze": squeeze_cases, "expand_dims": expand_dims_cases,
    "slice": slice_cases, "diagonal": diagonal_cases, "as_strided": as_strided_cases, "unfold": unfold_cases,
    "broadcast_in_dim": broadcast_in_dim_cases,
}


def test_every_view_prim_is_covered():
    assert {p.name for p in prims.PRIMS.values() if "view" in p.tags} == set(CASES)


def test_view_meta_matches_eager():
    checked = 0
    for name, cases in CASES.items():
        p = prims.PRIMS[name]
        for x in inputs():
            for args in cases(x):
                if name == "diagonal" and x.ndim < 2:
                    continue
                try:
                    out = p.ref(x, *args)
                except (RuntimeError, IndexError):
                    continue  # not a valid view of this input (eager refuses it too)
                meta = p.meta(TensorMeta.of(x), *args)
                got = (tuple(meta.shape), tuple(meta.strides), meta.storage_offset)
                want = (tuple(out.shape), tuple(out.stride()), out.storage_offset())
                assert got == want, (name, tuple(x.shape), x.stride(), x.storage_offset(), args)
                assert out._is_view() or out is x
                checked += 1
    assert checked > 300


def test_non_view_prims_start_a_storage():
    x = torch.arange(200.0).reshape(5, 8, 5)[1:3, 2:5, 1:5]
    m = TensorMeta.of(x)
    assert m.storage_offset == 51
    assert prims.exp.meta(m).storage_offset == 0
    assert prims.clone.meta(m, torch.preserve_format).storage_offset == 0
    assert prims.sum.meta(m, (0,)).storage_offset == 0
