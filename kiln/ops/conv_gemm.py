"""Small CPU convolutions as one matrix product over gathered windows (im2col + mm), forward and backward.

oneDNN's convolution costs ~40-70 us a call on this class of machine however little work it has, and its
backward (aten.convolution_backward) ~100-200 us: at a small CNN's sizes (a few channels, tens of pixels)
that is overhead, not arithmetic, and in training it is most of the step. Written with prims instead, a
convolution is

    cols = im2col(x)                          # (C, *K, N, *O) = (C*K, N*L): one gather kernel
    out  = mm(weight as (O, C*K), cols)       # (O, N*L): MKL
    out  = out as (O, N, *O), dims swapped    # (N, O, *O): a view the next kernel reads

and its backward comes from the prims' own VJP rules: the weight's gradient is one mm with the batch and
pixels as the contracted dim, the input's an mm followed by col2im, im2col's adjoint (kiln.prims.windows),
one summing kernel. At resnet_tiny's shapes a compiled conv + relu alone runs about even
with oneDNN forward and 1.25-1.6x faster forward + backward (bench/bench_conv.py, one run); in the model the
im2col gather also takes the BatchNorm + ReLU before it, computed once into a buffer.

A depthwise convolution (one input channel per group, m outputs each) has no matrix product to make: it is
the sum over the K window taps of a tap's shifted input times that tap's weight, each tap a view of
im2col's output, so the whole convolution is one pointwise kernel over the output pixels that fuses with
the BatchNorm and activation around it (the input padded once up front, so the taps are plain loads).
oneDNN spends ~45 us a call on MobileNet's small depthwise layers; this kernel a few.

Used for non-transposed convolutions of float32/float64 CPU tensors with static sizes: ungrouped ones whose
multiply-adds are at most `conv_gemm_max_macs` (0 turns it off), or 1x1 ones timed faster this way on this
machine (`kiln.ops.conv_choice`), whose gathered windows are at most `conv_gemm_max_bytes` (above that
oneDNN's own blocking wins, and the gathered copy costs memory), and
depthwise ones of at most `conv_depthwise_max_macs` (their windows are never gathered into a buffer). The
three limits are read as the graph being traced sees them: `kiln.compile(options=)` sets them per compile.
Other grouped convolutions keep oneDNN.
"""
from __future__ import annotations

import itertools
from typing import Any, Sequence

import torch

from .. import prims
from ..graph import traced_flag
from ..graph.layout import convolution_channels_last, strides_in_order, suggests_channels_last
from .conv_choice import gemm_faster, pointwise
from .utils import dense_in_order
from ..graph.lazy import is_expr


def _prod(sizes: Sequence[int]) -> int:
    total = 1
    for s in sizes:
        total *= s
    return total


def _out_sizes(x: Any, w: Any, stride: Sequence[int], padding: Sequence[int],
               dilation: Sequence[int]) -> list[int]:
    n = w.ndim - 2
    return [(x.shape[2 + i] + 2 * padding[i] - dilation[i] * (w.shape[2 + i] - 1) - 1) // stride[i] + 1
            for i in range(n)]


def eligible(x: Any, w: Any, transposed: bool, groups: int, stride: Sequence[int], padding: Sequence[int],
             dilation: Sequence[int]) -> bool:
    """Whether this convolution runs as gather + mm, or as gather + weighted sum when depthwise (see the
    module docstring)."""
    if transposed or x.ndim != w.ndim or x.device.type != "cpu":
        return False
    if x.dtype not in (torch.float32, torch.float64) or w.dtype != x.dtype:
        return False
    sizes = (*x.shape, *w.shape)
    if any(is_expr(s) or not isinstance(s, int) for s in sizes):
        return False
    if groups != 1 and not _depthwise(x, w, groups):
        return False
    if groups == 1 and x.shape[1] != w.shape[1]:
        return False
    out = _out_sizes(x, w, stride, padding, dilation)
    if any(s <= 0 for s in out) or any(p < 0 for p in padding) or 0 in sizes:
        return False
    window = w.shape[1] * _prod(w.shape[2:])  # C * K (K when depthwise)
    columns = x.shape[0] * _prod(out)  # N * L
    macs = w.shape[0] * window * columns
    if groups != 1:  # (its windows are never gathered into a buffer: each tap is a view the kernel reads)
        return 0 < macs <= traced_flag("conv_depthwise_max_macs")
    if window * columns * x.element_size() > traced_flag("conv_gemm_max_bytes"):
        return False
    limit = traced_flag("conv_gemm_max_macs")
    if limit <= 0 or macs <= 0:
        return False
    if macs <= limit:
        return True
    # a larger 1x1 convolution: a product where that was timed faster here (kiln.ops.conv_choice)
    return pointwise(tuple(w.shape), stride, padding, dilation, groups) and \
        gemm_faster(x.shape[0], x.shape[1], tuple(x.shape[2:]), w.shape[0], x.dtype,
                    traced_flag("conv_pointwise"), traced_flag("conv_pointwise_measure_max_macs"))


def _depthwise(x: Any, w: Any, groups: int) -> bool:
    """One input channel per group (w: (C*m, 1, *K), groups == C), each group's m outputs read only it."""
    return groups == x.shape[1] and w.shape[1] == 1 and w.shape[0] % groups == 0


def convolution(x: Any, w: Any, bias: Any, stride: Sequence[int], padding: Sequence[int],
                dilation: Sequence[int], groups: int = 1) -> Any:
    """conv(x, w) + bias for an `eligible` convolution, as gather + mm (same values up to summation order)."""
    n = w.ndim - 2
    # eager's CPU convolution returns channels-last when its input or weight is (kiln.prims.convolution)
    channels_last = convolution_channels_last(x.shape, x.stride(), w.shape, w.stride(), x.dtype, stride, dilation,
                                              groups)
    batch, channels, out_channels = x.shape[0], x.shape[1], w.shape[0]
    out = _out_sizes(x, w, stride, padding, dilation)
    window = _prod(w.shape[2:])
    spatial = tuple(range(2, n + 2))
    macs = out_channels * channels * batch * _prod(out)
    if pointwise(tuple(w.shape), stride, padding, dilation, groups) and \
            (macs > traced_flag("conv_gemm_max_macs") or _rows_first(x, out)):
        # a 1x1 convolution over channels-last images, or a large one timed faster as a product
        # (kiln.ops.conv_choice: few pixels, many channels): a product of the pixels' rows (N*L, C) and the
        # weight's transpose, (N*L, O), which is the channels-last result: over NHWC images the rows are a
        # view of them, and the result needs no transpose (kiln.lower.conv_layout follows it). Small ones over
        # NCHW images take the channels-first product below (`_rows_first`): there the gather of the rows
        # would read across the channels, one element per plane (DenseNet at batch 2: 1 GB/s, 3.2 -> 7.6 ms a
        # call). The large ones are few pixels each (PoolFormer's and EfficientNet's 2x2 and 4x4 stages),
        # where the rows measured faster either way: with the channels-first product EfficientNet at batch 8
        # ran 1.6 -> 2.1 ms a call, in its NHWC graph.
        rows = torch.reshape(prims.permute(x, (0,) + spatial + (1,)), (batch * _prod(out), channels))
        weight = prims.view(w if w.is_contiguous() else prims.clone(w, torch.contiguous_format),
                            (out_channels, channels))
        product = prims.mm(rows, prims.permute(weight, (1, 0)))  # (N*L, O)
        result = prims.permute(prims.view(product, (batch, *out, out_channels)), (0, n + 1, *range(1, n + 1)))
        return _eager_layout(result, bias, channels_last, n)
    if groups != 1 and any(padding):
        # padded once up front: the K taps below are then plain loads, not K bounds-checked ones each
        pad: list[int] = []
        for p in reversed(padding):
            pad += [p, p]
        x, padding = torch.nn.functional.pad(x, pad), (0,) * n
    cols = prims.im2col(x, tuple(w.shape[2:]), tuple(stride), tuple(padding), tuple(dilation))
    w = w if w.is_contiguous() else prims.clone(w, torch.contiguous_format)
    if groups != 1:  # depthwise: each output channel a weighted sum of its one input channel's windows
        per = out_channels // channels
        # a sum of K products, not a reduction over K: one pointwise kernel vectorized along the pixels.
        # The windows are selected dim by dim: a view merging im2col's window dims would index through
        # div and mod the kernel cannot vectorize. The weight, a plain buffer, merges them for free.
        taps = prims.view(w, (channels, per, window) + (1,) * (n + 1))  # (C, m, K, 1, ...)
        total = None
        for k, tap in enumerate(itertools.product(*(range(size) for size in w.shape[2:]))):
            pixels = cols
            for t in tap:
                pixels = torch.select(pixels, 1, t)
            term = pixels.unsqueeze(1) * torch.select(taps, 2, k)  # (C, m, N, *O)
            total = term if total is None else total + term
        product = prims.view(total, (out_channels, batch, *out))
    else:
        cols = prims.view(cols, (channels * window, batch * _prod(out)))  # (C*K, N*L)
        product = prims.mm(prims.view(w, (out_channels, channels * window)), cols)  # (O, N*L)
        product = prims.view(product, (out_channels, batch, *out))
    return _eager_layout(prims.permute(product, (1, 0) + spatial), bias, channels_last, n)


def _rows_first(x: Any, out: Sequence[int]) -> bool:
    """Whether a 1x1 convolution's images are known channels-last where it runs: eager's layout says so.
    Images the layout pass makes NHWC (many pixels, a graph with depthwise convolutions:
    kiln.lower.conv_layout) are not known here: rows there measured 5-7% faster at batch 8 (DenseNet,
    MobileNet, EfficientNet), but where the layouts of neighbouring values differ the rows' gather and the
    next kernels read across channels (MobileNet at batch 2: 0.96 -> 1.45 ms a call), so those keep the
    channels-first product."""
    return len(out) == 2 and suggests_channels_last(tuple(x.shape), tuple(x.stride()))


def _eager_layout(result: Any, bias: Any, channels_last: bool, n: int) -> Any:
    """The product plus the bias, copied into the strides eager's convolution returns."""
    if bias is not None:
        result = result + torch.reshape(bias, (1, -1) + (1,) * n)
    # eager's layout, exactly (a size-1 batch dim's stride too: eager's result is a fresh tensor): the copy is a
    # remap the consumers' kernels absorb
    if channels_last and n == 1:
        return dense_in_order(result, (0, 2, 1))
    order = (1,) + tuple(range(n + 1, 1, -1)) + (0,) if channels_last else tuple(range(n + 1, -1, -1))
    if tuple(result.stride()) == strides_in_order(tuple(result.shape), order):
        return result
    return prims.clone(result, torch.contiguous_format if not channels_last else
                       torch.channels_last if n == 2 else torch.channels_last_3d)
