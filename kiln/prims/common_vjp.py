"""What the prims' vjp rules share: the registration decorator and a few prim-built helpers.

A vjp rule is called as `rule(grads, outputs, *args, **kwargs)`: `grads` has one entry per output of the prim
(a tensor, or None where no gradient flows), `outputs` is the prim's outputs as a tuple, and args/kwargs are
the prim's own. It returns one entry per positional argument: the gradient of that argument (same shape and
dtype), or None. Rules compute with prims only, so that while tracing they record the backward graph.

`@vjp(p)` registers a rule written against the prim's full signature: the function returns a gradient for
every parameter, in order, and the registered rule keeps the entries of the arguments actually passed
positionally. When every incoming gradient is None the rule is not run at all.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from ..graph.symbolic import SizeUndecided, same_sizes, without_facts
from . import creation, elementwise, shape
from .registry import Prim, meta_of, rule


def vjp(p: Prim) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register `fn` as the vjp rule of prim `p` (see the module docstring)."""
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        def rule_fn(grads: Sequence[Any], outputs: Sequence[Any], *args: Any, **kwargs: Any) -> tuple:
            if all(g is None for g in grads):
                return tuple([None] * len(a) if p.name == "cat" and i == 0 else None
                             for i, a in enumerate(args))
            result = tuple(fn(tuple(grads), tuple(outputs), *args, **kwargs))
            if len(result) < len(args):
                result = result + (None,) * (len(args) - len(result))
            return result[:len(args)]
        rule_fn.__name__ = fn.__name__
        rule_fn.__doc__ = fn.__doc__
        rule_fn.__wrapped__ = fn  # type: ignore[attr-defined]
        rule("vjp", p)(rule_fn)
        return rule_fn
    return register


def no_gradient(p: Prim) -> None:
    """Register the rule of a prim no gradient flows through (integer results, random draws, sizes)."""
    def rule_fn(grads: Sequence[Any], outputs: Sequence[Any], *args: Any, **kwargs: Any) -> tuple:
        return (None,) * len(args)
    rule_fn.__name__ = f"_{p.name}_vjp"
    rule_fn.gives_no_gradient = True  # type: ignore[attr-defined]  (by design: see kiln.autograd.joint)
    rule("vjp", p)(rule_fn)


def not_differentiable_twice(p: Prim, why: str) -> None:
    """Register a rule that refuses: the prim is itself a backward, and its own derivative is not written."""
    def rule_fn(grads: Sequence[Any], outputs: Sequence[Any], *args: Any, **kwargs: Any) -> tuple:
        if all(g is None for g in grads):
            return (None,) * len(args)
        raise NotImplementedError(f"prims.{p.name}: no derivative ({why}); a double backward through it "
                                  "runs with torch")
    rule_fn.__name__ = f"_{p.name}_vjp"
    rule("vjp", p)(rule_fn)


def refuse_complex(name: str, *tensors: Any) -> None:
    """The rules that need a complex conjugate (no prim computes one) refuse complex tensors."""
    for t in tensors:
        if t is not None and meta_of(t).dtype.is_complex:
            raise NotImplementedError(f"prims.{name}: the derivative of a complex {name} needs a conjugate, "
                                      "which no prim computes")


def static_size(name: str, size: Any) -> int:
    """A size the rule needs as a Python number (a scale factor): symbolic sizes are refused."""
    if not isinstance(size, int):
        raise NotImplementedError(f"prims.{name}: the derivative needs the reduced size as a number, got the "
                                  f"symbolic size {size}")
    return size


def zeros(shape: Sequence[Any], dtype: torch.dtype, device: Any) -> Any:
    return creation.full(tuple(shape), 0, dtype, device)


def zeros_like(a: Any) -> Any:
    m = meta_of(a)
    return zeros(m.shape, m.dtype, m.device)


def reshape(a: Any, new_shape: Sequence[Any]) -> Any:
    """`a` with a new shape: a view where eager's view rule allows one, else a view of a contiguous copy.
    For values nothing aliases (gradients, a decomposition's intermediates): with symbolic sizes it is a
    view only where it is one at every size, else a copy, so it asks nothing the guards did not settle."""
    m = meta_of(a)
    new_shape = tuple(new_shape)
    if same_sizes(m.shape, new_shape):
        return a
    try:
        with without_facts():
            viewable = shape.view_strides(m.shape, m.strides, new_shape) is not None
    except SizeUndecided:
        viewable = False
    if not viewable:
        a = shape.clone(a)
    return shape.view(a, new_shape)


def restore_dims(g: Any, full_shape: Sequence[Any], reduced: Sequence[int]) -> Any:
    """A reduction's result `g` broadcast back over the dims it reduced (a view)."""
    kept = tuple(d for d in range(len(full_shape)) if d not in reduced)
    return shape.broadcast_in_dim(g, tuple(full_shape), kept)


def inverse_permutation(dims: Sequence[int]) -> tuple[int, ...]:
    inverse = [0] * len(dims)
    for i, d in enumerate(dims):
        inverse[d] = i
    return tuple(inverse)


def as_dtype(a: Any, dtype: torch.dtype) -> Any:
    return a if meta_of(a).dtype == dtype else elementwise.convert_element_type(a, dtype)


def positions(shape_: Sequence[Any], strides: Sequence[Any], offset: Any, device: Any) -> Any:
    """An int64 tensor of `shape_` holding each element's storage position under (strides, offset)."""
    shape_ = tuple(shape_)
    if not all(isinstance(v, int) for v in (*shape_, *strides, offset)):
        raise NotImplementedError(f"storage positions of a symbolic layout (sizes {list(shape_)}, strides "
                                  f"{list(strides)}, offset {offset})")
    out = creation.full(shape_, offset, torch.int64, device)
    for d, (size, stride) in enumerate(zip(shape_, strides)):
        if size == 1 or stride == 0:
            continue
        steps = creation.iota(size, 0, stride, torch.int64, device)
        out = elementwise.add(out, shape.broadcast_in_dim(steps, shape_, (d,)))
    return out
