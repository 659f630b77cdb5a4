"""Decompositions of torch's shape and view surface: view/reshape, squeeze/unsqueeze, permute/transpose,
expand, flatten, narrow/select, split/chunk/unbind, diagonal. Copies built from shape ops (cat, stack, flip,
roll, repeat, tril, diag_embed, ...) are in `shape_copies`, indexing in `getitem`.

Views are built from view prims (view, permute, squeeze, expand_dims, slice, diagonal, broadcast_in_dim),
so their strides are eager's; copies end in contiguous prims. Every view op is marked with `mark_view`.
"""
from __future__ import annotations

import builtins
from typing import Any, Sequence

import torch

from ..graph.layout import channels_last_contiguous
from ..graph.symbolic import SymInt, broadcastable, same_sizes
from .. import prims
from ..prims.registry import check, wrap_dim
from ..prims.shape import view_strides
from .registry import NoDecomposition, mark_view, register
from .utils import broadcast_shapes, is_tensor

_Shape = (tuple, list, torch.Size)


def _sizes(args: Sequence[Any], op: str) -> tuple:
    """Sizes given as `f(2, 3)` or `f((2, 3))`."""
    if len(args) == 1 and isinstance(args[0], _Shape):
        args = tuple(args[0])
    for s in args:
        if isinstance(s, bool) or not isinstance(s, (int, SymInt)):
            if is_tensor(s):
                raise NoDecomposition(f"{op} with tensor sizes")
            raise TypeError(f"{op}(): argument 'size' must be tuple of ints, but found element of type "
                            f"{type(s).__name__}")
    return tuple(args)


def infer_size(shape: Sequence[int], total: Any, op: str = "view") -> tuple:
    """A shape with at most one -1, resolved against a numel (eager's infer_size)."""
    shape = list(shape)
    infer = None
    known = 1
    for i, s in enumerate(shape):
        if s == -1:
            check(infer is None, lambda: "only one dimension can be inferred")
            infer = i
        else:
            check(s >= 0, lambda: f"invalid shape dimension {s}")
            known = known * s
    text = lambda: f"shape '[{', '.join(map(str, shape))}]' is invalid for input of size {total}"  # noqa: E731
    if infer is not None:
        check(known != 0, lambda: f"cannot reshape tensor of {total} elements into shape "
              f"[{', '.join(map(str, shape))}] because the unspecified dimension size -1 can be any value "
              f"and is ambiguous")
        check(total % known == 0, text)
        shape[infer] = total // known
    else:
        check(known == total, text)
    return tuple(shape)


# ---- view / reshape -----------------------------------------------------------------------------------

@register(torch.Tensor.view)
def view(a: Any, *shape: Any, size: Any = None) -> Any:
    if size is not None:
        shape = (size,)
    if len(shape) == 1 and isinstance(shape[0], torch.dtype):
        raise NoDecomposition("view(dtype)")
    return prims.view(a, infer_size(_sizes(shape, "view"), a.numel()))


def _reshape(a: Any, shape: tuple) -> Any:
    shape = infer_size(shape, a.numel())
    if view_strides(a.shape, a.stride(), shape) is not None:
        return prims.view(a, shape)
    return prims.view(prims.clone(a, torch.contiguous_format), shape)


@register(torch.reshape, torch.Tensor.reshape)
def reshape(a: Any, *shape: Any, **kwargs: Any) -> Any:
    if "shape" in kwargs:
        shape = (kwargs.pop("shape"),)
    check(not kwargs, lambda: f"reshape() got unexpected arguments {list(kwargs)}", TypeError)
    return _reshape(a, _sizes(shape, "reshape"))


@register(torch.Tensor.view_as)
def view_as(a: Any, other: Any) -> Any:
    return prims.view(a, tuple(other.shape))


@register(torch.Tensor.reshape_as)
def reshape_as(a: Any, other: Any) -> Any:
    return _reshape(a, tuple(other.shape))


@register(torch.flatten, torch.Tensor.flatten)
def flatten(a: Any, start_dim: int = 0, end_dim: int = -1) -> Any:
    if isinstance(start_dim, str) or isinstance(end_dim, str):
        raise NoDecomposition("flatten with named dims")
    if a.ndim == 0:
        return _reshape(a, (1,))
    start, end = wrap_dim(start_dim, a.ndim), wrap_dim(end_dim, a.ndim)
    check(start <= end, lambda: "flatten() has invalid args: start_dim cannot come after end_dim")
    if start == end:
        return a
    merged = 1
    for s in a.shape[start:end + 1]:
        merged = merged * s
    return _reshape(a, tuple(a.shape[:start]) + (merged,) + tuple(a.shape[end + 1:]))


@register(torch.ravel, torch.Tensor.ravel)
def ravel(a: Any) -> Any:
    # eager: contiguous().view(-1), so a non-contiguous input is copied even where a view would exist
    if not a.meta.is_contiguous():
        a = prims.clone(a, torch.contiguous_format)
    return prims.view(a, (a.numel(),))


@register(torch.unflatten, torch.Tensor.unflatten)
def unflatten(a: Any, dim: int, sizes: Sequence[int]) -> Any:
    if isinstance(dim, str):
        raise NoDecomposition("unflatten with named dims")
    d = wrap_dim(dim, a.ndim)
    check(len(sizes) > 0, lambda: "unflatten: sizes must be non-empty")
    sizes = infer_size(_sizes((sizes,), "unflatten"), a.shape[d])
    return prims.view(a, tuple(a.shape[:d]) + sizes + tuple(a.shape[d + 1:]))


# ---- squeeze / unsqueeze ------------------------------------------------------------------------------

@register(torch.squeeze, torch.Tensor.squeeze)
def squeeze(a: Any, dim: Any = None) -> Any:
    if isinstance(dim, str):
        raise NoDecomposition("squeeze with named dims")
    if dim is None:
        dims = tuple(d for d in range(a.ndim) if a.shape[d] == 1)
    else:
        wanted = (dim,) if isinstance(dim, int) else tuple(dim)
        wrapped = [wrap_dim(d, a.ndim) for d in wanted]
        check(len(set(wrapped)) == len(wrapped), lambda: f"dim {wrapped[0]} appears multiple times in the "
              f"list of dims")
        dims = tuple(sorted(d for d in set(wrapped) if a.ndim > 0 and a.shape[d] == 1))
    return prims.squeeze(a, dims)


@register(torch.unsqueeze, torch.Tensor.unsqueeze)
def unsqueeze(a: Any, dim: int) -> Any:
    return prims.expand_dims(a, (wrap_dim(dim, a.ndim + 1),))


# ---- permute / transpose ------------------------------------------------------------------------------

@register(torch.permute, torch.Tensor.permute)
def permute(a: Any, *dims: Any, **kwargs: Any) -> Any:
    if "dims" in kwargs:
        dims = (kwargs.pop("dims"),)
    check(not kwargs, lambda: f"permute() got unexpected keyword arguments {sorted(kwargs)}", TypeError)
    dims = _sizes(dims, "permute")
    check(len(dims) == a.ndim, lambda: f"permute(sparse_coo): number of dimensions in the tensor input does "
          f"not match the length of the desired ordering of dimensions i.e. input.dim() = {a.ndim} is not "
          f"equal to len(dims) = {len(dims)}")
    wrapped = tuple(wrap_dim(d, a.ndim) for d in dims)
    check(len(set(wrapped)) == len(wrapped), lambda: "permute(): duplicate dims are not allowed.")
    return prims.permute(a, wrapped)


def _transpose(a: Any, dim0: int, dim1: int) -> Any:
    if a.ndim == 0:
        wrap_dim(dim0, 0)
        wrap_dim(dim1, 0)
        return prims.squeeze(a, ())
    d0, d1 = wrap_dim(dim0, a.ndim), wrap_dim(dim1, a.ndim)
    perm = list(range(a.ndim))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return prims.permute(a, tuple(perm))


@register(torch.transpose, torch.Tensor.transpose, torch.swapdims, torch.Tensor.swapdims)
def transpose(a: Any, dim0: int, dim1: int) -> Any:
    if isinstance(dim0, str) or isinstance(dim1, str):
        raise NoDecomposition("transpose with named dims")
    return _transpose(a, dim0, dim1)


@register(torch.swapaxes, torch.Tensor.swapaxes)
def swapaxes(a: Any, axis0: int, axis1: int) -> Any:
    return _transpose(a, axis0, axis1)


@register(torch.t, torch.Tensor.t)
def t(a: Any) -> Any:
    check(a.ndim <= 2, lambda: f"t() expects a tensor with <= 2 dimensions, but self is {a.ndim}D")
    return _transpose(a, 0, 1) if a.ndim == 2 else prims.squeeze(a, ())


def _reverse_dims(a: Any) -> Any:
    return prims.permute(a, tuple(range(a.ndim - 1, -1, -1)))


@register(torch.Tensor.T.__get__)
def T(a: Any) -> Any:
    return _reverse_dims(a)


@register(torch.Tensor.mT.__get__)
def mT(a: Any) -> Any:
    check(a.ndim >= 2, lambda: f"tensor.mT is only supported on matrices or batches of matrices. Got "
          f"{a.ndim}-D tensor.")
    return _transpose(a, -2, -1)


@register(torch.Tensor.H.__get__)
def H(a: Any) -> Any:
    check(a.ndim in (0, 1, 2), lambda: f"tensor.H is only supported on matrices (2-D tensors). Got "
          f"{a.ndim}-D tensor.")
    if a.dtype.is_complex:
        raise NoDecomposition("H of a complex tensor")
    return _reverse_dims(a) if a.ndim == 2 else prims.squeeze(a, ())


@register(torch.Tensor.mH.__get__, torch.adjoint, torch.Tensor.adjoint)
def mH(a: Any) -> Any:
    check(a.ndim >= 2, lambda: f"tensor.mH is only supported on matrices or batches of matrices. Got "
          f"{a.ndim}-D tensor.")
    if a.dtype.is_complex:
        raise NoDecomposition("mH of a complex tensor")
    return _transpose(a, -2, -1)


def _move_dims(src: Any, dst: Any, ndim: int, op: str) -> tuple:
    src = (src,) if isinstance(src, int) else tuple(src)
    dst = (dst,) if isinstance(dst, int) else tuple(dst)
    check(len(src) == len(dst), lambda: f"{op}: Invalid source or destination dims: source ({list(src)} "
          f"dims) should contain the same number of dims as destination ({list(dst)} dims)")
    src = tuple(wrap_dim(d, ndim) for d in src)
    dst = tuple(wrap_dim(d, ndim) for d in dst)
    check(len(set(src)) == len(src), lambda: f"{op}: repeated dim in `source` ({list(src)})")
    check(len(set(dst)) == len(dst), lambda: f"{op}: repeated dim in `destination` ({list(dst)})")
    perm = [-1] * ndim
    for s, d in zip(src, dst):
        perm[d] = s
    rest = iter(d for d in range(ndim) if d not in src)
    return tuple(p if p != -1 else next(rest) for p in perm)


@register(torch.movedim, torch.Tensor.movedim, torch.moveaxis, torch.Tensor.moveaxis)
def movedim(a: Any, source: Any, destination: Any) -> Any:
    return prims.permute(a, _move_dims(source, destination, a.ndim, "movedim"))


# ---- expand / broadcast -------------------------------------------------------------------------------

def _expand(a: Any, sizes: tuple, op: str = "expand") -> Any:
    check(len(sizes) >= a.ndim, lambda: f"{op}({a.dtype}{{{list(a.shape)}}}, size={list(sizes)}): the number "
          f"of sizes provided ({len(sizes)}) must be greater or equal to the number of dimensions in the "
          f"tensor ({a.ndim})")
    offset = len(sizes) - a.ndim
    shape = []
    for i, s in enumerate(sizes):
        if i < offset:
            check(s >= 0, lambda: f"The expanded size of the tensor ({s}) isn't allowed in a leading, "
                  f"non-existing dimension {i}")
            shape.append(s)
            continue
        have = a.shape[i - offset]
        if s == -1:
            s = have
        check(broadcastable(have, s), lambda: f"The expanded size of the tensor ({s}) must match the "
              f"existing size ({have}) at non-singleton dimension {i}.  Target sizes: {list(sizes)}.  Tensor "
              f"sizes: {list(a.shape)}")
        shape.append(s)
    if same_sizes(shape, a.shape):  # (structurally: a size that may be 1 is not asked about)
        return prims.squeeze(a, ())  # an alias, strides unchanged
    return prims.broadcast_in_dim(a, tuple(shape), tuple(range(offset, len(shape))))


@register(torch.Tensor.expand)
def expand(a: Any, *sizes: Any, size: Any = None, implicit: bool = False) -> Any:
    return _expand(a, _sizes((size,) if size is not None else sizes, "expand"))


@register(torch.Tensor.expand_as)
def expand_as(a: Any, other: Any) -> Any:
    return _expand(a, tuple(other.shape))


@register(torch.broadcast_to)
def broadcast_to(a: Any, size: Any) -> Any:
    return _expand(a, _sizes((size,), "broadcast_to"), "broadcast_to")


@register(torch.broadcast_tensors)
def broadcast_tensors(*tensors: Any) -> Any:
    if len(tensors) == 1 and isinstance(tensors[0], (tuple, list)):
        tensors = tuple(tensors[0])
    shape = broadcast_shapes(*[t.shape for t in tensors])
    return tuple(_expand(t, shape) for t in tensors)


# ---- copies: contiguous / clone -----------------------------------------------------------------------

@register(torch.Tensor.contiguous)  # not a view op: the input itself when contiguous, else a new tensor
def contiguous(a: Any, memory_format: torch.memory_format = torch.contiguous_format) -> Any:
    if memory_format == torch.preserve_format:
        raise RuntimeError("preserve memory format is unsupported by the contiguous operator")
    if memory_format == torch.contiguous_format and a.meta.is_contiguous():
        return a
    if memory_format in (torch.channels_last, torch.channels_last_3d):
        if a.ndim == (4 if memory_format == torch.channels_last else 5) and \
                channels_last_contiguous(a.meta.shape, a.meta.strides):
            return a
    elif memory_format != torch.contiguous_format:
        raise NoDecomposition(f"contiguous with {memory_format}")
    return prims.clone(a, memory_format)  # (raises eager's error for a channels-last tensor of another rank)


@register(torch.clone, torch.Tensor.clone)
def clone(a: Any, *, memory_format: torch.memory_format = torch.preserve_format) -> Any:
    return prims.clone(a, memory_format)


# ---- slicing: narrow / select / split / chunk / unbind ------------------------------------------------

def slice_dim(a: Any, dim: int, start: int, stop: int, step: int = 1) -> Any:
    """a[..., start:stop:step, ...] along one (wrapped) dim, bounds already clamped; a view."""
    starts = [0] * a.ndim
    limits = list(a.shape)
    steps = [1] * a.ndim
    starts[dim], limits[dim], steps[dim] = start, stop, step
    return prims.slice(a, tuple(starts), tuple(limits), tuple(steps))


@register(torch.narrow, torch.Tensor.narrow)
def narrow(a: Any, dim: int, start: Any, length: int) -> Any:
    if is_tensor(start) or is_tensor(length):
        raise NoDecomposition("narrow with a tensor start")
    check(a.ndim > 0, lambda: "narrow() cannot be applied to a 0-dim tensor.")
    check(length >= 0, lambda: "narrow(): length must be non-negative.")
    d = wrap_dim(dim, a.ndim)
    size = a.shape[d]
    check(-size <= start <= size, lambda: f"start out of range (expected to be in range of [{-size}, "
          f"{size}], but got {start})", IndexError)
    if start < 0:
        start += size
    check(start <= size - length,
          lambda: f"start ({start}) + length ({length}) exceeds dimension size ({size}).")
    return slice_dim(a, d, start, start + length)


@register(torch.ops.aten.slice.Tensor)
def aten_slice(a: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Any:
    """aten.slice: a[start:end:step] along dim, bounds wrapped once and clamped as eager."""
    if any(is_tensor(v) for v in (start, end, step)):
        raise NoDecomposition("slice with tensor bounds")
    check(a.ndim > 0, lambda: "slice() cannot be applied to a 0-dim tensor.", IndexError)
    check(step > 0, lambda: "slice step must be positive")
    d = wrap_dim(dim, a.ndim)
    size = a.shape[d]
    first = 0 if start is None else start
    last = size if end is None else end
    if first < 0:
        first += size
    if last < 0:
        last += size
    first = min(max(first, 0), size)
    last = min(max(last, first), size)
    return slice_dim(a, d, first, last, step)


@register(torch.select, torch.Tensor.select)
def select(a: Any, dim: int, index: int) -> Any:
    if is_tensor(index):
        raise NoDecomposition("select with a tensor index")
    if isinstance(dim, str):
        raise NoDecomposition("select with a named dim")
    check(a.ndim > 0, lambda: "select() cannot be applied to a 0-dim tensor.", IndexError)
    d = wrap_dim(dim, a.ndim)
    size = a.shape[d]
    check(-size <= index < size, lambda: f"select(): index {index} out of range for tensor of size "
          f"{list(a.shape)} at dimension {dim}", IndexError)
    index = index + size if index < 0 else index
    return prims.squeeze(slice_dim(a, d, index, index + 1), (d,))


def _split_sizes(a: Any, dim: int, sizes: Sequence[int]) -> tuple:
    out, start = [], 0
    for s in sizes:
        out.append(slice_dim(a, dim, start, start + s))
        start += s
    return tuple(out)


@register(torch.split_with_sizes, torch.Tensor.split_with_sizes)
def split_with_sizes(a: Any, split_sizes: Sequence[int], dim: int = 0) -> Any:
    d = wrap_dim(dim, a.ndim)
    sizes = tuple(split_sizes)
    check(all(s >= 0 for s in sizes), lambda: f"split_with_sizes expects split_sizes have only non-negative "
          f"entries, but got split_sizes={list(sizes)}")
    check(sum(sizes) == a.shape[d], lambda: f"split_with_sizes expects split_sizes to sum exactly to "
          f"{a.shape[d]} (input tensor's size at dimension {d}), but got split_sizes={list(sizes)}")
    return _split_sizes(a, d, sizes)


@register(torch.split, torch.Tensor.split)
def split(a: Any, split_size_or_sections: Any = None, dim: int = 0, *, split_size: Any = None) -> Any:
    if split_size is not None:
        split_size_or_sections = split_size
    if isinstance(split_size_or_sections, (list, tuple)):
        return split_with_sizes(a, split_size_or_sections, dim)
    if is_tensor(split_size_or_sections):
        raise NoDecomposition("split with a tensor size")
    check(a.ndim > 0, lambda: "split expects at least a 1-dimensional tensor")
    d = wrap_dim(dim, a.ndim)
    size, step = a.shape[d], split_size_or_sections
    check(step >= 0, lambda: f"split expects split_size be non-negative, but got split_size={step}")
    check(step > 0 or size == 0, lambda: f"split_size can only be 0 if dimension size is 0, but got "
          f"dimension size of {size}")
    if size == 0:
        return (slice_dim(a, d, 0, 0),)
    count = -(-size // step)
    return _split_sizes(a, d, [step] * (count - 1) + [size - step * (count - 1)])


@register(torch.chunk, torch.Tensor.chunk)
def chunk(a: Any, chunks: int, dim: int = 0) -> Any:
    check(a.ndim > 0, lambda: "chunk expects at least a 1-dimensional tensor")
    check(chunks > 0, lambda: f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    d = wrap_dim(dim, a.ndim)
    size = a.shape[d]
    step = -(-size // chunks)
    if size == 0:
        return tuple(slice_dim(a, d, 0, 0) for _ in range(chunks))
    return split(a, step, d)


@register(torch.unbind, torch.Tensor.unbind)
def unbind(a: Any, dim: int = 0) -> Any:
    check(a.ndim > 0, lambda: "Dimension specified as 0 but tensor has no dimensions", IndexError)
    d = wrap_dim(dim, a.ndim)
    return tuple(select(a, d, i) for i in range(a.shape[d]))


@register(torch.tensor_split, torch.Tensor.tensor_split)
def tensor_split(a: Any, indices_or_sections: Any = None, dim: int = 0, *, sections: Any = None,
                 indices: Any = None) -> Any:
    if sections is not None or indices is not None:
        indices_or_sections = sections if sections is not None else indices
    if is_tensor(indices_or_sections):
        raise NoDecomposition("tensor_split with a tensor argument")
    check(a.ndim > 0, lambda: f"tensor_split expected at least a 1-dimensional tensor, but got a tensor with "
          f"{a.ndim} dims")
    d = wrap_dim(dim, a.ndim)
    size = a.shape[d]
    if isinstance(indices_or_sections, (int, SymInt)):
        n = indices_or_sections
        check(n > 0, lambda: f"number of sections must be larger than 0, got {n}")
        base, extra = divmod(size, n)
        bounds = [0]
        for i in range(n):
            bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    else:
        bounds = [0] + [builtins.min(builtins.max(i + size if i < 0 else i, 0), size)
                        for i in indices_or_sections] + [size]
    out = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        out.append(slice_dim(a, d, lo, builtins.max(lo, hi)))
    return tuple(out)


def _split_along(a: Any, arg: Any, dim: int, op: str) -> Any:
    if isinstance(arg, (int, SymInt)):
        size = a.shape[dim]
        check(arg != 0 and size % arg == 0, lambda: f"torch.{op} attempted to split along dimension {dim}, "
              f"but the size of the dimension {size} is not divisible by the split_size {arg}!")
    return tensor_split(a, arg, dim)


@register(torch.hsplit, torch.Tensor.hsplit)
def hsplit(a: Any, sections: Any) -> Any:
    check(a.ndim >= 1, lambda: f"torch.hsplit requires a tensor with at least 1 dimension, but got a tensor "
          f"with {a.ndim} dimensions!")
    return _split_along(a, sections, 1 if a.ndim > 1 else 0, "hsplit")


@register(torch.vsplit, torch.Tensor.vsplit)
def vsplit(a: Any, sections: Any) -> Any:
    check(a.ndim >= 2, lambda: f"torch.vsplit requires a tensor with at least 2 dimension, but got a tensor "
          f"with {a.ndim} dimensions!")
    return _split_along(a, sections, 0, "vsplit")


@register(torch.dsplit, torch.Tensor.dsplit)
def dsplit(a: Any, sections: Any) -> Any:
    check(a.ndim >= 3, lambda: f"torch.dsplit requires a tensor with at least 3 dimension, but got a tensor "
          f"with {a.ndim} dimensions!")
    return _split_along(a, sections, 2, "dsplit")


@register(torch.Tensor.unfold)
def unfold(a: Any, dimension: int, size: int, step: int) -> Any:
    d = wrap_dim(dimension, a.ndim)
    return prims.unfold(a, d, size, step)


@register(torch.unsafe_split, torch.Tensor.unsafe_split)
def unsafe_split(a: Any, split_size: int, dim: int = 0) -> Any:
    return split(a, split_size, dim)


@register(torch.unsafe_chunk, torch.Tensor.unsafe_chunk)
def unsafe_chunk(a: Any, chunks: int, dim: int = 0) -> Any:
    return chunk(a, chunks, dim)


# ---- diagonal -----------------------------------------------------------------------------------------

@register(torch.diagonal, torch.Tensor.diagonal)
def diagonal(a: Any, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Any:
    if any(isinstance(v, str) for v in (offset, dim1, dim2)):
        raise NoDecomposition("diagonal with named dims")
    d1, d2 = wrap_dim(dim1, a.ndim), wrap_dim(dim2, a.ndim)
    check(d1 != d2, lambda: f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    return prims.diagonal(a, offset, d1, d2)


mark_view(torch.Tensor.view, torch.reshape, torch.Tensor.reshape, torch.Tensor.view_as,
          torch.Tensor.reshape_as, torch.flatten, torch.Tensor.flatten, torch.ravel, torch.Tensor.ravel,
          torch.unflatten, torch.Tensor.unflatten, torch.squeeze, torch.Tensor.squeeze, torch.unsqueeze,
          torch.Tensor.unsqueeze,
          torch.permute, torch.Tensor.permute, torch.transpose, torch.Tensor.transpose, torch.swapaxes,
          torch.Tensor.swapaxes, torch.swapdims, torch.Tensor.swapdims, torch.t, torch.Tensor.t,
          torch.Tensor.T.__get__, torch.Tensor.mT.__get__, torch.Tensor.H.__get__, torch.Tensor.mH.__get__,
          torch.adjoint, torch.Tensor.adjoint, torch.movedim, torch.Tensor.movedim, torch.moveaxis,
          torch.Tensor.moveaxis, torch.Tensor.expand, torch.Tensor.expand_as, torch.broadcast_to,
          torch.broadcast_tensors, torch.narrow, torch.Tensor.narrow, torch.select,
          torch.Tensor.select, torch.split, torch.Tensor.split, torch.split_with_sizes,
          torch.Tensor.split_with_sizes, torch.chunk, torch.Tensor.chunk, torch.unbind, torch.Tensor.unbind,
          torch.tensor_split, torch.Tensor.tensor_split, torch.hsplit, torch.Tensor.hsplit, torch.vsplit,
          torch.Tensor.vsplit, torch.dsplit, torch.Tensor.dsplit, torch.diagonal, torch.Tensor.diagonal,
          torch.atleast_1d, torch.atleast_2d, torch.atleast_3d, torch.Tensor.unfold, torch.unsafe_split,
          torch.Tensor.unsafe_split, torch.unsafe_chunk, torch.Tensor.unsafe_chunk, torch.linalg.diagonal)


@register(torch.linalg.diagonal)
def linalg_diagonal(a: Any, *, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Any:
    return diagonal(a, offset, dim1, dim2)
