"""The torch surface: each torch callable maps to a decomposition into prims.

`@register(torch.add, torch.Tensor.add, torch.Tensor.__add__)` registers a Python function that takes the
same arguments as the torch op — with proxies for tensors — and computes the result with prims and other
decompositions. Torch calls on proxies reach `call`:

- at the top level of a trace, `call` records one `call_torch` node whose `decomposition` is the prim graph
  of the op, built by running the decomposition on fresh proxies; its output meta comes from there;
- inside a decomposition (the tracer is `inline`), torch calls record their prims directly;
- an op with no decomposition, or whose decomposition raises `NoDecomposition`, becomes a fallback node
  (it calls the torch op; its output meta comes from the `meta` device); fallbacks are counted;
- bad input raises the exception eager raises; a decomposition error eager does not share is a kiln bug:
  the op falls back (counted) unless `strict_decompositions` is set.
"""
from __future__ import annotations

import dataclasses
import inspect
import itertools
import weakref
from typing import Any, Callable

import torch

from .. import config
from ..counters import counters
from ..graph.node import Node, is_custom_op
from ..graph import (DataDependentError, Graph, Proxy, TensorMeta, Tracer, current_tracer, dce,
                     flatten, map_structure, torch_name, tracing)
from ..graph.proxy import set_torch_call_handler
from ..graph.symbolic import has_symbols, hint_of, specialize_all
from . import autocast, grad_flags
from . import updates as argument_updates
from .kinds import (_METADATA_ONLY, _RESTRIDE_INPLACE, INPLACE_FLAG_OPS, INPLACE_OPS, VIEW_OPS,  # noqa: F401
                    is_inplace, mark_inplace, mark_inplace_flag, mark_view)
from .standins import CannotCheck, LazyRun, aliasing, run_on
from .targets import OnCopy, TensorLeaves
from .overlap import memory_relation as _memory_relation, overlapping, overlaps_itself, shared_memory, uniform_fill
from .overlap import storage_key as _storage_key

log = config.channel("prims")

DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {}


class NoDecomposition(Exception):
    """Raised by a decomposition for a case it does not handle; the op runs as a fallback."""


class UnsupportedError(RuntimeError):
    """The trace cannot represent this program (kiln's capture turns it into a graph break)."""


class DataDependentShape(NoDecomposition):
    """A decomposition's refusal: the op's output shape depends on the values of its inputs (nonzero,
    x[mask]). Traced with examples, it is a fallback node whose shape is the examples'; the capture, whose
    graphs serve later calls with other values, refuses it instead (a graph break: it runs outside)."""


# ops without a decomposition whose output shape depends on their inputs' values (by name, as torch's
# Python wrappers, e.g. torch.unique, reach them under several names)
_DATA_DEPENDENT_FALLBACKS = {"unique", "_unique", "_unique2", "unique_dim", "unique_consecutive", "bincount"}


def register(*targets: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a decomposition for one or more torch callables."""
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        for target in targets:
            if target is None:
                continue
            DECOMPOSITIONS[target] = fn
        return fn
    return wrap


def lookup(func: Any) -> Callable[..., Any] | None:
    return DECOMPOSITIONS.get(func)


# ---- aliasing: views share storage, and in-place ops on aliased tensors are refused ---------------------

class _WeakIdentityDict:
    """Weak keys compared by identity: WeakKeyDictionary compares keys with `==`, which on a Proxy records
    an op (and then asks for its truth value)."""

    def __init__(self) -> None:
        self._data: dict[int, tuple[weakref.ref, Any]] = {}

    def __setitem__(self, key: Any, value: Any) -> None:
        data, k = self._data, id(key)
        data[k] = (weakref.ref(key, lambda _ref: data.pop(k, None)), value)

    def get(self, key: Any, default: Any = None) -> Any:
        entry = self._data.get(id(key))
        return entry[1] if entry is not None and entry[0]() is key else default

    def __contains__(self, key: Any) -> bool:
        entry = self._data.get(id(key))
        return entry is not None and entry[0]() is key

    def add(self, key: Any) -> None:
        self[key] = True

    def keys(self) -> list[Any]:
        """The keys still alive."""
        return [k for k in (ref() for ref, _ in list(self._data.values())) if k is not None]


class _Aliases:
    """Which proxies are views of which base, so in-place updates that would reach an alias are refused."""

    def __init__(self) -> None:
        self.base = _WeakIdentityDict()  # Proxy -> the Proxy it is a view of
        self.has_views = _WeakIdentityDict()  # Proxies that have views (a set)
        self.input_name = _WeakIdentityDict()  # Proxy -> its graph input's name
        self.chain = _WeakIdentityDict()  # view Proxy -> ViewChain from its base (None: unknown)
        # Proxies of tensors that require grad, updated in place under no_grad: eager's tensor keeps its
        # autograd identity (a leaf stays the leaf), which the graph's new value does not have
        self.updated_without_grad = _WeakIdentityDict()


_ALIASES: weakref.WeakKeyDictionary[Graph, _Aliases] = weakref.WeakKeyDictionary()


def aliases(graph: Graph) -> _Aliases:
    if graph not in _ALIASES:
        _ALIASES[graph] = _Aliases()
    return _ALIASES[graph]


def update_argument(target: Any, value: Any) -> None:
    """Inside a decomposition: the op writes `value` into its tensor argument `target` in place, as eager's
    BatchNorm updates its running statistics (kiln/ops/updates.py)."""
    reason = argument_updates.record(current_tracer(), target, value)
    if reason is not None:
        raise NoDecomposition(reason)


# ---- the torch-call handler ------------------------------------------------------------------------------

_op_name = torch_name
_OVERLOADS = (torch._ops.OpOverload, torch._ops.OpOverloadPacket)
_overload_route: Callable[[Any, tuple, dict], Any] | None = None


def _shapes(args: tuple, kwargs: dict) -> str:
    parts = []
    for v in flatten((args, kwargs)):
        if isinstance(v, (Proxy, torch.Tensor)):
            parts.append(f"{str(v.dtype).removeprefix('torch.')}[{', '.join(str(s) for s in v.shape)}]")
    return ", ".join(parts)


def _custom_operator(func: Any) -> bool:
    """An operator a library registered (torch.library), not one of torch's own."""
    name = getattr(func, "_qualified_op_name", None) or getattr(getattr(func, "_schema", None), "name", "")
    return isinstance(func, _OVERLOADS) and name.partition("::")[0] not in ("aten", "prims")


def _check_sizes_follow_metas(func: Any, name: str, args: tuple, kwargs: dict, real: Any) -> None:
    """A fallback node's output sizes are the example run's, which the graph keeps for every later call:
    they must follow from the inputs' metas. The op is run on the meta device (a custom operator's fake
    kernel, aten's meta kernels); sizes it cannot give, or gives otherwise, mean the op reads values to size
    its output (`x[x > 0]` in a custom op), and it runs outside the graph."""
    try:
        meta = run_on(func, args, kwargs, "meta")
    except Exception as e:
        if _custom_operator(func):
            raise UnsupportedError(f"{name} has no fake kernel, so kiln cannot know its output sizes without "
                                   f"running it; it runs outside the graph (register one with "
                                   f"torch.library.register_fake)") from None
        if "data-dependent" in str(e) or "data dependent" in str(e):
            raise UnsupportedError(f"{name}: its output shape depends on the values of its inputs; it runs "
                                   f"outside the graph") from None
        return  # (an aten op without a meta kernel: its sizes are taken as the example's, as before)
    got = [tuple(t.shape) for t in flatten(meta) if isinstance(t, torch.Tensor)]
    want = [tuple(t.shape) for t in flatten(real) if isinstance(t, torch.Tensor)]
    if got != want:
        raise UnsupportedError(f"{name}: its meta kernel gives sizes {got} where this call gives {want} (they "
                               f"depend on values); it runs outside the graph")


def _has_examples(args: tuple, kwargs: dict) -> bool:
    return all(p.has_example() for p in flatten((args, kwargs)) if isinstance(p, Proxy))


def call(func: Any, args: tuple, kwargs: dict) -> Any:
    """Handle a torch call whose arguments include proxies (or any torch call while tracing)."""
    if isinstance(func, _OVERLOADS) and func not in DECOMPOSITIONS and _overload_route is not None:
        return _overload_route(func, args, kwargs)  # torch.ops.aten.add.Tensor is recorded as torch.add
    return call_as_is(func, args, kwargs)


def route_overloads(handler: Callable[[Any, tuple, dict], Any]) -> None:
    """Install kiln/ops/aten.py's handler of OpOverloads and OpOverloadPackets without decompositions."""
    global _overload_route
    _overload_route = handler


def call_as_is(func: Any, args: tuple, kwargs: dict) -> Any:
    """`call` for func itself (kiln/ops/aten.py's fallback for an overload it does not map)."""
    tracer = current_tracer()
    if tracer is None:
        proxies = [a for a in flatten((args, kwargs)) if isinstance(a, Proxy)]
        if not proxies:
            return func(*args, **kwargs)
        tracer = Tracer(proxies[0].node.graph)
    if tracer.inline:
        fn = lookup(func)
        if fn is None:
            raise NoDecomposition(_op_name(func))
        return fn(*args, **kwargs)
    with tracing(tracer):
        return _record(tracer, func, args, kwargs)


def _refuse_data_dependent(tracer: Tracer, name: str, data_dependent: bool) -> None:
    """A tracer marked `static_shapes` (the capture's) refuses ops whose output shape depends on values."""
    if data_dependent and getattr(tracer, "static_shapes", False):
        raise UnsupportedError(f"{name}: its output shape depends on the values of its inputs, so a graph "
                               f"cannot be reused for other values; it runs outside the graph")


def _lift(tracer: Tracer, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Turn real tensors among the arguments into constant nodes of the graph. In a capture (`sourced`), a
    parameter, or a tensor that requires grad with grad on, refuses: it reached the op through code torch
    ran for kiln (a function handed to a torch function such as torch.utils.checkpoint.checkpoint), not
    through a source capture guards. As a constant its gradient would be lost (silently: a regression test
    in tests/capture/test_capture_examples.py) and a new value assigned later never seen."""
    graph = tracer.graph

    def lift(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and not isinstance(v, Proxy):
            if tracer.sourced and (isinstance(v, torch.nn.Parameter) or
                                   (v.requires_grad and torch.is_grad_enabled())):
                raise UnsupportedError(f"a {type(v).__name__} ({TensorMeta.of(v).short()}) reached the graph "
                                       f"outside of the sources kiln traces (code torch itself ran); as a "
                                       f"constant its gradient and later values would be lost")
            return Proxy(graph.constant(v), example=v)
        return v
    return map_structure(lift, args), map_structure(lift, kwargs)


def _record(tracer: Tracer, func: Any, args: tuple, kwargs: dict) -> Any:
    graph = tracer.graph
    if kwargs.get("out") is not None:
        return _record_out(tracer, func, args, kwargs)
    args, kwargs = _lift(tracer, args, kwargs)
    # autocast's casts become nodes of the graph; the op then runs as it would with autocast off
    args, kwargs, autocast_cast = autocast.cast_inputs(func, args, kwargs)
    region = autocast.state()
    name = _op_name(func)
    flag_op = getattr(func, "__name__", "")
    if flag_op in _RESTRIDE_INPLACE and args and isinstance(args[0], Proxy):
        # they change the tensor's strides or shape, not its values: eager's storage stays where it is
        raise UnsupportedError(f"{name} changes the shape or strides of a traced tensor in place")
    refused = grad_flags.refusal(name, flag_op, args, kwargs, aliases(graph).updated_without_grad)
    if refused is not None:
        raise UnsupportedError(refused)
    inplace = is_inplace(func, kwargs)
    if inplace and not (args and isinstance(args[0], Proxy)):
        args, kwargs = _target_first(func, args, kwargs)
    if inplace:
        _check_inplace(graph, func, args)
    outer = [v for v in flatten((args, kwargs)) if isinstance(v, Proxy)]

    # Build the decomposition on fresh proxies of a sub-graph.
    sub = Graph(name.rsplit(".", 1)[-1])
    sub_inputs = [Proxy(sub.placeholder(f"a{i}", p.meta)) for i, p in enumerate(outer)]
    order = iter(sub_inputs)

    def to_sub(v: Any) -> Any:
        return next(order) if isinstance(v, Proxy) else v
    sub_args, sub_kwargs = map_structure(to_sub, args), map_structure(to_sub, kwargs)
    decomposition: Graph | None = None
    result: Any = None
    fn = lookup(func)
    failure: BaseException | None = None
    argument_updates.begin(sub)
    if fn is not None:
        try:
            with tracing(Tracer(sub, inline=True, options=tracer.options)), autocast.autocast_off():
                result = fn(*sub_args, **sub_kwargs)
            decomposition = sub
        except NoDecomposition as e:
            _refuse_data_dependent(tracer, name, isinstance(e, DataDependentShape))
            counters["no_decomposition"][f"{name} (needs {e})" if str(e) != name else name] += 1
        except UnsupportedError:
            raise  # the call cannot be traced at all (e.g. torch drops an argument): capture breaks the graph
        except DataDependentError as e:
            failure = e
        except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError, AssertionError,
                ZeroDivisionError, OverflowError) as e:
            failure = e
    else:
        _refuse_data_dependent(tracer, name, getattr(func, "__name__", "") in _DATA_DEPENDENT_FALLBACKS)
        counters["no_decomposition"][name] += 1

    result, updated = argument_updates.end(sub, result, sub_inputs, outer)
    if decomposition is not None and (updated is None or inplace and updated):  # (see end)
        counters["no_decomposition"][f"{name} (updates a constant or repeated argument)"] += 1
        decomposition = None
    targets = [outer[i] for i in updated] if decomposition is not None else []  # updated in place
    examples = _has_examples(args, kwargs)
    if failure is not None:
        _raise_eager_error(func, name, args, kwargs, failure, examples)
        counters["decomposition_error"][name] += 1
        log.warning("decomposition of %s failed where eager succeeds (%s: %s); running it as a fallback",
                    name, type(failure).__name__, failure)
        if tracer.flag("strict_decompositions"):
            raise failure

    if decomposition is not None and not any(isinstance(v, Proxy) for v in flatten(result)):
        return result  # a Python value (e.g. torch.numel); nothing to record

    for t in targets:
        _check_inplace(graph, func, (t, *[o for o in outer if o is not t]))
    func = argument_updates.wrap(func, args, kwargs, targets)
    real: Any = None
    deferred: LazyRun | None = None
    owners_of: list[int | None] | None = None  # eager's aliasing of the results, from the meta device
    if examples and decomposition is not None and not region and not tracer.flag("check_metas"):
        # Recorded, not run: eager's checks and result metadata come from the meta device, and the examples
        # of the results are computed only if something asks for one. (Under autocast eager's result is
        # checked as it runs: a composite such as einsum reaches ops autocast casts inside it, which its
        # decomposition, built with autocast off, does not.)
        deferred = LazyRun(func, args, kwargs, protect=False, autocast_state=region)
        real, owners_of = _eager_checks(func, name, args, kwargs, result)
    elif examples:
        try:
            real = run_on(func, args, kwargs, "example", protect=decomposition is None)
        except Exception as e:  # bad input: eager's exception, naming the op and the shapes
            raise _named(e, name, args, kwargs) from None
    if decomposition is not None:
        leaves = [v for v in flatten(result) if isinstance(v, Proxy)]
        identity = _identity_output(result, sub_inputs, outer)
        if identity is not None and not inplace and (real is None or _metas_agree(leaves, real)):
            return identity  # (checked first: eager may not return its input, e.g. sum_to_size of a 0-d bool)
        if real is not None and not _metas_agree(leaves, real):
            counters["decomposition_mismatch"][name] += 1
            log.warning("decomposition of %s gives %s, eager gives %s; running it as a fallback", name,
                        [p.meta.short() for p in leaves],
                        [TensorMeta.of(t).short() for t in flatten(real) if isinstance(t, torch.Tensor)])
            if tracer.flag("strict_decompositions"):
                raise AssertionError(f"decomposition of {name} disagrees with eager on metadata")
            decomposition = None
            if deferred is not None:  # the torch op runs: its results' examples are real values
                deferred = owners_of = None
                real = run_on(func, args, kwargs, "example")
        else:
            sub.output(map_structure(lambda v: v.node if isinstance(v, Proxy) else v, result))
            dce(sub)
            metas = tuple(p.meta for p in leaves)
            structure = result
    if decomposition is None:
        if real is None:
            if region and not autocast_cast:  # (meta tensors do not see autocast)
                raise UnsupportedError(f"{name} runs with torch under torch.autocast with no example values")
            try:
                real = run_on(func, args, kwargs, "meta")
            except Exception as e:
                raise UnsupportedError(f"{name} has no decomposition and no meta implementation, so kiln "
                                       f"cannot know its output shape ({type(e).__name__}: {e})") from None
        else:
            _check_sizes_follow_metas(func, name, args, kwargs, real)
        if any(isinstance(v, (bool, int, float, complex)) for v in flatten(real)):
            # a number computed by torch (torch.equal, aten.item): the graph would keep this call's value
            raise UnsupportedError(f"{name} returns a Python number; it runs outside the graph")
        counters["custom_op" if is_custom_op(func) else "fallback"][name] += 1
        if has_symbols((args, kwargs)) and not all(isinstance(v, bool) for v in flatten(real)):
            # a torch op kiln cannot see into: its output sizes (or values) are the example's, right only
            # at these sizes, so every symbol of its inputs is specialized (guarded), counted
            counters["dynamic_specialized"][f"{name} (runs with torch)"] += 1
            specialize_all((args, kwargs))
        structure = real
        metas = tuple(TensorMeta.of(t) for t in flatten(real) if isinstance(t, torch.Tensor))

    node_args = map_structure(lambda v: v.node if isinstance(v, Proxy) else v, args)
    node_kwargs = map_structure(lambda v: v.node if isinstance(v, Proxy) else v, kwargs)
    single = isinstance(structure, (Proxy, torch.Tensor))
    target = func
    if inplace and decomposition is None:
        # the graph is functional: the op updates a copy, which stands for the tensor from here on (and is
        # written back at the end when the tensor is a graph input); reads before it see the old values
        target = OnCopy(func)
    if not single and not _flat_tensor_sequence(structure):
        # A nested result such as (hist, [edges, ...]): the node's value is the flat tuple of its tensors,
        # which is how getitem numbers them, in the decomposition and in the torch op alike.
        target = TensorLeaves(func)
        if decomposition is not None:
            decomposition.output_node.args = (tuple(p.node for p in flatten(structure) if isinstance(p, Proxy)),)
            dce(decomposition)
    if decomposition is None and region and not autocast_cast:
        target = autocast.UnderAutocast(target, region)  # eager's result depends on the state
    if grad_flags.output_requires_grad(func, args, kwargs):
        metas = tuple(dataclasses.replace(m, requires_grad=True) if m.dtype.is_floating_point or
                      m.dtype.is_complex else m for m in metas)
    metas = argument_updates.own_requires_grad(metas, targets)
    node = graph.call_torch(target, node_args, node_kwargs, metas[0] if single else metas, decomposition,
                            origin=tracer.origin)
    if single:
        out: Any = Proxy(node, example=deferred.leaf(0) if deferred is not None else
                         real if isinstance(real, torch.Tensor) else None)
    else:
        counter = itertools.count()
        real_leaves = [t for t in flatten(real) if isinstance(t, torch.Tensor)] if real is not None else None

        def rebuild(v: Any) -> Any:
            if isinstance(v, (Proxy, torch.Tensor)):
                i = next(counter)
                example = deferred.leaf(i) if deferred is not None else real_leaves[i] if real_leaves else None
                return Proxy(graph.getitem(node, i), example=example)
            return v
        out = map_structure(rebuild, structure)
    step = (func, args[1:], kwargs) if args and outer and args[0] is outer[0] else None
    if deferred is not None:
        if outer and (func in VIEW_OPS or not inplace and _views_an_input(decomposition)):
            # which results share an argument's memory is eager's to say: its run on the meta device tells
            # (the examples, where the meta device could not run it)
            _note_shared_storage(graph, outer, out, step if func not in VIEW_OPS else (func, args[1:], kwargs),
                                 owners_of, view_op=func in VIEW_OPS)
    elif func in VIEW_OPS and outer:
        _note_views(graph, outer[0], out, (func, args[1:], kwargs))
    elif real is not None and outer and not inplace:
        _note_shared_storage(graph, outer, out, step)
    if inplace:
        updated = _apply_inplace(graph, args[0], out)
        _propagate_to_aliases(graph, updated)
        return updated
    for t, value in zip(targets, out[1:] if targets else ()):
        _apply_inplace(graph, t, value)
        _propagate_to_aliases(graph, t)
    return out[0] if targets else out


def _eager_checks(func: Any, name: str, args: tuple, kwargs: dict,
                  result: Any) -> tuple[Any, list[int | None] | None]:
    """What a decomposed op learns from eager without running it on the examples: its run on zero-filled
    stand-ins laid out as its arguments where every tensor, its arguments' and its result's, is small
    (eager's kernels' checks, such as the dtypes a kernel is built for), else on the meta device (eager's
    checks of shapes and dtypes). Either gives the result's metadata and eager's aliasing (views share
    their base's storage on both). Where the run raises, the examples decide: eager's error, named, when
    they fail too (a zero divisor fails where the values do not). Returns the result and its aliasing;
    (None, None) where neither can run it. Above 2**16 elements eager's kernels are not asked: the
    decomposition's and the meta device's checks stand (`check_metas` runs every op on its examples)."""
    failed: BaseException | None = None
    small = all(hint_of(p.meta).numel() <= 1 << 16 for p in flatten(result) if isinstance(p, Proxy))
    for on in ("zeros", "meta") if small else ("meta",):
        stand_ins: list = []
        try:
            out = run_on(func, args, kwargs, on, stand_ins=stand_ins)
            return out, aliasing(out, stand_ins)
        except CannotCheck:
            continue
        except NotImplementedError as e:
            if on == "meta":
                return None, None  # (no meta kernel)
            failed = e
        except Exception as e:
            failed = e
        break
    try:
        run_on(func, args, kwargs, "example")
    except Exception as e:  # bad input: eager's exception, naming the op and the shapes
        raise _named(e, name, args, kwargs) from None
    counters["capture"]["stand-in runs refusing what eager takes"] += 1
    return None, None


def _views_an_input(decomposition: Graph | None) -> bool:
    """Whether a result of the decomposition is one of its inputs seen through view prims only (the op may
    return a view, as einsum does when it only permutes): then eager's aliasing is asked."""
    if decomposition is None:
        return False
    for node in flatten(decomposition.output_node.args):
        while isinstance(node, Node) and node.op == "call_prim" and "view" in node.target.tags:
            node = node.args[0]
        if isinstance(node, Node) and node.op == "placeholder":
            return True
    return False


def _flat_tensor_sequence(structure: Any) -> bool:
    return isinstance(structure, (tuple, list)) and all(isinstance(v, (Proxy, torch.Tensor)) for v in structure)


def _identity_output(result: Any, sub_inputs: list[Proxy], outer: list[Proxy]) -> Any:
    """When the decomposition returned one of its inputs unchanged, return the caller's proxy itself."""
    if isinstance(result, Proxy):
        for inner, o in zip(sub_inputs, outer):
            if result is inner:
                return o
    return None


def _metas_agree(leaves: list[Proxy], real: Any) -> bool:
    reals = [t for t in flatten(real) if isinstance(t, torch.Tensor)]
    if len(reals) != len(leaves):
        return False
    return all(tuple(hint_of(p.meta.shape)) == tuple(t.shape) and p.meta.dtype == t.dtype
               for p, t in zip(leaves, reals))


def _named(error: BaseException, name: str, args: tuple, kwargs: dict) -> BaseException:
    """`error` with the same type, its message starting with the op and the argument shapes."""
    prefix = f"{name}({_shapes(args, kwargs)})"
    text = str(error)
    if text.startswith(prefix):
        return error
    try:
        named = type(error)(f"{prefix}: {text.lstrip(': ')}")
    except Exception:
        return error
    named.__cause__ = None
    named.__suppress_context__ = True
    return named


def _raise_eager_error(func: Any, name: str, args: tuple, kwargs: dict, failure: BaseException,
                       examples: bool) -> None:
    """If eager fails on these inputs too, raise eager's exception type with a message naming the op and
    the shapes (the decomposition's own error when it has eager's type).

    Without examples the meta device decides; when it accepts the input (meta kernels skip some checks,
    e.g. of dtypes), eager runs on zero-filled CPU tensors of the same metadata, where they are small.
    """
    for on in (("example",) if examples else ("meta", "zeros")):
        try:
            run_on(func, args, kwargs, on)
            continue
        except CannotCheck:
            return
        except NotImplementedError as e:
            if on == "meta":  # the meta device cannot tell; trust the decomposition's check
                raise _named(failure, name, args, kwargs) from None
            eager_error: BaseException = e
        except Exception as e:
            eager_error = e
        if isinstance(failure, type(eager_error)):
            raise _named(failure, name, args, kwargs) from None
        raise _named(eager_error, name, args, kwargs) from None


def _record_out(tracer: Tracer, func: Any, args: tuple, kwargs: dict) -> Any:
    """`op(..., out=t)`: the op's functional result, then an in-place update of `t` (rebound and, for a
    graph input, written back at the end), so reads of `t` before the call keep its old values."""
    kwargs = dict(kwargs)
    targets = kwargs.pop("out")
    name = _op_name(func)
    flat = list(targets) if isinstance(targets, (tuple, list)) else [targets]
    if not all(isinstance(t, Proxy) for t in flat):
        raise UnsupportedError(f"{name}(out=...) writes a tensor that is not traced (a constant)")
    if autocast.policy_of(func, args, kwargs) is not None:
        raise UnsupportedError(f"{name}(out=...) under torch.autocast (eager casts only out-of-place ops)")
    for t in flat:
        _check_inplace(tracer.graph, func, (t, *args, *kwargs.values()))
    result = _record(tracer, func, args, kwargs)
    values = list(result) if isinstance(result, (tuple, list)) else [result]
    if len(values) != len(flat) or not all(isinstance(v, Proxy) for v in values):
        raise UnsupportedError(f"{name}(out=...): the result does not match the out tensors")
    for t, v in zip(flat, values):
        if v.meta.device != t.meta.device:  # eager's cross-device rules (and their exceptions) decide
            raise UnsupportedError(f"{name}(out=...) writes a result on {v.meta.device} into a tensor on "
                                   f"{t.meta.device}")
        if tuple(v.meta.shape) != tuple(t.meta.shape) or v.meta.dtype != t.meta.dtype:
            raise UnsupportedError(f"{name}(out=...) resizes or casts into its out tensor "
                                   f"({v.meta.short()} into {t.meta.short()})")
        _apply_inplace(tracer.graph, t, v)
        _propagate_to_aliases(tracer.graph, t)
    return targets


def _target_first(func: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """An in-place function called with its target as a keyword (`nn.init.uniform_(tensor=w)`, as torch's
    own dispatch does): the target becomes the first positional argument."""
    try:
        bound = inspect.signature(func).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return args, kwargs
    items = list(bound.arguments.items())
    if not items:
        return args, kwargs
    first_name, first = items[0]
    rest = dict(items[1:])
    params = inspect.signature(func).parameters
    positional: list = []
    keywords: dict = {}
    for k, v in rest.items():
        kind = params[k].kind
        if kind is inspect.Parameter.POSITIONAL_ONLY:
            positional.append(v)
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            return args, kwargs  # f(target, *rest): nothing to reorder safely
        elif kind is inspect.Parameter.VAR_KEYWORD:
            keywords.update(v)
        else:
            keywords[k] = v
    return (first, *positional), keywords


def _check_inplace(graph: Graph, func: Any, args: tuple) -> None:
    target = args[0] if args else None
    if not isinstance(target, Proxy):
        raise TypeError(f"{_op_name(func)}: expected a tensor to update in place")
    al = aliases(graph)
    root = al.base.get(target, target)
    sharing = [o for o in flatten(args[1:]) if isinstance(o, Proxy) and o is not target and
               al.base.get(o, o) is root]
    written = target.example if sharing else None
    if func is torch.Tensor.__setitem__ and written is not None and len(args) > 1:
        try:  # the region `x[index] = v` writes
            written = written[args[1]] if not any(isinstance(a, Proxy) for a in flatten(args[1])) else None
        except Exception:
            written = None
    for other in sharing:
        if _memory_relation(other.example, written) == "partial":
            # the op reads memory it writes, partly (x.add_(x[0])): eager refuses it or computes element by
            # element; it runs eagerly
            raise UnsupportedError(f"{_op_name(func)} reads a tensor that shares memory with the tensor it "
                                   f"updates ({target.node.name})")
    name = al.input_name.get(root)
    placeholder = next((p.meta for p in graph.placeholders if p.name == name), None) if name else None
    shared = shared_memory(target, root, name, placeholder, uniform_fill(func, args))
    if shared is not None:
        # eager refuses most such updates ("more than one element of the written-to tensor refers to a
        # single memory location") and computes the rest through the shared memory (a write through a
        # view of an expanded tensor shows in every element sharing it): it runs eagerly
        raise UnsupportedError(f"{_op_name(func)} updates tensor {target.node.name} ({target.meta.short()}), "
                               f"whose memory {shared} shares between its elements")
    if (target in al.base or target in al.has_views) and not _functional_update_ok(al, target):
        raise UnsupportedError(
            f"{_op_name(func)} updates tensor {target.node.name} in place while other tensors share its "
            f"memory in a way kiln cannot replay (a view it cannot re-derive, or a view with overlapping "
            f"elements)")


def _views_of(al: _Aliases, root: Proxy) -> list[Proxy]:
    return [v for v in al.base.keys() if al.base.get(v) is root]


def _functional_update_ok(al: _Aliases, target: Proxy) -> bool:
    """An update through an alias can be recorded functionally (kiln/ops/views.py): every live view of
    the base has a known chain, and the target has no overlapping elements (eager refuses those)."""
    root = al.base.get(target, target)
    if overlapping(target):  # (from the meta when it can tell; unknown counts as overlapping)
        return False
    return all(al.chain.get(v) is not None for v in _views_of(al, root))


def _propagate_to_aliases(graph: Graph, target: Proxy) -> None:
    """After an in-place update of `target`: update its base (when target is a view) and re-derive every
    view of the base from the new value, as eager's shared memory would show them."""
    al = aliases(graph)
    root = al.base.get(target)
    views = _views_of(al, target if root is None else root)
    if root is None and not views:
        return
    from .views import view_update
    if root is not None:
        new_root = call(view_update, (root, target, al.chain.get(target)), {})
        _apply_inplace(graph, root, new_root)
    else:
        root = target
    for view in views:
        fresh = al.chain.get(view).apply(root, call)
        view.node = fresh.node
        view.take_example_of(fresh)


def _note_views(graph: Graph, source: Proxy, out: Any, step: tuple | None = None,
                same: list[bool | None] | None = None) -> None:
    """Results of a view op of `source` (or results found to share its memory) are views of its base.
    `same[i]`: whether result i shares source's memory (eager's answer, from the meta device); without
    it the examples say, and a result whose memory no example tells is taken as a view that cannot be
    re-derived (an update through it runs eagerly)."""
    from .views import ViewChain
    al = aliases(graph)
    base = al.base.get(source, source)
    if source in al.base:
        chain = al.chain.get(source)
    else:
        example = source.example_at_hand()
        chain = ViewChain((), tuple(example.stride()) if isinstance(example, torch.Tensor) else
                          tuple(source.meta.strides))
    outputs = out if isinstance(out, (tuple, list)) else None
    k = -1  # (which tensor of the result: `same` counts tensors only)
    for i, v in enumerate(flatten(out)):
        k += isinstance(v, Proxy)
        if isinstance(v, Proxy) and v is not source:
            if same is not None:
                known = same[k] if k < len(same) else None
            else:
                mine = _storage_key(v.example) if v.example is not None else None
                theirs = _storage_key(source.example) if source.example is not None else None
                known = None if mine is None or theirs is None else mine == theirs
            if known is False:
                continue  # eager made a copy here (a reshape of a non-contiguous tensor): not an alias
            al.base[v] = base
            al.has_views.add(base)
            shares = step is not None and known is True and not any(isinstance(a, Proxy) for a in flatten(step[1:]))
            index = i if outputs is not None else None
            al.chain[v] = chain.then(step[0], tuple(step[1]), dict(step[2]), index) \
                if shares and chain is not None else None


def _note_shared_storage(graph: Graph, inputs: list[Proxy], out: Any, step: tuple | None = None,
                         owners_of: list[int | None] | None = None, view_op: bool = False) -> None:
    """Eager's own answer to aliasing: an output whose example shares memory with an input's example is a
    view of it (einsum that only permutes, fallbacks that return views, ...), whatever the op's name.
    `owners_of` (kiln.ops.standins.meta_aliases): per result, the input whose memory it shares, as the
    meta device says; the examples decide where it could not run (None). `view_op`: an op eager documents
    as a view of its first argument (`step` re-derives its results)."""
    if owners_of is not None and view_op:
        _note_views(graph, inputs[0], out, step, same=[o == 0 for o in owners_of])
        return
    if view_op:
        _note_views(graph, inputs[0], out, step)
        return
    if owners_of is not None:
        single = not isinstance(out, (tuple, list))
        for v, owner in zip([v for v in flatten(out) if isinstance(v, Proxy)], owners_of):
            source = inputs[owner] if owner is not None else None
            if source is not None and v is not source:
                _note_views(graph, source, v, step if source is inputs[0] and single else None, same=[True])
        return
    owners: dict[int, Proxy] = {}
    for p in inputs:
        key = _storage_key(p.example)
        if key is not None:
            owners.setdefault(key, p)
    if not owners:
        return
    for v in flatten(out):
        if isinstance(v, Proxy):
            source = owners.get(_storage_key(v.example))  # type: ignore[arg-type]
            if source is not None and v is not source:
                # the op's replay derives the alias again when the op's first argument is its source
                _note_views(graph, source, v, step if source is inputs[0] and not isinstance(out, (tuple, list))
                            else None)


def _apply_inplace(graph: Graph, target: Proxy, result: Any) -> Proxy:
    """Make `target` stand for the updated value; record the mutation when it is a graph input."""
    new = result if isinstance(result, Proxy) else next(v for v in flatten(result) if isinstance(v, Proxy))
    check_same = new.meta
    if tuple(check_same.shape) != tuple(target.meta.shape) or check_same.dtype != target.meta.dtype:
        raise UnsupportedError(f"in-place result {check_same.short()} does not match the updated tensor "
                           f"{target.meta.short()}")
    name = aliases(graph).input_name.get(target)
    if name is not None and torch.is_grad_enabled() and \
            any(ph.name == name and ph.meta.requires_grad for ph in graph.placeholders):
        # eager's own checks and autograd history (a leaf refuses it with grad on) belong to the real
        # tensor: the update runs eagerly. Under no_grad (an optimizer step) the graph's write-back is an
        # in-place copy_ under no_grad too, which moves the version counter as eager's update does.
        raise UnsupportedError(f"in-place update of input {name}, which requires grad")
    if not torch.is_grad_enabled() and target.meta.requires_grad and not new.meta.requires_grad:
        # (a weight clamped under no_grad in forward: `.requires_grad` still reads True, and a later op with
        # grad on breaks the graph, so that it differentiates with respect to the real tensor)
        new.node.meta = new.meta.with_(requires_grad=True)
        aliases(graph).updated_without_grad.add(target)
    target.node = new.node
    target.take_example_of(new)
    if name is not None:
        graph.mutated_inputs[name] = new.node
    return target


set_torch_call_handler(call)


def symbolic_call(func: Any, *args: Any, **kwargs: Any) -> Any:
    """Run one torch op on tensor metadata (TensorMeta or example tensors) without computing values.

    Returns the recorded graph's output proxies; used to check meta rules and error behaviour.
    """
    graph = Graph(_op_name(func).rsplit(".", 1)[-1])
    counter = itertools.count()

    def to_proxy(v: Any) -> Any:
        if isinstance(v, TensorMeta):
            return Proxy(graph.placeholder(f"x{next(counter)}", v))
        if isinstance(v, torch.Tensor):
            return Proxy(graph.placeholder(f"x{next(counter)}", TensorMeta.of(v)))
        return v
    args, kwargs = map_structure(to_proxy, args), map_structure(to_proxy, kwargs)
    with tracing(graph):
        return call(func, args, kwargs)
