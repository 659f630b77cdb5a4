"""Layout rules: where the elements of a strided tensor live.

A layout is (shape, strides, storage_offset), in elements: element `index` lives at
`storage_offset + sum(index[d] * strides[d])`. Every stage asks the same questions of layouts — is it
row-major, does it cover its memory exactly once, what dense strides keep its dim order, how much storage
does it reach — and this module is the one place that answers them.

Sizes, strides and offsets are `Dim`s: ints or sympy expressions (symbolic sizes). `numel`,
`contiguous_strides`, `strides_in_order`, `is_contiguous` and `storage_size` compute with either; a
symbolic size is used as it is (taken not to be 0). The rules that sort dims by stride
(`is_non_overlapping_and_dense`, `is_non_overlapping`, `dense_strides_like`, `preserve_strides`) need
comparable strides:
ints, or expressions whose order sympy can decide.
"""
from __future__ import annotations

from typing import Any, Sequence, Union

import torch

from .symbolic import same_sizes

Dim = Union[int, Any]  # an int or a sympy.Expr (named lazily: kiln.graph.lazy)


def numel(shape: Sequence[Dim]) -> Dim:
    """The number of elements of a shape (1 for a 0-d shape)."""
    total: Dim = 1
    for size in shape:
        total = total * size
    return total


def _extent(size: Dim) -> Dim:
    """What a dim multiplies the strides of the dims outside it by: its size, 1 for a size-0 dim (as eager,
    whose strides of an empty tensor are those it would have at size 1)."""
    return 1 if size == 0 else size


def strides_in_order(shape: Sequence[Dim], order: Sequence[int]) -> tuple[Dim, ...]:
    """Dense strides laying the dims out in `order`, innermost first: `order[0]` gets stride 1, each next
    dim the product of the extents before it. `order` is a permutation of the dims."""
    strides: list[Dim] = [0] * len(shape)
    running: Dim = 1
    for d in order:
        strides[d] = running
        running = running * _extent(shape[d])
    return tuple(strides)


def contiguous_strides(shape: Sequence[Dim]) -> tuple[Dim, ...]:
    """Row-major strides (eager's contiguous layout): the last dim innermost."""
    return strides_in_order(shape, range(len(shape) - 1, -1, -1))


def is_contiguous(shape: Sequence[Dim], strides: Sequence[Dim]) -> bool:
    """Eager's is_contiguous: row-major, ignoring the strides of size-1 dims; an empty tensor always is."""
    if any(size == 0 for size in shape):
        return True
    expected: Dim = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if same_sizes((stride,), (expected,)):  # (whether the size is 1 does not matter then)
            expected = expected * size
            continue
        if size == 1:
            continue
        if stride != expected:
            return False
        expected = expected * size
    return True


def is_non_overlapping_and_dense(shape: Sequence[Dim], strides: Sequence[Dim]) -> bool:
    """Eager's is_non_overlapping_and_dense: some permutation of the dims is contiguous (every element at
    its own address, no gaps). Dims of size 0 or 1 place nothing, so their strides do not matter."""
    placed = sorted((stride, size) for size, stride in zip(shape, strides) if size != 1)
    if any(size == 0 for _, size in placed):
        return True
    expected: Dim = 1
    for stride, size in placed:
        if stride != expected:
            return False
        expected = expected * size
    return True


def is_non_overlapping(shape: Sequence[Dim], strides: Sequence[Dim]) -> bool:
    """No two elements share an address, gaps allowed (a slice's layout): sorted by stride, each dim steps
    over everything the smaller-strided dims reach; an empty tensor has no elements to share. (Sufficient,
    not necessary: interleaved layouts that never collide are refused.)"""
    if any(size == 0 for size in shape):
        return True
    reach: Dim = 1
    for stride, size in sorted((stride, size) for size, stride in zip(shape, strides) if size != 1):
        if stride < reach:
            return False
        reach = stride * size
    return True


def dense_strides_like(shape: Sequence[Dim], strides: Sequence[Dim]) -> tuple[Dim, ...]:
    """Dense strides in the dim order of `strides` (eager's infer_dense_strides, as empty_like uses):
    dims sorted by stride, ties and stride-0 dims keeping their order from the last dim outwards."""
    return _dense_in_stride_order(shape, (strides,))


def preserve_strides(shape: Sequence[Dim], strides: Sequence[Dim]) -> tuple[Dim, ...]:
    """The strides eager's empty_like(preserve_format) gives a tensor of this layout: its own when
    non-overlapping and dense, else dense ones in its dim order (`dense_strides_like`)."""
    if is_non_overlapping_and_dense(shape, strides):
        return tuple(strides)
    return dense_strides_like(shape, strides)


def channels_last_contiguous(shape: Sequence[Dim], strides: Sequence[Dim]) -> bool:
    """Eager's is_contiguous(memory_format=channels_last / channels_last_3d): a 4-d (5-d) tensor dense in
    (N, H, W, C) ((N, D, H, W, C)) order, size-1 dims' strides ignored (False for symbolic sizes)."""
    if len(shape) not in (4, 5) or not all(type(v) is int for v in (*shape, *strides)):
        return False
    if any(size == 0 for size in shape):
        return True
    expected = 1
    for d in ((1, 3, 2, 0) if len(shape) == 4 else (1, 4, 3, 2, 0)):
        if shape[d] != 1 and strides[d] != expected:
            return False
        expected *= shape[d]
    return True


def suggests_channels_last(shape: Sequence[Dim], strides: Sequence[Dim]) -> bool:
    """c10's is_channels_last_strides_{2d,3d} (what suggest_memory_format asks): a 4-d or 5-d layout whose
    strides order the channel dim innermost, then the spatial dims from the last, then the batch."""
    if len(shape) not in (4, 5) or not all(type(v) is int for v in (*shape, *strides)) or strides[1] == 0:
        return False
    smallest = 0
    for d in ((1, 3, 2, 0) if len(shape) == 4 else (1, 4, 3, 2, 0)):
        if shape[d] == 0 or strides[d] < smallest:
            return False
        if d == 0 and smallest == strides[1]:
            return False
        smallest = strides[d]
        if shape[d] > 1:
            smallest *= shape[d]
    return True


# (kiln.lower.conv_layout) A dense convolution is laid out NHWC when its result has at least this many pixels
# (N * H * W). oneDNN's
# NHWC convolution wins on large images (one thread, 3x3, 16 -> 16 channels at 32x32: batch 8 599 -> 368
# us) and loses or ties on small ones (batch 1: 100 -> 104 us; 4x4 at batch 8: 314 -> 304 us only with
# an NHWC weight, 398 us when torch converts the weight per call); `bench/bench_conv.py --layout`. The
# bound is the zoo's resnet18 (32x32 images): at batch 8 NHWC through its 2048-pixel stage ran 7.3 ms
# against 8.0 NCHW; at batch 1 (1024 pixels at most) it stays NCHW, where NHWC lost 2.21 -> 2.41 ms.
NHWC_MIN_PIXELS = 2048


def convolution_channels_last(x_shape: Sequence[Dim], x_strides: Sequence[Dim], w_shape: Sequence[Dim],
                              w_strides: Sequence[Dim], dtype: Any = None, stride: Sequence[Dim] = (),
                              dilation: Sequence[Dim] = (), groups: Dim = 1) -> bool:
    """Whether eager's CPU convolution runs, and returns, channels-last: its input or weight suggests it.
    A 1-d convolution runs as a 2-d one over unsqueeze(2) views of a contiguous copy of its input and of its
    weight, so only the weight's layout counts there (a transposed weight gives a (N, L, C)-ordered
    result). A 3-d one returns channels-last only where oneDNN runs it (`_onednn_3d`, given the `dtype`,
    `stride`, `dilation` and `groups`): torch's own 3-d kernel writes a contiguous result."""
    if len(w_shape) == 3:
        k, k_stride = w_shape[2], w_strides[2]
        return suggests_channels_last((*w_shape[:2], 1, k), (*w_strides[:2], k * k_stride, k_stride))
    suggested = suggests_channels_last(x_shape, x_strides) or suggests_channels_last(w_shape, w_strides)
    if suggested and len(w_shape) == 5 and dtype is not None:
        return _onednn_3d(x_shape, w_shape, dtype, stride, dilation, groups)
    return suggested


def _onednn_3d(x_shape: Sequence[Dim], w_shape: Sequence[Dim], dtype: Any, stride: Sequence[Dim],
               dilation: Sequence[Dim], groups: Dim) -> bool:
    """Whether torch (2.13's ConvParams::use_mkldnn) runs a CPU 3-d convolution with oneDNN: always for
    bfloat16, never for float64; for float32 unless it is a 1x1 (in its last two dims), unstrided, undilated
    one over a batch under 16 on one thread, or one over a single image with kernels up to 3 wide and at most
    20480 elements in its first four dims (torch's own kernels are faster there). The thread count is the one
    at capture: a graph run after torch.set_num_threads changes it may return other strides than eager."""
    if dtype == torch.bfloat16:
        return True
    if dtype != torch.float32:
        return dtype != torch.float64
    sizes = (*x_shape, *w_shape, *stride, *dilation, groups)
    if not all(type(v) is int for v in sizes):
        return True
    n = x_shape[0]
    kh, kw = w_shape[-2], w_shape[-1]
    special = any(s != 1 for s in stride) or any(d != 1 for d in dilation) or n >= 16 or kw != 1 or kh != 1 \
        or torch.get_num_threads() > 1
    return special and (groups > 1 or (kw > 3 and kh > 3) or n > 1 or
                        x_shape[0] * x_shape[1] * x_shape[2] * x_shape[3] > 20480)


def elementwise_strides(shape: Sequence[Dim], operands: Sequence[Sequence[Dim]],
                        scalars: bool = False) -> tuple[Dim, ...]:
    """The strides eager's TensorIterator gives the result of an elementwise op whose tensor operands,
    broadcast to `shape`, have these strides (a broadcast dim's stride 0), in argument order; `scalars`: a
    number takes part too (eager wraps it in a 0-d tensor, which rules out its fast paths).

    Fast paths first: operands all contiguous give a contiguous result, all channels-last (4-d) a
    channels-last one, all non-overlapping and dense with the same strides those strides. Otherwise the
    dims are ordered innermost first by the operands' strides: a pair of dims is compared on the first
    operand that orders them (stride-0 dims are skipped, equal strides put the smaller size inside), an
    undecided pair keeps row-major order; the result is dense in that order. Symbolic sizes or strides give
    row-major strides (the rule needs comparable ints)."""
    ndim = len(shape)
    values = (*shape, *(s for strides in operands for s in strides))
    if not all(type(v) is int for v in values) or not operands:
        return contiguous_strides(shape)
    if not scalars:
        if all(is_contiguous(shape, s) for s in operands):
            return contiguous_strides(shape)
        if ndim == 4 and all(channels_last_contiguous(shape, s) for s in operands):
            return strides_in_order(shape, (1, 3, 2, 0))
        first = tuple(operands[0])
        if all(tuple(s) == first for s in operands) and is_non_overlapping_and_dense(shape, first):
            return first
    if ndim <= 1:
        return contiguous_strides(shape)

    return _dense_in_stride_order(shape, operands)


def _dense_in_stride_order(shape: Sequence[Dim], operands: Sequence[Sequence[Dim]]) -> tuple[Dim, ...]:
    """Dense strides with the dims ordered innermost first by the operands' strides, as ATen orders them
    (TensorIteratorBase::reorder_dimensions, infer_dense_strides): a pair of dims is compared on the first
    operand that orders it (stride-0 dims skipped, equal strides put the smaller size inside); an insertion
    sort, since an undecided pair compares equal to everything and so is not a plain sort."""
    ndim = len(shape)

    def should_swap(d0: int, d1: int) -> int:
        for strides in operands:
            s0, s1 = strides[d0], strides[d1]
            if s0 == 0 or s1 == 0:
                continue
            if s0 < s1:
                return -1
            if s0 > s1:
                return 1
            if shape[d0] > shape[d1]:
                return 1
        return 0
    perm = list(range(ndim - 1, -1, -1))  # innermost first
    for i in range(1, ndim):
        dim1 = i
        for dim0 in range(i - 1, -1, -1):
            comparison = should_swap(perm[dim0], perm[dim1])
            if comparison > 0:
                perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                dim1 = dim0
            elif comparison < 0:
                break
    return strides_in_order(shape, perm)


def storage_size(shape: Sequence[Dim], strides: Sequence[Dim], offset: Dim = 0) -> Dim:
    """Elements of storage a layout reaches: its offset plus one past its last element (0 when empty)."""
    if any(size == 0 for size in shape):
        return 0
    reach: Dim = offset + 1
    for size, stride in zip(shape, strides):
        reach = reach + (size - 1) * stride
    return reach
