"""Decompositions of matrix products (matmul in every rank case, mm, bmm, mv, dot, inner, outer, the addmm
family, tensordot, einsum), convolutions and attention onto the extern prims (mm, bmm, convolution, sdpa),
with torch's rank cases, broadcasting and argument handling.

Other torch.linalg ops (svd, qr, solve, ...) have no decomposition: they run as fallbacks.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F

from .. import prims
from ..prims.registry import check, meta_of, shape_text
from . import conv_gemm, nn_attention
from .registry import NoDecomposition, register
from .utils import broadcast_shapes, broadcast_to, computation_dtype, convert, is_tensor
from ..graph import torch_internals, traced_flag


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _same_dtype(op: str, *tensors: Any) -> None:
    first = tensors[0]
    for t in tensors[1:]:
        check(t.dtype == first.dtype, lambda: f"{op}: expected m1 and m2 to have the same dtype, but got: "
              f"{_dtype_name(first.dtype)} != {_dtype_name(t.dtype)}")


def _prod(sizes: Sequence[Any]) -> Any:
    total: Any = 1
    for s in sizes:
        total = total * s
    return total


# ---- matrix products ------------------------------------------------------------------------------------

@register(torch.mm, torch.Tensor.mm)
def mm(a: Any, b: Any) -> Any:
    return prims.mm(a, b)


@register(torch.bmm, torch.Tensor.bmm)
def bmm(a: Any, b: Any) -> Any:
    return prims.bmm(a, b)


@register(torch.dot, torch.Tensor.dot)
def dot(a: Any, b: Any) -> Any:
    check(a.ndim == 1 and b.ndim == 1,
          lambda: f"1D tensors expected, but got {a.ndim}D and {b.ndim}D tensors")
    check(a.shape[0] == b.shape[0],
          lambda: f"inconsistent tensor size, expected tensor [{a.shape[0]}] and src [{b.shape[0]}] to have "
                  f"the same number of elements, but got {a.shape[0]} and {b.shape[0]} elements respectively")
    check(a.dtype == b.dtype, lambda: f"dot : expected both vectors to have same dtype, but found "
          f"{a.dtype} and {b.dtype}")
    return prims.mm(a.unsqueeze(0), b.unsqueeze(1)).reshape(())


@register(torch.vdot, torch.Tensor.vdot)
def vdot(a: Any, b: Any) -> Any:
    if a.dtype.is_complex or b.dtype.is_complex:
        raise NoDecomposition("vdot of complex tensors")
    return dot(a, b)


@register(torch.mv, torch.Tensor.mv)
def mv(a: Any, v: Any) -> Any:
    check(a.ndim == 2 and v.ndim == 1, lambda: f"vector + matrix @ vector expected, got {a.ndim}, {a.ndim}, "
          f"{v.ndim}")
    check(a.shape[1] == v.shape[0], lambda: f"size mismatch, got input ({a.shape[0]}), mat "
          f"({a.shape[0]}x{a.shape[1]}), vec ({v.shape[0]})")
    return prims.mm(a, v.unsqueeze(1)).squeeze(1)


@register(torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.linalg.matmul)
def matmul(a: Any, b: Any) -> Any:
    """torch.matmul for every rank: dot, mv, mm, and batched products with broadcast batch dims."""
    check(a.ndim >= 1 and b.ndim >= 1, lambda: f"both arguments to matmul need to be at least 1D, but they "
          f"are {a.ndim}D and {b.ndim}D")
    _same_dtype("matmul", a, b)
    if a.ndim == 1 and b.ndim == 1:
        return dot(a, b)
    if a.ndim == 2 and b.ndim == 1:
        return mv(a, b)
    if a.ndim == 1 and b.ndim == 2:
        return prims.mm(a.unsqueeze(0), b).squeeze(0)
    if a.ndim == 2 and b.ndim == 2:
        return prims.mm(a, b)
    if a.ndim >= 3 and b.ndim <= 2:
        # fold a's batch dims into its rows: one mm
        k = a.shape[-1]
        rows = a.reshape(_prod(a.shape[:-1]), k)
        if b.ndim == 1:
            return prims.mm(rows, b.unsqueeze(1)).reshape(a.shape[:-1])
        return prims.mm(rows, b).reshape((*a.shape[:-1], b.shape[-1]))
    # batched: broadcast the batch dims, then one bmm
    a2 = a.unsqueeze(0) if a.ndim == 1 else a  # [1, k]
    b2 = b.unsqueeze(-1) if b.ndim == 1 else b  # [k, 1]
    n, k = a2.shape[-2], a2.shape[-1]
    k2, m = b2.shape[-2], b2.shape[-1]
    check(k == k2, lambda: f"matmul: mat1 and mat2 shapes cannot be multiplied ({n}x{k} and {k2}x{m}) "
          f"(operands {shape_text(a)} and {shape_text(b)})")
    batch = broadcast_shapes(tuple(a2.shape[:-2]), tuple(b2.shape[:-2]))
    count = _prod(batch)
    a3 = broadcast_to(a2, (*batch, n, k)).reshape(count, n, k)
    b3 = broadcast_to(b2, (*batch, k, m)).reshape(count, k, m)
    out = prims.bmm(a3, b3)
    shape = list(batch)
    if a.ndim > 1:
        shape.append(n)
    if b.ndim > 1:
        shape.append(m)
    return out.reshape(tuple(shape))


@register(torch.Tensor.__rmatmul__)
def rmatmul(a: Any, b: Any) -> Any:
    return matmul(b, a)


@register(torch.linalg.vecdot)
def vecdot(x: Any, y: Any, *, dim: int = -1) -> Any:
    """sum(conj(x) * y) over dim, with broadcasting (complex inputs fall back)."""
    check(x.dtype == y.dtype, lambda: f"linalg.vecdot: Expected x and y to have the same dtype, but found "
          f"x of type {x.dtype} and y of type {y.dtype} instead")
    if x.dtype.is_complex:
        raise NoDecomposition("linalg.vecdot of complex tensors")
    return (x * y).sum(dim)


@register(torch.inner, torch.Tensor.inner)
def inner(a: Any, b: Any) -> Any:
    if a.ndim == 0 or b.ndim == 0:
        return a * b
    check(a.shape[-1] == b.shape[-1], lambda: f"inner() the last dimension must match on both input tensors "
          f"but got shapes {shape_text(a)} and {shape_text(b)}")
    _same_dtype("inner", a, b)
    k = a.shape[-1]
    out = prims.mm(a.reshape(-1, k), b.reshape(-1, k).t())
    return out.reshape((*a.shape[:-1], *b.shape[:-1]))


@register(torch.outer, torch.ger, torch.Tensor.outer, torch.Tensor.ger)
def outer(a: Any, b: Any) -> Any:
    check(a.ndim == 1 and b.ndim == 1, lambda: f"outer: expected 1-D vectors, got {shape_text(a)} and "
          f"{shape_text(b)}")
    return a.unsqueeze(1) * b.unsqueeze(0)


def _scale(x: Any, factor: Any) -> Any:
    if isinstance(factor, (int, float)) and not isinstance(factor, bool) and factor == 1:
        return x
    return x * factor


def _scalars(op: str, dtype: torch.dtype, beta: Any, alpha: Any) -> tuple[Any, Any]:
    """beta and alpha as eager uses them: integer tensors truncate float factors (addr refuses them)."""
    out = []
    for name, value in (("beta", beta), ("alpha", alpha)):
        if is_tensor(value):
            raise NoDecomposition(f"{op} with a tensor {name}")
        check(not isinstance(value, complex) or dtype.is_complex,
              lambda: f"{op}: argument {name} must not be complex for non-complex input tensors", ValueError)
        if dtype == torch.bool:
            raise NoDecomposition(f"{op} of bool tensors")
        if not (dtype.is_floating_point or dtype.is_complex) and isinstance(value, float):
            check(op != "addr", lambda: f"For integral input tensors, argument {name} must not be a floating "
                  "point number.")
            value = int(value)
        out.append(value)
    return out[0], out[1]


def _add_scaled(op: str, inp: Any, product: Any, operands: Sequence[Any], beta: Any, alpha: Any) -> Any:
    """beta * inp + alpha * product(*operands), where beta == 0 ignores inp (its NaNs too), as eager does.

    Half-precision operands compute in float32 and round once at the end, as eager's fused kernels do.
    """
    dtype = operands[0].dtype
    beta, alpha = _scalars(op, dtype, beta, alpha)
    check(inp.dtype == dtype, lambda: f"{op}: self and mat2 must have the same dtype, but got "
          f"{_dtype_name(inp.dtype)} and {_dtype_name(dtype)}")
    compute = computation_dtype(dtype)
    out = product(*[convert(o, compute) for o in operands])
    shape = tuple(out.shape)
    try:
        inp = broadcast_to(inp, shape)
    except RuntimeError:
        raise RuntimeError(f"{op}: the input {shape_text(inp)} cannot broadcast to the product's shape "
                           f"{list(shape)}") from None
    out = _scale(out, alpha)
    if isinstance(beta, bool) or beta != 0:
        out = _scale(convert(inp, compute), beta) + out
    return convert(out, dtype).contiguous()  # eager allocates these results contiguous


def _half_bias(bias: Any, mat2: Any) -> bool:
    """A float16/bfloat16 bias vector of the product's width: eager adds it inside its half-precision gemm
    (float32 accumulation, one rounding), which is the prim addmm; float32 keeps mm + add, which fuses the
    add into the kernel reading the product (lower.patterns folds it back into a BLAS addmm where not)."""
    dtype = meta_of(bias).dtype
    return computation_dtype(dtype) != dtype and dtype == meta_of(mat2).dtype and bias.ndim == 1 and \
        mat2.ndim == 2 and bias.shape[0] == mat2.shape[1]


def _half_gemm_pays(rows: Any, k: Any, m: Any) -> bool:
    """Whether a half-precision product of this size runs as one half-precision library call (config
    half_addmm_min_macs; symbolic sizes: yes)."""
    if not all(isinstance(s, int) for s in (rows, k, m)):
        return True
    return rows * k * m >= traced_flag("half_addmm_min_macs")


def half_linear(input: Any, w: Any, bias: Any) -> Any:
    """F.linear(input, w.t(), bias) in float16/bfloat16 (w the [k, m] transposed weight, bias [m]) as eager
    runs it: a 2-D input, or a contiguous one flattened to rows, is one half-precision addmm; any other input
    of 3 or more dims is matmul, then the bias added (each rounded to the half dtype). None (the caller's
    float32 product plus the bias, rounded once) for a 1-D input, other shapes, and products too small for
    the half-precision call to pay (`_half_gemm_pays`)."""
    if not (_half_bias(bias, w) and meta_of(input).dtype == meta_of(w).dtype) or input.ndim < 2 or \
            not _half_gemm_pays(_prod(input.shape[:-1]), w.shape[0], w.shape[1]):
        return None
    if input.ndim == 2:
        return prims.addmm(bias, input, w)
    if input.ndim >= 3 and meta_of(input).is_contiguous():
        rows = input.reshape(_prod(input.shape[:-1]), input.shape[-1])
        return prims.addmm(bias, rows, w).reshape((*input.shape[:-1], w.shape[1]))
    return matmul(input, w) + bias


@register(torch.addmm, torch.Tensor.addmm)
def addmm(inp: Any, mat1: Any, mat2: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
    check(mat1.dtype == mat2.dtype and inp.dtype == mat1.dtype,
          lambda: f"addmm: self and mat2 must have the same dtype, but got {_dtype_name(inp.dtype)} and "
                  f"{_dtype_name(mat2.dtype)}")
    prims.mm.meta(mat1, mat2)  # shape errors name the operands' own shapes
    if type(beta) in (int, float) and type(alpha) in (int, float) and beta == 1 and alpha == 1 and \
            _half_bias(inp, mat2) and _half_gemm_pays(mat1.shape[0], mat1.shape[1], mat2.shape[1]):
        return prims.addmm(inp, mat1, mat2)
    return _add_scaled("addmm", inp, prims.mm, (mat1, mat2), beta, alpha)


@register(torch.addmv, torch.Tensor.addmv)
def addmv(inp: Any, mat: Any, vec: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
    _same_dtype("addmv", mat, vec)
    return _add_scaled("addmv", inp, mv, (mat, vec), beta, alpha)


@register(torch.addr, torch.Tensor.addr)
def addr(inp: Any, vec1: Any, vec2: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
    check(vec1.ndim == 1 and vec2.ndim == 1, lambda: f"addr: expected 1-D vectors, got {shape_text(vec1)} "
          f"and {shape_text(vec2)}")
    if inp.dtype == torch.bool or vec1.dtype != inp.dtype or vec2.dtype != inp.dtype:
        raise NoDecomposition("addr with bool or mixed dtypes")
    beta, alpha = _scalars("addr", inp.dtype, beta, alpha)
    # eager's kernel: self * beta + alpha * vec1 * vec2, each op rounded to the tensors' dtype, in this order,
    # with beta and alpha first converted to that dtype
    if computation_dtype(inp.dtype) != inp.dtype:
        beta, alpha = (float(torch.tensor(v, dtype=inp.dtype)) for v in (beta, alpha))
    out = outer(_scale(vec1, alpha), vec2)
    try:
        inp = broadcast_to(inp, tuple(out.shape))
    except RuntimeError:
        raise RuntimeError(f"addr: the input {shape_text(inp)} cannot broadcast to the outer product's shape "
                           f"{list(out.shape)}") from None
    if isinstance(beta, bool) or beta != 0:
        out = _scale(inp, beta) + out
    return out


@register(torch.baddbmm, torch.Tensor.baddbmm)
def baddbmm(inp: Any, batch1: Any, batch2: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
    prims.bmm.meta(batch1, batch2)
    return _add_scaled("baddbmm", inp, prims.bmm, (batch1, batch2), beta, alpha)


@register(torch.addbmm, torch.Tensor.addbmm)
def addbmm(inp: Any, batch1: Any, batch2: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
    """inp + sum over the batch of batch1 @ batch2, as one mm over [n, B*k] @ [B*k, m]."""
    check(batch1.ndim == 3 and batch2.ndim == 3, lambda: f"addbmm: batch1 and batch2 must be 3D tensors, got "
          f"{shape_text(batch1)} and {shape_text(batch2)}")
    b, n, k = batch1.shape
    b2, k2, m = batch2.shape
    check(b == b2, lambda: f"addbmm: batch1 and batch2 must have same number of batches, got {b} and {b2}")
    check(k == k2, lambda: f"addbmm: Incompatible matrix sizes for bmm ({n}x{k} and {k2}x{m})")
    _same_dtype("addbmm", batch1, batch2)
    if computation_dtype(inp.dtype) != inp.dtype and b > 0:
        # eager accumulates one addmm per batch, rounding to the half-precision dtype after each
        out = inp
        for i in range(b):
            out = addmm(out, batch1.select(0, i), batch2.select(0, i), beta=beta if i == 0 else 1,
                        alpha=alpha)
        return out

    def product(x: Any, y: Any) -> Any:
        return prims.mm(x.transpose(0, 1).reshape(n, b * k), y.reshape(b * k, m))
    return _add_scaled("addbmm", inp, product, (batch1, batch2), beta, alpha)


def _chain_order(sizes: list[Any]) -> list[list[int]]:
    """The split points of the cheapest parenthesization of a matrix chain (eager's dynamic program)."""
    n = len(sizes) - 1
    cost = [[0] * n for _ in range(n)]
    split = [[0] * n for _ in range(n)]
    for length in range(1, n):
        for i in range(n - length):
            j = i + length
            cost[i][j] = None
            for k in range(i, j):
                q = cost[i][k] + cost[k + 1][j] + sizes[i] * sizes[k + 1] * sizes[j + 1]
                if cost[i][j] is None or q < cost[i][j]:
                    cost[i][j], split[i][j] = q, k
    return split


def _chain(mats: list[Any], split: list[list[int]], i: int, j: int) -> Any:
    if i == j:
        return mats[i]
    return prims.mm(_chain(mats, split, i, split[i][j]), _chain(mats, split, split[i][j] + 1, j))


@register(torch.linalg.multi_dot)
def multi_dot(tensors: Sequence[Any], *, out: Any = None) -> Any:
    """A chain of mm in eager's order (cheapest parenthesization); a 1-D first or last operand is a vector."""
    mats = list(tensors)
    if out is not None or len(mats) < 2 or any(m.dtype != mats[0].dtype for m in mats):
        raise NoDecomposition("multi_dot with out=, fewer than two tensors or mixed dtypes")
    first_1d, last_1d = mats[0].ndim == 1, mats[-1].ndim == 1
    if first_1d:
        mats[0] = mats[0].unsqueeze(0)
    if last_1d:
        mats[-1] = mats[-1].unsqueeze(1)
    if any(m.ndim != 2 for m in mats) or any(a.shape[1] != b.shape[0] for a, b in zip(mats, mats[1:])):
        raise NoDecomposition("multi_dot of incompatible shapes")  # eager raises its own error
    if len(mats) == 2:
        result = prims.mm(mats[0], mats[1])
    elif len(mats) == 3:
        a, b, c, d = mats[0].shape[0], mats[1].shape[0], mats[2].shape[0], mats[2].shape[1]
        if a * c * (b + d) > b * d * (a + c):
            result = prims.mm(mats[0], prims.mm(mats[1], mats[2]))
        else:
            result = prims.mm(prims.mm(mats[0], mats[1]), mats[2])
    else:
        sizes = [m.shape[0] for m in mats] + [mats[-1].shape[1]]
        result = _chain(mats, _chain_order(sizes), 0, len(mats) - 1)
    if first_1d and last_1d:
        return result.reshape(())
    if first_1d:
        return result.squeeze(0)
    if last_1d:
        return result.squeeze(1)
    return result


@register(torch.chain_matmul)
def chain_matmul(*matrices: Any, out: Any = None) -> Any:
    if len(matrices) < 2 or any(m.ndim != 2 for m in matrices):
        raise NoDecomposition("chain_matmul of one matrix or of non-matrices")
    return multi_dot(matrices, out=out)


@register(torch.tensordot)
def tensordot(a: Any, b: Any, dims: Any = 2, out: Any = None) -> Any:
    """Contract the given dims of a and b with one mm (permute, reshape, mm, reshape)."""
    if out is not None or is_tensor(dims):
        raise NoDecomposition("tensordot with out= or tensor dims")
    if isinstance(dims, int):
        check(dims >= 0, lambda: f"tensordot expects dims >= 0, but got dims={dims}")
        check(dims <= a.ndim and dims <= b.ndim,
              lambda: f"tensordot expects dims < ndim_a or ndim_b, but got dims={dims}")
        dims_a = list(range(a.ndim - dims, a.ndim))
        dims_b = list(range(dims))
    else:
        dims_a, dims_b = dims
        dims_a = [dims_a] if isinstance(dims_a, int) else list(dims_a)
        dims_b = [dims_b] if isinstance(dims_b, int) else list(dims_b)
    check(len(dims_a) == len(dims_b), lambda: f"both dimension lists should have same length, got "
          f"{dims_a} and {dims_b}")
    dims_a = [prims.wrap_dim(d, a.ndim) for d in dims_a]
    dims_b = [prims.wrap_dim(d, b.ndim) for d in dims_b]
    for da, db in zip(dims_a, dims_b):
        # eager broadcasts a contracted dim of size 1 against the other operand's
        if a.shape[da] == 1 and b.shape[db] != 1:
            a = broadcast_to(a, tuple(b.shape[db] if d == da else s for d, s in enumerate(a.shape)))
        elif b.shape[db] == 1 and a.shape[da] != 1:
            b = broadcast_to(b, tuple(a.shape[da] if d == db else s for d, s in enumerate(b.shape)))
        check(a.shape[da] == b.shape[db], lambda: f"contracted dimensions need to match, but first has size "
              f"{a.shape[da]} in dim {da} and second has size {b.shape[db]} in dim {db}")
    _same_dtype("tensordot", a, b)
    free_a = [d for d in range(a.ndim) if d not in dims_a]
    free_b = [d for d in range(b.ndim) if d not in dims_b]
    k = _prod([a.shape[d] for d in dims_a])
    lhs = a.permute(*free_a, *dims_a).reshape(_prod([a.shape[d] for d in free_a]), k)
    rhs = b.permute(*dims_b, *free_b).reshape(k, _prod([b.shape[d] for d in free_b]))
    out_shape = tuple(a.shape[d] for d in free_a) + tuple(b.shape[d] for d in free_b)
    return prims.mm(lhs, rhs).reshape(out_shape)

# ---- convolution ----------------------------------------------------------------------------------------

def _expand(name: str, what: str, value: Any, n: int) -> list[int]:
    if isinstance(value, int):
        return [value] * n
    value = list(value)
    if len(value) == 1 and n > 1:
        return value * n
    check(len(value) == n, lambda: f"{name}: expected {what} to be a single integer value or a list of {n} "
          f"values to match the convolution dimensions, but got {what}={value}")
    return value


def _convolution(name: str, x: Any, w: Any, bias: Any, stride: Any, padding: Any, dilation: Any,
                 transposed: bool, output_padding: Any, groups: int) -> Any:
    n = w.ndim - 2
    check(n >= 1, lambda: f"{name}: weight should have at least three dimensions, got {shape_text(w)}")
    stride = _expand(name, "stride", stride, n)
    dilation = _expand(name, "dilation", dilation, n)
    output_padding = _expand(name, "output_padding", output_padding, n)
    if isinstance(padding, str):
        check(padding in ("same", "valid"), lambda: f"Invalid padding string: '{padding}'")
        check(not transposed, lambda: f"{name}: string padding is not supported for transposed convolutions")
        if padding == "valid":
            padding = [0] * n
        else:
            check(all(s == 1 for s in stride), lambda: "padding='same' is not supported for strided "
                  "convolutions")
            totals = [dilation[i] * (w.shape[2 + i] - 1) for i in range(n)]
            padding = [t // 2 for t in totals]
            extra = [t - 2 * p for t, p in zip(totals, padding)]
            if any(extra):
                # odd total padding: the extra element goes on the right, as eager pads
                pad: list[int] = []
                for e in reversed(extra):
                    pad += [0, e]
                x = F.pad(x, pad)
    else:
        padding = _expand(name, "padding", padding, n)
    if conv_gemm.eligible(x, w, transposed, groups, stride, padding, dilation):
        return conv_gemm.convolution(x, w, bias, stride, padding, dilation, groups)
    return prims.convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups)


def _batched(name: str, n: int, x: Any, w: Any, fn: Any) -> Any:
    """Run fn on a batched input; an unbatched input gets a batch dim of 1 and loses it after."""
    check(x.ndim in (n + 1, n + 2), lambda: f"Expected {n + 1}D (unbatched) or {n + 2}D (batched) input to "
          f"{name}, but got input of size: {shape_text(x)}")
    if x.ndim == n + 1:
        return fn(x.unsqueeze(0)).squeeze(0)
    return fn(x)


def _conv_nd(n: int) -> Any:
    name = f"conv{n}d"

    def conv(input: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
             dilation: Any = 1, groups: int = 1) -> Any:
        return _batched(name, n, input, weight, lambda x: _convolution(
            name, x, weight, bias, stride, padding, dilation, False, 0, groups))
    conv.__name__ = name
    return conv


def _conv_transpose_nd(n: int) -> Any:
    name = f"conv_transpose{n}d"

    def conv_transpose(input: Any, weight: Any, bias: Any = None, stride: Any = 1,
                       padding: Any = 0, output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Any:
        if isinstance(padding, str):
            raise NoDecomposition(f"{name} with string padding")
        return _batched(name, n, input, weight, lambda x: _convolution(
            name, x, weight, bias, stride, padding, dilation, True, output_padding, groups))
    conv_transpose.__name__ = name
    return conv_transpose


for _n in (1, 2, 3):
    register(getattr(torch, f"conv{_n}d"), getattr(F, f"conv{_n}d"))(_conv_nd(_n))
    register(getattr(torch, f"conv_transpose{_n}d"),
             getattr(F, f"conv_transpose{_n}d"))(_conv_transpose_nd(_n))


@register(torch.convolution, torch.ops.aten.convolution.default)
def convolution(input: Any, weight: Any, bias: Any, stride: Sequence[int], padding: Sequence[int],
                dilation: Sequence[int], transposed: bool, output_padding: Sequence[int], groups: int) -> Any:
    n = weight.ndim - 2
    if input.ndim == n + 1:
        raise NoDecomposition("torch.convolution of an unbatched input")
    return _convolution("convolution", input, weight, bias, stride, padding, dilation, transposed,
                        output_padding, groups)


# ---- attention ------------------------------------------------------------------------------------------

@register(F.scaled_dot_product_attention)
def scaled_dot_product_attention(query: Any, key: Any, value: Any, attn_mask: Any = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Any:
    """softmax(q @ k^T * scale + mask) @ v: the sdpa prim, or with dropout eager's CPU math path op for op."""
    check(query.ndim >= 2 and key.ndim >= 2 and value.ndim >= 2,
          lambda: f"Expected query, key, and value to all be  at least 2 dimensional, but got query.dim: "
                  f"{query.ndim} key.dim: {key.ndim} and value.dim: {value.ndim} instead.")
    if enable_gqa and not (query.ndim == key.ndim == value.ndim):
        raise NoDecomposition("scaled_dot_product_attention with enable_gqa and mixed ranks")
    if attn_mask is not None:
        check(not is_causal, lambda: "_scaled_dot_product_attention: Explicit attn_mask should not be set "
              "when is_causal=True")
        if attn_mask.dtype.is_floating_point and attn_mask.dtype != query.dtype:
            raise NoDecomposition("scaled_dot_product_attention with a mask of another float dtype")
        check(attn_mask.dtype in (torch.bool, query.dtype),
              lambda: f"Expected attn_mask dtype to be bool or float or to match query dtype, but got "
                      f"attn_mask.dtype: {attn_mask.dtype} and  query.dtype: {query.dtype} instead.")
    if dropout_p != 0.0:
        if enable_gqa:
            raise NoDecomposition("scaled_dot_product_attention with dropout and enable_gqa")
        return nn_attention.attention_with_dropout(query, key, value, _additive_mask(attn_mask, query),
                                                   float(dropout_p), is_causal, scale)
    flash = _runs_flash(query, key, value, attn_mask, is_causal, scale, enable_gqa)
    q, k, v = query, key, value
    if not enable_gqa or q.ndim < 3:
        batch = broadcast_shapes(tuple(q.shape[:-2]), tuple(k.shape[:-2]), tuple(v.shape[:-2]))
        q = broadcast_to(q, (*batch, *q.shape[-2:]))
        k = broadcast_to(k, (*batch, *k.shape[-2:]))
        v = broadcast_to(v, (*batch, *v.shape[-2:]))
    elif tuple(k.shape[:-3]) != tuple(q.shape[:-3]) or tuple(v.shape[:-3]) != tuple(q.shape[:-3]):
        raise NoDecomposition("scaled_dot_product_attention with enable_gqa and broadcast batch dims")
    if attn_mask is not None:
        attn_mask = _additive_mask(attn_mask, q)
        attn_mask = broadcast_to(attn_mask, (*q.shape[:-1], k.shape[-2]))
    if flash:
        return prims.sdpa_flash(q, k, v, attn_mask, is_causal, scale)[0]
    return prims.sdpa(q, k, v, attn_mask, is_causal, scale, enable_gqa)




def _runs_flash(q: Any, k: Any, v: Any, attn_mask: Any, is_causal: bool, scale: float | None,
                enable_gqa: bool) -> bool:
    """Whether eager's sdpa runs these operands (the user's, before any broadcast; a bool mask as the float
    one eager makes of it) on its CPU flash kernel: asked of torch itself (aten._fused_sdp_choice, the
    function eager's sdpa asks) on uninitialized CPU tensors of the same layouts, a mask that requires grad
    too where kiln knows it does (an input; eager then takes its math path). Then kiln calls that kernel
    directly and keeps its logsumexp, from which a backward needs no second forward. (The kernel takes
    grouped-query heads as they are: k and v with fewer heads than q.) Sizes that are symbols are not asked
    about (prims.sdpa, eager's choice at each call)."""
    metas = [x.meta for x in (q, k, v, attn_mask) if x is not None]
    if q.ndim != 4 or any(m.device.type != "cpu" for m in metas) or \
            not all(isinstance(n, int) for m in metas for n in (*m.shape, *m.strides)):
        return False
    if attn_mask is not None and attn_mask.dtype == torch.bool:  # (eager converts it first: a new tensor)
        metas[3] = metas[3].with_(dtype=q.dtype, strides=None, requires_grad=False)
    try:
        stand_ins = [torch.empty_strided(m.shape, m.strides, dtype=m.dtype) for m in metas]
        mask = stand_ins[3] if attn_mask is not None else None
        if mask is not None and metas[3].requires_grad and mask.dtype.is_floating_point:
            mask.requires_grad_(True)
        choice = torch_internals.fused_sdp_choice(*stand_ins[:3], mask, is_causal, scale, enable_gqa)
    except torch_internals.TorchInternalsError:
        raise
    except (RuntimeError, TypeError, ValueError):
        return False
    return choice == torch_internals.FLASH_ATTENTION


def _additive_mask(attn_mask: Any, q: Any) -> Any:
    """The mask as the float the attention adds (checked by the caller): a bool mask becomes 0 / -inf."""
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            # torch makes a bool mask additive (0 where True, -inf where False, in the query's dtype) on every
            # call, before any kernel (convert_boolean_attn_mask); made here it is computed by the kernel that
            # builds the mask, once per graph, at the mask's own (unbroadcast) shape, and sdpa gets that very
            # tensor: the same values, none of torch's per-call allocation and fill (hf_bert: 2 calls share it)
            zeros = prims.full(tuple(attn_mask.shape), 0.0, q.dtype, attn_mask.device)
            attn_mask = prims.where(attn_mask, zeros, float("-inf"))
    return attn_mask


# ---- einsum ---------------------------------------------------------------------------------------------

def _einsum_terms(equation: str, operands: Sequence[Any]) -> tuple[list[list[str]], list[str]]:
    """Each operand's dim labels and the output's; ellipsis dims get labels '.0', '.1', ... (from the right).

    Cases kiln does not decompose (sublist format, malformed equations) raise NoDecomposition: eager then
    runs the op and raises its own errors.
    """
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise NoDecomposition("einsum with a mismatched operand count")
    ellipsis_dims = 0
    labels: list[list[str]] = []
    for term, x in zip(terms, operands):
        if term.count("...") > 1 or "." in term.replace("...", ""):
            raise NoDecomposition("einsum with a malformed ellipsis")
        head, dots, tail = term.partition("...")
        if head + tail and not (head + tail).isalpha():
            raise NoDecomposition("einsum with a malformed equation")
        n = x.ndim - len(head) - len(tail)
        if n < 0 or (n > 0 and not dots):
            raise NoDecomposition("einsum with labels that do not match an operand's rank")
        ellipsis_dims = max(ellipsis_dims, n)
        labels.append(list(head) + [f".{n - 1 - i}" for i in range(n)] + list(tail))
    dots_out = [f".{i}" for i in reversed(range(ellipsis_dims))]
    if arrow:
        named = rhs.replace("...", "")
        if rhs.count("...") > 1 or (named and not named.isalpha()):
            raise NoDecomposition("einsum with a malformed output")
        head, dots, tail = rhs.partition("...")
        out = list(head) + (dots_out if dots else []) + list(tail)
        seen = {lab for term in labels for lab in term}
        if len(set(out)) != len(out) or any(lab not in seen for lab in out if not lab.startswith(".")):
            raise NoDecomposition("einsum with an invalid output")
    else:
        counts: dict[str, int] = {}
        for term in labels:
            for lab in term:
                counts[lab] = counts.get(lab, 0) + 1
        out = dots_out + sorted(lab for lab, c in counts.items() if c == 1 and not lab.startswith("."))
    return labels, out


def _einsum_diagonals(x: Any, labels: list[str]) -> tuple[Any, list[str]]:
    """A label repeated within one operand takes the diagonal of those dims (it moves to the end)."""
    while len(set(labels)) != len(labels):
        lab = next(lab for lab in labels if labels.count(lab) > 1)
        d1 = labels.index(lab)
        d2 = labels.index(lab, d1 + 1)
        if x.shape[d1] != x.shape[d2]:
            raise NoDecomposition("einsum with a repeated label over dims of different sizes")
        x = x.diagonal(0, d1, d2)
        labels = [v for i, v in enumerate(labels) if i not in (d1, d2)] + [lab]
    return x, labels


def _einsum_sum_out(x: Any, labels: list[str], keep: set[str]) -> tuple[Any, list[str]]:
    dims = [d for d, lab in enumerate(labels) if lab not in keep]
    if dims:
        x = x.sum(dims)
        labels = [lab for lab in labels if lab in keep]
    return x, labels


def _einsum_pair(a: Any, la: list[str], b: Any, lb: list[str], keep: set[str]) -> tuple[Any, list[str]]:
    """Contract two operands with one bmm: [batch, left, k] @ [batch, k, right]."""
    a, la = _einsum_sum_out(a, la, keep | set(lb))
    b, lb = _einsum_sum_out(b, lb, keep | set(la))
    size = {**dict(zip(lb, b.shape)), **dict(zip(la, a.shape))}
    batch = [lab for lab in la if lab in lb and lab in keep]
    contract = [lab for lab in la if lab in lb and lab not in keep]
    left = [lab for lab in la if lab not in lb]
    right = [lab for lab in lb if lab not in la]
    a3 = a.permute(*[la.index(lab) for lab in batch + left + contract])
    b3 = b.permute(*[lb.index(lab) for lab in batch + contract + right])
    nb, nl, nk, nr = (_prod([size[lab] for lab in group]) for group in (batch, left, contract, right))
    out = prims.bmm(a3.reshape(nb, nl, nk), b3.reshape(nb, nk, nr))
    labels = batch + left + right
    return out.reshape(tuple(size[lab] for lab in labels)), labels


@register(torch.einsum)
def einsum(equation: Any, *operands: Any) -> Any:
    """Contract operands pairwise, left to right, each pair with one bmm (diagonals and broadcast size-1
    dims fall back)."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not isinstance(equation, str) or not operands or not all(is_tensor(x) for x in operands):
        raise NoDecomposition("einsum in sublist format")
    dtype = operands[0].dtype
    if any(x.dtype != dtype for x in operands) or not (dtype.is_floating_point or dtype.is_complex
                                                       or dtype == torch.int64):
        raise NoDecomposition("einsum of mixed dtypes or of integers narrower than int64")
    labels, out = _einsum_terms(equation, operands)
    pairs = [_einsum_diagonals(x, lab) for x, lab in zip(operands, labels)]
    operands, labels = [x for x, _ in pairs], [lab for _, lab in pairs]
    sizes: dict[str, Any] = {}
    for term, x in zip(labels, operands):
        for lab, s in zip(term, x.shape):
            if sizes.setdefault(lab, s) != s:
                raise NoDecomposition("einsum with dims that broadcast")
    result, result_labels = operands[0], labels[0]
    for i in range(1, len(operands)):
        later = {lab for term in labels[i + 1:] for lab in term} | set(out)
        result, result_labels = _einsum_pair(result, result_labels, operands[i], labels[i], later)
    result, result_labels = _einsum_sum_out(result, result_labels, set(out))
    order = [result_labels.index(lab) for lab in out]
    if order != list(range(len(order))):
        result = result.permute(*order)
    return result  # like eager's, a one-operand einsum that only permutes or takes diagonals is a view
