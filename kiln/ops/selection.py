"""Decompositions of selections and searches: kthvalue, median, nanmedian, quantile, nanquantile by a stable
sort, and searchsorted/bucketize by eager's binary search, step by step.

Sorting stably, median and nanmedian pick eager's index (its partition breaks ties by position), kthvalue
the first of equal values (eager's quickselect leaves that index unspecified, so integer inputs fall
back), and nanmedian of an all-NaN row the first NaN (eager: wherever std::nth_element leaves it).
"""
from __future__ import annotations

import builtins
from typing import Any

import torch

from .. import prims
from ..prims.registry import check, wrap_dim
from .registry import NoDecomposition
from .utils import checked, decomposition, is_tensor, method, result_type, wants_gradient


# ---- selections by a stable sort: kthvalue, median, nanmedian, quantile, nanquantile -------------------

def _sorted_along(input: Any, d: int) -> tuple[Any, Any]:
    return torch.sort(input, dim=d, stable=True)


def _pick(input: Any, d: int, position: Any, keepdim: bool) -> tuple[Any, Any]:
    """(values, indices) at `position` (a keepdim-shaped int64 tensor) of input sorted along d."""
    values, indices = _sorted_along(input, d)
    value, index = values.gather(d, position), indices.gather(d, position)
    if not keepdim:
        value, index = value.squeeze(d), index.squeeze(d)
    return value, index


def _check_selection_dim(input: Any, dim: int) -> int:
    d = wrap_dim(dim, builtins.max(input.ndim, 1))
    return d


@decomposition(torch.kthvalue, method("kthvalue"))
def kthvalue(input: Any, k: int, dim: int = -1, keepdim: bool = False) -> Any:
    if not input.dtype.is_floating_point:
        # eager's quickselect picks an arbitrary index among equal values, common among integers
        raise NoDecomposition(f"kthvalue of {input.dtype} values")
    d = _check_selection_dim(input, dim)
    check(input.numel() > 0, lambda: "cannot perform reduction function kthvalue on tensor with no elements "
          "because the operation does not have an identity")
    size = input.shape[d] if input.ndim > 0 else 1
    check(0 < k <= size, lambda: "selected index k out of range")
    if input.ndim == 0:
        return torch.return_types.kthvalue((torch.clone(input), torch.zeros_like(input, dtype=torch.int64)))
    shape = tuple(1 if i == d else s for i, s in enumerate(input.shape))
    position = torch.full(shape, k - 1, dtype=torch.int64, device=input.device)
    return torch.return_types.kthvalue(_pick(input, d, position, keepdim))


def _median_position(input: Any, d: int, ignore_nan: bool) -> Any:
    """The rank eager's median picks along d (keepdim shape): the first NaN for median when there is one,
    else the lower middle; nanmedian takes the lower middle of the values that are not NaN."""
    size = input.shape[d]
    nans = torch.isnan(input).sum(d, keepdim=True)
    if ignore_nan:
        return torch.clamp_min(torch.div(size - nans - 1, 2, rounding_mode="floor"), 0)
    middle = torch.full_like(nans, (size - 1) // 2)
    return torch.where(nans > 0, size - nans, middle)


def _median(op: str, input: Any, dim: Any, keepdim: bool, ignore_nan: bool) -> Any:
    if input.dtype.is_complex or input.dtype == torch.bool:
        raise NoDecomposition(f"{op} of {input.dtype} values")
    if dim is None:
        check(input.numel() > 0,
              lambda: "median() operation does not have an identity for empty input tensor")
        flat = input.reshape(-1)
        value = _pick(flat, 0, _median_position(flat, 0, ignore_nan), False)[0]
        if not wants_gradient(input):
            return value
        # eager shares the gradient among the elements equal to the median (amax's rule, on them alone)
        value = prims.stop_gradient(value)
        equal = torch.logical_or(flat == value, torch.logical_and(torch.isnan(flat), torch.isnan(value)))
        return torch.amax(torch.where(equal, flat, float("-inf") if flat.dtype.is_floating_point else value))
    d = _check_selection_dim(input, dim)
    size = input.shape[d] if input.ndim > 0 else 1
    check(size > 0, lambda: "median() cannot compute median for a dimension of size 0 because the operation "
          "does not have an identity", IndexError)
    result = torch.return_types.nanmedian if ignore_nan else torch.return_types.median
    if input.ndim == 0:
        return result((torch.clone(input), torch.zeros_like(input, dtype=torch.int64)))
    return result(_pick(input, d, _median_position(input, d, ignore_nan), keepdim))


@decomposition(torch.median, method("median"))
def median(input: Any, dim: Any = None, keepdim: bool = False) -> Any:
    return _median("median", input, dim, keepdim, ignore_nan=False)


@decomposition(torch.nanmedian, method("nanmedian"))
def nanmedian(input: Any, dim: Any = None, keepdim: bool = False) -> Any:
    return _median("nanmedian", input, dim, keepdim, ignore_nan=True)


_INTERPOLATIONS = ("linear", "lower", "higher", "midpoint", "nearest")


def _quantile(op: str, input: Any, q: Any, dim: Any, keepdim: bool, interpolation: str,
              ignore_nan: bool) -> Any:
    check(input.numel() > 0, lambda: f"{op}() input tensor must be non-empty")
    check(input.dtype in (torch.float32, torch.float64),
          lambda: f"{op}() input tensor must be either float or double dtype")
    check(interpolation in _INTERPOLATIONS, lambda: f"{op}() interpolation must be one of linear, lower, "
          f"higher, midpoint or nearest. Got {interpolation}")
    if is_tensor(q):
        check(q.ndim <= 1, lambda: f"{op}() q must be a scalar or 1D tensor")
        check(q.dtype == input.dtype, lambda: f"{op}() q tensor must be same dtype as the input tensor")
        # eager checks the values before it selects anything; the check runs when the graph runs
        q = checked(torch.all(torch.logical_and(q >= 0, q <= 1)), q,
                    f"{op}() q values must be in the range [0, 1]")
    else:
        check(0 <= q <= 1, lambda: f"{op}() q must be in the range [0, 1] but got {q}")
        q = torch.scalar_tensor(q, dtype=input.dtype, device=input.device)
    if dim is None:
        reduced: list = [1] * input.ndim if keepdim else []
        sorted_values = torch.sort(input.flatten())[0]
    else:
        d = wrap_dim(dim, builtins.max(input.ndim, 1))
        reduced = list(input.shape)
        if input.ndim > 0:
            if keepdim:
                reduced[d] = 1
            else:
                del reduced[d]
        if d == input.ndim - 1 or input.ndim == 0:
            sorted_values = torch.sort(input)[0]
        else:
            sorted_values = torch.sort(input.unsqueeze(-1).transpose(d, -1))[0]
    n = sorted_values.shape[-1] if sorted_values.ndim > 0 else 1
    sorted_values = sorted_values.reshape(tuple(reduced) + (n,))
    if ignore_nan:
        ranks = q * (torch.logical_not(sorted_values.isnan()).sum(-1, keepdim=True) - 1)
        ranks = ranks.masked_fill(ranks < 0, 0)
    else:
        last = n - 1
        scaled, has_nan = torch.broadcast_tensors(q * last, sorted_values.isnan().any(-1, keepdim=True))
        ranks = scaled.masked_fill(has_nan, last)
    if interpolation == "lower":
        ranks = ranks.floor()
    elif interpolation == "higher":
        ranks = ranks.ceil()
    elif interpolation == "nearest":
        ranks = ranks.round()
    ranks_below = ranks.to(torch.int64)
    values = sorted_values.gather(-1, ranks_below)
    if interpolation in ("linear", "midpoint"):
        weights = torch.full_like(ranks, 0.5) if interpolation == "midpoint" else ranks - ranks_below
        ranks_above = ranks.ceil().to(torch.int64)
        values = values.lerp(sorted_values.gather(-1, ranks_above), weights)
    if q.ndim == 0:
        values = values.squeeze(-1)
    else:
        values = values.unsqueeze(0).transpose(0, -1).squeeze(-1)
    return values


@decomposition(torch.quantile, method("quantile"))
def quantile(input: Any, q: Any, dim: Any = None, keepdim: bool = False, *,
             interpolation: str = "linear") -> Any:
    return _quantile("quantile", input, q, dim, keepdim, interpolation, ignore_nan=False)


@decomposition(torch.nanquantile, method("nanquantile"))
def nanquantile(input: Any, q: Any, dim: Any = None, keepdim: bool = False, *,
                interpolation: str = "linear") -> Any:
    return _quantile("nanquantile", input, q, dim, keepdim, interpolation, ignore_nan=True)


# ---- searchsorted, bucketize: eager's binary search, step by step -------------------------------------

def _binary_search(boundaries: Any, values: Any, right: bool, sorter: Any) -> Any:
    """The position eager's lower (upper) bound search returns for each value: a fixed number of halving
    steps, so unsorted boundaries (which eager does not check) give eager's positions too.

    boundaries (..., n) with values (..., m) (matching leading dims), or 1-D boundaries with any values."""
    n = boundaries.shape[-1]
    flat = boundaries.ndim == 1
    shape = tuple(values.shape)
    if flat:
        values = values.reshape(-1)
    start = torch.zeros(tuple(values.shape), dtype=torch.int64, device=values.device)
    end = torch.full(tuple(values.shape), n, dtype=torch.int64, device=values.device)
    for _ in range(n.bit_length()):
        active = start < end
        mid = start + torch.div(end - start, 2, rounding_mode="floor")
        at = torch.clamp_max(mid, n - 1)
        if sorter is not None:
            at = sorter.index_select(0, at) if flat else sorter.gather(-1, at)
        found = boundaries.index_select(0, at) if flat else boundaries.gather(-1, at)
        # eager moves right unless mid_val >= value (lower bound) or mid_val > value (upper bound)
        stop = found > values if right else found >= values
        go_right = torch.logical_and(active, torch.logical_not(stop))
        go_left = torch.logical_and(active, stop)
        start = torch.where(go_right, mid + 1, start)
        end = torch.where(go_left, mid, end)
    return start.reshape(shape) if flat else start


def _searchsorted(op: str, boundaries: Any, values: Any, out_int32: bool, right: bool, sorter: Any) -> Any:
    if boundaries.dtype.is_complex or boundaries.dtype == torch.bool:
        raise NoDecomposition(f"{op} of {boundaries.dtype} values")
    if not is_tensor(values):
        check(boundaries.ndim == 1, lambda: f"{op}(): input value can be a scalar only when boundaries "
              f"tensor dimension is 1, but we got boundaries tensor dim({boundaries.ndim}) and input value's "
              f"dim(0) numel(1)")
        values = torch.scalar_tensor(values, dtype=result_type(values), device=boundaries.device)
    if values.dtype.is_complex or values.dtype == torch.bool:
        raise NoDecomposition(f"{op} of {values.dtype} values")
    check(boundaries.ndim >= 1, lambda: f"{op}(): boundaries tensor should have positive dimension")
    if boundaries.ndim > 1:
        check(values.ndim == boundaries.ndim and tuple(values.shape[:-1]) == tuple(boundaries.shape[:-1]),
              lambda: f"{op}(): boundaries tensor should be 1 dimension or the first N-1 dimensions of "
              f"boundaries tensor and input value tensor must match, but we got boundaries tensor "
              f"{list(boundaries.shape)} and input value tensor {list(values.shape)}")
    if sorter is not None:
        check(sorter.dtype == torch.int64, lambda: f"{op}(): sorter must be a tensor of long dtype but got "
              f"dtype {sorter.dtype}")
        check(tuple(sorter.shape) == tuple(boundaries.shape), lambda: f"{op}(): boundary and sorter must "
              f"have the same size, but got boundary tensor {list(boundaries.shape)}and got sorter tensor "
              f"{list(sorter.shape)}")
    dtype = torch.promote_types(boundaries.dtype, values.dtype)
    if boundaries.dtype != dtype:
        boundaries = boundaries.to(dtype)
    if values.dtype != dtype:
        values = values.to(dtype)
    if boundaries.shape[-1] == 0:
        out = torch.zeros(tuple(values.shape), dtype=torch.int64, device=values.device)
    else:
        out = _binary_search(boundaries, values, right, sorter)
    return out.to(torch.int32) if out_int32 else out


@decomposition(torch.searchsorted)
def searchsorted(sorted_sequence: Any, input: Any, *, out_int32: bool = False, right: bool = False,
                 side: str | None = None, sorter: Any = None) -> Any:
    if side is not None:
        check(side in ("left", "right"),
              lambda: f"torch.searchsorted(): side can only be 'left' or 'right' but got {side}")
        check(not (right and side == "left"), lambda: "torch.searchsorted(): side and right can't be set to "
              "opposites, got side of left while right was True")
        right = side == "right"
    return _searchsorted("torch.searchsorted", sorted_sequence, input, out_int32, bool(right), sorter)


@decomposition(torch.bucketize)
def bucketize(input: Any, boundaries: Any, *, out_int32: bool = False, right: bool = False) -> Any:
    check(boundaries.ndim == 1, lambda: f"boundaries tensor must be 1 dimension, but got dim("
          f"{boundaries.ndim})")
    return _searchsorted("torch.bucketize", boundaries, input, out_int32, bool(right), None)
