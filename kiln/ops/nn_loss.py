"""Decompositions of torch.nn.functional losses, following eager's formulas (ATen and functional.py).

Reductions: 'none' keeps the per-element loss, 'sum' sums it, 'mean' averages it — weighted losses
(nll_loss, cross_entropy with class weights) divide by the total weight of the counted targets, as eager.
Checks that depend on tensor values (targets out of range, probabilities outside [0, 1]) are eager-only:
a decomposition cannot raise on values, so gaussian_nll_loss (which checks its variance) falls back.
"""
from __future__ import annotations

import math
import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn import _reduction

from .. import prims
from ..prims.registry import check, shape_text
from .registry import NoDecomposition, UnsupportedError, register
from .utils import computation_dtype, convert, is_float_dtype, wants_gradient


def reduction_mode(size_average: Any, reduce: Any, reduction: str) -> str:
    """The reduction string, from the legacy size_average/reduce flags when given."""
    if size_average is not None or reduce is not None:
        return _reduction.legacy_get_string(size_average, reduce, emit_warning=False)
    check(reduction in ("none", "mean", "sum"), lambda: f"{reduction} is not a valid value for reduction",
          ValueError)
    return reduction


def reduce_loss(loss: Any, reduction: str) -> Any:
    if reduction == "none":
        return loss
    return torch.sum(loss) if reduction == "sum" else torch.mean(loss)


def _same_size(op: str, input: Any, target: Any) -> tuple[Any, Any]:
    """Broadcast input and target (eager warns when their sizes differ)."""
    if list(input.shape) == list(target.shape):
        return input, target
    return tuple(torch.broadcast_tensors(input, target))


# ---- regression losses ------------------------------------------------------------------------------------

@register(F.mse_loss)
def mse_loss(input: Any, target: Any, size_average: Any = None, reduce: Any = None, reduction: str = "mean",
             weight: Any = None) -> Any:
    reduction = reduction_mode(size_average, reduce, reduction)
    x, t = _same_size("mse_loss", input, target)
    diff = x - t
    if weight is None:
        return reduce_loss(diff * diff, reduction)
    check(list(weight.shape) == list(input.shape), lambda: "Weights and input must have the same size.",
          ValueError)
    weighted = torch.pow(diff, 2) * weight
    if reduction == "none":
        return weighted
    return torch.sum(weighted) if reduction == "sum" else torch.sum(weighted) / torch.sum(weight)


def _l1_loss_weight_dropped() -> bool:
    """Whether F.l1_loss was called with a weight: its __torch_function__ call does not forward `weight`
    (torch 2.x), so neither a decomposition nor a fallback would see it; its frame still holds it."""
    frame = sys._getframe(1)
    code = getattr(F.l1_loss, "__code__", None)
    while frame is not None:
        if frame.f_code is code:
            return frame.f_locals.get("weight") is not None
        frame = frame.f_back
    return False


@register(F.l1_loss)
def l1_loss(input: Any, target: Any, size_average: Any = None, reduce: Any = None, reduction: str = "mean",
            weight: Any = None) -> Any:
    reduction = reduction_mode(size_average, reduce, reduction)
    if weight is None and _l1_loss_weight_dropped():
        raise UnsupportedError("torch.nn.functional.l1_loss(weight=...) does not pass `weight` on to traced "
                               "tensors (a torch limitation), so kiln cannot trace it; it runs eagerly")
    if weight is not None:
        check(list(weight.shape) == list(input.shape), lambda: "Weights and input must have the same size.",
              ValueError)
    x, t = _same_size("l1_loss", input, target)
    if weight is None:
        return reduce_loss(torch.abs(x - t), reduction)
    weighted = torch.abs(x - t) * weight
    if reduction == "none":
        return weighted
    return torch.sum(weighted) if reduction == "sum" else torch.sum(weighted) / torch.sum(weight)


@register(F.smooth_l1_loss)
def smooth_l1_loss(input: Any, target: Any, size_average: Any = None, reduce: Any = None,
                   reduction: str = "mean", beta: float = 1.0) -> Any:
    reduction = reduction_mode(size_average, reduce, reduction)
    check(beta >= 0, lambda: "smooth_l1_loss does not support negative values for beta.", RuntimeError)
    x, t = _same_size("smooth_l1_loss", input, target)
    z = torch.abs(x - t)
    if beta == 0:
        return reduce_loss(z, reduction)
    return reduce_loss(torch.where(z < beta, 0.5 * z * z / beta, z - 0.5 * beta), reduction)


@register(F.huber_loss)
def huber_loss(input: Any, target: Any, reduction: str = "mean", delta: float = 1.0,
               weight: Any = None) -> Any:
    reduction = reduction_mode(None, None, reduction)
    if weight is not None:
        raise NoDecomposition("huber_loss with weight")
    check(delta > 0, lambda: "huber_loss does not support non-positive values for delta.", RuntimeError)
    x, t = _same_size("huber_loss", input, target)
    z = torch.abs(x - t)
    return reduce_loss(torch.where(z < delta, 0.5 * z * z, delta * (z - 0.5 * delta)), reduction)


@register(F.poisson_nll_loss)
def poisson_nll_loss(input: Any, target: Any, log_input: bool = True, full: bool = False,
                     size_average: Any = None, eps: float = 1e-8, reduce: Any = None,
                     reduction: str = "mean") -> Any:
    reduction = reduction_mode(size_average, reduce, reduction)
    if log_input:
        loss = torch.exp(input) - target * input
    else:
        loss = input - target * torch.log(input + eps)
    if full:
        stirling = target * torch.log(target) - target + 0.5 * torch.log(2 * math.pi * target)
        loss = loss + torch.where(target > 1, stirling, 0.0)
    return reduce_loss(loss, reduction)


@register(F.gaussian_nll_loss)
def gaussian_nll_loss(input: Any, target: Any, var: Any, full: bool = False, eps: float = 1e-6,
                      reduction: str = "mean") -> Any:
    raise NoDecomposition("gaussian_nll_loss checks its variance's values")


# ---- classification losses --------------------------------------------------------------------------------

def _class_dim(input: Any) -> int:
    return 1 if input.ndim >= 2 else 0


def _check_targets(op: str, input: Any, target: Any) -> int:
    check(input.ndim >= 1, lambda: f"{op}: input tensor should be 1D or more, got {shape_text(input)}",
          RuntimeError)
    cdim = _class_dim(input)
    check(target.dtype == torch.int64, lambda: f"{op}: expected scalar type Long but found {target.dtype}",
          RuntimeError)
    if input.ndim == 1:
        check(target.ndim == 0, lambda: f"{op}: 1D input expects a 0D target, got {shape_text(target)}",
              RuntimeError)
    else:
        check(input.shape[0] == (target.shape[0] if target.ndim else -1), lambda: f"Expected input "
              f"batch_size ({input.shape[0]}) to match target batch_size "
              f"({target.shape[0] if target.ndim else 0}).",
              ValueError if input.ndim == 2 else RuntimeError)
        expected = [input.shape[0]] + list(input.shape[2:])
        check(list(target.shape) == expected, lambda: f"{op}: expected target size {expected}, got "
              f"{list(target.shape)}", RuntimeError)
    return cdim


def _target_weights(target: Any, weight: Any, ignore_index: int, dtype: torch.dtype) -> tuple[Any, Any]:
    """(the target with ignored entries replaced by class 0, each entry's weight: 0 where ignored)."""
    ignored = target == ignore_index
    safe = torch.where(ignored, 0, target)
    if weight is None:
        w = convert(torch.logical_not(ignored), dtype)
    else:
        w = torch.reshape(torch.index_select(weight, 0, torch.reshape(safe, [-1])), list(target.shape))
        w = torch.where(ignored, 0.0, w)
    return safe, w


def _nll(input: Any, target: Any, weight: Any, reduction: str, ignore_index: int) -> Any:
    cdim = _check_targets("nll_loss", input, target)
    c = input.shape[cdim]
    check(weight is None or (weight.ndim == 1 and weight.numel() == c), lambda: f"weight tensor should be "
          f"defined either for all {c} classes or no classes but got weight tensor of shape: "
          f"{shape_text(weight)}", RuntimeError)
    check(is_float_dtype(input.dtype), lambda: f"nll_loss: expected a floating input, got {input.dtype}",
          RuntimeError)
    # float16/bfloat16 accumulate in float32 and round once, as eager's kernel
    dtype = computation_dtype(input.dtype)
    safe, w = _target_weights(target, None if weight is None else convert(weight, dtype), ignore_index, dtype)
    picked = convert(torch.squeeze(torch.gather(input, cdim, torch.unsqueeze(safe, cdim)), cdim), dtype)
    if wants_gradient(input):
        # eager's gradient skips ignored entries: 0 there even when every entry is ignored (the mean's
        # 1 / total weight is inf then; a weight of 0 times inf would be NaN)
        picked = torch.where(target == ignore_index, prims.stop_gradient(picked), picked)
    loss = -(picked * w)
    if reduction == "sum":
        loss = torch.sum(loss)
    elif reduction == "mean":
        loss = torch.sum(loss) / torch.sum(w)
    return convert(loss, input.dtype)


@register(F.nll_loss)
def nll_loss(input: Any, target: Any, weight: Any = None, size_average: Any = None, ignore_index: int = -100,
             reduce: Any = None, reduction: str = "mean") -> Any:
    return _nll(input, target, weight, reduction_mode(size_average, reduce, reduction), ignore_index)


@register(F.cross_entropy)
def cross_entropy(input: Any, target: Any, weight: Any = None, size_average: Any = None,
                  ignore_index: int = -100, reduce: Any = None, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> Any:
    reduction = reduction_mode(size_average, reduce, reduction)
    check(0.0 <= label_smoothing <= 1.0, lambda: f"label_smoothing must be between 0.0 and 1.0. Got: "
          f"{label_smoothing}", RuntimeError)
    check(input.ndim >= 1, lambda: f"cross_entropy: input tensor should be 1D or more, got "
          f"{shape_text(input)}", RuntimeError)
    cdim = _class_dim(input)
    c = input.shape[cdim]
    logp = F.log_softmax(input, cdim)
    wshape = [1] * input.ndim
    wshape[cdim] = c
    if is_float_dtype(target.dtype):
        return _cross_entropy_probs(logp, target, weight, reduction, label_smoothing, cdim, wshape)
    nll = _nll(logp, target, weight, reduction, ignore_index)
    if label_smoothing == 0:
        return nll
    safe, w = _target_weights(target, weight, ignore_index, logp.dtype)
    terms = logp if weight is None else logp * torch.reshape(weight, wshape)
    smooth = torch.where(target == ignore_index, 0.0, -torch.sum(terms, cdim))
    if reduction == "mean":
        smooth = torch.sum(smooth) / torch.sum(w)
    elif reduction == "sum":
        smooth = torch.sum(smooth)
    return nll * (1 - label_smoothing) + smooth * (label_smoothing / c)


def _cross_entropy_probs(logp: Any, target: Any, weight: Any, reduction: str, label_smoothing: float,
                         cdim: int, wshape: list[int]) -> Any:
    check(list(target.shape) == list(logp.shape), lambda: f"cross_entropy: class probabilities need a target "
          f"of the input's shape {list(logp.shape)}, got {list(target.shape)}", RuntimeError)
    c = logp.shape[cdim]
    if label_smoothing > 0:
        target = target * (1 - label_smoothing) + label_smoothing / c
    terms = logp * target
    if weight is not None:
        terms = terms * (torch.reshape(weight, wshape) if logp.ndim > 1 else weight)
    if reduction == "none":
        return -torch.sum(terms, cdim)
    if reduction == "sum":
        return -torch.sum(terms)
    if logp.numel() == 0:
        raise NoDecomposition("cross_entropy mean over an empty input")
    return -torch.sum(terms) / (logp.numel() // c)


def _bce_weight(weight: Any, target: Any) -> Any:
    return weight if list(weight.shape) == list(target.shape) else torch.broadcast_to(weight, target.shape)


@register(F.binary_cross_entropy)
def binary_cross_entropy(input: Any, target: Any, weight: Any = None, size_average: Any = None,
                         reduce: Any = None, reduction: str = "mean") -> Any:
    reduction = reduction_mode(size_average, reduce, reduction)
    check(list(target.shape) == list(input.shape), lambda: f"Using a target size "
          f"({torch.Size(target.shape)}) that is different to the input size ({torch.Size(input.shape)}) is "
          f"deprecated. Please ensure they have the same size.", ValueError)
    check(is_float_dtype(input.dtype), lambda: "binary_cross_entropy: expected a floating input",
          RuntimeError)
    # eager: (t - 1) * max(log1p(-x), -100) - t * max(log(x), -100)
    x = prims.stop_gradient(input) if wants_gradient(input) else input
    loss = (target - 1) * torch.clamp_min(torch.log1p(-x), -100) - target * torch.clamp_min(torch.log(x), -100)
    if x is not input:
        # eager's gradient (x - t) / max(x (1 - x), 1e-12), finite where x is 0 or 1 (the logs' give NaN):
        # added as (input - input) * gradient, zero in value
        slope = prims.stop_gradient((x - target) / torch.clamp_min((1 - x) * x, 1e-12))
        loss = loss + (input - x) * slope
    if weight is not None:
        loss = loss * _bce_weight(weight, target)
    return reduce_loss(loss, reduction)


@register(F.binary_cross_entropy_with_logits)
def binary_cross_entropy_with_logits(input: Any, target: Any, weight: Any = None, size_average: Any = None,
                                     reduce: Any = None, reduction: str = "mean",
                                     pos_weight: Any = None) -> Any:
    reduction = reduction_mode(size_average, reduce, reduction)
    check(list(target.shape) == list(input.shape), lambda: f"Target size ({torch.Size(target.shape)}) must "
          f"be the same as input size ({torch.Size(input.shape)})", ValueError)
    log_sig = F.logsigmoid(input)
    if pos_weight is None:
        loss = (1 - target) * input - log_sig
    else:
        loss = (1 - target) * input - ((pos_weight - 1) * target + 1) * log_sig
    if weight is not None:
        loss = loss * weight
    return reduce_loss(loss, reduction)


@register(F.kl_div)
def kl_div(input: Any, target: Any, size_average: Any = None, reduce: Any = None, reduction: str = "mean",
           log_target: bool = False) -> Any:
    if size_average is not None or reduce is not None:
        reduction = _reduction.legacy_get_string(size_average, reduce, emit_warning=False)
    check(reduction in ("none", "mean", "sum", "batchmean"), lambda: f"{reduction} is not a valid value for "
          f"reduction", ValueError)
    if log_target:
        loss = torch.exp(target) * (target - input)
    else:
        loss = torch.xlogy(target, target) - target * input
    if reduction == "batchmean":
        total = torch.sum(loss)
        return total / input.shape[0] if input.ndim else total
    return reduce_loss(loss, reduction)


@register(F.soft_margin_loss)
def soft_margin_loss(input: Any, target: Any, size_average: Any = None, reduce: Any = None,
                     reduction: str = "mean") -> Any:
    reduction = reduction_mode(size_average, reduce, reduction)
    return reduce_loss(torch.log1p(torch.exp(-target * input)), reduction)


@register(F.margin_ranking_loss)
def margin_ranking_loss(input1: Any, input2: Any, target: Any, margin: float = 0, size_average: Any = None,
                        reduce: Any = None, reduction: str = "mean") -> Any:
    reduction = reduction_mode(size_average, reduce, reduction)
    check(input1.ndim == input2.ndim == target.ndim, lambda: f"margin_ranking_loss : All input tensors "
          f"should have same dimension but got sizes: input1: {torch.Size(input1.shape)}, input2: "
          f"{torch.Size(input2.shape)}, target: {torch.Size(target.shape)} ", RuntimeError)
    return reduce_loss(torch.clamp_min(-target * (input1 - input2) + margin, 0), reduction)


@register(F.hinge_embedding_loss)
def hinge_embedding_loss(input: Any, target: Any, margin: float = 1.0, size_average: Any = None,
                         reduce: Any = None, reduction: str = "mean") -> Any:
    reduction = reduction_mode(size_average, reduce, reduction)
    margin_clamp = torch.clamp_min(margin - input, 0)
    output_margin = torch.where(target != 1, margin_clamp, 0.0)
    output_self = torch.where(target != -1, input, 0.0)
    return reduce_loss(output_margin + output_self, reduction)


@register(F.cosine_embedding_loss)
def cosine_embedding_loss(input1: Any, input2: Any, target: Any, margin: float = 0, size_average: Any = None,
                          reduce: Any = None, reduction: str = "mean") -> Any:
    reduction = reduction_mode(size_average, reduce, reduction)
    check(input1.ndim in (1, 2) and input1.ndim == input2.ndim, lambda: f"cosine_embedding_loss expects 1D "
          f"or 2D inputs of the same dimension, got {shape_text(input1)} and {shape_text(input2)}",
          RuntimeError)
    dim = input1.ndim - 1
    eps = 1e-12
    prod = torch.sum(input1 * input2, dim)
    mag1 = torch.sum(input1 * input1, dim) + eps
    mag2 = torch.sum(input2 * input2, dim) + eps
    cos = prod / torch.sqrt(mag1 * mag2)
    pos = torch.where(target == 1, 1 - cos, 0.0)
    neg = torch.where(target == -1, torch.clamp_min(cos - margin, 0), 0.0)
    return reduce_loss(pos + neg, reduction)


@register(F.triplet_margin_loss)
def triplet_margin_loss(anchor: Any, positive: Any, negative: Any, margin: float = 1.0, p: float = 2,
                        eps: float = 1e-6, swap: bool = False, size_average: Any = None, reduce: Any = None,
                        reduction: str = "mean") -> Any:
    reduction = reduction_mode(size_average, reduce, reduction)
    check(anchor.ndim == positive.ndim == negative.ndim, lambda: f"The anchor, positive, and negative "
          f"tensors are expected to have the same number of dimensions, but got: anchor {anchor.ndim}D, "
          f"positive {positive.ndim}D, and negative {negative.ndim}D inputs", RuntimeError)
    check(margin > 0, lambda: f"triplet_margin_loss: expected margin to be greater than 0, got {margin} "
          f"instead", RuntimeError)
    d_pos = F.pairwise_distance(anchor, positive, p, eps)
    d_neg = F.pairwise_distance(anchor, negative, p, eps)
    if swap:
        d_neg = torch.minimum(d_neg, F.pairwise_distance(positive, negative, p, eps))
    return reduce_loss(torch.clamp_min(margin + d_pos - d_neg, 0), reduction)


@register(F.multilabel_soft_margin_loss)
def multilabel_soft_margin_loss(input: Any, target: Any, weight: Any = None, size_average: Any = None,
                                reduce: Any = None, reduction: str = "mean") -> Any:
    reduction = reduction_mode(size_average, reduce, reduction)
    loss = -(target * F.logsigmoid(input) + (1 - target) * F.logsigmoid(-input))
    if weight is not None:
        loss = loss * weight
    class_dim = input.ndim - 1
    loss = torch.sum(loss, class_dim) / input.shape[class_dim]
    return reduce_loss(loss, reduction)


@register(F.triplet_margin_with_distance_loss)
def triplet_margin_with_distance_loss(anchor: Any, positive: Any, negative: Any, *,
                                      distance_function: Any = None, margin: float = 1.0, swap: bool = False,
                                      reduction: str = "mean") -> Any:
    check(reduction in ("mean", "sum", "none"), lambda: f"{reduction} is not a valid value for reduction",
          ValueError)
    check(margin > 0, lambda: f"margin must be greater than 0, got {margin}", ValueError)
    check(anchor.ndim == positive.ndim == negative.ndim, lambda: f"The anchor, positive, and negative "
          f"tensors are expected to have the same number of dimensions, but got: anchor {anchor.ndim}D, "
          f"positive {positive.ndim}D, and negative {negative.ndim}D inputs", RuntimeError)
    # a user's distance function is ordinary torch code: it traces into this decomposition
    distance = distance_function if distance_function is not None else torch.pairwise_distance
    d_pos = distance(anchor, positive)
    d_neg = distance(anchor, negative)
    if swap:
        d_neg = torch.minimum(d_neg, distance(positive, negative))
    return reduce_loss(torch.clamp_min(margin + d_pos - d_neg, 0), reduction)


@register(F.multi_margin_loss)
def multi_margin_loss(input: Any, target: Any, p: int = 1, margin: float = 1.0, weight: Any = None,
                      size_average: Any = None, reduce: Any = None, reduction: str = "mean") -> Any:
    reduction = reduction_mode(size_average, reduce, reduction)
    check(p in (1, 2), lambda: "only p == 1 and p == 2 supported", ValueError)
    check(weight is None or weight.ndim == 1, lambda: "weight must be one-dimensional", ValueError)
    if input.ndim not in (1, 2) or target.dtype != torch.int64 or not is_float_dtype(input.dtype):
        raise NoDecomposition("multi_margin_loss of unusual inputs")  # eager's checks and messages
    x = input if input.ndim == 2 else torch.unsqueeze(input, 0)
    n, c = x.shape
    check(target.numel() == n and target.ndim <= 1 and (weight is None or weight.numel() == c),
          lambda: f"inconsistent target size: {list(target.shape)} for input of size: {list(input.shape)}",
          RuntimeError)
    t = torch.reshape(target, [n, 1])
    # loss_i = sum_{j != y_i} w[y_i] * max(0, margin - x[i, y_i] + x[i, j])^p / C
    z = torch.relu(margin - torch.gather(x, 1, t) + x)  # (relu: eager's gradient is 0 at the margin)
    h = z if p == 1 else z * z
    if weight is not None:
        h = h * torch.unsqueeze(torch.index_select(weight, 0, torch.reshape(target, [n])), 1)
    classes = torch.arange(c, device=x.device)
    h = torch.where(classes == t, 0.0, h)
    loss = torch.sum(h, 1) / c
    if input.ndim == 1 or target.ndim == 0:
        loss = torch.reshape(loss, list(target.shape))
    return reduce_loss(loss, reduction)
