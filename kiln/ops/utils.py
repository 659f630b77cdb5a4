"""What decompositions share: torch's type promotion, broadcasting, dims, the elementwise wrapper, and the
`decomposition` decorator with the small helpers the elementwise, reduction and selection modules use.

`check`, `shape_text` and `wrap_dim` are the prims' own: decompositions import them from kiln.prims.registry.
This module imports no decomposition module, so every one of them may import it.
"""
from __future__ import annotations

import struct
from typing import Any, Callable, Sequence

import torch

from ..graph.symbolic import SymInt, same_sizes
from .. import prims
from ..graph import Proxy, TensorMeta
from ..graph.layout import preserve_strides, suggests_channels_last
from ..prims.registry import check, shape_text, wrap_dim
from .registry import NoDecomposition, register

Number = (bool, int, float, complex)


def is_tensor(v: Any) -> bool:
    return isinstance(v, (Proxy, torch.Tensor))


def wants_gradient(*values: Any) -> bool:
    """Grad mode is on and a value requires grad: a decomposition whose prims' gradients differ from eager's
    formula at a boundary or tie (relu at 0, clamp at its bounds) then routes the gradient as eager does."""
    return torch.is_grad_enabled() and any(is_tensor(v) and v.requires_grad for v in values)


def root_of_sum(s: Any, root: Callable[[Any], Any], source: Any) -> Any:
    """root(s) (sqrt, or pow(s, 1/p)) of a sum of powers or a variance of `source`. Where s == 0 (a zero
    vector's norm, the std of equal values) eager's gradient is 0; root's own derivative gives 0 * inf = NaN."""
    if not wants_gradient(source):
        return root(s)
    zero = s == 0
    return torch.where(zero, s * 0, root(torch.where(zero, s + 1, s)))


def is_number(v: Any) -> bool:
    return isinstance(v, Number) and not isinstance(v, torch.Tensor)


# ---- type promotion (torch's rules: dimensioned tensors > zero-dim tensors > Python numbers) --------------

def _category(dtype: torch.dtype | None) -> int:
    if dtype is None:
        return -1
    if dtype == torch.bool:
        return 0
    if dtype.is_complex:
        return 3
    return 2 if dtype.is_floating_point else 1


def _promote(a: torch.dtype | None, b: torch.dtype | None) -> torch.dtype | None:
    if a is None:
        return b
    if b is None:
        return a
    return torch.promote_types(a, b)


def _to_complex(dtype: torch.dtype) -> torch.dtype:
    return {torch.float64: torch.complex128, torch.float16: torch.complex32}.get(dtype, torch.complex64)


def _combine(higher: torch.dtype | None, lower: torch.dtype | None) -> torch.dtype | None:
    """Combine the results of two priority groups: the lower group counts only if its category is higher."""
    if higher is not None and higher.is_complex:
        return higher
    if lower is not None and lower.is_complex:
        if higher is not None and higher.is_floating_point:
            return _to_complex(higher)
        return lower
    if higher is not None and higher.is_floating_point:
        return higher
    if higher == torch.bool or (lower is not None and lower.is_floating_point):
        return _promote(higher, lower)
    return higher if higher is not None else lower


def scalar_dtype(value: Any) -> torch.dtype:
    if isinstance(value, bool):
        return torch.bool
    if isinstance(value, (int, SymInt)):
        return torch.int64
    if isinstance(value, float):
        return torch.get_default_dtype()
    if isinstance(value, complex):
        return _to_complex(torch.get_default_dtype())
    raise TypeError(f"expected a tensor or a number, got {type(value).__name__}")


def result_type(*args: Any) -> torch.dtype:
    """The dtype torch computes an elementwise op in, for tensors and Python numbers (torch.result_type)."""
    dim_result = zero_result = wrapped_result = None
    for a in args:
        if a is None:
            continue
        if is_tensor(a):
            if a.ndim > 0:
                dim_result = _promote(dim_result, a.dtype)
            else:
                zero_result = _promote(zero_result, a.dtype)
        elif isinstance(a, torch.dtype):
            dim_result = _promote(dim_result, a)
        else:
            wrapped_result = _promote(wrapped_result, scalar_dtype(a))
    result = _combine(dim_result, _combine(zero_result, wrapped_result))
    if result is None:
        raise TypeError("result_type needs at least one tensor or number")
    return result


def is_float_dtype(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


def computation_dtype(dtype: torch.dtype) -> torch.dtype:
    """Low-precision floats compute in float32 (as torch's CPU kernels do), then round back."""
    if dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    if dtype == torch.complex32:
        return torch.complex64
    return dtype


def can_cast(from_: torch.dtype, to: torch.dtype) -> bool:
    """torch.can_cast: same or lower category."""
    return _category(from_) <= _category(to)


# ---- conversion and broadcasting --------------------------------------------------------------------------

def convert(a: Any, dtype: torch.dtype) -> Any:
    """A tensor or number converted to dtype (numbers stay Python numbers of the right kind)."""
    if is_tensor(a):
        return a if a.dtype == dtype else prims.convert_element_type(a, dtype)
    if dtype == torch.bool:
        return bool(a)
    if dtype.is_complex:
        return complex(a)
    if isinstance(a, SymInt):  # a symbolic size stays one (float() would specialize it); kernels convert it
        return a
    if dtype.is_floating_point:
        return float(a) if not isinstance(a, complex) else a
    return int(a) if not isinstance(a, (float, complex)) else a


def broadcast_shapes(*shapes: Sequence[Any]) -> tuple:
    """torch.broadcast_shapes, with eager's error message."""
    ndim = max((len(s) for s in shapes), default=0)
    result: list[Any] = [1] * ndim
    for shape in shapes:
        offset = ndim - len(shape)
        for i in reversed(range(len(shape))):  # from the last dim, so errors name the dim eager names
            size = shape[i]
            j = offset + i
            # asked so that a symbolic size that may be 1 is not asked about where the answer is the same
            # either way: the same size again, or a literal 1 so far (the result is the size, 1 or not)
            if same_sizes((size,), (result[j],)):
                continue
            if type(result[j]) is int and result[j] == 1:
                result[j] = size
                continue
            if size == 1:
                continue
            if result[j] == 1:
                result[j] = size
            elif result[j] != size:
                raise RuntimeError(f"The size of tensor a ({result[j]}) must match the size of tensor b "
                                   f"({size}) at non-singleton dimension {j}")
    # a 0-size dim wins over a size-1 dim
    for shape in shapes:
        offset = ndim - len(shape)
        for i, size in enumerate(shape):
            if size == 0:
                result[offset + i] = 0
    return tuple(result)


def broadcast_to(a: Any, shape: Sequence[Any]) -> Any:
    """Broadcast a tensor to shape (a view); numbers stay numbers."""
    if not is_tensor(a):
        return a
    shape = tuple(shape)
    if same_sizes(a.shape, shape):
        return a
    check(len(shape) >= a.ndim, lambda: f"cannot broadcast {shape_text(a)} to {list(shape)}")
    offset = len(shape) - a.ndim
    return prims.broadcast_in_dim(a, shape, tuple(range(offset, len(shape))))


def broadcast(*args: Any) -> list[Any]:
    shape = broadcast_shapes(*[a.shape for a in args if is_tensor(a)])
    return [broadcast_to(a, shape) for a in args]


def canonical_dims(dims: Any, ndim: int) -> tuple[int, ...]:
    """Dims as a sorted tuple of non-negative ints; None or () mean every dim."""
    if dims is None:
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = (dims,)
    dims = tuple(wrap_dim(d, ndim) for d in dims)
    check(len(set(dims)) == len(dims), lambda: f"dim {dims} appears multiple times in the list of dims")
    return tuple(sorted(dims)) if dims else tuple(range(ndim))


# ---- the elementwise wrapper --------------------------------------------------------------------------

def elementwise(prim: Any, *args: Any, promotion: str = "default", name: str | None = None) -> Any:
    """Apply an elementwise prim with torch's promotion and broadcasting.

    promotion:
      default       compute and return in the promoted dtype (low-precision floats compute in float32)
      int_to_float  like default, but integer and bool inputs compute in the default float dtype
      always_bool   compute in the promoted dtype, the prim returns bool (comparisons)
      no_opmath     compute in the promoted dtype exactly, no float32 upcast
    """
    check(any(is_tensor(a) for a in args), lambda: f"{name or prim.name}: expected a tensor argument",
          TypeError)
    dtype = result_type(*args)
    if promotion == "int_to_float" and not is_float_dtype(dtype):
        dtype = torch.get_default_dtype()
    compute = dtype if promotion == "no_opmath" else computation_dtype(dtype)
    # through the result dtype first: a float16 operand of a bfloat16 op rounds to bfloat16, as eager
    converted = [convert(convert(a, dtype), compute) for a in args]
    out = prim(*broadcast(*converted))
    if promotion == "always_bool":
        return out
    return convert(out, dtype) if out.dtype != dtype else out


def eager_format(value: Any, like: Any) -> Any:
    """`value` laid out as eager's kernels allocate a result computed from `like` (its
    suggest_memory_format): channels-last when `like`'s strides suggest it (4-d or 5-d), else contiguous.
    A copy only where `value` is laid out otherwise, which a compiled graph folds into the kernel writing
    it."""
    memory_format = torch.contiguous_format
    if value.ndim == like.ndim and suggests_channels_last(like.meta.shape, like.meta.strides):
        memory_format = torch.channels_last if like.ndim == 4 else torch.channels_last_3d
    return value.contiguous(memory_format=memory_format)


def preserve_layout(value: Any, like: Any) -> Any:
    """`value` laid out as eager's empty_like(like) (preserve_format): like's strides when dense, else dense
    in its dim order. For ops whose eager kernel clones its input and writes into the clone (the scatters,
    index_put, put). A copy only where `value` is laid out otherwise."""
    meta, have = like.meta, value.meta
    if not all(type(v) is int for v in (*meta.shape, *meta.strides)):
        return value.contiguous()
    strides = preserve_strides(meta.shape, meta.strides)
    if tuple(have.strides) == strides or have.with_(strides=strides).is_contiguous() and have.is_contiguous():
        return value
    order = sorted(range(len(strides)), key=lambda d: (-strides[d], -meta.shape[d], d))  # outermost first
    return dense_in_order(value, tuple(order))


def dense_in_order(value: Any, order: Sequence[int]) -> Any:
    """A copy of `value` dense in dim `order` (outermost first): a contiguous copy of the permuted dims,
    permuted back (a remap in a compiled graph)."""
    inverse = tuple(order.index(d) for d in range(len(order)))
    copy = prims.clone(prims.permute(value, tuple(order)), torch.contiguous_format)
    return prims.permute(copy, inverse)


def meta_like(a: Any) -> TensorMeta:
    return a.meta if isinstance(a, Proxy) else TensorMeta.of(a)


# ---- writing decompositions -------------------------------------------------------------------------------

def decomposition(*targets: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`register`, skipping targets this torch build lacks (None) and refusing `out=` (a fallback)."""
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            if kwargs.pop("out", None) is not None:
                raise NoDecomposition(f"{fn.__name__} with out=")
            return fn(*args, **kwargs)
        run.__name__ = fn.__name__
        run.__qualname__ = fn.__qualname__
        run.__module__ = fn.__module__
        run.__doc__ = fn.__doc__
        register(*targets)(run)
        return run
    return wrap


def method(name: str) -> Any:
    """The Tensor method `name`, or None where this torch build lacks it (`decomposition` skips None)."""
    return getattr(torch.Tensor, name, None)


def refuse_complex(op: str, *args: Any) -> None:
    """Leave `op` to eager (NoDecomposition) when any operand is complex."""
    if any(is_tensor(a) and a.dtype.is_complex for a in args) or any(isinstance(a, complex) for a in args):
        raise NoDecomposition(f"{op} of complex values")


def in_dtype(value: float, dtype: torch.dtype) -> float:
    """A Python float rounded to float32 or float64 (constants eager's kernels compute in that type)."""
    return struct.unpack("f", struct.pack("f", value))[0] if dtype == torch.float32 else value


def to_compute(v: Any, dtype: torch.dtype) -> Any:
    """An operand of an op whose result dtype is `dtype`, in the dtype the op computes in: through `dtype`
    first (a float16 operand of a bfloat16 op rounds to bfloat16), then upcast (float16 -> float32)."""
    return convert(convert(v, dtype), computation_dtype(dtype))


def scalar_type_name(dtype: torch.dtype) -> str:
    """The dtype as eager's kernel error messages spell it ("Long", "Float", ...)."""
    return {torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char",
            torch.uint8: "Byte", torch.bool: "Bool", torch.float32: "Float", torch.float64: "Double",
            torch.float16: "Half", torch.bfloat16: "BFloat16"}.get(dtype, str(dtype))


def full_like(t: Any, value: Any, dtype: torch.dtype) -> Any:
    """A tensor of t's shape filled with a Python number (no creation prim needed: an all-true mask)."""
    mask = prims.convert_element_type(t, torch.bool)
    return prims.where(prims.eq(mask, mask), convert(value, dtype), prims.convert_element_type(t, dtype))


def materialize(*args: Any) -> list[Any]:
    """Operands with Python numbers replaced by full tensors of the first tensor's shape and dtype."""
    like = next(a for a in args if is_tensor(a))
    return [a if is_tensor(a) else full_like(like, a, like.dtype) for a in args]


def to_bool(a: Any) -> Any:
    """A truth value: a bool tensor (nonzero elements) or a Python bool."""
    if not is_tensor(a):
        return bool(a)
    return a if a.dtype == torch.bool else prims.ne(a, 0)


def checked(valid: Any, value: Any, message: str) -> Any:
    """value, once the graph has checked at run time that the bool tensor `valid` holds everywhere; where it
    does not, running the graph raises RuntimeError(message), as eager's check on the values does."""
    return prims.check_values(value, valid, message)
