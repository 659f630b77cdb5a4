"""Creation and random prims: tensors made from sizes and values, not from other tensors' values.

  iota(length, start, step, dtype, device)           start + step * i for i < length (eager arange's kernel)
  full(shape, value, dtype, device)                  a contiguous tensor filled with a Python number
  empty_strided(shape, strides, dtype, device)       uninitialized memory with the given strides
Random (tag "random"; the refs draw from torch's generator exactly as the eager factories do, so after
`torch.manual_seed(s)` a graph gives eager's numbers when its random prims run in program order):
  uniform(shape, low, high, dtype, device, generator)   torch.rand's stream (uniform_)
  normal(shape, mean, std, dtype, device, generator)    torch.randn's stream (normal_)
  randint(low, high, shape, dtype, device, generator)   torch.randint's stream (random_)
  bernoulli(a, p, generator)   0/1 draws shaped like `a`: with p=None `a` holds the probabilities
      (torch.bernoulli(a)), with a float p every draw has probability p (torch.bernoulli(a, p), as
      Tensor.bernoulli_(p))
"""
from __future__ import annotations

from typing import Any

from ..graph.lazy import is_expr
import torch

from ..graph.symbolic import SymInt
from ..graph import TensorMeta
from .registry import check, is_tensor, meta_of, prim, rule, shape_text


def _device(device: Any) -> torch.device:
    """The device a tensor made on `device` reports: eager's tensors always name their index, so a bare
    "cuda" is the current CUDA device (cuda:0 by default); otherwise such a tensor's meta would differ from
    its operands' and a strict prim would refuse to combine them."""
    if device is None:
        device = torch.get_default_device() if hasattr(torch, "get_default_device") else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _shape(op: str, shape: Any) -> tuple:
    check(isinstance(shape, (tuple, list, torch.Size)),
          lambda: f"prims.{op}: shape must be a tuple of ints, got {type(shape).__name__}", TypeError)
    shape = tuple(shape)
    for s in shape:
        check(not isinstance(s, bool) and (isinstance(s, (int, SymInt)) or is_expr(s)),
              lambda: f"prims.{op}: shape must be ints, got {shape}", TypeError)
        check(not isinstance(s, (int, SymInt)) or s >= 0,
              lambda: f"prims.{op}: negative dimension in shape {list(shape)}")
    return shape


def _dtype(op: str, dtype: Any) -> torch.dtype:
    check(isinstance(dtype, torch.dtype), lambda: f"prims.{op}: expected a dtype, got {dtype!r}", TypeError)
    return dtype


def _number(op: str, value: Any) -> None:
    check(isinstance(value, (bool, int, float, complex, SymInt)) and not is_tensor(value),
          lambda: f"prims.{op}: expected a Python number, got {type(value).__name__}", TypeError)


# ---- iota / full / empty_strided ------------------------------------------------------------------------

def _iota_meta(length: Any, start: Any, step: Any, dtype: torch.dtype, device: Any = None) -> TensorMeta:
    check((isinstance(length, (int, SymInt)) or is_expr(length)) and not isinstance(length, bool) and length >= 0,
          lambda: f"prims.iota: length must be a non-negative int, got {length!r}", TypeError)
    _number("iota", start)
    _number("iota", step)
    check(step != 0, lambda: "prims.iota: step must be nonzero")
    _dtype("iota", dtype)
    check(dtype != torch.bool and not dtype.is_complex, lambda: f"prims.iota: not defined for {dtype}",
          TypeError)
    return TensorMeta((length,), dtype, _device(device))


def _iota_ref(length: int, start: Any, step: Any, dtype: torch.dtype, device: Any = None) -> torch.Tensor:
    if length == 0:
        return torch.empty(0, dtype=dtype, device=_device(device))
    # The end half a step past the last element, so eager's size rule gives exactly `length` elements and
    # its kernel (start + step * i, vectorized in chunks) gives eager arange's values.
    if dtype.is_floating_point:
        end = start + (length - 0.5) * step
    else:
        end = int(start) + length * int(step)  # eager truncates integer bounds; this end is exact
    return torch.arange(start, end, step, dtype=dtype, device=_device(device))


iota = prim("iota", _iota_meta, _iota_ref, tags=("creation",),
            doc="iota(length, start, step, dtype, device): start + step * i, as eager's arange computes it.")


def _full_meta(shape: Any, value: Any, dtype: torch.dtype, device: Any = None) -> TensorMeta:
    shape = _shape("full", shape)
    _number("full", value)
    _dtype("full", dtype)
    check(not isinstance(value, complex) or dtype.is_complex,
          lambda: f"prims.full: a complex value cannot fill a {dtype} tensor", TypeError)
    return TensorMeta(shape, dtype, _device(device))


full = prim("full", _full_meta,
            lambda shape, value, dtype, device=None: torch.full(tuple(shape), value, dtype=dtype,
                                                                device=_device(device)),
            tags=("creation",), doc="full(shape, value, dtype, device): a contiguous tensor of one value.")


def _empty_strided_meta(shape: Any, strides: Any, dtype: torch.dtype, device: Any = None) -> TensorMeta:
    shape = _shape("empty_strided", shape)
    strides = tuple(strides)
    check(len(strides) == len(shape), lambda: f"prims.empty_strided: {len(shape)} sizes but {len(strides)} "
          f"strides")
    return TensorMeta(shape, _dtype("empty_strided", dtype), _device(device), strides)


empty_strided = prim("empty_strided", _empty_strided_meta,
                     lambda shape, strides, dtype, device=None: torch.empty_strided(
                         tuple(shape), tuple(strides), dtype=dtype, device=_device(device)),
                     tags=("creation",),
                     doc="empty_strided(shape, strides, dtype, device): uninitialized values.")


# ---- random ---------------------------------------------------------------------------------------------

def _check_generator(op: str, generator: Any) -> None:
    check(generator is None or isinstance(generator, torch.Generator),
          lambda: f"prims.{op}: generator must be a torch.Generator, got {type(generator).__name__}",
          TypeError)


def _uniform_meta(shape: Any, low: Any, high: Any, dtype: torch.dtype, device: Any = None,
                  generator: Any = None) -> TensorMeta:
    shape = _shape("uniform", shape)
    _number("uniform", low)
    _number("uniform", high)
    _dtype("uniform", dtype)
    check(dtype.is_floating_point or dtype.is_complex, lambda: f"prims.uniform: expected a floating dtype, "
          f"got {dtype}", TypeError)
    _check_generator("uniform", generator)
    return TensorMeta(shape, dtype, _device(device))


def _uniform_ref(shape: Any, low: Any, high: Any, dtype: torch.dtype, device: Any = None,
                 generator: Any = None) -> torch.Tensor:
    out = torch.empty(tuple(shape), dtype=dtype, device=_device(device))
    return out.uniform_(low, high, generator=generator)


uniform = prim("uniform", _uniform_meta, _uniform_ref, tags=("creation", "random"),
               doc="uniform(shape, low, high, dtype, device, generator): U[low, high) draws (torch.rand's).")


def _normal_meta(shape: Any, mean: Any, std: Any, dtype: torch.dtype, device: Any = None,
                 generator: Any = None) -> TensorMeta:
    shape = _shape("normal", shape)
    _number("normal", mean)
    _number("normal", std)
    check(std >= 0, lambda: f"normal expects std >= 0.0, but found std {std}")
    _dtype("normal", dtype)
    check(dtype.is_floating_point or dtype.is_complex, lambda: f"prims.normal: expected a floating dtype, "
          f"got {dtype}", TypeError)
    _check_generator("normal", generator)
    return TensorMeta(shape, dtype, _device(device))


def _normal_ref(shape: Any, mean: Any, std: Any, dtype: torch.dtype, device: Any = None,
                generator: Any = None) -> torch.Tensor:
    out = torch.empty(tuple(shape), dtype=dtype, device=_device(device))
    return out.normal_(mean, std, generator=generator)


normal = prim("normal", _normal_meta, _normal_ref, tags=("creation", "random"),
              doc="normal(shape, mean, std, dtype, device, generator): N(mean, std²) draws (torch.randn's).")


def _randint_meta(low: int, high: int, shape: Any, dtype: torch.dtype, device: Any = None,
                  generator: Any = None) -> TensorMeta:
    shape = _shape("randint", shape)
    check(isinstance(low, int) and isinstance(high, int), lambda: f"prims.randint: bounds must be ints, got "
          f"{low!r}, {high!r}", TypeError)
    check(low < high, lambda: f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")
    _dtype("randint", dtype)
    _check_generator("randint", generator)
    return TensorMeta(shape, dtype, _device(device))


randint = prim("randint", _randint_meta,
               lambda low, high, shape, dtype, device=None, generator=None: torch.randint(
                   low, high, tuple(shape), generator=generator, dtype=dtype, device=_device(device)),
               tags=("creation", "random"),
               doc="randint(low, high, shape, dtype, device, generator): integers in [low, high).")


def _bernoulli_meta(a: Any, p: Any = None, generator: Any = None) -> TensorMeta:
    check(is_tensor(a), lambda: "prims.bernoulli: expected a tensor", TypeError)
    m = meta_of(a)
    check(m.dtype.is_floating_point, lambda: f"prims.bernoulli: expected a floating tensor, got {m.dtype} "
          f"{shape_text(a)}", TypeError)
    check(p is None or (isinstance(p, (int, float)) and not isinstance(p, bool)),
          lambda: f"prims.bernoulli: p must be None or a float, got {p!r}", TypeError)
    check(p is None or 0 <= p <= 1, lambda: f"bernoulli_ expects p to be in [0, 1], but got p={p}")
    _check_generator("bernoulli", generator)
    return TensorMeta(m.shape, m.dtype, m.device)


def _bernoulli_ref(a: torch.Tensor, p: Any = None, generator: Any = None) -> torch.Tensor:
    out = torch.bernoulli(a, generator=generator) if p is None else torch.bernoulli(a, p, generator=generator)
    return out.contiguous()


bernoulli = prim("bernoulli", _bernoulli_meta, _bernoulli_ref, tags=("random",),
                 doc="bernoulli(a, p=None, generator=None): 0/1 draws shaped like a (contiguous).")


# ---- vjp rules: none of these is differentiable ---------------------------------------------------------
# The arguments are sizes and numbers, and bernoulli's draws are 0/1 (eager gives its probabilities no
# gradient either), so every argument gets None.

def _no_gradient(grads: Any, outputs: Any, *args: Any, **kwargs: Any) -> tuple:
    return (None,) * len(args)


_no_gradient.gives_no_gradient = True  # type: ignore[attr-defined]  (by design: see kiln.autograd.joint)


for _p in (iota, full, empty_strided, uniform, normal, randint, bernoulli):
    rule("vjp", _p)(_no_gradient)
del _p
