"""Extern prims (mm, addmm, bmm, convolution, sdpa, sort, topk, scans) against eager: meta shapes and dtypes
equal the reference's, and bad input raises eager's exception type from the meta rule, naming the shapes."""
import pytest
import torch
import torch.nn.functional as F

from kiln import prims
from prims_helpers import check_prim, meta_raises


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.complex64])
def test_mm_bmm(dtype):
    a = torch.randn(3, 4).to(dtype)
    b = torch.randn(4, 5).to(dtype)
    torch.testing.assert_close(check_prim(prims.mm, a, b), torch.mm(a, b))
    a3, b3 = torch.randn(2, 3, 4).to(dtype), torch.randn(2, 4, 5).to(dtype)
    torch.testing.assert_close(check_prim(prims.bmm, a3, b3), torch.bmm(a3, b3))
    check_prim(prims.mm, torch.randn(0, 4).to(dtype), torch.randn(4, 0).to(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_addmm(dtype):
    """addmm(bias, a, b) is torch.addmm with a bias vector, bit for bit (one call, one rounding)."""
    bias, a, b = torch.randn(5).to(dtype), torch.randn(3, 40).to(dtype), torch.randn(40, 5).to(dtype)
    torch.testing.assert_close(check_prim(prims.addmm, bias, a, b), torch.addmm(bias, a, b), rtol=0, atol=0)
    w = torch.randn(5, 40).to(dtype)  # a Linear's transposed weight
    torch.testing.assert_close(check_prim(prims.addmm, bias, a, w.t()), F.linear(a, w, bias), rtol=0, atol=0)


def test_addmm_errors():
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    meta_raises(RuntimeError, prims.addmm, torch.randn(4), a, b, match=r"bias of size \[5\]")
    meta_raises(RuntimeError, prims.addmm, torch.randn(3, 5), a, b, match=r"bias of size \[5\]")
    meta_raises(RuntimeError, prims.addmm, torch.randn(5).double(), a, b, match="dtype")
    meta_raises(RuntimeError, prims.addmm, torch.randn(5), a, torch.randn(3, 5), match=r"3x4 and 3x5")


def test_mm_bmm_errors():
    meta_raises(RuntimeError, prims.mm, torch.randn(2, 3), torch.randn(4, 5), match=r"2x3 and 4x5")
    meta_raises(RuntimeError, prims.mm, torch.randn(2, 3), torch.randn(3, 5).double(), match="dtype")
    meta_raises(RuntimeError, prims.mm, torch.randn(2, 3), torch.randn(3), match="matrix")
    ones = torch.ones(2, 2, dtype=torch.bool)
    meta_raises(NotImplementedError, prims.mm, ones, ones)
    meta_raises(RuntimeError, prims.bmm, torch.randn(2, 2, 3), torch.randn(3, 3, 5), match=r"\[2, 3\]")
    meta_raises(RuntimeError, prims.bmm, torch.randn(2, 3), torch.randn(3, 5), match="3D")


CONV_CASES = [
    # x shape, w shape, bias, stride, padding, dilation, transposed, output_padding, groups
    ((2, 4, 8), (6, 4, 3), True, [1], [0], [1], False, [0], 1),
    ((2, 4, 8), (6, 2, 3), False, [2], [1], [2], False, [0], 2),
    ((2, 4, 8, 8), (6, 4, 3, 3), True, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
    ((2, 4, 9, 7), (8, 1, 3, 2), False, [2, 1], [0, 2], [1, 3], False, [0, 0], 4),
    ((1, 2, 5, 5, 5), (3, 2, 3, 3, 3), True, [1, 2, 1], [1, 0, 1], [1, 1, 2], False, [0, 0, 0], 1),
    ((2, 4, 8, 8), (4, 3, 3, 3), True, [2, 2], [1, 1], [1, 1], True, [1, 0], 1),
    ((2, 4, 8, 8), (4, 3, 3, 3), False, [1, 1], [0, 0], [2, 2], True, [1, 1], 2),
    ((2, 4, 6), (4, 2, 3), True, [3], [1], [1], True, [2], 1),
    ((0, 4, 8, 8), (6, 4, 3, 3), False, [1, 1], [0, 0], [1, 1], False, [0, 0], 1),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"{c[0]}x{c[1]}-T{int(c[6])}-g{c[8]}")
def test_convolution(case):
    xs, ws, has_bias, stride, padding, dilation, transposed, output_padding, groups = case
    x, w = torch.randn(xs, dtype=torch.float64), torch.randn(ws, dtype=torch.float64)
    out_channels = ws[1] * groups if transposed else ws[0]
    bias = torch.randn(out_channels, dtype=torch.float64) if has_bias else None
    args = (x, w, bias, stride, padding, dilation, transposed, output_padding, groups)
    got = check_prim(prims.convolution, *args)
    torch.testing.assert_close(got, torch.convolution(*args))


def test_convolution_errors():
    x, w = torch.randn(2, 4, 8, 8), torch.randn(6, 4, 3, 3)
    ok = ([1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    meta_raises(RuntimeError, prims.convolution, x, torch.randn(6, 3, 3, 3), None, *ok,
                match=r"expected input\[2, 4, 8, 8\] to have 3 channels")
    meta_raises(RuntimeError, prims.convolution, x, torch.randn(5, 2, 3, 3), None, [1, 1], [0, 0], [1, 1],
                False, [0, 0], 2, match="divisible")
    meta_raises(RuntimeError, prims.convolution, x, torch.randn(6, 4, 9, 9), None, *ok, match="Kernel size")
    meta_raises(RuntimeError, prims.convolution, x, w, torch.randn(5), *ok, match=r"bias of size \[5\]")
    meta_raises(RuntimeError, prims.convolution, x, w.double(), None, *ok, match="should be the same")
    meta_raises(RuntimeError, prims.convolution, x, w, None, [0, 1], [0, 0], [1, 1], False, [0, 0], 1,
                match="stride")
    meta_raises(RuntimeError, prims.convolution, x, w, None, [1, 1], [-1, 0], [1, 1], False, [0, 0], 1,
                match="padding")
    meta_raises(RuntimeError, prims.convolution, x, w, None, [1], [0, 0], [1, 1], False, [0, 0], 1)
    meta_raises(RuntimeError, prims.convolution, x[0], w, None, *ok)
    wt = torch.randn(4, 3, 3, 3)
    meta_raises(RuntimeError, prims.convolution, x, wt, None, [2, 2], [0, 0], [1, 1], True, [2, 2], 1,
                match="output padding")
    meta_raises(RuntimeError, prims.convolution, torch.randn(1, 4, 1, 1), wt, None, [1, 1], [3, 3], [1, 1],
                True, [0, 0], 1, match="too small")
    # each of these is also an error in eager, with the same exception type
    for args in [(x, torch.randn(6, 3, 3, 3), None, *ok), (x, w, torch.randn(5), *ok),
                 (x, torch.randn(6, 4, 9, 9), None, *ok)]:
        with pytest.raises(RuntimeError):
            torch.convolution(*args)


@pytest.mark.parametrize("kw", [
    dict(), dict(is_causal=True), dict(scale=0.3), dict(mask="bool"), dict(mask="float"),
])
def test_sdpa(kw):
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 4)
    kind = kw.pop("mask", None)
    mask = {None: None, "bool": torch.rand(2, 3, 5, 7) > 0.3, "float": torch.randn(2, 3, 5, 7)}[kind]
    args = (q, k, v, mask, kw.get("is_causal", False), kw.get("scale"), False)
    got = check_prim(prims.sdpa, *args)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw))


def test_sdpa_gqa_and_errors():
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 4)
    got = check_prim(prims.sdpa, q, k, v, None, False, None, True)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    q3 = torch.randn(2, 3, 5, 8)
    meta_raises(RuntimeError, prims.sdpa, q3, k, v, None, False, None, True, match="divide")
    meta_raises(RuntimeError, prims.sdpa, q, k.double(), v, None, False, None, True, match="dtype")
    meta_raises(RuntimeError, prims.sdpa, q, k, v, torch.ones(2, 4, 5, 7, dtype=torch.bool), True, None, True,
                match="is_causal")
    meta_raises(RuntimeError, prims.sdpa, q, k, v, torch.ones(2, 4, 5, 7).long(), False, None, True,
                match="attn_mask dtype")


@pytest.mark.parametrize("x", [torch.randn(4, 6), torch.randint(0, 3, (4, 6)), torch.tensor(3.0),
                               torch.tensor([True, False, True])], ids=lambda x: f"{x.dtype}-{x.ndim}")
def test_sort_topk(x):
    for dim in range(-max(x.ndim, 1), max(x.ndim, 1)):
        for descending in (False, True):
            values, indices = check_prim(prims.sort, x, dim, descending, True)
            want = torch.sort(x, dim=dim, descending=descending, stable=True)
            torch.testing.assert_close(values, want.values)
            torch.testing.assert_close(indices, want.indices)
        if x.dtype != torch.bool:
            k = min(2, x.shape[dim] if x.ndim else 1)
            values, indices = check_prim(prims.topk, x, k, dim, True, True)
            torch.testing.assert_close(values, torch.topk(x, k, dim).values)
    meta_raises(IndexError, prims.sort, x, 3)


def test_topk_errors():
    meta_raises(RuntimeError, prims.topk, torch.randn(3), 4, -1, True, True, match="k out of range")
    meta_raises(RuntimeError, prims.topk, torch.tensor([True]), 1, -1, True, True, match="bool")


@pytest.mark.parametrize("x", [torch.randn(3, 5), torch.randint(-3, 4, (3, 5)), torch.tensor(2.0),
                               torch.randint(-3, 4, (2, 3), dtype=torch.int32), torch.randn(4).half()],
                         ids=lambda x: f"{x.dtype}-{x.ndim}")
def test_scans(x):
    for dim in range(-max(x.ndim, 1), max(x.ndim, 1)):
        torch.testing.assert_close(check_prim(prims.cumsum, x, dim), torch.cumsum(x, dim, dtype=x.dtype))
        torch.testing.assert_close(check_prim(prims.cumprod, x, dim), torch.cumprod(x, dim, dtype=x.dtype))
        for p, ref in [(prims.cummax, torch.cummax), (prims.cummin, torch.cummin)]:
            values, indices = check_prim(p, x, dim)
            want = ref(x, dim)
            torch.testing.assert_close(values, want.values)
            torch.testing.assert_close(indices, want.indices)
        if x.dtype.is_floating_point:
            torch.testing.assert_close(check_prim(prims.logcumsumexp, x, dim), torch.logcumsumexp(x, dim))
    meta_raises(TypeError, prims.cumsum, torch.ones(3, dtype=torch.bool), 0)
    meta_raises(TypeError, prims.logcumsumexp, torch.ones(3, dtype=torch.long), 0)
    meta_raises(IndexError, prims.cumsum, torch.ones(3), 1)
