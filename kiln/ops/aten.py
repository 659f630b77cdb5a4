"""torch.ops overloads in traces: `torch.ops.aten.add.Tensor(x, 1)` records what `torch.add(x, 1)` records.

Library code and tests call operator overloads directly: an `OpOverload` (`torch.ops.aten.sum.dim_IntList`,
`torch.ops.aten.add_.Tensor`, `torch.ops.aten.add.out`), an `OpOverloadPacket` (`torch.ops.aten.add`, whose
overload torch picks from the arguments), or a custom operator (`torch.ops.mylib.foo`). `registry.call`
hands an overload without a decomposition of its own to `overload_call`, which

- resolves a packet to the overload torch's dispatcher would pick (on meta stand-ins of the arguments);
- maps an aten overload to the torch-level callable of the same operator: a rule of `_RULES` (renamed ops
  and argument conventions: `_softmax(self, dim, half_to_float)` is `torch.softmax(self, dim)` when
  `half_to_float` is False), else the Python binding of the same name (`torch.add`, `torch.Tensor.add_`,
  `torch._C._nn.gelu`, `torch._C._linalg.linalg_vector_norm`, ...) when kiln decomposes it. The call is
  bound to the overload's schema and passed on in the binding's conventions (`.out` arguments become
  `out=`), so in-place and `out=` calls take kiln's in-place and out paths;
- accepts the mapping only where the torch-level call agrees with the overload itself on the meta device
  (the same result structure, shapes, dtypes and strides), and returns the result in the overload's
  conventions (a plain tuple where torch returns a named one, a list for `Tensor[]`);
- records anything else as a fallback node that calls the overload (counted), marked in-place or as a view
  from its schema's alias annotations; an overload that writes any argument but its first (or changes a
  tensor's shape, strides or autograd state in place) cannot be recorded functionally and raises
  UnsupportedError (the capture runs it outside the graph).

Overloads whose results differ from any torch-level call (`native_layer_norm` returns the statistics too)
are registered here as decompositions of their own.
"""
from __future__ import annotations

import inspect
import types
from typing import Any, Callable

import torch

from ..graph import Proxy, flatten, map_structure
from .kinds import _METADATA_ONLY, _RESTRIDE_INPLACE, INPLACE_OPS, VIEW_OPS, mark_inplace, mark_view
from .registry import DECOMPOSITIONS, UnsupportedError, call, call_as_is, register, route_overloads
from .standins import meta_value as _meta_value, run_on as _eager
from ..graph import torch_internals

OVERLOADS = (torch._ops.OpOverload, torch._ops.OpOverloadPacket)

# where the Python binding of an aten operator lives, by the operator's name
_BINDING_SPACES = (torch, torch.Tensor, torch._C._nn, torch._C._linalg, torch._C._special, torch._C._fft)
_BINDING_TYPES = (types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType)

Mapped = tuple[Any, tuple, dict]  # (torch-level callable, args, kwargs)


# ---- rules for operators whose torch-level name or conventions differ ---------------------------------

def _softmax_rule(fn: Any) -> Callable[[dict], Mapped | None]:
    def rule(bound: dict) -> Mapped | None:
        if bound.get("half_to_float"):
            return None  # (a float16 input computed and returned in float32: no torch-level twin)
        return fn, (bound["self"], bound["dim"]), {}
    return rule


def _to_copy_rule(bound: dict) -> Mapped | None:
    if bound.get("layout") not in (None, torch.strided) or bound.get("pin_memory"):
        return None
    kwargs = {"copy": True, "non_blocking": bool(bound.get("non_blocking", False))}
    for name in ("dtype", "device"):
        if bound.get(name) is not None:
            kwargs[name] = bound[name]
    if bound.get("memory_format") is not None:
        kwargs["memory_format"] = bound["memory_format"]
    return torch.Tensor.to, (bound["self"],), kwargs


def _unsafe_view_rule(bound: dict) -> Mapped:
    return torch.Tensor.view, (bound["self"], bound["size"]), {}


def _lift_fresh_copy_rule(bound: dict) -> Mapped:
    return torch.clone, (bound["self"],), {}


def _split_rule(bound: dict) -> Mapped:
    return torch.Tensor.split, (bound["self"], bound["split_size"], bound.get("dim", 0)), {}


def _split_with_sizes_rule(bound: dict) -> Mapped:
    return torch.Tensor.split, (bound["self"], list(bound["split_sizes"]), bound.get("dim", 0)), {}


# "aten::name.overload" (or "aten::name" for all its overloads) -> rule(bound arguments)
_RULES: dict[str, Callable[[dict], Mapped | None]] = {
    "aten::_softmax": _softmax_rule(torch.softmax),
    "aten::_log_softmax": _softmax_rule(torch.log_softmax),
    "aten::_to_copy": _to_copy_rule,
    "aten::_unsafe_view": _unsafe_view_rule,
    "aten::lift_fresh_copy": _lift_fresh_copy_rule,
    "aten::split.Tensor": _split_rule,
    "aten::split_with_sizes": _split_with_sizes_rule,
    "aten::split.sizes": lambda bound: _split_with_sizes_rule({**bound, "split_sizes": bound["split_size"]}),
    # (torch.export writes aten.alias where a module hands back a value it did not compute)
    "aten::alias": lambda bound: (torch.Tensor.view_as, (bound["self"], bound["self"]), {}),
    "aten::atleast_1d": lambda bound: (torch.atleast_1d, (bound["self"],), {}),
    "aten::atleast_2d": lambda bound: (torch.atleast_2d, (bound["self"],), {}),
    "aten::atleast_3d": lambda bound: (torch.atleast_3d, (bound["self"],), {}),
}


# metadata queries answered from the proxy's meta (its sizes are guarded, or symbolic), not run by torch
_QUERIES: dict[str, Callable[..., Any]] = {
    "aten::sym_size.int": lambda self, dim: self.size(dim),
    "aten::size.int": lambda self, dim: self.size(dim),
    "aten::sym_stride.int": lambda self, dim: self.stride(dim),
    "aten::stride.int": lambda self, dim: self.stride(dim),
    "aten::sym_numel.default": lambda self: self.numel(),
    "aten::numel.default": lambda self: self.numel(),
    "aten::dim.default": lambda self: self.dim(),
}


# ---- decompositions of overloads with no torch-level twin ---------------------------------------------

@register(torch.ops.aten.native_layer_norm.default)
def native_layer_norm(input: Any, normalized_shape: Any, weight: Any, bias: Any, eps: float) -> Any:
    """(layer_norm's result, the mean, 1 / sqrt(var + eps)), the statistics over the normalized dims with
    those dims kept as size 1, in float32 for reduced-precision inputs (in the input's dtype on the CPU)."""
    out = torch.layer_norm(input, normalized_shape, weight, bias, eps)
    dims = list(range(input.dim() - len(normalized_shape), input.dim()))
    wide = input.float() if input.dtype in (torch.float16, torch.bfloat16) else input
    var, mean = torch.var_mean(wide, dims, correction=0, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    if input.device.type == "cpu":
        mean, rstd = mean.to(input.dtype), rstd.to(input.dtype)
    return out, mean, rstd


# ---- the mapping --------------------------------------------------------------------------------------

def _binding(op: torch._ops.OpOverload) -> Any:
    """The Python binding of the op's operator that kiln decomposes, or None."""
    name = op._schema.name.split("::", 1)[1]
    for space in _BINDING_SPACES:
        fn = getattr(space, name, None)
        if isinstance(fn, _BINDING_TYPES) and fn in DECOMPOSITIONS:
            return fn
    return None


def _functional_call(op: torch._ops.OpOverload, bound: dict) -> Mapped | None:
    """torch.nn.functional's function of the operator's name (F.leaky_relu for aten::leaky_relu, whose
    binding kiln does not decompose): the first argument in place, every other argument the call gives by
    its schema name, which must be a parameter of the function (else None)."""
    name = op._schema.name.split("::", 1)[1]
    fn = getattr(torch.nn.functional, name, None)
    if not isinstance(fn, types.FunctionType) or fn not in DECOMPOSITIONS:
        return None
    arguments = op._schema.arguments
    if not arguments or arguments[0].name not in bound or any(a.is_out for a in arguments):
        return None
    params = inspect.signature(fn).parameters
    first, rest = arguments[0].name, [a.name for a in arguments[1:] if a.name in bound]
    if any(p not in params or params[p].kind is inspect.Parameter.POSITIONAL_ONLY for p in rest):
        return None
    return fn, (bound[first],), {p: bound[p] for p in rest}


def _bind(schema: Any, args: tuple, kwargs: dict) -> dict | None:
    """The call's arguments by schema name (None when they do not fit: eager's own call raises)."""
    positional = [a for a in schema.arguments if not a.kwarg_only]
    if len(args) > len(positional):
        return None
    bound = {a.name: v for a, v in zip(positional, args)}
    names = {a.name for a in schema.arguments}
    for key, value in kwargs.items():
        if key not in names or key in bound:
            return None
        bound[key] = value
    if any(a.name not in bound and not a.has_default_value() and not a.is_out for a in schema.arguments):
        return None
    return bound


def _same_name_call(op: torch._ops.OpOverload, fn: Any, bound: dict) -> Mapped:
    """fn's call for the bound arguments: the leading positional ones in order, the rest by name (the
    bindings take the schema's names, `self` aside, which is always first), the out arguments as out=."""
    args: list = []
    kwargs: dict = {}
    outs = []
    gap = False
    for a in op._schema.arguments:
        if a.is_out:
            if a.name in bound:
                outs.append(bound[a.name])
        elif a.name not in bound:
            gap = gap or not a.kwarg_only
        elif a.kwarg_only or gap:
            kwargs[a.name] = bound[a.name]
        else:
            args.append(bound[a.name])
    if outs:
        kwargs["out"] = outs[0] if len(outs) == 1 else tuple(outs)
    return fn, tuple(args), kwargs


def _mapped(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Mapped | None:
    """The torch-level call computing what op(*args, **kwargs) computes, or None."""
    if op.namespace != "aten":
        return None
    schema = op._schema
    rule = _RULES.get(f"{schema.name}.{schema.overload_name}") or _RULES.get(schema.name)
    bound = _bind(schema, args, kwargs)
    if bound is None:
        return None
    if rule is not None:
        return rule(bound)
    fn = _binding(op)
    return _same_name_call(op, fn, bound) if fn is not None else _functional_call(op, bound)


def _meta_agree(a: Any, b: Any) -> bool:
    """The same result structure; tensors of the same shape, dtype and strides; other values equal."""
    left, right = list(flatten(a)), list(flatten(b))
    if len(left) != len(right):
        return False
    for x, y in zip(left, right):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or x.shape != y.shape or \
                    x.dtype != y.dtype or x.layout != y.layout or \
                    (x.layout == torch.strided and x.stride() != y.stride()):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


def _stand_in(v: Any) -> Any:
    if isinstance(v, torch.Tensor) and not isinstance(v, Proxy):
        return v.to("meta")  # (a constant tensor of the program)
    return _meta_value(v)


def _run(fn: Any, args: tuple, kwargs: dict, on: str) -> Any:
    if on == "meta":
        return fn(*map_structure(_stand_in, args), **map_structure(_stand_in, kwargs))
    return _eager(fn, _clone_examples(args), _clone_examples(kwargs), "example")


def _clone_examples(value: Any) -> Any:
    """Proxies whose examples are copies (an in-place overload must not write the user's tensors)."""
    def clone(v: Any) -> Any:
        if isinstance(v, Proxy) and isinstance(v.example, torch.Tensor):
            return Proxy(v.node, example=v.example.clone())
        return v
    return map_structure(clone, value)


def _checked(op: torch._ops.OpOverload, args: tuple, kwargs: dict, mapped: Mapped) -> bool:
    """Whether the torch-level call agrees with the overload on meta stand-ins of the arguments, or on
    copies of their examples where the meta device cannot run it (no meta kernel, a copy to the CPU)."""
    fn, margs, mkwargs = mapped
    examples = all(p.example is not None for p in flatten((args, kwargs)) if isinstance(p, Proxy))
    for on in ("meta", "example") if examples else ("meta",):
        try:
            expected = _run(op, args, kwargs, on)
        except Exception:
            continue  # (bad input fails on the examples too: the overload's fallback raises eager's error)
        try:
            return _meta_agree(expected, _run(fn, margs, mkwargs, on))
        except Exception:
            return False
    return False


def _in_schema_conventions(op: torch._ops.OpOverload, result: Any) -> Any:
    """A named tuple (torch.return_types.max) as the plain tuple, a tuple of tensors as the list
    (`Tensor[]`) the overload returns."""
    returns = op._schema.returns
    if len(returns) > 1 and isinstance(result, tuple):
        return tuple(result)
    if len(returns) == 1 and isinstance(returns[0].type, torch._C.ListType) and isinstance(result, tuple):
        return list(result)
    return result


def _resolve(packet: torch._ops.OpOverloadPacket, args: tuple, kwargs: dict) -> Any:
    """The overload torch's dispatcher picks for these arguments, or None."""
    try:
        stand_ins = map_structure(_meta_value, args), map_structure(_meta_value, kwargs)
        name = torch_internals.resolve_overload(packet, stand_ins[0], stand_ins[1])
        return getattr(packet, name)
    except torch_internals.TorchInternalsError:
        raise
    except Exception:
        return None


def _writes(op: torch._ops.OpOverload) -> list[int]:
    """Positions in the schema of the arguments the op writes."""
    return [i for i, a in enumerate(op._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write]


def _fallback(op: Any, args: tuple, kwargs: dict) -> Any:
    """A fallback node calling the overload; in-place on its first argument or a view of it as its schema
    says; UnsupportedError for what a functional graph cannot replay."""
    name = str(op)
    overloads = [op] if isinstance(op, torch._ops.OpOverload) else \
        [getattr(op, o) for o in op.overloads()]
    writes = [_writes(o) for o in overloads]
    if isinstance(op, torch._ops.OpOverloadPacket):
        if any(writes):
            raise UnsupportedError(f"torch.ops.{name}: kiln cannot tell which overload runs, and some write "
                                   f"their arguments; it runs outside the graph")
        return call_as_is(op, args, kwargs)
    base = op._schema.name.split("::", 1)[1]
    if writes[0] and (writes[0] != [0] or op._schema.arguments[0].kwarg_only or base in _RESTRIDE_INPLACE
                      or base in _METADATA_ONLY):
        raise UnsupportedError(f"torch.ops.{name} writes its arguments "
                               f"{[op._schema.arguments[i].name for i in writes[0]]} in a way kiln cannot "
                               f"record in a graph; it runs outside the graph")
    if writes[0] and op not in INPLACE_OPS:
        mark_inplace(op)
    returns = op._schema.returns
    if not writes[0] and returns and returns[0].alias_info is not None and op not in VIEW_OPS:
        mark_view(op)  # (e.g. aten::alias, aten::unfold: the result shares its first argument's memory)
    return call_as_is(op, args, kwargs)


def overload_call(op: Any, args: tuple, kwargs: dict) -> Any:
    """`registry.call` for an OpOverload or OpOverloadPacket without a decomposition of its own."""
    if isinstance(op, torch._ops.OpOverloadPacket):
        resolved = _resolve(op, args, kwargs)
        if resolved is None:
            return _fallback(op, args, kwargs)
        op = resolved
        if op in DECOMPOSITIONS:
            return call_as_is(op, args, kwargs)
    query = _QUERIES.get(f"{op._schema.name}.{op._overloadname}")
    if query is not None and args and isinstance(args[0], Proxy) and len(args) + len(kwargs) <= 2:
        try:
            return query(*args, **kwargs)
        except (TypeError, IndexError):
            pass  # (bad arguments: the fallback raises eager's error)
    mapped = _mapped(op, args, kwargs)
    if mapped is not None and _checked(op, args, kwargs, mapped):
        fn, margs, mkwargs = mapped
        return _in_schema_conventions(op, call(fn, margs, mkwargs))
    return _fallback(op, args, kwargs)


route_overloads(overload_call)
