"""Decompositions of torch.nn.functional: softmax, normalizations, dropout, linear layers.

Each decomposition is written with ordinary torch calls on proxies (each routed to its own decomposition)
and follows eager's CPU kernels where numerics depend on the formula: low-precision floats compute in
float32 and round back once, softmax subtracts the row maximum, batch_norm folds its statistics into one
scale and shift per channel. Padding, interpolation and other layout ops live in `nn_layout.py`; losses in
`nn_loss.py`, pooling in `nn_pool.py`, activations in `nn_activations.py`.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from .. import prims
from ..graph.symbolic import SymInt
from ..prims.registry import check, shape_text, wrap_dim
from . import linalg, nn_attention  # noqa: F401  (nn_attention registers multi_head_attention_forward)
from .nn_layout import vector_norm  # also registers the layout ops (pad, interpolate, ...)
from .nn_activations import _m, _t, check_float, upcast  # (importing it registers the activations)
from .registry import NoDecomposition, mark_inplace_flag, register, update_argument
from .utils import computation_dtype, convert, eager_format, is_float_dtype


# ---- softmax ----------------------------------------------------------------------------------------------

def _legacy_softmax_dim(ndim: int) -> int:
    return 0 if ndim in (0, 1, 3) else 1


def _softmax_input(op: str, input: Any, dim: Any, dtype: torch.dtype | None) -> tuple[Any, int, Any]:
    """(input in its computation dtype, the wrapped dim, the output dtype)."""
    check(isinstance(dim, int) and not isinstance(dim, bool),
          lambda: f"{op}(): argument 'dim' must be int, not {type(dim).__name__}", TypeError)
    d = wrap_dim(dim, input.ndim)
    if dtype is not None:
        input = convert(input, dtype)
    check(is_float_dtype(input.dtype), lambda: f"\"{op}_lastdim_kernel_impl\" not implemented for "
          f"'{str(input.dtype).removeprefix('torch.').capitalize()}'", RuntimeError)
    return upcast(input), d, input.dtype


def _shifted(x: Any, d: int) -> Any:
    """x minus its maximum along d (an empty tensor stays as it is: amax refuses empty dims). The maximum
    only steadies exp: softmax does not depend on it, so no gradient flows through it (as eager's backward,
    which reads only the output), and the backward neither compares x with it nor keeps x for that."""
    if x.ndim == 0 or x.numel() == 0:
        return x - x if x.ndim == 0 else x
    return x - torch.amax(prims.stop_gradient(x), d, keepdim=True)


def _softmax(op: str, input: Any, dim: Any, dtype: torch.dtype | None, negate: bool = False) -> Any:
    x, d, out_dtype = _softmax_input(op, input, dim, dtype)
    if negate:
        x = -x
    e = torch.exp(_shifted(x, d))
    return convert(e / torch.sum(e, d, keepdim=True), out_dtype).contiguous()  # eager's is contiguous


def _log_softmax(op: str, input: Any, dim: Any, dtype: torch.dtype | None) -> Any:
    x, d, out_dtype = _softmax_input(op, input, dim, dtype)
    s = _shifted(x, d)
    return convert(s - torch.log(torch.sum(torch.exp(s), d, keepdim=True)), out_dtype).contiguous()


@register(F.softmax)
def softmax(input: Any, dim: int | None = None, _stacklevel: int = 3,
            dtype: torch.dtype | None = None) -> Any:
    return _softmax("softmax", input, _legacy_softmax_dim(input.ndim) if dim is None else dim, dtype)


@register(F.softmin)
def softmin(input: Any, dim: int | None = None, _stacklevel: int = 3,
            dtype: torch.dtype | None = None) -> Any:
    return _softmax("softmax", input, _legacy_softmax_dim(input.ndim) if dim is None else dim, dtype,
                    negate=True)


@register(F.log_softmax)
def log_softmax(input: Any, dim: int | None = None, _stacklevel: int = 3,
                dtype: torch.dtype | None = None) -> Any:
    return _log_softmax("log_softmax", input, _legacy_softmax_dim(input.ndim) if dim is None else dim, dtype)


@register(torch.softmax, _m("softmax"), torch.special.softmax)
def softmax_twin(input: Any, dim: int, dtype: torch.dtype | None = None, **kwargs: Any) -> Any:
    return _softmax("softmax", input, dim, dtype)


@register(torch.log_softmax, _m("log_softmax"), torch.special.log_softmax)
def log_softmax_twin(input: Any, dim: int, dtype: torch.dtype | None = None, **kwargs: Any) -> Any:
    return _log_softmax("log_softmax", input, dim, dtype)


# ---- normalizations ---------------------------------------------------------------------------------------

def _moments(x: Any, dims: Sequence[int]) -> tuple[Any, Any]:
    """Mean and biased variance over dims (keepdim), two-pass."""
    mean = torch.mean(x, list(dims), keepdim=True)
    centered = x - mean
    return mean, torch.mean(centered * centered, list(dims), keepdim=True)


def _param(p: Any, dtype: torch.dtype) -> Any:
    return None if p is None else convert(p, dtype)


@register(F.layer_norm)
def layer_norm(input: Any, normalized_shape: Sequence[int], weight: Any = None, bias: Any = None,
               eps: float = 1e-5) -> Any:
    shape = [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
    k = len(shape)
    check(k >= 1, lambda: "Expected normalized_shape to be at least 1-dimensional, i.e., containing at "
          "least one element, but got normalized_shape = []", RuntimeError)
    for name, p in (("weight", weight), ("bias", bias)):
        check(p is None or list(p.shape) == shape, lambda: f"Expected {name} to be of same shape as "
              f"normalized_shape, but got {name} of shape {shape_text(p)} and normalized_shape = {shape}",
              RuntimeError)
    check(input.ndim >= k and list(input.shape[input.ndim - k:]) == shape,
          lambda: f"Given normalized_shape={shape}, expected input with shape [*, "
                  f"{', '.join(str(s) for s in shape)}], but got input of size{list(input.shape)}",
          RuntimeError)
    check_float("layer_norm", input)
    x = upcast(input)
    mean, var = _moments(x, range(input.ndim - k, input.ndim))
    out = (x - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        out = out * _param(weight, x.dtype)
    if bias is not None:
        out = out + _param(bias, x.dtype)
    return convert(out, input.dtype).contiguous()  # eager's kernel normalizes a contiguous copy


@register(torch.layer_norm)
def layer_norm_twin(input: Any, normalized_shape: Sequence[int], weight: Any = None, bias: Any = None,
                    eps: float = 1e-5, cudnn_enable: bool = True) -> Any:
    return layer_norm(input, normalized_shape, weight, bias, eps)


@register(F.rms_norm, _t("rms_norm"))
def rms_norm(input: Any, normalized_shape: Sequence[int], weight: Any = None,
             eps: float | None = None) -> Any:
    shape = [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
    k = len(shape)
    check(weight is None or list(weight.shape) == shape, lambda: f"Expected weight to be of same shape as "
          f"normalized_shape, but got weight of shape {shape_text(weight)} and normalized_shape = {shape}",
          RuntimeError)
    check(input.ndim >= k and list(input.shape[input.ndim - k:]) == shape,
          lambda: f"Given normalized_shape={shape}, expected input with shape [*, "
                  f"{', '.join(str(s) for s in shape)}], but got input of size{list(input.shape)}",
          RuntimeError)
    check_float("rms_norm", input)
    x = upcast(input)
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    dims = list(range(input.ndim - k, input.ndim))
    out = convert(x * torch.rsqrt(torch.mean(x * x, dims, keepdim=True) + eps), input.dtype)
    if weight is not None:
        out = convert(out * weight, input.dtype)  # eager: result.mul_(weight), in the input's dtype
    return out.contiguous()  # eager's fused kernel returns a contiguous result


def _channel_shape(input: Any) -> list[int]:
    return [1, input.shape[1]] + [1] * (input.ndim - 2)


def _normalize_channels(input: Any, mean: Any, var: Any, weight: Any, bias: Any, eps: float) -> Any:
    """Eager's batch-norm transform: per channel alpha = w / sqrt(var + eps), beta = b - mean * alpha,
    out = x * alpha + beta; mean and var have shape (C,)."""
    x = upcast(input)
    dtype = x.dtype
    invstd = 1 / torch.sqrt(convert(var, dtype) + eps)
    alpha = invstd if weight is None else invstd * convert(weight, dtype)
    mean = convert(mean, dtype)
    beta = -mean * alpha if bias is None else convert(bias, dtype) - mean * alpha
    shape = _channel_shape(input)
    out = x * torch.reshape(alpha, shape) + torch.reshape(beta, shape)
    return eager_format(convert(out, input.dtype), input)


def _check_channels(op: str, input: Any, tensors: dict[str, Any]) -> None:
    if input.ndim < 2:
        raise NoDecomposition(f"{op} of a {input.ndim}-D input")  # eager's own checks and quirks
    c = input.shape[1]
    for name, t in tensors.items():
        check(t is None or t.numel() == c, lambda: f"{op}: {name} should contain {c} elements not "
              f"{t.numel()}", RuntimeError)


def _running_update(running: Any, stat: Any, momentum: float) -> Any:
    """Eager's update of a running statistic: momentum * stat + (1 - momentum) * running, in the
    statistics' computation dtype (float32 for float16/bfloat16 and float32), rounded once."""
    dtype = computation_dtype(running.dtype)
    new = momentum * convert(stat, dtype) + (1 - momentum) * convert(running, dtype)
    return convert(new, running.dtype)


def _batch_statistics(input: Any, running_mean: Any, running_var: Any, momentum: Any) -> tuple[Any, Any]:
    """Training mode's per-channel batch mean and biased variance (shape (C,), two-pass, in the
    computation dtype), and eager's in-place updates of the running statistics given: the mean, and the
    unbiased variance (sum of squares / (n - 1))."""
    for stat in (running_mean, running_var):
        if stat is not None and stat.dtype != input.dtype and \
                not (stat.dtype == torch.float32 and input.dtype in (torch.float16, torch.bfloat16)):
            raise NoDecomposition(f"batch_norm of a {input.dtype} input with {stat.dtype} running statistics")
    tracks = running_mean is not None or running_var is not None
    if tracks and (isinstance(momentum, bool) or not isinstance(momentum, (int, float))):
        raise NoDecomposition(f"batch_norm(momentum={momentum!r})")  # eager's own checks
    x = upcast(input)
    dims = [0] + list(range(2, input.ndim))
    c = input.shape[1]
    count = 1
    for d in dims:
        count = count * input.shape[d]
    mean = torch.mean(x, dims, keepdim=True)
    centered = x - mean
    squares = torch.sum(centered * centered, dims)  # (C,)
    var = prims.div(squares, count if isinstance(count, SymInt) else float(count))
    mean = torch.reshape(mean, [c])
    if running_mean is not None:
        update_argument(running_mean, _running_update(running_mean, mean, momentum))
    if running_var is not None:
        unbiased = prims.div(squares, count - 1 if isinstance(count, SymInt) else float(count - 1))
        update_argument(running_var, _running_update(running_var, unbiased, momentum))
    return mean, var


def _batch_norm(input: Any, running_mean: Any, running_var: Any, weight: Any, bias: Any, training: bool,
                eps: float, momentum: Any = 0.1) -> Any:
    _check_channels("batch_norm", input, {"running_mean": running_mean, "running_var": running_var,
                                          "weight": weight, "bias": bias})
    check_float("batch_norm", input)
    if training:
        check((running_mean is None) == (running_var is None), lambda: "running_mean and running_var must "
              "either both be None or neither be None", ValueError)
        mean, var = _batch_statistics(input, running_mean, running_var, momentum)
        return _normalize_channels(input, mean, var, weight, bias, eps)
    check(running_mean is not None and running_var is not None,
          lambda: "batch_norm: running_mean and running_var must be defined in evaluation mode", RuntimeError)
    return _normalize_channels(input, running_mean, running_var, weight, bias, eps)


@register(F.batch_norm)
def batch_norm(input: Any, running_mean: Any, running_var: Any, weight: Any = None, bias: Any = None,
               training: bool = False, momentum: float = 0.1, eps: float = 1e-5) -> Any:
    if training:
        size = list(input.shape)
        count = size[0] if size else 1
        for s in size[2:]:
            count *= s
        check(count != 1, lambda: f"Expected more than 1 value per channel when training, got input size "
              f"{torch.Size(size)}", ValueError)
    return _batch_norm(input, running_mean, running_var, weight, bias, training, eps, momentum)


@register(torch.batch_norm)
def batch_norm_twin(input: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any, training: bool,
                    momentum: float, eps: float, cudnn_enabled: bool = True) -> Any:
    return _batch_norm(input, running_mean, running_var, weight, bias, training, eps, momentum)


@register(F.instance_norm)
def instance_norm(input: Any, running_mean: Any = None, running_var: Any = None, weight: Any = None,
                  bias: Any = None, use_input_stats: bool = True, momentum: float = 0.1,
                  eps: float = 1e-5) -> Any:
    if not use_input_stats:
        _check_channels("instance_norm", input, {"running_mean": running_mean, "running_var": running_var})
        check(running_mean is not None and running_var is not None, lambda: "Expected running_mean and "
              "running_var to be defined when use_input_stats is false", RuntimeError)
        return _batch_norm(input, running_mean, running_var, weight, bias, False, eps)
    if running_mean is not None or running_var is not None:
        raise NoDecomposition("instance_norm updating running statistics")
    spatial = 1
    for s in input.shape[2:]:
        spatial *= s
    check(input.ndim < 2 or spatial != 1, lambda: f"Expected more than 1 spatial element when training, "
          f"got input size {torch.Size(list(input.shape))}", ValueError)
    _check_channels("instance_norm", input, {"weight": weight, "bias": bias})
    check_float("instance_norm", input)
    # eager: training-mode batch_norm of the input seen as (1, N * C, ...), weight and bias repeated N times
    n, c = input.shape[0], input.shape[1]
    folded = torch.reshape(input, [1, n * c] + list(input.shape[2:]))
    mean, var = _moments(upcast(folded), range(2, input.ndim))
    w = None if weight is None else torch.reshape(weight.repeat(n), [n * c])
    b = None if bias is None else torch.reshape(bias.repeat(n), [n * c])
    out = _normalize_channels(folded, torch.reshape(mean, [n * c]), torch.reshape(var, [n * c]), w, b, eps)
    return torch.reshape(out, list(input.shape))


@register(F.group_norm)
def group_norm(input: Any, num_groups: int, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> Any:
    check(input.ndim >= 2, lambda: f"Expected at least 2 dimensions for input tensor but received "
          f"{input.ndim}", RuntimeError)
    n, c = input.shape[0], input.shape[1]
    check(num_groups > 0, lambda: f"Expected num groups to be greater than 0, got {num_groups}", RuntimeError)
    check(c % num_groups == 0, lambda: f"Expected number of channels in input to be divisible by num_groups, "
          f"but got input of shape {list(input.shape)} and num_groups={num_groups}", RuntimeError)
    for name, p in (("weight", weight), ("bias", bias)):
        check(p is None or (p.ndim == 1 and p.numel() == c), lambda: f"Expected {name} to be a vector of "
              f"size equal to the number of channels in input, but got {name} of shape {shape_text(p)} and "
              f"input of shape {list(input.shape)}", RuntimeError)
    check_float("group_norm", input)
    x = upcast(input)
    # (N, G, C/G, *spatial): the channels split, the spatial dims kept apart rather than flattened with
    # them, so a channels-last input is reduced by plain strides (a flattened index reads it through div
    # and mod: PoolFormer's GroupNorm statistics at batch 8 ran at 1 GB/s)
    grouped = torch.reshape(x, [n, num_groups, c // num_groups, *input.shape[2:]])
    mean, var = _moments(grouped, list(range(2, grouped.ndim)))
    # the statistics per channel (N * C elements), the normalization over the input as it is laid out: a
    # normalization of `grouped` reshaped back was materialized row-major, so a channels-last GroupNorm
    # (PoolFormer's) wrote its result transposed and its reader gathered it back
    per_channel = [n, c] + [1] * (input.ndim - 2)
    grown = [n, num_groups, c // num_groups] + [1] * (input.ndim - 2)
    mean_c = torch.reshape(torch.broadcast_to(mean, grown), per_channel)
    rstd_c = torch.reshape(torch.broadcast_to(torch.rsqrt(var + eps), grown), per_channel)
    out = (x - mean_c) * rstd_c
    shape = _channel_shape(input)
    if weight is not None:
        out = out * torch.reshape(convert(weight, x.dtype), shape)
    if bias is not None:
        out = out + torch.reshape(convert(bias, x.dtype), shape)
    # (the reshape above keeps a transposed input's layout where it is a view: eager's result is laid out
    # by its input's suggested format, contiguous or channels-last)
    return eager_format(convert(out, input.dtype), input)


@register(torch.group_norm)
def group_norm_twin(input: Any, num_groups: int, weight: Any = None, bias: Any = None, eps: float = 1e-5,
                    cudnn_enabled: bool = True) -> Any:
    return group_norm(input, num_groups, weight, bias, eps)


@register(F.local_response_norm)
def local_response_norm(input: Any, size: int, alpha: float = 1e-4, beta: float = 0.75,
                        k: float = 1.0) -> Any:
    check(input.ndim >= 3, lambda: f"Expected 3D or higher dimensionality input (got {input.ndim} "
          f"dimensions)", ValueError)
    if input.numel() == 0:
        return input
    div = input * input
    if input.ndim == 3:
        div = F.pad(torch.unsqueeze(div, 1), (0, 0, size // 2, (size - 1) // 2))
        div = torch.squeeze(F.avg_pool2d(div, (size, 1), stride=1), 1)
    else:
        sizes = list(input.shape)
        div = torch.reshape(div, [sizes[0], 1, sizes[1], sizes[2], -1])
        div = F.pad(div, (0, 0, 0, 0, size // 2, (size - 1) // 2))
        div = torch.reshape(torch.squeeze(F.avg_pool3d(div, (size, 1, 1), stride=1), 1), sizes)
    return input / torch.pow(div * alpha + k, beta)


@register(F.normalize)
def normalize(input: Any, p: float = 2.0, dim: int = 1, eps: float = 1e-12, out: Any = None) -> Any:
    if out is not None:
        raise NoDecomposition("normalize(out=...)")
    check_float("normalize", input)
    d = wrap_dim(dim, input.ndim)
    x = upcast(input)
    denom = torch.clamp_min(vector_norm(x, float(p), [d] if input.ndim else [], True), eps)
    return convert(x / denom, input.dtype)


# ---- dropout ----------------------------------------------------------------------------------------------

def _dropout_args(op: str, p: float, inplace: bool) -> None:
    check(0.0 <= p <= 1.0, lambda: f"{op} probability has to be between 0 and 1, but got {p}", ValueError)


_ALPHA = 1.7580993408473766  # eager's alpha_dropout constant (-selu's negative saturation)


def _dropout(input: Any, p: float, train: bool, feature: bool, alpha: bool) -> Any:
    """Eager's CPU dropout (ATen _dropout_impl), step for step, so the same seed draws the same mask:
    noise = empty(shape).bernoulli_(1 - p) over the input's shape (feature dropout: (N, C, 1, ...)),
    then plain dropout scales noise by 1 / (1 - p), alpha dropout shifts and scales it."""
    if p == 0 or not train or input.numel() == 0:
        return input
    if p == 1:
        return input * 0.0 if is_float_dtype(input.dtype) else input * 0
    check_float("dropout", input)
    if feature:
        check(input.ndim >= 2, lambda: f"Feature dropout requires at least 2 dimensions in the input, got "
              f"{shape_text(input)}", RuntimeError)
        template = input.new_empty([input.shape[0], input.shape[1]] + [1] * (input.ndim - 2))
    else:
        if not input.meta.is_contiguous():
            # eager draws into empty_like(input), in the input's memory order
            raise NoDecomposition("dropout(training=True) of a non-contiguous input")
        template = input
    noise = prims.bernoulli(template, 1.0 - p)
    if not alpha:
        return input * (noise / (1.0 - p))
    a = 1.0 / math.sqrt((_ALPHA * _ALPHA * p + 1) * (1 - p))
    b = (noise + -1) * (_ALPHA * a) + _ALPHA * a * p
    return input * (noise * a) + b


@register(F.dropout)
def dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
    _dropout_args("dropout", p, inplace)
    return _dropout(input, p, training, feature=False, alpha=False)


@register(F.alpha_dropout)
def alpha_dropout(input: Any, p: float = 0.5, training: bool = False, inplace: bool = False) -> Any:
    _dropout_args("dropout", p, inplace)
    return _dropout(input, p, training, feature=False, alpha=True)


@register(F.feature_alpha_dropout)
def feature_alpha_dropout(input: Any, p: float = 0.5, training: bool = False, inplace: bool = False) -> Any:
    _dropout_args("dropout", p, inplace)
    return _dropout(input, p, training, feature=True, alpha=True)


def _feature_dropout(op: str, batched_ndim: int, input: Any, p: float, training: bool, inplace: bool) -> Any:
    """dropout1d/3d: one draw per channel; an input of another rank than batched_ndim gets a batch dim of 1
    (as F.dropout1d/3d; dropout1d refuses ranks other than 2 and 3)."""
    _dropout_args("dropout", p, inplace)
    ndim = input.ndim
    if op == "dropout1d":
        check(ndim in (2, 3), lambda: f"dropout1d: Expected 2D or 3D input, but received a {ndim}D input. "
              f"Note that dropout1d exists to provide channel-wise dropout on inputs with 1 spatial "
              f"dimension, a channel dimension, and an optional batch dimension (i.e. 2D or 3D inputs).",
              RuntimeError)
    if ndim != batched_ndim:
        if not training or p == 0:
            return input
        return torch.squeeze(_dropout(torch.unsqueeze(input, 0), p, training, feature=True, alpha=False), 0)
    return _dropout(input, p, training, feature=True, alpha=False)


@register(F.dropout1d)
def dropout1d(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
    return _feature_dropout("dropout1d", 3, input, p, training, inplace)


@register(F.dropout2d)
def dropout2d(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
    # eager: feature dropout of the input as it is, whatever its rank (a 3-D input is (N, C, L); eager warns)
    _dropout_args("dropout", p, inplace)
    return _dropout(input, p, training, feature=True, alpha=False)


@register(F.dropout3d)
def dropout3d(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
    return _feature_dropout("dropout3d", 5, input, p, training, inplace)


def _check_p(p: float) -> None:
    check(0.0 <= p <= 1.0, lambda: f"dropout probability has to be between 0 and 1, but got {p}",
          RuntimeError)


@register(torch.dropout)
def dropout_twin(input: Any, p: float, train: bool) -> Any:
    _check_p(p)
    return _dropout(input, p, train, feature=False, alpha=False)


@register(torch.feature_dropout)
def feature_dropout_twin(input: Any, p: float, train: bool) -> Any:
    _check_p(p)
    return _dropout(input, p, train, feature=True, alpha=False)


@register(torch.alpha_dropout)
def alpha_dropout_twin(input: Any, p: float, train: bool) -> Any:
    _check_p(p)
    return _dropout(input, p, train, feature=False, alpha=True)


@register(torch.feature_alpha_dropout)
def feature_alpha_dropout_twin(input: Any, p: float, train: bool) -> Any:
    _check_p(p)
    return _dropout(input, p, train, feature=True, alpha=True)


# ---- linear layers ----------------------------------------------------------------------------------------

@register(F.linear)
def linear(input: Any, weight: Any, bias: Any = None) -> Any:
    check(input.ndim >= 1 and weight.ndim in (1, 2), lambda: f"linear: expected input of at least 1 dim and "
          f"a 1-D or 2-D weight, got input {shape_text(input)} and weight {shape_text(weight)}", RuntimeError)
    w = torch.t(weight) if weight.ndim == 2 else weight
    if bias is None:
        return torch.matmul(input, w)
    dtype = computation_dtype(input.dtype)
    if dtype != input.dtype and input.dtype == weight.dtype == bias.dtype:
        out = linalg.half_linear(input, w, bias)  # eager's half-precision addmm, one library call
        if out is not None:
            return out
        # eager adds the bias inside its float16/bfloat16 gemm (float32 accumulation) and rounds once
        out = torch.matmul(convert(input, dtype), convert(w, dtype)) + convert(bias, dtype)
        return convert(out, input.dtype)
    return torch.matmul(input, w) + bias


@register(F.bilinear, _t("bilinear"))
def bilinear(input1: Any, input2: Any, weight: Any, bias: Any = None) -> Any:
    check(weight.ndim == 3, lambda: f"bilinear(): weight must be 3-D, got {shape_text(weight)}", RuntimeError)
    o, i, j = weight.shape
    check(input1.ndim == input2.ndim and list(input1.shape[:-1]) == list(input2.shape[:-1]),
          lambda: f"bilinear(): input batch dimensions do not match: got {shape_text(input1)} and "
                  f"{shape_text(input2)}", RuntimeError)
    check(input1.shape[-1] == i and input2.shape[-1] == j, lambda: f"bilinear(): input sizes "
          f"{shape_text(input1)}, {shape_text(input2)} do not match weight {shape_text(weight)}",
          RuntimeError)
    # out[..., o] = sum_ij x1[..., i] W[o, i, j] x2[..., j]; float16/bfloat16 accumulate in float32
    dtype = computation_dtype(input1.dtype)
    low = dtype != input1.dtype and input1.dtype == input2.dtype == weight.dtype
    x1, x2, weight = (convert(t, dtype) if low else t for t in (input1, input2, weight))
    w = torch.reshape(torch.permute(weight, [1, 0, 2]), [i, o * j])
    t = torch.reshape(torch.matmul(x1, w), list(input1.shape[:-1]) + [o, j])
    out = torch.sum(t * torch.unsqueeze(x2, -2), -1)
    if bias is not None:
        out = out + (convert(bias, dtype) if low else bias)
    return convert(out, input1.dtype) if low else out


# with inplace=True these F ops compute their result as usual: the registry writes it back to the input
mark_inplace_flag(F.relu, F.relu6, F.hardtanh, F.leaky_relu, F.rrelu, F.elu, F.selu, F.celu, F.silu,
                  F.mish, F.hardsigmoid, F.hardswish, F.threshold, F.dropout, F.alpha_dropout,
                  F.feature_alpha_dropout, F.dropout1d, F.dropout2d, F.dropout3d)
