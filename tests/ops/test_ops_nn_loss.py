"""Loss decompositions against eager (values, dtypes, reductions, class weights, ignore_index, smoothing)."""
import os
import sys

import pytest
import torch
import torch.nn.functional as F

import kiln.ops
from kiln.counters import counters

sys.path.insert(0, os.path.dirname(__file__))
from test_ops_nn import check_error, check_nn  # noqa: E402

DTYPES = [torch.float32, torch.float64]
REDUCTIONS = ["mean", "sum", "none"]


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_regression_losses(reduction, dtype):
    torch.manual_seed(0)
    x, t = torch.randn(3, 4, 5, dtype=dtype), torch.randn(3, 4, 5, dtype=dtype)
    check_nn(lambda a, b: F.mse_loss(a, b, reduction=reduction), x, t)
    check_nn(lambda a, b, w: F.mse_loss(a, b, reduction=reduction, weight=w), x, t,
             torch.rand(3, 4, 5, dtype=dtype))
    check_nn(lambda a, b: F.l1_loss(a, b, reduction=reduction), x, t)
    check_nn(lambda a, b: F.smooth_l1_loss(a, b, reduction=reduction), x, t)
    check_nn(lambda a, b: F.smooth_l1_loss(a, b, reduction=reduction, beta=0.5), x, t)
    check_nn(lambda a, b: F.smooth_l1_loss(a, b, reduction=reduction, beta=0.0), x, t)
    check_nn(lambda a, b: F.huber_loss(a, b, reduction=reduction, delta=0.7), x, t)
    check_nn(lambda a, b: F.poisson_nll_loss(a, b, reduction=reduction), x, t.abs())
    check_nn(lambda a, b: F.poisson_nll_loss(a, b, log_input=False, full=True, reduction=reduction),
             x.abs(), t.abs() * 3)
    check_nn(lambda a, b: F.soft_margin_loss(a, b, reduction=reduction), x, t.sign())
    check_nn(lambda a, b: F.mse_loss(a, b), x, t[0])  # broadcast (eager warns)


def test_legacy_reduction_and_errors():
    x, t = torch.randn(3, 4), torch.randn(3, 4)
    check_nn(lambda a, b: F.mse_loss(a, b, size_average=False), x, t)
    check_nn(lambda a, b: F.l1_loss(a, b, reduce=False), x, t)
    check_error(lambda a, b: F.mse_loss(a, b, reduction="avg"), x, t, exc=ValueError)
    check_nn(lambda a, b, m: m(a, b), x, t, torch.nn.MSELoss())
    check_nn(lambda a, b, m: m(a, b), x, t, torch.nn.SmoothL1Loss(beta=2.0))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_nll_and_cross_entropy(reduction, dtype):
    torch.manual_seed(0)
    x = torch.randn(6, 5, dtype=dtype)
    t = torch.tensor([0, 4, 2, -100, 1, 4])
    w = torch.rand(5, dtype=dtype) + 0.1
    for ls in (0.0, 0.2):
        check_nn(lambda a, b: F.cross_entropy(a, b, reduction=reduction, label_smoothing=ls), x, t)
        check_nn(lambda a, b, c: F.cross_entropy(a, b, c, reduction=reduction, label_smoothing=ls), x, t, w)
        check_nn(lambda a, b, c: F.cross_entropy(a, b, c, ignore_index=4, reduction=reduction,
                                                 label_smoothing=ls), x, t.clamp(min=0), w)
    check_nn(lambda a, b: F.nll_loss(F.log_softmax(a, 1), b, reduction=reduction), x, t)
    check_nn(lambda a, b, c: F.nll_loss(a, b, c, reduction=reduction), x, t, w)
    x4, t4 = torch.randn(2, 5, 3, 4, dtype=dtype), torch.randint(0, 5, (2, 3, 4))
    check_nn(lambda a, b: F.cross_entropy(a, b, reduction=reduction), x4, t4)
    check_nn(lambda a, b, c: F.cross_entropy(a, b, c, reduction=reduction, label_smoothing=0.1), x4, t4, w)
    check_nn(lambda a, b: F.cross_entropy(a, b, reduction=reduction), x[0], t[1])  # unbatched
    probs = torch.softmax(torch.randn(6, 5, dtype=dtype), 1)
    for ls in (0.0, 0.3):
        check_nn(lambda a, b: F.cross_entropy(a, b, reduction=reduction, label_smoothing=ls), x, probs)
        check_nn(lambda a, b, c: F.cross_entropy(a, b, c, reduction=reduction, label_smoothing=ls),
                 x, probs, w)
    check_nn(lambda a, b: F.cross_entropy(a, b, reduction=reduction),
             x4, torch.softmax(torch.randn(2, 5, 3, 4, dtype=dtype), 1))


def test_cross_entropy_modules_and_errors():
    torch.manual_seed(0)
    x, t = torch.randn(4, 3), torch.tensor([0, 2, 1, 1])
    check_nn(lambda a, b, m: m(a, b), x, t, torch.nn.CrossEntropyLoss(label_smoothing=0.1))
    check_nn(lambda a, b, m: m(a, b), F.log_softmax(x, 1), t, torch.nn.NLLLoss(weight=torch.rand(3)))
    check_nn(lambda a, b: F.cross_entropy(a, b), x, torch.full((4,), -100))  # all ignored: nan
    check_error(lambda a, b: F.cross_entropy(a, b), x, t[:3], exc=ValueError)
    check_error(lambda a, b: F.nll_loss(a, b, torch.ones(4)), x, t)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_binary_losses(reduction, dtype):
    torch.manual_seed(0)
    x = torch.randn(4, 6, dtype=dtype)
    p = torch.sigmoid(x)
    p[0, 0], p[0, 1] = 0.0, 1.0
    t = torch.rand(4, 6, dtype=dtype)
    w = torch.rand(6, dtype=dtype)
    check_nn(lambda a, b: F.binary_cross_entropy(a, b, reduction=reduction), p, t)
    check_nn(lambda a, b, c: F.binary_cross_entropy(a, b, c, reduction=reduction), p, t, w)
    check_nn(lambda a, b: F.binary_cross_entropy_with_logits(a, b, reduction=reduction), x * 10, t)
    check_nn(lambda a, b, c, d: F.binary_cross_entropy_with_logits(a, b, c, reduction=reduction,
                                                                    pos_weight=d),
             x * 10, t, w, torch.rand(6, dtype=dtype) * 3)
    check_nn(lambda a, b, c: F.multilabel_soft_margin_loss(a, b, c, reduction=reduction), x, t.round(), w)
    check_nn(lambda a, b: F.kl_div(a, b, reduction=reduction), F.log_softmax(x, 1), F.softmax(x.flip(1), 1))
    check_nn(lambda a, b: F.kl_div(a, b, reduction=reduction, log_target=True), F.log_softmax(x, 1),
             F.log_softmax(x.flip(0), 1))
    check_nn(lambda a, b: F.kl_div(a, b, reduction="batchmean"), F.log_softmax(x, 1), t)
    check_error(lambda a, b: F.binary_cross_entropy(a, b), p, t[0], exc=ValueError)
    check_error(lambda a, b: F.binary_cross_entropy_with_logits(a, b), x, t[0], exc=ValueError)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_margin_and_embedding_losses(reduction):
    torch.manual_seed(0)
    a, b, c = torch.randn(5, 4), torch.randn(5, 4), torch.randn(5, 4)
    y = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0])
    check_nn(lambda p, q, r: F.margin_ranking_loss(p, q, r, 0.3, reduction=reduction), a[:, 0], b[:, 0], y)
    check_nn(lambda p, r: F.hinge_embedding_loss(p, r, 0.5, reduction=reduction), a, y.repeat(4, 1).t())
    check_nn(lambda p, q, r: F.cosine_embedding_loss(p, q, r, 0.1, reduction=reduction), a, b, y)
    check_nn(lambda p, q, r: F.cosine_embedding_loss(p, q, r, reduction=reduction), a[0], b[0], y[1])
    check_nn(lambda p, q, r: F.triplet_margin_loss(p, q, r, reduction=reduction), a, b, c)
    check_nn(lambda p, q, r: F.triplet_margin_loss(p, q, r, 0.5, 1.0, swap=True, reduction=reduction),
             a, b, c)


def test_gaussian_nll_falls_back():
    x, t, v = torch.randn(4, 3), torch.randn(4, 3), torch.rand(4, 3) + 0.1
    counters.clear()
    g = kiln.ops.trace(F.gaussian_nll_loss, x, t, v)
    assert [n.target for n in g.fallbacks()] == [F.gaussian_nll_loss]


def test_l1_loss_weight_is_refused():
    """F.l1_loss does not forward `weight` to __torch_function__: tracing it would silently drop the weight,
    so kiln refuses the call (capture runs it eagerly); torch.nn.L1Loss has no weight and traces."""
    x, t, w = torch.randn(4, 3), torch.randn(4, 3), torch.rand(4, 3)
    with pytest.raises(kiln.ops.UnsupportedError):
        kiln.ops.trace(lambda a, b, c: F.l1_loss(a, b, weight=c), x, t, w)
    check_nn(lambda a, b, m: m(a, b), x, t, torch.nn.L1Loss(reduction="sum"))
    for reduction in REDUCTIONS:  # the decomposition itself handles a weight passed directly
        fn = kiln.ops.lookup(F.l1_loss)
        torch.testing.assert_close(fn(x, t, reduction=reduction, weight=w),
                                   F.l1_loss(x, t, reduction=reduction, weight=w))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_multi_margin_and_distance_losses(reduction):
    torch.manual_seed(0)
    x, t = torch.randn(5, 4), torch.tensor([0, 3, 1, 2, 3])
    for p in (1, 2):
        check_nn(lambda a, b: F.multi_margin_loss(a, b, p, 0.7, reduction=reduction), x, t)
        check_nn(lambda a, b, w: F.multi_margin_loss(a, b, p, weight=w, reduction=reduction), x, t,
                 torch.rand(4))
        check_nn(lambda a, b: F.multi_margin_loss(a, b, p, reduction=reduction), x[0], t[1])
    check_error(lambda a, b: F.multi_margin_loss(a, b, 3), x, t, exc=ValueError)
    a, b, c = torch.randn(5, 4), torch.randn(5, 4), torch.randn(5, 4)
    check_nn(lambda p, q, r: F.triplet_margin_with_distance_loss(p, q, r, reduction=reduction), a, b, c)
    cosine = lambda u, v: 1 - F.cosine_similarity(u, v)  # noqa: E731
    check_nn(lambda p, q, r: F.triplet_margin_with_distance_loss(p, q, r, distance_function=cosine, swap=True,
                                                                  reduction=reduction), a, b, c)
