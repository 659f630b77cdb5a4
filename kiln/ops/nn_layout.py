"""Decompositions of torch.nn.functional layout ops: pad, interpolate, pixel_shuffle, one_hot, distances.

Constant padding is one `prims.pad` (negative pads crop); reflect/replicate/circular padding concatenate
slices of the input. Interpolation gathers rows with index tensors computed at trace time in eager's own
arithmetic (float32 source coordinates for float32 inputs), then mixes them with constant weights.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .. import prims
from ..prims.registry import check, shape_text, wrap_dim
from .registry import NoDecomposition, register
from .utils import computation_dtype, convert, eager_format, is_float_dtype, result_type, root_of_sum


# ---- pad --------------------------------------------------------------------------------------------------

def _constant_pad(input: Any, pad: Sequence[int], value: Any) -> Any:
    config = [(0, 0, 0)] * input.ndim
    for i in range(len(pad) // 2):
        d = input.ndim - 1 - i
        config[d] = (pad[2 * i], pad[2 * i + 1], 0)
        new = input.shape[d] + pad[2 * i] + pad[2 * i + 1]
        check(new >= 0, lambda: f"The input size {input.shape[d]}, plus negative padding {pad[2 * i]} and "
              f"{pad[2 * i + 1]} resulted in a negative output size, which is invalid. Check dimension "
              f"{d} of your input.", RuntimeError)
    if input.dtype == torch.bool:
        value = bool(value)
    elif not is_float_dtype(input.dtype):
        value = int(value)  # eager truncates the fill value to the integer dtype
    else:
        value = float(value) if not isinstance(value, complex) else value
    if all(c == (0, 0, 0) for c in config):
        return torch.clone(input)
    return prims.pad(input, value, config)


def _edge_pad(mode: str, input: Any, pad: Sequence[int]) -> Any:
    n = len(pad) // 2
    allowed = {1: (2, 3), 2: (3, 4), 3: (4, 5)}
    if n not in allowed or input.ndim not in allowed[n]:
        raise NotImplementedError(
            f"Padding size {len(pad)} is not supported for {input.ndim}D input tensor.\nSupported "
            f"combinations for non-constant padding:\n  - 2D or 3D input: padding size = 2 (pads last "
            f"dimension)\n  - 3D or 4D input: padding size = 4 (pads last 2 dimensions)\n  - 4D or 5D input: "
            f"padding size = 6 (pads last 3 dimensions)")
    x = input
    for i in range(n):
        d = input.ndim - 1 - i
        left, right = pad[2 * i], pad[2 * i + 1]
        size = input.shape[d]
        if left < 0 or right < 0:
            # negative padding crops first (eager gives the same as padding the cropped input)
            keep = size + min(left, 0) + min(right, 0)
            fits = size > 0 and keep > 0 and (max(left, 0) < keep and max(right, 0) < keep)
            if not fits:
                raise NoDecomposition(f"pad(mode={mode!r}) with negative padding beyond the input")
            x = torch.narrow(x, d, max(-left, 0), keep)
            left, right, size = max(left, 0), max(right, 0), keep
        if mode == "reflect":
            check(left < size and right < size, lambda: f"Argument #4: Padding size should be less than "
                  f"the corresponding input dimension, but got: padding ({left}, {right}) at dimension "
                  f"{d} of input {list(input.shape)}", RuntimeError)
        elif mode == "circular":
            check(left <= size and right <= size, lambda: "Padding value causes wrapping around more than "
                  "once.", RuntimeError)
        else:
            check(size > 0 or (left == 0 and right == 0), lambda: f"Expected input to have non-zero size in "
                  f"padded dimension {d}, got {shape_text(input)}", RuntimeError)
        if left == 0 and right == 0:
            continue
        parts = []
        if left:
            if mode == "reflect":
                parts.append(torch.flip(torch.narrow(x, d, 1, left), [d]))
            elif mode == "circular":
                parts.append(torch.narrow(x, d, size - left, left))
            else:
                parts.append(torch.narrow(x, d, 0, 1).expand(
                    *[left if j == d else s for j, s in enumerate(x.shape)]))
        parts.append(x)
        if right:
            if mode == "reflect":
                parts.append(torch.flip(torch.narrow(x, d, size - 1 - right, right), [d]))
            elif mode == "circular":
                parts.append(torch.narrow(x, d, 0, right))
            else:
                parts.append(torch.narrow(x, d, size - 1, 1).expand(
                    *[right if j == d else s for j, s in enumerate(x.shape)]))
        x = torch.cat(parts, d)
    return x


@register(F.pad, torch._C._nn.pad)
def pad(input: Any, pad: Sequence[int], mode: str = "constant", value: Any = None) -> Any:
    pad = list(pad)
    check(len(pad) % 2 == 0, lambda: "Padding length must be divisible by 2", RuntimeError)
    check(len(pad) // 2 <= input.ndim, lambda: f"Padding length should be less than or equal to two times "
          f"the input dimension but got padding length {len(pad)} and input of dimension {input.ndim}",
          RuntimeError)
    if mode == "constant":
        return _constant_pad(input, pad, 0 if value is None else value)
    check(value is None or value == 0, lambda: f"Padding mode \"{mode}\" doesn't take in value argument",
          RuntimeError)
    check(mode in ("reflect", "replicate", "circular"), lambda: f"Unrecognised padding mode {mode}",
          NotImplementedError)
    return _edge_pad(mode, input, pad)


@register(torch.constant_pad_nd)
def constant_pad_nd(input: Any, pad: Sequence[int], value: Any = 0) -> Any:
    pad = list(pad)
    check(len(pad) % 2 == 0 and len(pad) // 2 <= input.ndim, lambda: f"Length of pad must be even but "
          f"instead it equals {len(pad)}", RuntimeError)
    return _constant_pad(input, pad, value)


# ---- pixel shuffle, one_hot -------------------------------------------------------------------------------

@register(F.pixel_shuffle, torch.pixel_shuffle)
def pixel_shuffle(input: Any, upscale_factor: int) -> Any:
    check(input.ndim >= 3, lambda: f"pixel_shuffle expects input to have at least 3 dimensions, but got "
          f"input with {input.ndim} dimension(s)", RuntimeError)
    check(upscale_factor > 0, lambda: f"pixel_shuffle expects a positive upscale_factor, but got "
          f"{upscale_factor}", RuntimeError)
    r = upscale_factor
    c, h, w = input.shape[-3:]
    check(c % (r * r) == 0, lambda: f"pixel_shuffle expects its input's 'channel' dimension to be divisible "
          f"by the square of upscale_factor, but input.size(-3)={c} is not divisible by {r * r}",
          RuntimeError)
    batch = list(input.shape[:-3])
    b = len(batch)
    x = torch.reshape(input, batch + [c // (r * r), r, r, h, w])
    x = torch.permute(x, list(range(b)) + [b, b + 3, b + 1, b + 4, b + 2])
    return eager_format(torch.reshape(x, batch + [c // (r * r), h * r, w * r]), input)


@register(F.pixel_unshuffle, torch.pixel_unshuffle)
def pixel_unshuffle(input: Any, downscale_factor: int) -> Any:
    check(input.ndim >= 3, lambda: f"pixel_unshuffle expects input to have at least 3 dimensions, but got "
          f"input with {input.ndim} dimension(s)", RuntimeError)
    check(downscale_factor > 0, lambda: f"pixel_unshuffle expects a positive downscale_factor, but got "
          f"{downscale_factor}", RuntimeError)
    r = downscale_factor
    c, h, w = input.shape[-3:]
    check(h % r == 0 and w % r == 0, lambda: f"pixel_unshuffle expects height and width to be divisible by "
          f"downscale_factor, got {shape_text(input)} and {r}", RuntimeError)
    batch = list(input.shape[:-3])
    b = len(batch)
    x = torch.reshape(input, batch + [c, h // r, r, w // r, r])
    x = torch.permute(x, list(range(b)) + [b, b + 2, b + 4, b + 1, b + 3])
    return eager_format(torch.reshape(x, batch + [c * r * r, h // r, w // r]), input)


@register(F.one_hot)
def one_hot(tensor: Any, num_classes: int = -1) -> Any:
    check(tensor.dtype == torch.int64,
          lambda: "one_hot is only applicable to index tensor of type LongTensor.", RuntimeError)
    if num_classes == -1:
        raise NoDecomposition("one_hot without num_classes (the size depends on the values)")
    check(num_classes >= 0, lambda: "num_classes should be positive", RuntimeError)
    # eager raises for class values outside [0, num_classes): the graph checks them when it runs
    tensor = prims.check_values(tensor, torch.all(tensor >= 0), "Class values must be non-negative.")
    tensor = prims.check_values(tensor, torch.all(tensor < num_classes),
                                "Class values must be smaller than num_classes.")
    classes = torch.arange(num_classes, dtype=torch.int64, device=tensor.device)
    return convert(torch.unsqueeze(tensor, -1) == classes, torch.int64)


# ---- distances --------------------------------------------------------------------------------------------

def vector_norm(x: Any, p: float, dims: Sequence[int], keepdim: bool) -> Any:
    """The p-norm of a real floating x over dims, as torch.linalg.vector_norm."""
    dims = list(dims)
    if p == 2:
        return root_of_sum(torch.sum(x * x, dims, keepdim=keepdim), torch.sqrt, x)
    if p == 1:
        return torch.sum(torch.abs(x), dims, keepdim=keepdim)
    if p == math.inf:
        return torch.amax(torch.abs(x), dims, keepdim=keepdim)
    if p == -math.inf:
        return torch.amin(torch.abs(x), dims, keepdim=keepdim)
    if p == 0:
        return torch.sum(convert(x != 0, x.dtype), dims, keepdim=keepdim)
    total = torch.sum(torch.pow(torch.abs(x), p), dims, keepdim=keepdim)
    return root_of_sum(total, lambda s: torch.pow(s, 1.0 / p), x) if p > 0 else torch.pow(total, 1.0 / p)


@register(F.cosine_similarity, torch.cosine_similarity)
def cosine_similarity(x1: Any, x2: Any, dim: int = 1, eps: float = 1e-8) -> Any:
    ndim = max(x1.ndim, x2.ndim)
    d = wrap_dim(dim, ndim)
    x1, x2 = torch.broadcast_tensors(x1, x2)
    common = result_type(x1, x2)
    check(is_float_dtype(common), lambda: f"expected common dtype to be floating point, yet common dtype is "
          f"{str(common).removeprefix('torch.').capitalize()}", RuntimeError)
    a, b = convert(x1, computation_dtype(common)), convert(x2, computation_dtype(common))
    # eager: each input divided by its norm clamped to eps, then the dot product
    na = torch.clamp_min(vector_norm(a, 2, [d], True), eps)
    nb = torch.clamp_min(vector_norm(b, 2, [d], True), eps)
    return convert(torch.sum((a / na) * (b / nb), d), common)


@register(F.pairwise_distance, torch.pairwise_distance)
def pairwise_distance(x1: Any, x2: Any, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False) -> Any:
    ndim = max(x1.ndim, x2.ndim, 1)
    diff = x1 - x2 + eps
    if diff.ndim == 0:
        raise NoDecomposition("pairwise_distance of 0-d inputs")
    return vector_norm(diff, p, [ndim - 1], keepdim)


# ---- interpolate ------------------------------------------------------------------------------------------

_LINEAR_MODES = {"linear": 3, "bilinear": 4, "bicubic": 4, "trilinear": 5}


def _interpolate_sizes(input: Any, size: Any, scale_factor: Any,
                       recompute_scale_factor: Any) -> tuple[list[int], list[float | None]]:
    """(output sizes, scale factors passed to the kernel), as F.interpolate computes them."""
    n = input.ndim - 2
    if size is not None and scale_factor is not None:
        raise ValueError("only one of size or scale_factor should be defined")
    if size is not None:
        check(not recompute_scale_factor, lambda: "recompute_scale_factor is not meaningful with an explicit "
              "size.", ValueError)
        sizes = list(size) if isinstance(size, (list, tuple)) else [size] * n
        check(len(sizes) == n, lambda: f"Input and output must have the same number of spatial dimensions, "
              f"but got input with spatial dimensions of {list(input.shape[2:])} and output size of {size}. "
              f"Please provide input tensor in (N, C, d1, d2, ...,dK) format and output size in "
              f"(o1, o2, ...,oK) format.", ValueError)
        return [int(s) for s in sizes], [None] * n
    if scale_factor is None:
        raise ValueError("either size or scale_factor should be defined")
    scales = list(scale_factor) if isinstance(scale_factor, (list, tuple)) else [scale_factor] * n
    check(len(scales) == n, lambda: f"Input and scale_factor must have the same number of spatial "
          f"dimensions, but got input with spatial dimensions of {list(input.shape[2:])} and scale_factor of "
          f"shape {scale_factor}. Please provide input tensor in (N, C, d1, d2, ...,dK) format and "
          f"scale_factor in (s1, s2, ...,sK) format.", ValueError)
    sizes = [math.floor(float(input.shape[2 + d]) * float(scales[d])) for d in range(n)]
    if recompute_scale_factor:
        return sizes, [None] * n
    return sizes, [float(s) for s in scales]


def _kernel_scale(np_dtype: Any, in_size: int, out_size: int, align_corners: bool,
                  scale: float | None) -> Any:
    """Eager's area_pixel_compute_scale in the kernel's arithmetic type."""
    if align_corners:
        return np_dtype(in_size - 1) / np_dtype(out_size - 1) if out_size > 1 else np_dtype(0)
    if scale is not None and scale > 0:
        return np_dtype(1.0 / scale)
    return np_dtype(in_size) / np_dtype(out_size)


def _nearest_indices(in_size: int, out_size: int, scale: float | None, exact: bool,
                     special_cases: bool) -> list[int]:
    # eager's 2-d nearest kernel (nearest_idx) special-cases these sizes, whatever the scale factor
    if special_cases and not exact and out_size == in_size:
        return list(range(out_size))
    if special_cases and not exact and out_size == 2 * in_size:
        return [i >> 1 for i in range(out_size)]
    s = _kernel_scale(np.float32, in_size, out_size, False, scale)
    dst = np.arange(out_size)
    if exact:
        src = np.floor(((dst + 0.5) * np.float64(s)).astype(np.float32))
    else:
        src = np.floor(dst.astype(np.float32) * s)
    return [int(i) for i in np.minimum(src.astype(np.int64), in_size - 1)]


def _linear_taps(np_dtype: Any, in_size: int, out_size: int, align_corners: bool,
                 scale: float | None) -> tuple[list[list[int]], list[list[float]]]:
    """Eager's compute_source_index_and_lambda: two source indices and weights per output index."""
    if in_size == out_size:
        idx = list(range(out_size))
        return [idx, idx], [[1.0] * out_size, [0.0] * out_size]
    s = _kernel_scale(np_dtype, in_size, out_size, align_corners, scale)
    i0s, i1s, w0s, w1s = [], [], [], []
    for dst in range(out_size):
        if align_corners:
            real = s * np_dtype(dst)
        else:
            real = s * (np_dtype(dst) + np_dtype(0.5)) - np_dtype(0.5)
            real = max(real, np_dtype(0))
        i0 = min(int(np.floor(np.float32(real))), in_size - 1)
        lam1 = min(max(real - np_dtype(i0), np_dtype(0)), np_dtype(1))
        i1 = i0 + (1 if i0 < in_size - 1 else 0)
        i0s.append(i0)
        i1s.append(i1)
        w0s.append(float(np_dtype(1) - lam1))
        w1s.append(float(lam1))
    return [i0s, i1s], [w0s, w1s]


_CUBIC_A = -0.75


def _cubic_taps(np_dtype: Any, in_size: int, out_size: int, align_corners: bool,
                scale: float | None) -> tuple[list[list[int]], list[list[float]]]:
    """Eager's bicubic: four source indices (clamped to the input) and cubic-convolution weights."""
    s = _kernel_scale(np_dtype, in_size, out_size, align_corners, scale)
    a = np_dtype(_CUBIC_A)
    one = np_dtype(1)
    taps: list[list[int]] = [[], [], [], []]
    weights: list[list[float]] = [[], [], [], []]
    for dst in range(out_size):
        real = s * np_dtype(dst) if align_corners else s * (np_dtype(dst) + np_dtype(0.5)) - np_dtype(0.5)
        i = int(np.floor(np.float32(real)))
        t = np_dtype(real - np_dtype(i))
        # cubic_convolution1 for |x| <= 1, cubic_convolution2 for 1 < |x| < 2
        x1 = t + one
        x2 = one - t
        x3 = x2 + one
        conv2 = lambda x: (((a * x - np_dtype(5) * a) * x + np_dtype(8) * a) * x  # noqa: E731
                           - np_dtype(4) * a)
        conv1 = lambda x: ((a + np_dtype(2)) * x - (a + np_dtype(3))) * x * x + one  # noqa: E731
        coeffs = [conv2(x1), conv1(t), conv1(x2), conv2(x3)]
        for k in range(4):
            taps[k].append(min(max(i - 1 + k, 0), in_size - 1))
            weights[k].append(float(np_dtype(coeffs[k])))
    return taps, weights


def _mix(x: Any, dim: int, taps: list[list[int]], weights: list[list[float]],
         weight_dtype: torch.dtype) -> Any:
    """sum_k x.index_select(dim, taps[k]) * weights[k] along dim (weights broadcast over later dims).

    Eager keeps the weights in the input's dtype (rounded for float16/bfloat16) and mixes in x's dtype."""
    shape = [len(taps[0])] + [1] * (x.ndim - 1 - dim)
    out = None
    for idx, w in zip(taps, weights):
        rows = torch.index_select(x, dim, torch.tensor(idx, dtype=torch.int64, device=x.device))
        w = torch.tensor(w, dtype=weight_dtype, device=x.device).to(x.dtype)
        term = rows * w.reshape(shape)
        out = term if out is None else out + term
    return out


@register(F.interpolate)
def interpolate(input: Any, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                align_corners: Any = None, recompute_scale_factor: Any = None,
                antialias: bool = False) -> Any:
    if mode in ("nearest", "area", "nearest-exact"):
        check(align_corners is None, lambda: "align_corners option can only be set with the interpolating "
              "modes: linear | bilinear | bicubic | trilinear", ValueError)
    elif align_corners is None:
        align_corners = False
    sizes, scales = _interpolate_sizes(input, size, scale_factor, recompute_scale_factor)
    if antialias:
        raise NoDecomposition("interpolate(antialias=True)")
    n = input.ndim - 2
    check(input.ndim in (3, 4, 5), lambda: f"Input Error: Only 3D, 4D and 5D input Tensors supported (got "
          f"{input.ndim}D) for the modes: nearest | linear | bilinear | bicubic | trilinear | area | "
          f"nearest-exact (got {mode})", NotImplementedError)
    if mode == "area":
        pool = {1: F.adaptive_avg_pool1d, 2: F.adaptive_avg_pool2d, 3: F.adaptive_avg_pool3d}[n]
        return pool(input, sizes)
    check(mode in ("nearest", "nearest-exact") or mode in _LINEAR_MODES, lambda: f"Input Error: Only 3D, 4D "
          f"and 5D input Tensors supported (got {input.ndim}D) for the modes: nearest | linear | bilinear | "
          f"bicubic | trilinear | area | nearest-exact (got {mode})", NotImplementedError)
    check(mode not in _LINEAR_MODES or _LINEAR_MODES[mode] == input.ndim, lambda: f"Got {input.ndim}D input, "
          f"but {mode} mode needs {_LINEAR_MODES[mode]}D input", NotImplementedError)
    check(all(s > 0 for s in sizes) and all(s > 0 for s in input.shape[2:]), lambda: f"Input and output "
          f"sizes should be greater than 0, but got input ({', '.join(map(str, input.shape[2:]))}) and "
          f"output ({', '.join(map(str, sizes))})", RuntimeError)
    if mode in ("nearest", "nearest-exact"):
        check(is_float_dtype(input.dtype) or input.dtype == torch.uint8, lambda: f"\"compute_indices_weights_"
              f"nearest\" not implemented for '{str(input.dtype).removeprefix('torch.').capitalize()}'",
              NotImplementedError)
        x = input
        for d in range(n):
            idx = _nearest_indices(input.shape[2 + d], sizes[d], scales[d], mode == "nearest-exact", n == 2)
            if idx != list(range(input.shape[2 + d])):
                x = torch.index_select(x, 2 + d, torch.tensor(idx, dtype=torch.int64, device=input.device))
        return _upsampled(x, input)
    check(is_float_dtype(input.dtype), lambda: f"\"upsample_{mode}\" not implemented for "
          f"'{str(input.dtype).removeprefix('torch.').capitalize()}'", RuntimeError)
    compute = computation_dtype(input.dtype)
    np_dtype = np.float64 if compute == torch.float64 else np.float32
    x = convert(input, compute)
    taps_of = _cubic_taps if mode == "bicubic" else _linear_taps
    for d in reversed(range(n)):
        taps, weights = taps_of(np_dtype, input.shape[2 + d], sizes[d], align_corners, scales[d])
        x = _mix(x, 2 + d, taps, weights, input.dtype)
    return _upsampled(convert(x, input.dtype), input)


def _upsampled(x: Any, input: Any) -> Any:
    """An upsampled 2-d or 3-d image laid out as eager's upsample kernels lay it out (channels-last when the
    input is)."""
    return eager_format(x, input) if input.ndim in (4, 5) and x is not input else x


@register(F.pdist, torch.pdist)
def pdist(input: Any, p: float = 2) -> Any:
    """Distances between rows i < j of a 2-D input, in row-major order of the pairs."""
    check(input.ndim == 2, lambda: f"pdist only supports 2D tensors, got: {input.ndim}D", RuntimeError)
    check(p >= 0, lambda: "pdist only supports non-negative p values", RuntimeError)
    check(is_float_dtype(input.dtype), lambda: "pdist only supports floating-point dtypes", RuntimeError)
    n = input.shape[0]
    if n < 2:
        raise NoDecomposition("pdist of fewer than two rows")
    rows, cols = np.triu_indices(n, 1)
    with torch._C.DisableTorchFunction():  # constants on the input's device, not recorded copies
        rows, cols = (torch.from_numpy(v.astype(np.int64)).to(input.device) for v in (rows, cols))
    first = torch.index_select(input, 0, rows)
    second = torch.index_select(input, 0, cols)
    x = convert(first - second, computation_dtype(input.dtype))
    return convert(vector_norm(x, float(p), [1], False), input.dtype)


@register(torch.ops.aten._safe_softmax.default)
def safe_softmax(input: Any, dim: int, dtype: torch.dtype | None = None) -> Any:
    """softmax, with rows that are entirely -inf giving zeros instead of NaN (aten._safe_softmax).

    The softmax runs on those rows with the -inf replaced by 0, so that no NaN exists anywhere: the
    backward of `where` routes a zero gradient into the discarded branch, and a NaN there would turn it
    into NaN (eager's gradient of such a row is 0)."""
    masked = torch.all(input == float("-inf"), dim, keepdim=True)
    out = F.softmax(torch.where(masked, torch.zeros_like(input), input), dim, dtype=dtype)
    return torch.where(masked, torch.zeros_like(out), out).contiguous()  # eager's is contiguous
