"""Matrix products, convolutions and attention decomposed onto mm/bmm/convolution/sdpa, against eager:
values, shapes, dtypes, fully decomposed, and eager's exception types for bad input."""
import pytest
import torch
import torch.nn.functional as F

import kiln.ops
import ops_helpers
from kiln import graph as kg
from kiln.counters import counters, reset
from kiln.graph import TensorMeta

MY_MODULES = ("kiln.ops.indexing", "kiln.ops.linalg")


def check_op(fn, *inputs, decomposed=True):
    return ops_helpers.check_op(fn, *inputs, decomposed=decomposed, modules=MY_MODULES)


def r(*shape, dtype=torch.float64):
    return torch.randn(shape, dtype=torch.float64).to(dtype)


MATMUL_SHAPES = [
    ((4,), (4,)), ((3, 4), (4,)), ((4,), (4, 5)), ((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 3, 4), (4,)),
    ((4,), (2, 4, 5)), ((2, 3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 6)), ((1, 3, 4), (2, 1, 4, 6)),
    ((3, 4), (2, 4, 5)), ((0, 3, 4), (4, 2)), ((2, 3, 0), (2, 0, 5)),
]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
def test_matmul(shapes):
    a, b = r(*shapes[0]), r(*shapes[1])
    check_op(torch.matmul, a, b)
    check_op(lambda x, y: x @ y, a, b)
    check_op(lambda x, y: x.matmul(y), a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.complex128])
def test_products_dtypes(dtype):
    check_op(torch.mm, r(3, 4, dtype=dtype), r(4, 5, dtype=dtype))
    check_op(torch.bmm, r(2, 3, 4, dtype=dtype), r(2, 4, 5, dtype=dtype))
    check_op(torch.mv, r(3, 4, dtype=dtype), r(4, dtype=dtype))
    check_op(torch.dot, r(4, dtype=dtype), r(4, dtype=dtype))
    check_op(torch.matmul, r(2, 3, 4, dtype=dtype), r(3, 4, 2, dtype=dtype)[0])


def test_vector_products():
    check_op(torch.vdot, r(5), r(5))
    check_op(torch.vdot, r(5, dtype=torch.complex64), r(5, dtype=torch.complex64), decomposed=False)
    check_op(torch.inner, r(2, 3), r(4, 3))
    check_op(torch.inner, r(2, 5, 3), r(3))
    check_op(torch.inner, r(), r(4, 3))
    check_op(torch.outer, r(2), r(3))
    check_op(torch.outer, r(2, dtype=torch.float32), r(3))  # promotes to float64
    check_op(torch.outer, r(2, dtype=torch.int32), r(3, dtype=torch.float32))
    check_op(torch.ger, r(2), r(3))


def test_addmm_family():
    check_op(torch.addmm, r(3, 5), r(3, 4), r(4, 5))
    check_op(lambda i, a, b: torch.addmm(i, a, b, beta=0.5, alpha=2), r(5), r(3, 4), r(4, 5))
    nan = torch.full((3, 5), float("nan"), dtype=torch.float64)
    check_op(lambda i, a, b: torch.addmm(i, a, b, beta=0), nan, r(3, 4), r(4, 5))
    check_op(lambda i, a, b: i.addmm(a, b, alpha=3), r(3, 5, dtype=torch.int64), r(3, 4, dtype=torch.int64),
             r(4, 5, dtype=torch.int64))
    check_op(torch.addmv, r(3), r(3, 4), r(4))
    check_op(lambda i, a, b: torch.addmv(i, a, b, beta=2, alpha=0.5), r(1), r(3, 4), r(4))
    check_op(torch.addr, r(2, 3), r(2), r(3))
    check_op(lambda i, a, b: torch.addr(i, a, b, beta=0.1, alpha=-1), r(3), r(2), r(3))
    check_op(torch.baddbmm, r(2, 3, 5), r(2, 3, 4), r(2, 4, 5))
    check_op(lambda i, a, b: torch.baddbmm(i, a, b, beta=0.5, alpha=2), r(3, 1), r(2, 3, 4), r(2, 4, 5))
    check_op(torch.addbmm, r(3, 5), r(2, 3, 4), r(2, 4, 5))
    check_op(lambda i, a, b: torch.addbmm(i, a, b, beta=-1, alpha=0.25), r(5), r(2, 3, 4), r(2, 4, 5))


def test_half_precision_addmm_rounds_once():
    h = torch.float16
    check_op(torch.addmm, r(5, 10, dtype=h), r(5, 64, dtype=h), r(64, 10, dtype=h))
    check_op(lambda i, a, b: torch.baddbmm(i, a, b, beta=0.5), r(2, 5, 10, dtype=h), r(2, 5, 64, dtype=h),
             r(2, 64, 10, dtype=h))
    bf = torch.bfloat16
    check_op(lambda i, a, b: torch.addr(i, a, b, beta=0.3, alpha=0.7), r(5, 10, dtype=bf), r(5, dtype=bf),
             r(10, dtype=bf))
    check_op(lambda i, a, b: torch.addbmm(i, a, b, alpha=0.5), r(5, 10, dtype=h), r(3, 5, 64, dtype=h),
             r(3, 64, 10, dtype=h))


def test_integer_factors_truncate():
    ints = [torch.randint(-3, 4, s) for s in [(2, 5), (2, 3), (3, 5)]]
    check_op(lambda i, a, b: torch.addmm(i, a, b, beta=1.7, alpha=2.6), *ints)
    check_op(lambda i, a, b: torch.addmv(i, a, b, beta=0.2, alpha=0.6), ints[0][:, 0], ints[1], ints[2][:, 0])
    raises(RuntimeError, lambda i, a, b: torch.addr(i, a, b, beta=1.5), ints[1], ints[1][:, 0], ints[1][0])


def test_vecdot_rmatmul():
    check_op(lambda a, b: torch.linalg.vecdot(a, b), r(2, 3), r(3))
    check_op(lambda a, b: torch.linalg.vecdot(a, b, dim=0), r(2, 3), r(2, 1))
    check_op(lambda a, b: b.__rmatmul__(a), r(2, 3), r(3, 4))


@pytest.mark.parametrize("shapes", [
    [(2, 3), (3, 4)], [(3,), (3, 4), (4,)], [(2, 30), (30, 5), (5, 40)], [(20, 3), (3, 40), (40, 2)],
    [(2, 3), (3, 4), (4, 5), (5, 6)], [(10, 2), (2, 30), (30, 3), (3, 9), (9,)], [(4,), (4, 2), (2, 7), (7, 1)],
])
def test_multi_dot(shapes):
    check_op(lambda *ms: torch.linalg.multi_dot(ms), *[r(*s) for s in shapes])
    check_op(lambda *ms: torch.linalg.multi_dot(list(ms)), *[r(*s, dtype=torch.float32) for s in shapes])
    if all(len(s) == 2 for s in shapes):
        check_op(lambda *ms: torch.chain_matmul(*ms), *[r(*s) for s in shapes])


def test_tensordot():
    check_op(lambda a, b: torch.tensordot(a, b), r(2, 3, 4), r(3, 4, 5))
    check_op(lambda a, b: torch.tensordot(a, b, dims=1), r(2, 3, 4), r(4, 5))
    check_op(lambda a, b: torch.tensordot(a, b, dims=0), r(2, 3), r(4))
    check_op(lambda a, b: torch.tensordot(a, b, dims=([0, 2], [2, 0])), r(4, 3, 5), r(5, 2, 4))
    check_op(lambda a, b: torch.tensordot(a, b, dims=([1], [0])), r(2, 3), r(3, 4))
    check_op(lambda a, b: torch.tensordot(a, b, dims=([0, 1], [2, 0])), r(1, 1, 1), r(2, 1, 2))
    check_op(lambda a, b: torch.tensordot(a, b, dims=([1], [0])), r(2, 3), r(1, 4))


EINSUMS = [
    ("ij,jk->ik", (2, 3), (3, 4)), ("ij,jk", (2, 3), (3, 4)), ("bhid,bhjd->bhij", (2, 3, 4, 5), (2, 3, 6, 5)),
    ("i,i->", (3,), (3,)), ("i,j->ij", (3,), (4,)), ("ij->ji", (2, 3)), ("ij->", (2, 3)), ("ij->j", (2, 3)),
    ("...ij,...jk->...ik", (2, 5, 2, 3), (2, 5, 3, 4)), ("...ij,jk", (5, 2, 3), (3, 4)),
    ("ij,jk,kl->il", (2, 3), (3, 4), (4, 5)), ("ii->i", (3, 3)), ("iji->j", (2, 3, 2)),
    ("ijk,ikl->jl", (2, 3, 4), (2, 4, 5)), ("abc,cd,bd->a", (2, 3, 4), (4, 5), (3, 5)),
    ("ij,ij->ij", (2, 3), (2, 3)), ("...", (2, 3)),
    ("ba", (2, 3)), ("...ik,...j->ij", (1, 2, 3), (3,)), (" i j , j k -> i k ", (2, 3), (3, 4)),
]


@pytest.mark.parametrize("eq_shapes", EINSUMS, ids=lambda e: e[0])
def test_einsum(eq_shapes):
    eq, *shapes = eq_shapes
    check_op(lambda *ops: torch.einsum(eq, *ops), *[r(*s) for s in shapes])
    check_op(lambda *ops: torch.einsum(eq, *ops), *[r(*s, dtype=torch.int64) for s in shapes])
    check_op(lambda *ops: torch.einsum(eq, list(ops)), *[r(*s, dtype=torch.float32) for s in shapes])


def test_einsum_falls_back():
    check_op(lambda a, b: torch.einsum("bij,bjk->bik", a, b), r(2, 2, 3), r(1, 3, 4), decomposed=False)
    check_op(lambda a, b: torch.einsum(a, [0, 1], b, [1, 2]), r(2, 3), r(3, 4), decomposed=False)
    raises(RuntimeError, lambda a, b: torch.einsum("ij,jk->ik", a, b), M(2, 3), M(4, 5))
    raises(RuntimeError, lambda a: torch.einsum("ij,jk->ik", a), M(2, 3))


@pytest.mark.parametrize("call, x, w", [
    (lambda x, w: F.conv1d(x, w), r(2, 4, 9), r(6, 4, 3)),
    (lambda x, w: F.conv1d(x, w, None, 2, 1, 2, 2), r(2, 4, 9), r(6, 2, 3)),
    (lambda x, w: F.conv1d(x, w, padding="same", dilation=2), r(2, 4, 9), r(6, 4, 3)),
    (lambda x, w: F.conv1d(x, w, padding="valid"), r(4, 9), r(6, 4, 3)),
    (lambda x, w: F.conv2d(x, w, padding=1), r(2, 4, 8, 8), r(6, 4, 3, 3)),
    (lambda x, w: F.conv2d(x, w, stride=(2, 1), padding=(0, 2), dilation=(1, 2), groups=2), r(2, 4, 9, 7),
     r(6, 2, 3, 2)),
    (lambda x, w: torch.conv2d(x, w, stride=[2]), r(4, 8, 8), r(6, 4, 3, 3)),
    (lambda x, w: F.conv2d(x, w, padding="same"), r(2, 4, 8, 8), r(6, 4, 3, 3)),
    (lambda x, w: F.conv2d(x, w, padding="same"), r(2, 4, 8, 8), r(6, 4, 4, 2)),
    (lambda x, w: F.conv3d(x, w, padding=1, stride=2), r(1, 2, 5, 6, 7), r(3, 2, 3, 3, 3)),
    (lambda x, w: F.conv_transpose1d(x, w, stride=3, padding=1, output_padding=2), r(2, 4, 6), r(4, 2, 3)),
    (lambda x, w: F.conv_transpose2d(x, w, stride=2, output_padding=1), r(2, 4, 5, 5), r(4, 3, 3, 3)),
    (lambda x, w: F.conv_transpose2d(x, w, groups=2, dilation=2), r(4, 5, 5), r(4, 3, 3, 3)),
    (lambda x, w: F.conv_transpose3d(x, w, stride=(1, 2, 1)), r(1, 2, 3, 4, 3), r(2, 3, 2, 2, 2)),
    (lambda x, w: torch.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), r(2, 4, 8, 8),
     r(6, 4, 3, 3)),
    (lambda x, w: torch.convolution(x, w, None, [2, 2], [0, 0], [1, 1], True, [1, 1], 1), r(2, 4, 5, 5),
     r(4, 3, 3, 3)),
])
def test_convolutions(call, x, w):
    check_op(call, x, w)


def test_convolution_bias_and_dtype():
    x, w, b = r(2, 4, 8, dtype=torch.float32), r(6, 4, 3, dtype=torch.float32), r(6, dtype=torch.float32)
    check_op(lambda x, w, b: F.conv1d(x, w, b, padding=1), x, w, b)
    check_op(lambda x, w, b: F.conv_transpose1d(x, w, b, stride=2), x, r(4, 6, 3, dtype=torch.float32), b)
    check_op(lambda x, w: F.conv1d(x, w), x.half(), w.half())


def sdpa(**kw):
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw)


@pytest.mark.parametrize("qs, ks, vs", [
    ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4)),
    ((3, 5, 8), (3, 7, 8), (3, 7, 4)),
    ((5, 8), (7, 8), (7, 4)),
    ((2, 3, 5, 8), (1, 7, 8), (1, 7, 4)),
    ((2, 3, 5, 8), (2, 1, 7, 8), (2, 1, 7, 4)),
])
def test_sdpa(qs, ks, vs):
    q, k, v = r(*qs, dtype=torch.float32), r(*ks, dtype=torch.float32), r(*vs, dtype=torch.float32)
    check_op(sdpa(), q, k, v)
    check_op(sdpa(is_causal=True), q, k, v)
    check_op(sdpa(scale=0.125), q, k, v)
    mask = torch.rand(qs[-2], ks[-2]) > 0.2
    check_op(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, mask)
    fmask = torch.randn(qs[-2], ks[-2])
    check_op(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m), q, k, v, fmask)


def test_sdpa_gqa_and_dropout():
    q, k, v = r(2, 4, 5, 8), r(2, 2, 7, 8), r(2, 2, 7, 4)
    check_op(sdpa(enable_gqa=True), q, k, v)
    check_op(sdpa(enable_gqa=True, is_causal=True), q, k, v)
    reset()
    kiln.ops.trace(sdpa(dropout_p=0.5), q, q, q)  # decomposed: the math path (tests/autograd/test_attention_dropout)
    assert not counters["fallback"]
    kiln.ops.trace(sdpa(dropout_p=0.5, enable_gqa=True), q, k, v)
    assert counters["fallback"]["torch.nn.functional.scaled_dot_product_attention"] == 1


def raises(exc, fn, *metas, match=None):
    """Tracing on tensors of these shapes raises exc, as eager does; with `match`, so does the shape-only
    (symbolic) call, from the decomposition's own checks."""
    real = [torch.zeros(m.shape, dtype=m.dtype) if isinstance(m, TensorMeta) else m for m in metas]
    with pytest.raises(exc):
        fn(*real)
    with pytest.raises(exc):
        kiln.ops.trace(fn, *real)
    if match is not None:
        with pytest.raises(exc, match=match):
            kiln.ops.symbolic_call(fn, *metas)


def M(*shape, dtype=torch.float32):
    return TensorMeta(shape, dtype)


def test_errors():
    raises(RuntimeError, torch.mm, M(2, 3), M(4, 5), match=r"2x3 and 4x5")
    raises(RuntimeError, torch.matmul, M(2, 3), M(4, 5), match=r"2x3 and 4x5")
    raises(RuntimeError, torch.matmul, M(2, 2, 3), M(5, 3, 4))
    raises(RuntimeError, torch.matmul, M(), M(4))
    raises(RuntimeError, torch.matmul, M(3), M(4))
    raises(RuntimeError, torch.matmul, M(2, 3), M(3, 4, dtype=torch.float64))
    raises(RuntimeError, torch.bmm, M(2, 2, 3), M(3, 3, 5))
    raises(RuntimeError, torch.dot, M(3), M(4))
    raises(RuntimeError, torch.dot, M(3, 1), M(3))
    raises(RuntimeError, torch.mv, M(2, 3), M(4))
    raises(RuntimeError, torch.addmm, M(2, dtype=torch.float64), M(2, 3), M(3, 2))
    raises(RuntimeError, torch.addmm, M(4, 5), M(2, 3), M(3, 2))
    raises(RuntimeError, F.conv2d, M(2, 4, 8, 8), M(6, 3, 3, 3), match=r"\[6, 3, 3, 3\]")
    raises(RuntimeError, F.conv2d, M(8, 8), M(6, 4, 3, 3))
    raises(RuntimeError, F.conv2d, M(2, 4, 8, 8), M(6, 4, 9, 9))
    raises(RuntimeError, lambda x, w: F.conv2d(x, w, padding="same", stride=2), M(2, 4, 8, 8), M(6, 4, 3, 3))
    raises(RuntimeError, lambda x, w: F.conv2d(x, w, padding="foo"), M(2, 4, 8, 8), M(6, 4, 3, 3))
    raises(RuntimeError, lambda x, w: F.conv1d(x, w, stride=[2, 2]), M(2, 4, 8), M(6, 4, 3))
    raises(RuntimeError, sdpa(), M(2, 3, 5, 8), M(2, 3, 7, 4), M(2, 3, 7, 4))
    raises(RuntimeError, sdpa(), M(2, 3, 5, 8), M(2, 3, 7, 8, dtype=torch.float64), M(2, 3, 7, 4))
    raises(RuntimeError, sdpa(), M(8), M(8), M(8))
