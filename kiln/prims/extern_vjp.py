"""Reverse-mode derivatives (vjp rules) of the extern prims, as eager autograd computes them.

mm, bmm       products with the other operand transposed
addmm         mm's, and the bias's: the gradient summed over the rows (eager's AddmmBackward)
convolution   the extern convolution_backward (eager's aten.convolution_backward)
sdpa          the extern sdpa_backward (eager's autograd of the attention), with a float mask's gradient where
              an input's gradient needs it
sdpa_flash    torch's flash backward from the saved output and logsumexp (a mask needing a gradient: as sdpa)
sort, topk, cummax, cummin   the values' gradient added into zeros at the indices
cumsum        the reversed cumulative sum of the gradient
cumprod       exact with zeros: before a row's first zero, reversed_cumsum(grad * out) / a; at the first
              zero, the same sum with that zero replaced by 1 (no division); after it, 0
logcumsumexp  eager's stable form: positive and negative parts of the gradient scanned in log space
convolution_backward and sdpa_backward have no derivative of their own (a double backward runs with torch).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from . import elementwise as ew
from . import shape
from .common_vjp import as_dtype, not_differentiable_twice, refuse_complex, vjp, zeros_like
from .extern import (addmm, bmm, convolution, convolution_backward, cummax, cummin, cumprod, cumsum,
                     logcumsumexp, mm, sdpa, sdpa_backward, sdpa_flash, sdpa_flash_backward, sort, topk)
from .indexing import scatter_add
from .reductions import sum as reduce_sum
from .registry import is_tensor, meta_of, wrap_dim


@vjp(mm)
def _mm_vjp(grads: tuple, outputs: tuple, a: Any, b: Any) -> tuple:
    (g,) = grads
    refuse_complex("mm", a)
    return (mm(g, shape.permute(b, (1, 0))), mm(shape.permute(a, (1, 0)), g))


@vjp(addmm)
def _addmm_vjp(grads: tuple, outputs: tuple, bias: Any, a: Any, b: Any) -> tuple:
    (g,) = grads
    refuse_complex("addmm", a)
    return (reduce_sum(g, (0,)), mm(g, shape.permute(b, (1, 0))), mm(shape.permute(a, (1, 0)), g))


@vjp(bmm)
def _bmm_vjp(grads: tuple, outputs: tuple, a: Any, b: Any) -> tuple:
    (g,) = grads
    refuse_complex("bmm", a)
    return (bmm(g, shape.permute(b, (0, 2, 1))), bmm(shape.permute(a, (0, 2, 1)), g))


@vjp(convolution)
def _convolution_vjp(grads: tuple, outputs: tuple, x: Any, w: Any, bias: Any, stride: Sequence[int],
                     padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                     output_padding: Sequence[int], groups: int,
                     grad_mask: Sequence[bool] = (True, True, True)) -> tuple:
    """`grad_mask` (passed by kiln.autograd.joint, see `takes_grad_mask`): which of x, w, bias need a
    gradient. It becomes convolution_backward's output_mask, so that, as in eager, the first convolution of
    a network (whose input needs none) computes no input gradient, and frozen weights no weight gradient."""
    (g,) = grads
    refuse_complex("convolution", x)
    has_bias = bias is not None
    bias_sizes = list(meta_of(bias).shape) if has_bias else None
    mask = (bool(grad_mask[0]), bool(grad_mask[1]), has_bias and bool(grad_mask[2]))
    if not any(mask):
        return (None,) * 9
    results = iter(convolution_backward(g, x, w, bias_sizes, stride, padding, dilation, transposed,
                                        output_padding, groups, mask))
    return tuple(next(results) if wanted else None for wanted in mask) + (None,) * 6


_convolution_vjp.takes_grad_mask = True  # type: ignore[attr-defined]


def _mask_needs_gradient(grad_mask: Sequence[bool], attn_mask: Any) -> bool:
    """A float attn_mask (the fourth argument) that some input's gradient depends on."""
    return len(grad_mask) > 3 and bool(grad_mask[3]) and is_tensor(attn_mask) and \
        meta_of(attn_mask).dtype.is_floating_point


@vjp(sdpa)
def _sdpa_vjp(grads: tuple, outputs: tuple, q: Any, k: Any, v: Any, attn_mask: Any = None,
              is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
              grad_mask: Sequence[bool] = (True,) * 4) -> tuple:
    """`grad_mask` (see `takes_grad_mask`): a float attn_mask that some input's gradient depends on (Swin's
    relative position bias, a learned bias) gets its gradient too, as in eager."""
    (g,) = grads
    mask_grad = _mask_needs_gradient(grad_mask, attn_mask)
    result = sdpa_backward(g, q, k, v, attn_mask, is_causal, scale, enable_gqa, mask_grad)
    gmask = result[3] if mask_grad else None
    return (result[0], result[1], result[2], gmask, None, None, None)


_sdpa_vjp.takes_grad_mask = True  # type: ignore[attr-defined]


@vjp(sdpa_flash)
def _sdpa_flash_vjp(grads: tuple, outputs: tuple, q: Any, k: Any, v: Any, attn_mask: Any = None,
                    is_causal: bool = False, scale: float | None = None,
                    grad_mask: Sequence[bool] = (True,) * 4) -> tuple:
    """torch's flash backward from the saved output and logsumexp (no second forward). A float mask that
    needs a gradient (which the flash backward does not give; eager runs such an attention on its math
    path) takes sdpa_backward, the attention differentiated by eager autograd."""
    g = grads[0]
    if g is None:
        return (None,) * 6
    out, lse = outputs
    if _mask_needs_gradient(grad_mask, attn_mask):
        grouped = meta_of(k).shape[1] != meta_of(q).shape[1]
        dq, dk, dv, dmask = sdpa_backward(g, q, k, v, attn_mask, is_causal, scale, grouped, True)
        return (dq, dk, dv, dmask, None, None)
    dq, dk, dv = sdpa_flash_backward(g, q, k, v, out, lse, attn_mask, is_causal, scale)
    return (dq, dk, dv, None, None, None)


_sdpa_flash_vjp.takes_grad_mask = True  # type: ignore[attr-defined]


not_differentiable_twice(convolution_backward, "the derivative of a convolution's backward is not written")
not_differentiable_twice(sdpa_backward, "the derivative of attention's backward is not written")
not_differentiable_twice(sdpa_flash_backward, "the derivative of attention's backward is not written")


# ---- values selected at indices -------------------------------------------------------------------------

def _selected_vjp(grads: tuple, outputs: tuple, a: Any, dim: int) -> Any:
    """The values' gradient added into zeros at the positions the indices name."""
    g_values = grads[0]
    if g_values is None:
        return None
    m = meta_of(a)
    return scatter_add(zeros_like(a), wrap_dim(dim, m.ndim), outputs[1], g_values)


@vjp(sort)
def _sort_vjp(grads: tuple, outputs: tuple, a: Any, dim: int = -1, descending: bool = False,
              stable: bool = False) -> tuple:
    return (_selected_vjp(grads, outputs, a, dim), None, None, None)


@vjp(topk)
def _topk_vjp(grads: tuple, outputs: tuple, a: Any, k: int, dim: int = -1, largest: bool = True,
              sorted: bool = True) -> tuple:  # noqa: A002
    return (_selected_vjp(grads, outputs, a, dim), None, None, None, None)


@vjp(cummax)
def _cummax_vjp(grads: tuple, outputs: tuple, a: Any, dim: int) -> tuple:
    return (_selected_vjp(grads, outputs, a, dim), None)


@vjp(cummin)
def _cummin_vjp(grads: tuple, outputs: tuple, a: Any, dim: int) -> tuple:
    return (_selected_vjp(grads, outputs, a, dim), None)


# ---- scans ----------------------------------------------------------------------------------------------

def _reversed(scan: Any, x: Any, dim: int) -> Any:
    """The scan run from the end of dim towards its start."""
    return shape.rev(scan(shape.rev(x, (dim,)), dim), (dim,))


@vjp(cumsum)
def _cumsum_vjp(grads: tuple, outputs: tuple, a: Any, dim: int) -> tuple:
    (g,) = grads
    m = meta_of(a)
    if m.ndim == 0:
        return (g, None)
    return (_reversed(cumsum, g, wrap_dim(dim, m.ndim)), None)


@vjp(cumprod)
def _cumprod_vjp(grads: tuple, outputs: tuple, a: Any, dim: int) -> tuple:
    (g,) = grads
    refuse_complex("cumprod", a)
    m = meta_of(a)
    if m.ndim == 0:
        return (g, None)
    dim = wrap_dim(dim, m.ndim)
    out = outputs[0]
    is_zero = ew.eq(a, 0)
    zeros_so_far = cumsum(as_dtype(is_zero, torch.int64), dim)
    before = ew.eq(zeros_so_far, 0)  # no zero at or before this position
    first_zero = ew.bitwise_and(is_zero, ew.eq(zeros_so_far, 1))
    # before the first zero a is nonzero: d out_j / d a_i = out_j / a_i for j >= i
    part_before = ew.div(_reversed(cumsum, ew.mul(g, out), dim), ew.where(before, a, 1))
    # at the first zero: d out_j / d a_i is the product of a_k, k <= j, k != i, i.e. the cumulative product
    # with that zero replaced by 1; later positions multiply a zero in every product, so get 0
    skipped = cumprod(ew.where(first_zero, 1, a), dim)
    part_at = _reversed(cumsum, ew.mul(g, skipped), dim)
    return (ew.where(before, part_before, ew.where(first_zero, part_at, 0)), None)


@vjp(logcumsumexp)
def _logcumsumexp_vjp(grads: tuple, outputs: tuple, a: Any, dim: int) -> tuple:
    (g,) = grads
    refuse_complex("logcumsumexp", a)
    m = meta_of(a)
    if m.ndim == 0:
        return (g, None)
    dim = wrap_dim(dim, m.ndim)
    result = outputs[0]
    # grad_i = sum_{j >= i} g_j exp(a_i - out_j), split by the sign of g_j so each part is a logcumsumexp
    lowest = torch.finfo(m.dtype).min
    log_abs = ew.log(ew.abs(g))
    parts = []
    for sign_holds in (ew.gt(g, 0), ew.lt(g, 0)):
        log_part = ew.where(sign_holds, log_abs, lowest)
        parts.append(ew.exp(ew.add(_reversed(logcumsumexp, ew.sub(log_part, result), dim), a)))
    return (ew.sub(parts[0], parts[1]), None)
