"""Decompositions of pooling: max_pool, avg_pool, lp_pool, adaptive_avg_pool (1d/2d/3d).

A window reduction is a sum (or maximum) of strided slices: the input is padded (zeros, or -inf for max),
then for every offset of the kernel one `prims.slice` picks the element at that offset of every window;
the slices combine elementwise. Output sizes and divisors follow eager (ceil_mode drops a last window that
would start in the right padding; count_include_pad counts padding but not the ceil overhang).
"""
from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .. import prims
from ..prims.registry import check, shape_text
from .registry import NoDecomposition, register
from .utils import computation_dtype, convert, eager_format, is_float_dtype, wants_gradient

# a pooling window of more elements than this is not a sum or maximum of one slice per element (the graph
# would hold one node per element: ALIGN's AvgPool2d(hidden_dim, ceil_mode=True), a 64x64 window at the small
# config, never finished compiling); a single window per pooled dim is a reduction over the input it covers
MAX_WINDOW_TAPS = 256


def _tuple(op: str, name: str, value: Any, n: int, default: Any = None) -> tuple[int, ...]:
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0 and default is not None):
        value = default
    if isinstance(value, int):
        return (value,) * n
    value = tuple(value)
    if len(value) == 1:
        return value * n
    check(len(value) == n, lambda: f"{op}: {name} must either be a single int, or a tuple of {n} ints",
          RuntimeError)
    return value


def pool_output_size(size: int, kernel: int, stride: int, pad: int, dilation: int, ceil_mode: bool) -> int:
    """Eager's pooling_output_shape."""
    span = size + 2 * pad - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)
    out = span // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


class Windows:
    """Geometry of a pooling over the last n dims: kernel, stride, padding, dilation, output sizes."""

    def __init__(self, op: str, input: Any, n: int, kernel_size: Any, stride: Any, padding: Any,
                 dilation: Any, ceil_mode: bool):
        self.op, self.n = op, n
        check(input.ndim in (n + 1, n + 2), lambda: f"{op}: Expected {n + 1}D or {n + 2}D input, got "
              f"{shape_text(input)}", RuntimeError)
        self.kernel = _tuple(op, "kernel_size", kernel_size, n)
        self.stride = _tuple(op, "stride", stride, n, default=self.kernel)
        self.padding = _tuple(op, "padding", padding, n)
        self.dilation = _tuple(op, "dilation", dilation, n)
        self.sizes = tuple(input.shape[input.ndim - n:])
        for d in range(n):
            k, s, p, dl = self.kernel[d], self.stride[d], self.padding[d], self.dilation[d]
            check(k > 0, lambda: f"{op}: kernel_size should be greater than zero, but got {self.kernel}",
                  RuntimeError)
            check(s > 0, lambda: f"{op}: stride should be greater than zero, but got {self.stride}",
                  RuntimeError)
            check(dl > 0, lambda: f"{op}: dilation should be greater than zero, but got {self.dilation}",
                  RuntimeError)
            check(0 <= p <= k // 2, lambda: f"{op}: pad should be at most half of effective kernel size, but "
                  f"got pad={p}, kernel_size={k} and dilation={dl}", RuntimeError)
        check(all(s > 0 for s in input.shape[input.ndim - n - 1:]), lambda: f"{op}: Expected input's "
              f"non-batch dimensions to have positive length, but input has a shape of {list(input.shape)}",
              RuntimeError)
        self.out = tuple(pool_output_size(self.sizes[d], self.kernel[d], self.stride[d], self.padding[d],
                                          self.dilation[d], ceil_mode) for d in range(n))
        check(all(o > 0 for o in self.out), lambda: f"{op}: Given input size: {list(input.shape)}. "
              f"Calculated output size: {list(self.out)}. Output size is too small", RuntimeError)

    @property
    def taps(self) -> int:
        """The elements of one window."""
        count = 1
        for k in self.kernel:
            count *= k
        return count

    def padded(self, x: Any, value: Any) -> Any:
        """x padded on the last n dims so that every window (including ceil_mode's last) lies inside."""
        config = [(0, 0, 0)] * (x.ndim - self.n)
        for d in range(self.n):
            needed = (self.out[d] - 1) * self.stride[d] + self.dilation[d] * (self.kernel[d] - 1) + 1
            high = needed - self.sizes[d] - self.padding[d]
            config.append((self.padding[d], high, 0))
        if all(c == (0, 0, 0) for c in config):
            return x
        return prims.pad(x, value, config)

    def slices(self, x: Any) -> list[Any]:
        """For every kernel offset, the strided slice of padded x holding that element of each window."""
        lead = x.ndim - self.n
        result = []
        for offset in itertools.product(*(range(k) for k in self.kernel)):
            start = [0] * lead + [offset[d] * self.dilation[d] for d in range(self.n)]
            limit = list(x.shape[:lead]) + [start[lead + d] + (self.out[d] - 1) * self.stride[d] + 1
                                            for d in range(self.n)]
            result.append(prims.slice(x, start, limit, [1] * lead + list(self.stride)))
        return result


def _lowest(dtype: torch.dtype) -> Any:
    if dtype.is_floating_point:
        return -float("inf")
    if dtype == torch.bool:
        return False
    return torch.iinfo(dtype).min


def _window_positions(w: Windows, d: int, k: int) -> np.ndarray:
    """Input positions along spatial dim d of kernel offset k for every output index (may be outside)."""
    return np.arange(w.out[d]) * w.stride[d] - w.padding[d] + k * w.dilation[d]


def _flat_index(w: Windows, positions: list[np.ndarray], device: torch.device) -> torch.Tensor:
    """Flat index into the input's spatial dims, shaped like the output's spatial dims, on the input's
    device (a CUDA input's kernels cannot read a CPU constant)."""
    flat = np.zeros(w.out, dtype=np.int64)
    for d, pos in enumerate(positions):
        shape = [1] * w.n
        shape[d] = w.out[d]
        flat = flat * w.sizes[d] + pos.reshape(shape)
    with torch._C.DisableTorchFunction():  # a constant, not a recorded copy
        return torch.from_numpy(np.ascontiguousarray(flat)).to(device)


def _max_pool_with_indices(w: Windows, input: Any) -> tuple[Any, Any]:
    """Eager's scan: start at -inf with the window's first valid element, take an element when it is greater
    or NaN (ties keep the first, NaN the last), in kernel order."""
    if w.taps > MAX_WINDOW_TAPS:
        raise NoDecomposition(f"{w.op} with indices (or a gradient) over a window of {w.taps} elements")
    x = w.padded(input, _lowest(input.dtype))
    first = []
    for d in range(w.n):
        start = _window_positions(w, d, 0)
        steps = np.maximum(-(start // w.dilation[d]), 0)  # offsets to skip over the left padding
        first.append(start + steps * w.dilation[d])
    out_shape = list(input.shape[:input.ndim - w.n]) + list(w.out)
    best = input.new_full(out_shape, _lowest(input.dtype))
    best_index = _flat_index(w, first, input.device)  # (out spatial dims); the first update broadcasts it
    offsets = itertools.product(*(range(k) for k in w.kernel))
    for offset, s in zip(offsets, w.slices(x)):
        index = _flat_index(w, [_window_positions(w, d, offset[d]) for d in range(w.n)], input.device)
        take = torch.gt(s, best)
        if input.dtype.is_floating_point:
            take = torch.logical_or(take, torch.isnan(s))
        best = torch.where(take, s, best)
        best_index = torch.where(take, index, best_index)
    return best, best_index


def _pooled(result: Any, input: Any, n: int) -> Any:
    """A pool's result laid out as eager's kernels lay it out: in its input's suggested memory format; a
    1-d pool runs as a 2-d one over input.unsqueeze(-2) (so a transposed input gives a transposed result)."""
    if n == 1 and input.ndim == 3:
        return eager_format(result.unsqueeze(-2), input.unsqueeze(-2)).squeeze(-2)
    return eager_format(result, input)


def _max_pool(op: str, n: int, input: Any, kernel_size: Any, stride: Any, padding: Any, dilation: Any,
              ceil_mode: bool, return_indices: bool) -> Any:
    w = Windows(op, input, n, kernel_size, stride, padding, dilation, ceil_mode)
    check(input.dtype != torch.bool, lambda: f"{op}: not implemented for 'Bool'", RuntimeError)
    if return_indices:
        best, index = _max_pool_with_indices(w, input)
        return _pooled(best, input, n), _pooled(index, input, n)
    if wants_gradient(input):  # eager's gradient goes to each window's first maximum (maximum's splits ties)
        return _pooled(_max_pool_with_indices(w, input)[0], input, n)
    result = _one_window(w, input, torch.amax)   # (amax propagates NaN too)
    if result is None:
        for s in w.slices(w.padded(input, _lowest(input.dtype))):
            result = s if result is None else torch.maximum(result, s)  # propagates NaN, as eager
    return eager_format(result, input)


def _one_window(w: Windows, x: Any, reduce: Any) -> Any:
    """A window of more than MAX_WINDOW_TAPS elements: where each pooled dim has one window, `reduce` over
    the part of x it covers (its padding holds no element of x); None for a small window."""
    if w.taps <= MAX_WINDOW_TAPS:
        return None
    if any(o != 1 for o in w.out) or any(dl != 1 for dl in w.dilation):
        raise NoDecomposition(f"{w.op} with a window of {w.taps} elements over more than one position")
    lead = x.ndim - w.n
    for d in range(w.n):
        start, end = max(-w.padding[d], 0), min(w.kernel[d] - w.padding[d], w.sizes[d])
        x = x.narrow(lead + d, start, end - start)
    return reduce(x, dim=tuple(range(lead, x.ndim)), keepdim=True)


@register(F.max_pool1d_with_indices)
def max_pool1d_with_indices(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0,
                            dilation: Any = 1, ceil_mode: bool = False, return_indices: bool = False) -> Any:
    return _max_pool("max_pool1d", 1, input, kernel_size, stride, padding, dilation, ceil_mode, True)


@register(F.max_pool2d_with_indices)
def max_pool2d_with_indices(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0,
                            dilation: Any = 1, ceil_mode: bool = False, return_indices: bool = False) -> Any:
    return _max_pool("max_pool2d", 2, input, kernel_size, stride, padding, dilation, ceil_mode, True)


@register(F.max_pool3d_with_indices)
def max_pool3d_with_indices(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0,
                            dilation: Any = 1, ceil_mode: bool = False, return_indices: bool = False) -> Any:
    return _max_pool("max_pool3d", 3, input, kernel_size, stride, padding, dilation, ceil_mode, True)


@register(F.max_pool1d, torch.max_pool1d)
def max_pool1d(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, return_indices: bool = False) -> Any:
    return _max_pool("max_pool1d", 1, input, kernel_size, stride, padding, dilation, ceil_mode,
                     return_indices)


@register(F.max_pool2d, torch.max_pool2d)
def max_pool2d(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, return_indices: bool = False) -> Any:
    return _max_pool("max_pool2d", 2, input, kernel_size, stride, padding, dilation, ceil_mode,
                     return_indices)


@register(F.max_pool3d, torch.max_pool3d)
def max_pool3d(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, return_indices: bool = False) -> Any:
    return _max_pool("max_pool3d", 3, input, kernel_size, stride, padding, dilation, ceil_mode,
                     return_indices)


def _avg_divisors(w: Windows, count_include_pad: bool) -> list[list[int]]:
    """Per dim, the divisor factor of each output position (eager's avg_pool: window clipped to the padded
    input when counting padding, else to the input)."""
    factors = []
    for d in range(w.n):
        k, s, p, size = w.kernel[d], w.stride[d], w.padding[d], w.sizes[d]
        row = []
        for o in range(w.out[d]):
            start = o * s - p
            end = min(start + k, size + p)
            count = end - start
            start, end = max(start, 0), min(end, size)
            row.append(count if count_include_pad else end - start)
        factors.append(row)
    return factors


def _avg_pool(op: str, n: int, input: Any, kernel_size: Any, stride: Any, padding: Any, ceil_mode: bool,
              count_include_pad: bool, divisor_override: Any) -> Any:
    w = Windows(op, input, n, kernel_size, stride, padding, 1, ceil_mode)
    if not is_float_dtype(input.dtype):
        raise NoDecomposition(f"{op} of an integer tensor")  # eager divides in integers (or refuses)
    check(divisor_override is None or divisor_override != 0, lambda: "divisor must be not zero", RuntimeError)
    x = convert(input, computation_dtype(input.dtype))
    total = _one_window(w, x, torch.sum)
    if total is None:
        for s in w.slices(w.padded(x, 0.0)):
            total = s if total is None else total + s
    if divisor_override is not None:
        return _pooled(convert(total / divisor_override, input.dtype), input, n)
    factors = _avg_divisors(w, count_include_pad)
    if all(len(set(row)) == 1 for row in factors):
        divisor = 1
        for row in factors:
            divisor *= row[0]
        return _pooled(convert(total / divisor, input.dtype), input, n)
    # Windows at the border count fewer elements: one divisor per output position.
    table = torch.ones(w.out, dtype=torch.float64, device=total.device)
    for d, row in enumerate(factors):
        shape = [1] * n
        shape[d] = len(row)
        table = table * torch.tensor(row, dtype=torch.float64, device=total.device).reshape(shape)
    return _pooled(convert(total / table.to(total.dtype), input.dtype), input, n)


@register(F.avg_pool1d, torch.avg_pool1d)
def avg_pool1d(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True) -> Any:
    return _avg_pool("avg_pool1d", 1, input, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


@register(F.avg_pool2d)
def avg_pool2d(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: Any = None) -> Any:
    return _avg_pool("avg_pool2d", 2, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)


@register(F.avg_pool3d)
def avg_pool3d(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: Any = None) -> Any:
    return _avg_pool("avg_pool3d", 3, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)


def _lp_pool(op: str, n: int, input: Any, norm_type: float, kernel_size: Any, stride: Any,
             ceil_mode: bool) -> Any:
    # eager: out = avg_pool(x^p); (sign(out) * relu(|out|) * prod(kernel)) ^ (1/p)
    kernel = _tuple(op, "kernel_size", kernel_size, n)
    avg = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[n]
    if stride is not None:
        out = avg(torch.pow(input, norm_type), kernel, stride, 0, ceil_mode)
    else:
        out = avg(torch.pow(input, norm_type), kernel, padding=0, ceil_mode=ceil_mode)
    area = 1
    for k in kernel:
        area *= k
    return torch.pow(torch.sign(out) * F.relu(torch.abs(out)) * area, 1.0 / norm_type)


@register(F.lp_pool1d)
def lp_pool1d(input: Any, norm_type: float, kernel_size: Any, stride: Any = None,
              ceil_mode: bool = False) -> Any:
    return _lp_pool("lp_pool1d", 1, input, norm_type, kernel_size, stride, ceil_mode)


@register(F.lp_pool2d)
def lp_pool2d(input: Any, norm_type: float, kernel_size: Any, stride: Any = None,
              ceil_mode: bool = False) -> Any:
    return _lp_pool("lp_pool2d", 2, input, norm_type, kernel_size, stride, ceil_mode)


@register(F.lp_pool3d)
def lp_pool3d(input: Any, norm_type: float, kernel_size: Any, stride: Any = None,
              ceil_mode: bool = False) -> Any:
    return _lp_pool("lp_pool3d", 3, input, norm_type, kernel_size, stride, ceil_mode)


def _adaptive_pool(op: str, n: int, input: Any, output_size: Any, is_max: bool) -> Any:
    check(input.ndim in (n + 1, n + 2), lambda: f"{op}: Expected {n + 1}D or {n + 2}D tensor, but got "
          f"{shape_text(input)}", RuntimeError)
    sizes = list(input.shape[input.ndim - n:])
    out = list(_tuple(op, "output_size", output_size, n))
    out = [sizes[d] if out[d] is None else out[d] for d in range(n)]
    check(all(s > 0 for s in input.shape[1:]), lambda: f"{op}: Expected input to have non-zero size for "
          f"non-batch dimensions, but input has sizes {list(input.shape)}", RuntimeError)
    check(all(o >= 0 for o in out), lambda: f"{op}: elements of output_size must be greater than or equal to "
          f"0 but received {out}", RuntimeError)
    if any(o == 0 for o in out):
        raise NoDecomposition(f"{op} to an empty output")
    if not is_max:
        check(is_float_dtype(input.dtype), lambda: f"\"{op}\" not implemented for "
              f"'{str(input.dtype).removeprefix('torch.').capitalize()}'", RuntimeError)
    x = convert(input, computation_dtype(input.dtype)) if not is_max else input
    lead = input.ndim - n
    if all(s % o == 0 for s, o in zip(sizes, out)):
        # Regular windows: kernel = stride = size / out. A global pool is one reduction.
        if all(o == 1 for o in out):
            dims = list(range(lead, input.ndim))
            result = torch.amax(x, dims, keepdim=True) if is_max else torch.mean(x, dims, keepdim=True)
            return _pooled(convert(result, input.dtype), input, n)
        kernel = [s // o for s, o in zip(sizes, out)]
        if is_max:  # (eager's adaptive 1-d pools run as 2-d ones, as its max_pool1d does not)
            return _pooled(_max_pool(op, n, input, kernel, kernel, 0, 1, False, False), input, n)
        w = Windows(op, x, n, kernel, kernel, 0, 1, False)
        total = None
        for s in w.slices(x):
            total = s if total is None else total + s
        area = 1
        for k in kernel:
            area *= k
        return _pooled(convert(total / area, input.dtype), input, n)
    # Irregular windows [floor(i * s / o), ceil((i + 1) * s / o)): reduce one dim at a time (a window is a
    # box, so the mean of per-dim means is the box mean, and the max of maxes its max).
    # (a gradient goes to each window's first maximum in row-major order, eager's: max(dim) picks the first
    # along a dim, last dim first)
    routed = is_max and wants_gradient(input)
    for d in (reversed(range(n)) if routed else range(n)):
        dim = lead + d
        parts = []
        for i in range(out[d]):
            start = (i * sizes[d]) // out[d]
            end = -((-(i + 1) * sizes[d]) // out[d])
            window = torch.narrow(x, dim, start, end - start)
            parts.append(torch.max(window, dim, keepdim=True).values if routed else
                         torch.amax(window, dim, keepdim=True) if is_max else torch.mean(window, dim, keepdim=True))
        x = torch.cat(parts, dim)
    return _pooled(convert(x, input.dtype), input, n)


def _adaptive_avg_pool(op: str, n: int, input: Any, output_size: Any) -> Any:
    return _adaptive_pool(op, n, input, output_size, False)


@register(F.adaptive_avg_pool1d, torch.adaptive_avg_pool1d)
def adaptive_avg_pool1d(input: Any, output_size: Any) -> Any:
    return _adaptive_avg_pool("adaptive_avg_pool1d", 1, input, output_size)


@register(F.adaptive_avg_pool2d)
def adaptive_avg_pool2d(input: Any, output_size: Any) -> Any:
    return _adaptive_avg_pool("adaptive_avg_pool2d", 2, input, output_size)


@register(F.adaptive_avg_pool3d)
def adaptive_avg_pool3d(input: Any, output_size: Any) -> Any:
    return _adaptive_avg_pool("adaptive_avg_pool3d", 3, input, output_size)


def _adaptive_max_pool(op: str, n: int, input: Any, output_size: Any, return_indices: bool) -> Any:
    if not return_indices:
        return _adaptive_pool(op, n, input, output_size, True)
    sizes = list(input.shape[input.ndim - n:]) if input.ndim >= n else []
    out = list(_tuple(op, "output_size", output_size, n))
    out = [sizes[d] if out[d] is None else out[d] for d in range(n)] if sizes else out
    regular = bool(sizes) and all(o > 0 and s % o == 0 for s, o in zip(sizes, out))
    if not regular or input.ndim not in (n + 1, n + 2):
        raise NoDecomposition(f"{op}(return_indices=True) with irregular windows")
    kernel = [s // o for s, o in zip(sizes, out)]
    return _max_pool(op, n, input, kernel, kernel, 0, 1, False, True)


@register(F.adaptive_max_pool1d_with_indices)
def adaptive_max_pool1d_with_indices(input: Any, output_size: Any, return_indices: bool = False) -> Any:
    return _adaptive_max_pool("adaptive_max_pool1d", 1, input, output_size, True)


@register(F.adaptive_max_pool2d_with_indices)
def adaptive_max_pool2d_with_indices(input: Any, output_size: Any, return_indices: bool = False) -> Any:
    return _adaptive_max_pool("adaptive_max_pool2d", 2, input, output_size, True)


@register(F.adaptive_max_pool3d_with_indices)
def adaptive_max_pool3d_with_indices(input: Any, output_size: Any, return_indices: bool = False) -> Any:
    return _adaptive_max_pool("adaptive_max_pool3d", 3, input, output_size, True)


@register(F.adaptive_max_pool1d)
def adaptive_max_pool1d(input: Any, output_size: Any, return_indices: bool = False) -> Any:
    return _adaptive_max_pool("adaptive_max_pool1d", 1, input, output_size, return_indices)


@register(F.adaptive_max_pool2d)
def adaptive_max_pool2d(input: Any, output_size: Any, return_indices: bool = False) -> Any:
    return _adaptive_max_pool("adaptive_max_pool2d", 2, input, output_size, return_indices)


@register(F.adaptive_max_pool3d)
def adaptive_max_pool3d(input: Any, output_size: Any, return_indices: bool = False) -> Any:
    return _adaptive_max_pool("adaptive_max_pool3d", 3, input, output_size, return_indices)


@register(F.unfold)
def unfold(input: Any, kernel_size: Any, dilation: Any = 1, padding: Any = 0, stride: Any = 1) -> Any:
    """im2col: (N, C, H, W) -> (N, C * kh * kw, L), a strided slice of the padded input per kernel offset."""
    check(input.ndim in (3, 4), lambda: f"Input Error: Only 3D or 4D input Tensors are supported (got "
          f"{input.ndim}D)", NotImplementedError)
    kernel = _tuple("unfold", "kernel_size", kernel_size, 2)
    dil = _tuple("unfold", "dilation", dilation, 2)
    pad = _tuple("unfold", "padding", padding, 2)
    step = _tuple("unfold", "stride", stride, 2)
    check(all(k > 0 for k in kernel) and all(d > 0 for d in dil) and all(s > 0 for s in step)
          and all(p >= 0 for p in pad), lambda: f"unfold: kernel_size {kernel}, dilation {dil} and stride "
          f"{step} must be positive and padding {pad} non-negative", RuntimeError)
    sizes = list(input.shape[-2:])
    out = [(sizes[d] + 2 * pad[d] - dil[d] * (kernel[d] - 1) - 1) // step[d] + 1 for d in range(2)]
    check(all(o >= 1 for o in out), lambda: f"Given input with spatial size {tuple(sizes)}, kernel_size="
          f"{kernel}, dilation={dil}, padding={pad}, calculated shape of the array of sliding blocks as "
          f"{tuple(out)}, but its components must be at least one.", RuntimeError)
    check(input.numel() > 0 or input.shape[0] == 0, lambda: f"unfold: expected non-empty input, got "
          f"{shape_text(input)}", RuntimeError)
    x = input
    lead = input.ndim - 2
    if any(pad):
        x = prims.pad(x, 0 if not is_float_dtype(x.dtype) else 0.0,
                      [(0, 0, 0)] * lead + [(pad[0], pad[0], 0), (pad[1], pad[1], 0)])
    columns = []
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            start = [0] * lead + [i * dil[0], j * dil[1]]
            limit = list(x.shape[:lead]) + [start[lead] + (out[0] - 1) * step[0] + 1,
                                            start[lead + 1] + (out[1] - 1) * step[1] + 1]
            columns.append(prims.slice(x, start, limit, [1] * lead + list(step)))
    blocks = torch.stack(columns, lead)  # (N, C, kh * kw, oh, ow)
    shape = list(input.shape[:lead - 1]) + [input.shape[lead - 1] * kernel[0] * kernel[1], out[0] * out[1]]
    return torch.reshape(blocks, shape)


@register(F.channel_shuffle, torch.channel_shuffle, torch.native_channel_shuffle)
def channel_shuffle(input: Any, groups: int) -> Any:
    check(input.ndim > 2, lambda: f"channel_shuffle expects input to have at least 3 dimensions, but got "
          f"input with {input.ndim} dimension(s)", RuntimeError)
    check(groups > 0, lambda: f"Number of groups to divide channels in must be positive. Value of groups:"
          f"{groups}", RuntimeError)
    c = input.shape[1]
    check(c % groups == 0, lambda: f"Number of channels must be divisible by groups. Got {c} channels and "
          f"{groups} groups.", RuntimeError)
    n, rest = input.shape[0], list(input.shape[2:])
    x = torch.reshape(input, [n, groups, c // groups] + rest)
    return eager_format(torch.reshape(torch.transpose(x, 1, 2), [n, c] + rest), input)
