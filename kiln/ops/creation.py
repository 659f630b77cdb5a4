"""Decompositions of torch's factories: zeros/ones/full/empty and their _like and new_ forms, arange,
linspace, logspace, eye, scalar_tensor, and the random factories rand/randn/randint/bernoulli/normal.

Dtypes follow eager's defaults (a float fill or bound gives the default dtype, ints give int64, bools give
bool). `*_like` ops keep the input's dense layout (memory_format=preserve_format) by creating the values in
the input's memory order and permuting them back, so strides — and random values — match eager's.
Arguments the prims do not model (requires_grad=True, pinned memory, non-strided layouts, tensor bounds)
fall back.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from ..graph.symbolic import SymInt
from .. import prims
from ..prims.registry import check
from ..prims.shape import is_non_overlapping_and_dense, preserve_strides
from .registry import NoDecomposition, mark_inplace, register
from .utils import is_tensor, result_type, scalar_dtype

_Shape = (tuple, list, torch.Size)


def _size(args: Sequence[Any], kwargs: dict, op: str) -> tuple:
    """Sizes given as `f(2, 3)`, `f((2, 3))` or `f(size=(2, 3))`."""
    if "size" in kwargs:
        args = (kwargs.pop("size"),)
    if len(args) == 1 and isinstance(args[0], _Shape):
        args = tuple(args[0])
    for s in args:
        if is_tensor(s):
            raise NoDecomposition(f"{op} with tensor sizes")
        check(isinstance(s, (int, SymInt)) and not isinstance(s, bool), lambda: f"{op}(): argument 'size' must be "
              f"tuple of ints, but found element of type {type(s).__name__}", TypeError)
        check(s >= 0, lambda: f"Trying to create tensor with negative dimension {s}: {list(args)}")
    return tuple(args)


def _options(op: str, kwargs: dict, dtype: Any = None,
             device: Any = None) -> tuple[torch.dtype, torch.device]:
    """dtype and device from factory keyword arguments; refuses what the prims do not model."""
    if kwargs.pop("requires_grad", False):
        raise NoDecomposition(f"{op} with requires_grad=True")
    if kwargs.pop("pin_memory", False):
        raise NoDecomposition(f"{op} with pin_memory=True")
    layout = kwargs.pop("layout", None)
    if layout not in (None, torch.strided):
        raise NoDecomposition(f"{op} with layout {layout}")
    if kwargs.pop("out", None) is not None:
        raise NoDecomposition(f"{op} with out=")
    if kwargs.pop("names", None) is not None:
        raise NoDecomposition(f"{op} with named dims")
    dtype = kwargs.pop("dtype", None) or dtype
    device = kwargs.pop("device", None) or device
    check(not kwargs, lambda: f"{op}() got unexpected keyword arguments {sorted(kwargs)}", TypeError)
    if dtype is None:
        dtype = torch.get_default_dtype()
    if device is None:
        device = torch.get_default_device()
    return dtype, torch.device(device)


def _fill_value(value: Any, dtype: torch.dtype) -> Any:
    """A Python number converted as eager converts a fill value to dtype."""
    if is_tensor(value):
        raise NoDecomposition("a tensor fill value")
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_complex:
        return complex(value)
    if dtype.is_floating_point:
        check(not isinstance(value, complex), lambda: f"value cannot be converted to type {dtype} without "
              f"overflow", RuntimeError)
        return float(value)
    check(not isinstance(value, complex),
          lambda: f"value cannot be converted to type {dtype} without overflow")
    if isinstance(value, float) and not math.isfinite(value):
        raise NoDecomposition("a non-finite fill for an integer dtype")
    value = int(value)
    info = torch.iinfo(dtype)
    check(info.min <= value <= info.max,
          lambda: f"value cannot be converted to type {dtype} without overflow")
    return value


# ---- zeros / ones / full / empty ----------------------------------------------------------------------

@register(torch.zeros)
def zeros(*size: Any, **kwargs: Any) -> Any:
    shape = _size(size, kwargs, "zeros")
    dtype, device = _options("zeros", kwargs)
    return prims.full(shape, _fill_value(0, dtype), dtype, device)


@register(torch.ones)
def ones(*size: Any, **kwargs: Any) -> Any:
    shape = _size(size, kwargs, "ones")
    dtype, device = _options("ones", kwargs)
    return prims.full(shape, _fill_value(1, dtype), dtype, device)


@register(torch.full)
def full(size: Any, fill_value: Any, **kwargs: Any) -> Any:
    shape = _size((size,), {}, "full")
    if is_tensor(fill_value):
        raise NoDecomposition("full with a tensor fill value")
    default = scalar_dtype(fill_value) if kwargs.get("dtype") is None else None
    dtype, device = _options("full", kwargs, default)
    return prims.full(shape, _fill_value(fill_value, dtype), dtype, device)


@register(torch.empty)
def empty(*size: Any, **kwargs: Any) -> Any:
    shape = _size(size, kwargs, "empty")
    memory_format = kwargs.pop("memory_format", None) or torch.contiguous_format
    dtype, device = _options("empty", kwargs)
    return prims.empty_strided(shape, prims.shape.memory_format_strides(shape, memory_format, "empty"), dtype,
                               device)


@register(torch.empty_strided)
def empty_strided(size: Any, stride: Any, **kwargs: Any) -> Any:
    dtype, device = _options("empty_strided", kwargs)
    return prims.empty_strided(_size((size,), {}, "empty_strided"), tuple(stride), dtype, device)


@register(torch.empty_permuted)
def empty_permuted(size: Any, physical_layout: Sequence[int], **kwargs: Any) -> Any:
    shape = _size((size,), {}, "empty_permuted")
    perm = tuple(physical_layout)
    check(sorted(perm) == list(range(len(shape))), lambda: f"empty_permuted: physical_layout {list(perm)} is "
          f"not a permutation of the {len(shape)} dims")
    dtype, device = _options("empty_permuted", kwargs)
    physical = tuple(shape[d] for d in perm)
    inverse = [0] * len(perm)
    for i, d in enumerate(perm):
        inverse[d] = i
    values = prims.empty_strided(physical, prims.shape.contiguous_strides(physical), dtype, device)
    return prims.permute(values, tuple(inverse))


@register(torch.scalar_tensor)
def scalar_tensor(s: Any, **kwargs: Any) -> Any:
    dtype, device = _options("scalar_tensor", kwargs)
    return prims.full((), _fill_value(s, dtype), dtype, device)


# ---- tensors from Python data -------------------------------------------------------------------------

_MAX_CONSTANT = 1 << 16  # larger literal data stays a fallback node rather than a graph constant


def _from_data(op: str, data: Any, kwargs: dict, dtype: Any = None, device: Any = None) -> Any:
    from ..graph import flatten
    dtype = kwargs.pop("dtype", None) or dtype
    device = kwargs.pop("device", None) or device
    if kwargs.pop("requires_grad", False) or kwargs.pop("pin_memory", False):
        raise NoDecomposition(f"{op} with requires_grad or pin_memory")
    check(not kwargs, lambda: f"{op}() got unexpected keyword arguments {sorted(kwargs)}", TypeError)
    if op == "as_tensor" and is_tensor(data):
        return _tensor_as_tensor(data, dtype, device)
    if isinstance(data, (list, tuple)) and any(is_tensor(v) for v in flatten(data)):
        return _stacked_scalars(op, data, dtype, device)
    if is_tensor(data):
        raise NoDecomposition(f"{op} of a tensor")
    # a real tensor (a graph constant), built exactly as eager builds it
    with torch._C.DisableTorchFunction():
        value = torch.tensor(data, dtype=dtype, device=device)
    if value.numel() > _MAX_CONSTANT:
        raise NoDecomposition(f"{op} of more than {_MAX_CONSTANT} values")
    return prims.clone(value, torch.contiguous_format)


def _tensor_as_tensor(data: Any, dtype: Any, device: Any) -> Any:
    """as_tensor of a tensor: the tensor itself (eager returns the same object), or a converted copy."""
    if device is not None and torch.device(device) != data.device:
        raise NoDecomposition("as_tensor to another device")
    if dtype is None or dtype == data.dtype:
        return data
    return prims.convert_element_type(data, dtype)


def _stacked_scalars(op: str, data: Any, dtype: Any, device: Any) -> Any:
    """tensor/as_tensor of (nested) lists of 0-d tensors, as eager reads them: each element's value, stacked
    into a tensor of the lists' shape. Mixed dtypes or numbers among them (eager infers the dtype by
    rules of its own) and tensors on another device stay a fallback."""
    shape: list[int] = []
    level = data
    while isinstance(level, (list, tuple)):
        shape.append(len(level))
        level = level[0] if level else None
    leaves = _nested_leaves(data, len(shape))
    if leaves is None or not leaves or not all(is_tensor(v) and v.ndim == 0 for v in leaves):
        raise NoDecomposition(f"{op} of lists mixing tensors and other values, or of tensors with dims")
    dtypes = {v.dtype for v in leaves}
    if dtype is None and len(dtypes) > 1:
        raise NoDecomposition(f"{op} of tensors of several dtypes")
    where = torch.device(device) if device is not None else torch.device("cpu")
    if any(v.device != where for v in leaves):
        raise NoDecomposition(f"{op} of tensors on another device")
    dtype = dtype or leaves[0].dtype
    values = [prims.expand_dims(prims.convert_element_type(v, dtype), (0,)) for v in leaves]
    return prims.view(prims.cat(values, 0), tuple(shape))   # (n,) -> the lists' shape


def _nested_leaves(data: Any, depth: int) -> list | None:
    """The leaves of lists nested exactly `depth` deep, all of one length per level; None if ragged."""
    if depth == 0:
        return None if isinstance(data, (list, tuple)) else [data]
    if not isinstance(data, (list, tuple)):
        return None
    lengths = {len(item) if isinstance(item, (list, tuple)) else -1 for item in data}
    if depth > 1 and len(lengths) > 1:
        return None
    leaves: list = []
    for item in data:
        inner = _nested_leaves(item, depth - 1)
        if inner is None:
            return None
        leaves += inner
    return leaves


@register(torch.tensor)
def tensor(data: Any, **kwargs: Any) -> Any:
    return _from_data("tensor", data, kwargs)


@register(torch.as_tensor)
def as_tensor(data: Any, dtype: Any = None, device: Any = None) -> Any:
    return _from_data("as_tensor", data, {}, dtype, device)


def _constant_factory(op: str, make: Any) -> Any:
    """A data-independent factory computed once while tracing, as a graph constant."""
    with torch._C.DisableTorchFunction():
        value = make()
    if value.numel() > _MAX_CONSTANT:
        raise NoDecomposition(f"{op} of more than {_MAX_CONSTANT} values")
    return prims.clone(value, torch.contiguous_format)


@register(torch.tril_indices)
def tril_indices(row: int, col: int, offset: int = 0, **kwargs: Any) -> Any:
    dtype, device = _options("tril_indices", kwargs, torch.int64)
    return _constant_factory("tril_indices", lambda: torch.tril_indices(row, col, offset, dtype=dtype,
                                                                        device=device))


@register(torch.triu_indices)
def triu_indices(row: int, col: int, offset: int = 0, **kwargs: Any) -> Any:
    dtype, device = _options("triu_indices", kwargs, torch.int64)
    return _constant_factory("triu_indices", lambda: torch.triu_indices(row, col, offset, dtype=dtype,
                                                                        device=device))


@register(torch.Tensor.new_tensor)
def new_tensor(a: Any, data: Any, **kwargs: Any) -> Any:
    return _from_data("new_tensor", data, kwargs, a.dtype, a.device)  # a's dtype whatever the data


# ---- _like and new_ -----------------------------------------------------------------------------------

def _like_layout(a: Any, memory_format: Any) -> tuple[tuple, tuple, bool] | None:
    """(permutation, permuted shape, whether the layout is contiguous) that creates a tensor in the memory
    order eager's empty_like(a, memory_format) gives; None for plain contiguous strides."""
    shape = tuple(a.shape)
    if memory_format is None or memory_format == torch.preserve_format:
        strides = preserve_strides(shape, tuple(a.stride()))
    elif memory_format in (torch.contiguous_format, torch.channels_last, torch.channels_last_3d):
        strides = prims.shape.memory_format_strides(shape, memory_format, "empty_like")
    else:
        raise NoDecomposition(f"a _like factory with {memory_format}")
    if strides == prims.shape.contiguous_strides(shape):
        return None
    # outermost (largest stride) first, a size-1 dim after the larger dim sharing its stride: permuting a
    # contiguous tensor of the permuted shape back then gives these strides
    perm = tuple(sorted(range(len(shape)), key=lambda d: (-strides[d], -shape[d], d)))
    permuted = tuple(shape[d] for d in perm)
    contiguous = a.meta.with_(strides=strides).is_contiguous()
    made = prims.shape.contiguous_strides(permuted)
    if contiguous and tuple(made[perm.index(d)] for d in range(len(shape))) != strides:
        return None  # only size-1 dims' strides differ, which this construction cannot reproduce
    return perm, permuted, contiguous


def _like(a: Any, op: str, kwargs: dict, make: Any, contiguous_only: bool = False) -> Any:
    """Run make(shape, dtype, device) in `a`'s memory order and permute the result back to `a`'s dims."""
    layout = _like_layout(a, kwargs.pop("memory_format", None))
    dtype, device = _options(op, kwargs, a.dtype, a.device)
    if layout is None:
        return make(tuple(a.shape), dtype, device)
    perm, shape, contiguous = layout
    if contiguous_only and not contiguous:
        raise NoDecomposition(f"{op} of a non-contiguous tensor (eager draws in another order)")
    inverse = [0] * len(perm)
    for i, d in enumerate(perm):
        inverse[d] = i
    return prims.permute(make(shape, dtype, device), tuple(inverse))


@register(torch.zeros_like)
def zeros_like(a: Any, **kwargs: Any) -> Any:
    return _like(a, "zeros_like", kwargs, lambda s, dt, dev: prims.full(s, _fill_value(0, dt), dt, dev))


@register(torch.ones_like)
def ones_like(a: Any, **kwargs: Any) -> Any:
    return _like(a, "ones_like", kwargs, lambda s, dt, dev: prims.full(s, _fill_value(1, dt), dt, dev))


@register(torch.full_like)
def full_like(a: Any, fill_value: Any, **kwargs: Any) -> Any:
    return _like(a, "full_like", kwargs,
                 lambda s, dt, dev: prims.full(s, _fill_value(fill_value, dt), dt, dev))


@register(torch.empty_like)
def empty_like(a: Any, **kwargs: Any) -> Any:
    return _like(a, "empty_like", kwargs,
                 lambda s, dt, dev: prims.empty_strided(s, prims.shape.contiguous_strides(s), dt, dev))


def _new(a: Any, op: str, size: Sequence[Any], kwargs: dict, value: Any) -> Any:
    shape = _size(size, kwargs, op)
    dtype, device = _options(op, kwargs, a.dtype, a.device)
    if value is None:
        return prims.empty_strided(shape, prims.shape.contiguous_strides(shape), dtype, device)
    return prims.full(shape, _fill_value(value, dtype), dtype, device)


@register(torch.Tensor.new_zeros)
def new_zeros(a: Any, *size: Any, **kwargs: Any) -> Any:
    return _new(a, "new_zeros", size, kwargs, 0)


@register(torch.Tensor.new_ones)
def new_ones(a: Any, *size: Any, **kwargs: Any) -> Any:
    return _new(a, "new_ones", size, kwargs, 1)


@register(torch.Tensor.new_empty)
def new_empty(a: Any, *size: Any, **kwargs: Any) -> Any:
    return _new(a, "new_empty", size, kwargs, None)


@register(torch.Tensor.new_empty_strided)
def new_empty_strided(a: Any, size: Any, stride: Any, **kwargs: Any) -> Any:
    dtype, device = _options("new_empty_strided", kwargs, a.dtype, a.device)
    return prims.empty_strided(_size((size,), {}, "new_empty_strided"), tuple(stride), dtype, device)


@register(torch.Tensor.new_full)
def new_full(a: Any, size: Any, fill_value: Any, **kwargs: Any) -> Any:
    return _new(a, "new_full", (size,), kwargs, fill_value)


# ---- ranges ---------------------------------------------------------------------------------------------

def _range_number(v: Any, op: str) -> Any:
    if is_tensor(v):
        raise NoDecomposition(f"{op} with tensor bounds")
    check(isinstance(v, (bool, int, float, SymInt)), lambda: f"{op}(): expected a number, got "
          f"{type(v).__name__}", TypeError)
    return v


@register(torch.arange)
def arange(*args: Any, **kwargs: Any) -> Any:
    names = ["start", "end", "step"]
    given = {k: kwargs.pop(k) for k in names if k in kwargs}
    if len(args) == 1 and "end" not in given:
        given["end"] = args[0]
    else:
        for name, v in zip(names, args):
            given[name] = v
    start = _range_number(given.get("start", 0), "arange")
    end = _range_number(given["end"], "arange")
    step = _range_number(given.get("step", 1), "arange")
    inferred = torch.int64
    if any(isinstance(v, float) for v in (start, end, step)):
        inferred = torch.get_default_dtype()
    dtype, device = _options("arange", kwargs, inferred if kwargs.get("dtype") is None else None)
    if dtype == torch.bool or dtype.is_complex:
        raise NoDecomposition(f"arange with dtype {dtype}")
    check(all(isinstance(v, SymInt) or math.isfinite(float(v)) for v in (start, end)),
          lambda: f"unsupported range: {start} -> {end}")
    if dtype.is_floating_point and any(isinstance(v, SymInt) for v in (start, end, step)) and \
            all(isinstance(v, (int, SymInt)) and not isinstance(v, bool) for v in (start, end, step)):
        # integer bounds, one of them a symbolic size: the length is exact integer arithmetic (eager's
        # ceil of the quotient in double is the same number)
        check(step != 0, lambda: "step must be nonzero")
        check((step > 0 and end >= start) or (step < 0 and end <= start),
              lambda: "upper bound and larger bound inconsistent with step sign")
        length = (end - start + step - 1) // step if step > 0 else (start - end - step - 1) // (-step)
    elif dtype.is_floating_point:
        check(step != 0, lambda: "step must be nonzero")
        check((step > 0 and end >= start) or (step < 0 and end <= start),
              lambda: "upper bound and larger bound inconsistent with step sign")
        length = math.ceil((float(end) - float(start)) / float(step))
    else:
        # eager converts the bounds to integers first (truncating), then checks and sizes with them:
        # int64 with exact integer arithmetic, narrower types in double
        xstart, xend, xstep = (v if isinstance(v, SymInt) else int(v) for v in (start, end, step))
        check(xstep != 0, lambda: "step must be nonzero")
        check((xstep > 0 and xend >= xstart) or (xstep < 0 and xend <= xstart),
              lambda: "upper bound and larger bound inconsistent with step sign")
        if dtype == torch.int64:
            sign = 1 if xstep > 0 else -1
            numerator = xend - xstart + xstep - sign
            length = abs(numerator) // abs(xstep) * (1 if (numerator >= 0) == (xstep > 0) else -1)
        else:
            length = math.ceil((float(end) - float(start)) / float(step))
        start, step = xstart, xstep
    return prims.iota(length if isinstance(length, SymInt) else int(length), start, step, dtype, device)


def _bound_value(v: Any, op: str, name: str, dtype: torch.dtype, device: Any) -> Any:
    """A tensor bound (0-d) or a number as a 0-d tensor of dtype: eager reads the bound's value as a
    number and converts it to dtype."""
    if not is_tensor(v):
        return prims.full((), _fill_value(_range_number(v, op), dtype), dtype, device)
    check(v.ndim == 0, lambda: f"{op} only supports 0-dimensional start and end tensors, but got {name} "
          f"with {v.ndim} dimension(s).")
    if v.dtype.is_complex or v.dtype == torch.bool:
        raise NoDecomposition(f"{op} with a {v.dtype} bound")
    return v if v.dtype == dtype else prims.convert_element_type(v, dtype)


def _linspace_of_tensors(start: Any, end: Any, steps: int, dtype: torch.dtype, device: Any) -> Any:
    """linspace with tensor bounds: eager's formula with the bounds' values known only when the graph
    runs (start + step * i for the first half, end - step * (steps - 1 - i) for the second)."""
    if dtype not in (torch.float32, torch.float64):
        raise NoDecomposition(f"linspace with tensor bounds and dtype {dtype}")
    first = _bound_value(start, "linspace", "start", dtype, device)
    last = _bound_value(end, "linspace", "end", dtype, device)
    if steps <= 1:
        return prims.broadcast_in_dim(first, (steps,), ()) if steps == 0 else prims.clone(
            prims.broadcast_in_dim(first, (1,), ()), torch.contiguous_format)
    step = prims.broadcast_in_dim(prims.div(prims.sub(last, first), float(steps - 1)), (steps,), ())
    idx = prims.iota(steps, 0, 1, torch.int64, device)
    low = prims.add(prims.mul(step, prims.convert_element_type(idx, dtype)),
                    prims.broadcast_in_dim(first, (steps,), ()))
    back = prims.sub(prims.full((steps,), steps - 1, torch.int64, device), idx)
    high = prims.sub(prims.broadcast_in_dim(last, (steps,), ()),
                     prims.mul(step, prims.convert_element_type(back, dtype)))
    return prims.where(prims.lt(idx, steps // 2), low, high)


@register(torch.linspace)
def linspace(start: Any, end: Any, steps: int, **kwargs: Any) -> Any:
    if is_tensor(start) or is_tensor(end) or is_tensor(steps):
        if is_tensor(steps):
            raise NoDecomposition("linspace with a tensor number of steps")
        check(isinstance(steps, int) and steps >= 0,
              lambda: "linspace(): number of steps must be non-negative")
        dtype, device = _options("linspace", kwargs)
        return _linspace_of_tensors(start, end, steps, dtype, device)
    start, end = _range_number(start, "linspace"), _range_number(end, "linspace")
    check(isinstance(steps, int) and steps >= 0, lambda: "linspace(): number of steps must be non-negative")
    dtype, device = _options("linspace", kwargs)
    if not dtype.is_floating_point:
        raise NoDecomposition(f"linspace with dtype {dtype}")
    if steps <= 1:
        return prims.full((steps,), _fill_value(start, dtype), dtype, device)
    # eager: start + step * i for the first half, end - step * (steps - 1 - i) for the second
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    step = (end - start) / (steps - 1)
    idx = prims.iota(steps, 0, 1, torch.int64, device)
    fidx = prims.convert_element_type(idx, compute)
    low = prims.add(prims.mul(fidx, step), float(start))
    back = prims.convert_element_type(prims.sub(prims.full((steps,), steps - 1, torch.int64, device), idx),
                                      compute)
    high = prims.sub(prims.full((steps,), float(end), compute, device), prims.mul(back, step))
    halfway = steps // 2
    out = prims.where(prims.lt(idx, halfway), low, high)
    return out if out.dtype == dtype else prims.convert_element_type(out, dtype)


@register(torch.logspace)
def logspace(start: Any, end: Any, steps: int, base: float = 10.0, **kwargs: Any) -> Any:
    dtype, device = _options("logspace", dict(kwargs))
    if not dtype.is_floating_point:
        raise NoDecomposition(f"logspace with dtype {dtype}")
    if is_tensor(base):
        raise NoDecomposition("logspace with a tensor base")
    exponents = linspace(start, end, steps, **kwargs)
    return prims.pow(prims.full(tuple(exponents.shape), float(base), dtype, device), exponents)


@register(torch.eye)
def eye(n: int, m: Any = None, **kwargs: Any) -> Any:
    if m is None or isinstance(m, (torch.dtype,)):
        m = n
    check(n >= 0, lambda: f"n must be greater or equal to 0, got {n}")
    check(m >= 0, lambda: f"m must be greater or equal to 0, got {m}")
    dtype, device = _options("eye", kwargs)
    rows = prims.broadcast_in_dim(prims.iota(n, 0, 1, torch.int64, device), (n, m), (0,))
    cols = prims.broadcast_in_dim(prims.iota(m, 0, 1, torch.int64, device), (n, m), (1,))
    return prims.convert_element_type(prims.eq(rows, cols), dtype)


# ---- random -------------------------------------------------------------------------------------------

def _float_dtype(dtype: torch.dtype, op: str) -> torch.dtype:
    check(dtype.is_floating_point or dtype.is_complex, lambda: f"{op} is not implemented for {dtype}",
          NotImplementedError)
    if dtype.is_complex:
        raise NoDecomposition(f"{op} with a complex dtype")
    return dtype


@register(torch.rand)
def rand(*size: Any, generator: Any = None, **kwargs: Any) -> Any:
    shape = _size(size, kwargs, "rand")
    dtype, device = _options("rand", kwargs)
    return prims.uniform(shape, 0.0, 1.0, _float_dtype(dtype, "rand"), device, generator)


@register(torch.randn)
def randn(*size: Any, generator: Any = None, **kwargs: Any) -> Any:
    shape = _size(size, kwargs, "randn")
    dtype, device = _options("randn", kwargs)
    return prims.normal(shape, 0.0, 1.0, _float_dtype(dtype, "randn"), device, generator)


@register(torch.rand_like)
def rand_like(a: Any, *, generator: Any = None, **kwargs: Any) -> Any:
    return _like(a, "rand_like", kwargs, lambda s, dt, dev: prims.uniform(s, 0.0, 1.0, _float_dtype(
        dt, "rand_like"), dev, generator))


@register(torch.randn_like)
def randn_like(a: Any, *, generator: Any = None, **kwargs: Any) -> Any:
    return _like(a, "randn_like", kwargs, lambda s, dt, dev: prims.normal(s, 0.0, 1.0, _float_dtype(
        dt, "randn_like"), dev, generator), contiguous_only=True)


def _randint_bounds(args: tuple, kwargs: dict) -> tuple:
    if "high" in kwargs:
        high = kwargs.pop("high")
        low = kwargs.pop("low", args[0] if args else 0)
        size = kwargs.pop("size", args[-1] if args and isinstance(args[-1], _Shape) else None)
    elif len(args) >= 3 or (len(args) == 2 and not isinstance(args[1], _Shape)):
        low, high, size = args[0], args[1], (args[2] if len(args) > 2 else kwargs.pop("size"))
    elif len(args) == 2:
        low, high, size = 0, args[0], args[1]
    else:
        low, high, size = kwargs.pop("low", 0), args[0], kwargs.pop("size")
    for v in (low, high):
        if is_tensor(v):
            raise NoDecomposition("randint with tensor bounds")
    return int(low), int(high), size


@register(torch.randint)
def randint(*args: Any, generator: Any = None, **kwargs: Any) -> Any:
    low, high, size = _randint_bounds(args, kwargs)
    shape = _size((size,), {}, "randint")
    dtype, device = _options("randint", kwargs, torch.int64 if kwargs.get("dtype") is None else None)
    if dtype == torch.bool or dtype.is_complex:
        raise NoDecomposition(f"randint with dtype {dtype}")
    return prims.randint(low, high, shape, dtype, device, generator)


@register(torch.randint_like)
def randint_like(a: Any, *args: Any, generator: Any = None, **kwargs: Any) -> Any:
    if len(args) == 1:
        low, high = kwargs.pop("low", 0), args[0]
    elif len(args) == 2:
        low, high = args
    else:
        low, high = kwargs.pop("low", 0), kwargs.pop("high")
    if is_tensor(low) or is_tensor(high):
        raise NoDecomposition("randint_like with tensor bounds")

    def make(s: tuple, dt: torch.dtype, dev: torch.device) -> Any:
        if dt == torch.bool or dt.is_complex:
            raise NoDecomposition(f"randint_like with dtype {dt}")
        return prims.randint(int(low), int(high), s, dt, dev, generator)
    return _like(a, "randint_like", kwargs, make)


@register(torch.bernoulli, torch.Tensor.bernoulli)
def bernoulli(a: Any, p: Any = None, *, generator: Any = None, out: Any = None) -> Any:
    if out is not None:
        raise NoDecomposition("bernoulli with out=")
    if is_tensor(p):
        raise NoDecomposition("bernoulli with a tensor p")
    check(a.dtype.is_floating_point, lambda: f"\"bernoulli_tensor_cpu_self_\" not implemented for "
          f"'{str(a.dtype).removeprefix('torch.')}'", NotImplementedError)
    if not a.meta.is_contiguous():
        raise NoDecomposition("bernoulli of a non-contiguous tensor (eager draws in its memory order)")
    return prims.bernoulli(a, None if p is None else float(p), generator)


def _normal_of_tensors(mean: Any, std: Any, generator: Any, kwargs: dict) -> Any:
    """normal with a tensor mean or std, drawn as eager draws it: standard normals (or N(0, std) for a
    number std) in the output's memory order, then scaled by std and shifted by mean."""
    if kwargs.pop("out", None) is not None:
        raise NoDecomposition("normal with out=")
    check(not kwargs, lambda: f"normal() got unexpected keyword arguments {sorted(kwargs)}", TypeError)
    tensors = [t for t in (mean, std) if is_tensor(t)]
    if any(t.dtype.is_complex for t in tensors):
        raise NoDecomposition("normal with complex mean or std")
    dtype = result_type(*tensors)
    _float_dtype(dtype, "normal")
    device = tensors[0].device
    if len(tensors) == 1:
        # eager draws into empty_like(the tensor): its memory order decides which value goes where
        if not tensors[0].meta.is_contiguous():
            raise NoDecomposition("normal with a non-contiguous mean or std (eager draws in memory order)")
        shape = tuple(tensors[0].shape)
    else:
        shape = tuple(torch.broadcast_shapes(tuple(mean.shape), tuple(std.shape)))
    if is_tensor(std):
        draws = prims.normal(shape, 0.0, 1.0, dtype, device, generator)
        out = draws * std + mean
        return prims.check_values(out, torch.all(std >= 0), "normal expects all elements of std >= 0.0")
    check(std >= 0, lambda: f"normal expects std >= 0.0, but found std {std}")
    return prims.normal(shape, 0.0, float(std), dtype, device, generator) + mean


@register(torch.normal)
def normal(mean: Any, std: Any = 1.0, size: Any = None, *, generator: Any = None, **kwargs: Any) -> Any:
    if (is_tensor(mean) or is_tensor(std)) and size is None:
        return _normal_of_tensors(mean, std, generator, kwargs)
    if is_tensor(mean) or is_tensor(std) or size is None:
        raise NoDecomposition("normal with tensor mean or std")
    check(std >= 0, lambda: f"normal expects std >= 0.0, but found std {std}")
    shape = _size((size,), {}, "normal")
    dtype, device = _options("normal", kwargs)
    return prims.normal(shape, float(mean), float(std), _float_dtype(dtype, "normal"), device, generator)


# ---- in-place random fills: the drawn tensor replaces the input (marked in-place) ------------------------

def _fill_target(a: Any, op: str, contiguous_only: bool) -> None:
    if not is_non_overlapping_and_dense(tuple(a.shape), tuple(a.stride())):
        raise NoDecomposition(f"{op} of a tensor with overlapping or non-dense memory")
    if contiguous_only and not a.meta.is_contiguous():
        raise NoDecomposition(f"{op} of a non-contiguous tensor (eager draws in another order)")


@register(torch.Tensor.uniform_)
def uniform_(a: Any, from_: float = 0.0, to: float = 1.0, *, generator: Any = None, **kwargs: Any) -> Any:
    low, high = kwargs.pop("from", from_), to
    check(not kwargs, lambda: f"uniform_() got unexpected arguments {sorted(kwargs)}", TypeError)
    check(low <= high,
          lambda: f"uniform_ expects to return a [from, to) range, but found from={low} > to={high}")
    _fill_target(a, "uniform_", contiguous_only=False)
    dtype = _float_dtype(a.dtype, "uniform_")
    return _like(a, "uniform_", {}, lambda s, dt, dev: prims.uniform(s, float(low), float(high), dtype, dev,
                                                                    generator))


@register(torch.Tensor.normal_)
def normal_(a: Any, mean: float = 0.0, std: float = 1.0, *, generator: Any = None) -> Any:
    check(std >= 0, lambda: f"normal expects std >= 0.0, but found std {std}")
    _fill_target(a, "normal_", contiguous_only=True)
    return prims.normal(tuple(a.shape), float(mean), float(std), _float_dtype(a.dtype, "normal_"), a.device,
                        generator)


@register(torch.Tensor.bernoulli_)
def bernoulli_(a: Any, p: Any = 0.5, *, generator: Any = None) -> Any:
    _fill_target(a, "bernoulli_", contiguous_only=True)
    if is_tensor(p):
        # eager's a.bernoulli_(p) draws as torch.bernoulli(p) when p matches a exactly
        if tuple(p.shape) != tuple(a.shape) or p.dtype != a.dtype or not p.meta.is_contiguous():
            raise NoDecomposition("bernoulli_ with a tensor p of another shape, dtype or layout")
        return prims.bernoulli(p, None, generator)
    check(0 <= p <= 1, lambda: f"bernoulli_ expects p to be in [0, 1], but got p={p}")
    if not a.dtype.is_floating_point:
        raise NoDecomposition(f"bernoulli_ of a {a.dtype} tensor")
    return prims.bernoulli(a, float(p), generator)


@register(torch.Tensor.random_)
def random_(a: Any, *args: Any, generator: Any = None, **kwargs: Any) -> Any:
    bounds = list(args)
    if "from" in kwargs:
        bounds = [kwargs.pop("from")] + bounds
    if "to" in kwargs:
        bounds.append(kwargs.pop("to"))
    if len(bounds) == 1:
        bounds = [0] + bounds
    if len(bounds) != 2 or bounds[1] is None or a.dtype == torch.bool:
        raise NoDecomposition("random_ without explicit bounds")
    _fill_target(a, "random_", contiguous_only=False)
    low, high = int(bounds[0]), int(bounds[1])
    return _like(a, "random_", {}, lambda s, dt, dev: prims.randint(low, high, s, a.dtype, dev, generator))


@register(torch.Tensor.fill_, torch.fill_, torch.fill)
def fill_(a: Any, value: Any) -> Any:
    """Tensor.fill_ (in-place) and torch.fill (a new tensor in a's layout)."""
    if is_tensor(value):
        check(value.ndim == 0, lambda: f"fill_ only supports 0-dimension value tensor but got tensor with "
              f"{value.ndim} dimensions.")
        value = value if value.dtype == a.dtype else prims.convert_element_type(value, a.dtype)
        return _like(a, "fill_", {}, lambda s, dt, dev: prims.clone(prims.broadcast_in_dim(value, s, ()),
                                                                     torch.contiguous_format))
    return _like(a, "fill_", {}, lambda s, dt, dev: prims.full(s, _fill_value(value, dt), dt, dev))


@register(torch.Tensor.zero_, torch.zero_)
def zero_(a: Any) -> Any:
    return _like(a, "zero_", {}, lambda s, dt, dev: prims.full(s, _fill_value(0, dt), dt, dev))


mark_inplace(torch.Tensor.uniform_, torch.Tensor.normal_, torch.Tensor.bernoulli_, torch.Tensor.random_,
             torch.Tensor.fill_, torch.fill_, torch.Tensor.zero_, torch.zero_)
