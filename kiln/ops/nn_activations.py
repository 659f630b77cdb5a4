"""Decompositions of torch.nn.functional's activations (relu, gelu, silu, elu, softplus, ...) and the
helpers the nn decompositions share (`upcast`, `check_float`, `register_missing`).

Low-precision floats compute in float32 and round back once, as eager's CPU kernels. Where a composite of
prims would differentiate differently from eager's formula at a boundary (relu at 0, hardtanh at its bounds)
or overflow on a side `where` does not take (elu, softplus of large inputs), a graph that wants a gradient
routes it as eager does (`wants_gradient`); inference graphs keep the plain composite.

The torch./Tensor. twins of activations (torch.relu, Tensor.sigmoid, ...) are registered here only when
no other module registered them first (the elementwise module owns the plain math).
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from .. import prims
from ..prims.registry import check, shape_text, wrap_dim
from .registry import DECOMPOSITIONS, NoDecomposition, register
from .utils import computation_dtype, convert, elementwise, is_float_dtype, wants_gradient


def register_missing(*targets: Any):
    """Register for the targets no other module has registered (torch./Tensor. twins of F ops)."""
    return register(*[t for t in targets if t is not None and t not in DECOMPOSITIONS])


def upcast(x: Any) -> Any:
    """x in its computation dtype (float16/bfloat16 compute in float32, as eager's CPU kernels)."""
    return convert(x, computation_dtype(x.dtype))


def check_float(op: str, x: Any) -> None:
    check(is_float_dtype(x.dtype), lambda: f"{op}: expected a floating point input, got {x.dtype} "
          f"{shape_text(x)}", RuntimeError)


def _t(name: str) -> Any:
    return getattr(torch, name, None)


def _m(name: str) -> Any:
    return getattr(torch.Tensor, name, None)


# ---- activations ------------------------------------------------------------------------------------------

@register(F.relu)
def relu(input: Any, inplace: bool = False) -> Any:
    out = torch.clamp_min(input, 0)
    if wants_gradient(input):  # eager's gradient is 0 at 0 (clamp's is 1): it flows where the result is > 0
        out = torch.where(out > 0, out, prims.stop_gradient(out))
    return out


@register_missing(torch.relu, _m("relu"))
def relu_twin(input: Any) -> Any:
    return relu(input)


@register(F.relu6)
def relu6(input: Any, inplace: bool = False) -> Any:
    return hardtanh(input, 0.0, 6.0)


@register(F.hardtanh)
def hardtanh(input: Any, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Any:
    check(max_val >= min_val, lambda: "hardtanh: min_val cannot be greater than max_val", ValueError)
    if not is_float_dtype(input.dtype):
        min_val, max_val = int(min_val), int(max_val)  # eager casts the bounds to the integer dtype
    out = torch.clamp(input, min_val, max_val)
    if wants_gradient(input):  # eager's gradient is 1 strictly inside the bounds only (clamp's includes them)
        inside = torch.logical_and(torch.gt(input, min_val), torch.lt(input, max_val))
        out = torch.where(inside, input, prims.stop_gradient(out))
    return out


@register(F.leaky_relu)
def leaky_relu(input: Any, negative_slope: float = 0.01, inplace: bool = False) -> Any:
    return torch.where(input > 0, input, input * negative_slope)


@register_missing(_t("rrelu"))
def rrelu_twin(input: Any, lower: float = 1.0 / 8, upper: float = 1.0 / 3, training: bool = False,
               generator: Any = None) -> Any:
    return rrelu(input, lower, upper, training)


@register(F.rrelu)
def rrelu(input: Any, lower: float = 1.0 / 8, upper: float = 1.0 / 3, training: bool = False,
          inplace: bool = False) -> Any:
    if training:
        raise NoDecomposition("rrelu(training=True)")  # draws a random slope per element
    return leaky_relu(input, (lower + upper) / 2)


def _elu(x: Any, alpha: float, scale: float, input_scale: float) -> Any:
    # eager: x > 0 ? x * scale : expm1(x * input_scale) * alpha * scale
    c = upcast(x)
    # (wanting a gradient, the negative side reads 0 where x > 0: expm1 of a large x is inf, and its unused
    # gradient 0 * inf would be NaN)
    n = torch.where(c > 0, 0.0, c) if wants_gradient(x) else c
    negative = torch.expm1(n * input_scale) * (alpha * scale) if input_scale != 1 else \
        torch.expm1(n) * (alpha * scale)
    positive = c * scale if scale != 1 else c
    return convert(torch.where(c > 0, positive, negative), x.dtype)


@register(F.elu)
def elu(input: Any, alpha: float = 1.0, inplace: bool = False) -> Any:
    check_float("elu", input)
    return _elu(input, alpha, 1.0, 1.0)


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


@register(F.selu)
def selu(input: Any, inplace: bool = False) -> Any:
    check_float("selu", input)
    return _elu(input, _SELU_ALPHA, _SELU_SCALE, 1.0)


@register_missing(_t("selu"))
def selu_twin(input: Any) -> Any:
    return selu(input)


@register(F.celu)
def celu(input: Any, alpha: float = 1.0, inplace: bool = False) -> Any:
    check_float("celu", input)
    check(alpha != 0, lambda: "ZeroDivisionError", RuntimeError)
    return _elu(input, alpha, 1.0, 1.0 / alpha)


@register_missing(_t("celu"))
def celu_twin(input: Any, alpha: float = 1.0) -> Any:
    return celu(input, alpha)


_SQRT1_2 = 0.70710678118654752440
_GELU_BETA = math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5
_GELU_KAPPA = 0.044715


@register(F.gelu)
def gelu(input: Any, approximate: str = "none") -> Any:
    check(approximate in ("none", "tanh"), lambda: f"gelu: approximate argument must be either none or "
          f"tanh, got {approximate!r}", RuntimeError)
    check_float("gelu", input)
    x = upcast(input)
    if approximate == "tanh":
        inner = (x + x * x * x * _GELU_KAPPA) * _GELU_BETA
        out = x * 0.5 * (torch.tanh(inner) + 1)
    else:
        out = x * 0.5 * (torch.erf(x * _SQRT1_2) + 1)
    return convert(out, input.dtype)


@register(F.silu)
def silu(input: Any, inplace: bool = False) -> Any:
    check_float("silu", input)
    x = upcast(input)
    if wants_gradient(input):  # sigmoid's gradient from its result: finite where exp(-x) overflows
        return convert(x * prims.sigmoid(x), input.dtype)
    return convert(x / (torch.exp(-x) + 1), input.dtype)


@register(F.mish)
def mish(input: Any, inplace: bool = False) -> Any:
    check_float("mish", input)
    x = upcast(input)
    if wants_gradient(input):  # softplus with its threshold (tanh is 1 above it): no exp overflow, no NaN
        return convert(x * torch.tanh(softplus(x)), input.dtype)
    return convert(x * torch.tanh(torch.log1p(torch.exp(x))), input.dtype)


@register(F.hardsigmoid)
def hardsigmoid(input: Any, inplace: bool = False) -> Any:
    check_float("hardsigmoid", input)
    x = upcast(input)
    out = torch.clamp(x + 3, 0, 6) / 6
    if wants_gradient(input):  # eager's gradient is 1/6 strictly inside (-3, 3) only (clamp's includes them)
        out = torch.where(torch.logical_and(x > -3, x < 3), (x + 3) / 6, prims.stop_gradient(out))
    return convert(out, input.dtype)


@register(F.hardswish)
def hardswish(input: Any, inplace: bool = False) -> Any:
    check_float("hardswish", input)
    x = upcast(input)
    out = x * torch.clamp(x + 3, 0, 6) / 6
    if wants_gradient(input):  # eager's gradient: 0 up to -3, x / 3 + 1/2 inside, 1 from 3 on
        out = torch.where(x <= -3, prims.stop_gradient(out), torch.where(x < 3, x * (x + 3) / 6, x * 6 / 6))
    return convert(out, input.dtype)


@register(F.softplus)
def softplus(input: Any, beta: float = 1.0, threshold: float = 20.0) -> Any:
    check_float("softplus", input)
    x = upcast(input)
    scaled = x * beta
    above = scaled > threshold
    # (wanting a gradient, the soft side reads 0 above the threshold: exp overflows there, 0 * inf is NaN)
    soft = torch.log1p(torch.exp(torch.where(above, 0.0, scaled) if wants_gradient(input) else scaled)) / beta
    return convert(torch.where(above, x, soft), input.dtype)


@register(F.softsign)
def softsign(input: Any) -> Any:
    return input / (torch.abs(input) + 1)


@register(F.tanhshrink)
def tanhshrink(input: Any) -> Any:
    return input - torch.tanh(input)


def _threshold(input: Any, threshold: float, value: float) -> Any:
    if input.dtype == torch.bool:
        raise NoDecomposition("threshold of a bool tensor")
    if not is_float_dtype(input.dtype):
        threshold, value = int(threshold), int(value)  # eager casts both to the integer dtype
    return torch.where(input <= threshold, value, input)


@register(F.threshold)
def threshold(input: Any, threshold: float, value: float, inplace: bool = False) -> Any:
    return _threshold(input, threshold, value)


@register_missing(_t("threshold"))
def threshold_twin(input: Any, threshold: float, value: float) -> Any:
    return _threshold(input, threshold, value)


@register(F.glu)
def glu(input: Any, dim: int = -1) -> Any:
    check(input.ndim > 0, lambda: "glu does not support scalars because halving size must be even",
          RuntimeError)
    d = wrap_dim(dim, input.ndim)
    size = input.shape[d]
    check(size % 2 == 0, lambda: f"Halving dimension must be even, but dimension {d} is size {size}",
          RuntimeError)
    check_float("glu", input)
    a = torch.narrow(input, d, 0, size // 2)
    b = torch.narrow(input, d, size // 2, size // 2)
    return a * torch.sigmoid(b)


@register(F.logsigmoid)
def logsigmoid(input: Any) -> Any:
    check_float("log_sigmoid", input)
    x = upcast(input)
    # eager: min(x, 0) - log1p(exp(-|x|)), stable for large |x|
    if not wants_gradient(input):
        return convert(torch.clamp_max(x, 0) - torch.log1p(torch.exp(-torch.abs(x))), input.dtype)
    # the same values by sides, so the gradient is eager's 1 - sigmoid(x) at 0 too (abs' and min's give 1)
    negative = x < 0
    below, above = torch.where(negative, x, 0.0), torch.where(negative, 0.0, x)
    out = torch.where(negative, below - torch.log1p(torch.exp(below)),
                      prims.stop_gradient(torch.clamp_max(x, 0)) - torch.log1p(torch.exp(-above)))
    return convert(out, input.dtype)


@register(F.prelu, _t("prelu"))
def prelu(input: Any, weight: Any) -> Any:
    check(weight.ndim <= 1, lambda: f"prelu: Expected `weight` to be a scalar or 1D tensor, but got: "
          f"ndim = {weight.ndim}", RuntimeError)
    channels = input.shape[1] if input.ndim >= 2 else 1
    count = weight.numel()
    check(count == 1 or count == channels, lambda: f"prelu: Mismatch of parameter numbers and input "
          f"channel size. Found parameter numbers = {count} and channel size = {channels}.", RuntimeError)
    check(input.dtype == weight.dtype, lambda: f"prelu: expected weight of dtype {input.dtype}, got "
          f"{weight.dtype}", RuntimeError)
    if input.ndim == 0 or count == 1:
        w = torch.reshape(weight, ())
    else:
        w = torch.reshape(weight, [channels] + [1] * (input.ndim - 2))
    return torch.where(input > 0, input, w * input)


@register(F.hardshrink, _t("hardshrink"), _m("hardshrink"))
def hardshrink(input: Any, lambd: float = 0.5) -> Any:
    # eager: (x >= -lambd && x <= lambd) ? 0 : x  (NaN stays NaN)
    inside = torch.logical_and(input >= -lambd, input <= lambd)
    return torch.where(inside, 0, input)


@register(F.softshrink)
def softshrink(input: Any, lambd: float = 0.5) -> Any:
    check(lambd >= 0, lambda: f"lambda must be greater or equal to 0, but found to be {lambd}.",
          RuntimeError)
    # eager: x > lambd ? x - lambd : (x < -lambd ? x + lambd : x * 0)  (NaN stays NaN)
    return torch.where(input > lambd, input - lambd,
                       torch.where(input < -lambd, input + lambd, input * 0))


@register_missing(torch.sigmoid, _m("sigmoid"), F.sigmoid)
def sigmoid(input: Any) -> Any:
    return elementwise(prims.sigmoid, input, promotion="int_to_float")


@register_missing(torch.tanh, _m("tanh"), F.tanh)
def tanh(input: Any) -> Any:
    return elementwise(prims.tanh, input, promotion="int_to_float")
