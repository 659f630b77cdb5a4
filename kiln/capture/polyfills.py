"""Python stand-ins for torch functions kiln cannot trace as they are written.

Each stand-in is plain Python over torch ops, inlined by the interpreter in place of the torch function,
so its ops (and the user callables it calls) land in the graph. It computes what the torch function
computes, raises what it raises for the arguments users pass, and is looked up by the torch function's
module and name (kiln never imports torch's higher-order-op machinery).

- `torch._higher_order_ops.associative_scan.associative_scan(combine_fn, xs, dim, reverse, combine_mode)`:
  torch runs it only under torch.compile (transformers' Mamba, Jamba and Falcon-Mamba call it when
  `is_torchdynamo_compiling()`, which is true under kiln). In "generic" mode torch applies combine_fn
  under vmap over the scan dimension, so combine_fn sees one element at a time, without that dimension.
  The stand-in calls it element by element in scan order, which is exactly that semantics whatever
  combine_fn does (a batched log-depth scan would be right only for combine_fns that broadcast over a
  leading dimension, which nothing checks). "pointwise" mode is CUDA-only in torch, as here.
"""
from __future__ import annotations

from typing import Any, Callable

import torch


def _flatten(tree: Any) -> tuple[list, Any]:
    """(leaves, spec) of a tensor or nested tuples/lists/dicts of them (torch's pytree for these)."""
    if isinstance(tree, (tuple, list)):
        leaves: list = []
        specs = []
        for item in tree:
            sub, spec = _flatten(item)
            leaves.extend(sub)
            specs.append((len(sub), spec))
        return leaves, (type(tree), None, specs)
    if isinstance(tree, dict):
        leaves = []
        specs = []
        keys = list(tree)
        for key in keys:
            sub, spec = _flatten(tree[key])
            leaves.extend(sub)
            specs.append((len(sub), spec))
        return leaves, (dict, keys, specs)
    return [tree], None


def _unflatten(leaves: list, spec: Any) -> Any:
    if spec is None:
        return leaves[0]
    kind, keys, specs = spec
    items = []
    start = 0
    for count, sub in specs:
        items.append(_unflatten(leaves[start:start + count], sub))
        start += count
    if kind is dict:
        return dict(zip(keys, items))
    if kind is tuple or kind is list:
        return kind(items)
    return kind(*items)  # a namedtuple


def associative_scan(combine_fn: Callable[[Any, Any], Any], xs: Any, dim: int, reverse: bool = False,
                     combine_mode: str = "pointwise") -> Any:
    leaves, spec = _flatten(xs)
    if not callable(combine_fn):
        raise ValueError(f"Combine_fn must be a callable, but got {combine_fn}")
    if not isinstance(dim, int):
        raise ValueError("Dim must be an int, but got " + str(type(dim)))
    if not isinstance(reverse, bool):
        raise RuntimeError("Reverse must be a bool, but got " + str(type(reverse)))
    if combine_mode not in ("pointwise", "generic"):
        raise ValueError(f"Combine_mode must either 'pointwise' or 'generic', but got {combine_mode}")
    if len(leaves) == 0:
        raise ValueError("Expected at least 1 xs leaf")
    for leaf in leaves:
        if not isinstance(leaf, torch.Tensor):
            raise ValueError("xs leaves must be a Tensor")
    ndim = leaves[0].ndim
    if dim < -max(ndim, 1) or dim >= max(ndim, 1):
        raise IndexError(f"Dimension out of range (expected to be in range of [{-max(ndim, 1)}, "
                         f"{max(ndim, 1) - 1}], but got {dim})")
    if dim < 0:
        dim = dim + ndim
    if combine_mode == "pointwise":
        for leaf in leaves:
            if leaf.device.type not in ("cuda", "xpu"):
                raise ValueError("For combine_mode='pointwise', all input tensors need to be on CUDA or XPU")
    for leaf in leaves:
        if leaf.is_sparse:
            raise ValueError("xs leaves must dense Tensors, consider using `to_dense()`")
        if leaf.ndim <= dim or leaf.shape[dim] == 0:
            raise ValueError("All xs leaves must at least have 'dim' number of dimensions and scan dimension > 0")
    moved = [torch.movedim(leaf, dim, 0) for leaf in leaves]
    if reverse:
        moved = [leaf.flip([0]) for leaf in moved]
    length = moved[0].shape[0]
    carry = [leaf[0] for leaf in moved]
    columns = [[value] for value in carry]
    for i in range(1, length):
        result, _ = _flatten(combine_fn(_unflatten(carry, spec), _unflatten([leaf[i] for leaf in moved], spec)))
        if len(result) != len(carry):
            raise RuntimeError(f"The number of leaves of the pytree of the output ({len(result)}) must match "
                               f"the number of leaves of the pytree of the input ({len(carry)})")
        carry = result
        for column, value in zip(columns, carry):
            column.append(value)
    out = [torch.stack(column, 0) for column in columns]
    if reverse:
        out = [leaf.flip([0]) for leaf in out]
    return _unflatten([torch.movedim(leaf, 0, dim) for leaf in out], spec)


# (torch module, name) -> stand-in
POLYFILLS: dict[tuple[str, str], Callable[..., Any]] = {
    ("torch._higher_order_ops.associative_scan", "associative_scan"): associative_scan,
}


def polyfill_for(fn: Any) -> Callable[..., Any] | None:
    return POLYFILLS.get((getattr(fn, "__module__", None) or "", getattr(fn, "__name__", None) or ""))
