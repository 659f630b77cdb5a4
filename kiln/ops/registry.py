"""The torch surface: each torch callable maps to a decomposition into prims.

`@register(torch.add, torch.Tensor.add, torch.Tensor.__add__)` registers a Python function that takes the
same arguments as the torch op — with proxies for tensors — and computes the result with prims and other
decompositions. Torch calls on proxies reach `call`:

- at the top level of a trace, `call` records one `call_torch` node whose `decomposition` is the prim graph
  of the op, built by running the decomposition on fresh proxies; its output meta comes from there
  (kiln/ops/record.py: classify, decompose, ask eager without running the op on values, emit);
- inside a decomposition (the tracer is `inline`), torch calls record their prims directly;
- an op with no decomposition, or whose decomposition raises `NoDecomposition`, becomes a fallback node
  (it calls the torch op; its output meta comes from the `meta` device); fallbacks are counted;
- bad input raises the exception eager raises; a decomposition error eager does not share is a kiln bug:
  the op falls back (counted) unless `strict_decompositions` is set.
"""
from __future__ import annotations

import itertools
import weakref
from typing import Any, Callable

import torch

from .. import config
from ..graph import Graph, Proxy, TensorMeta, Tracer, current_tracer, flatten, map_structure, torch_name, tracing
from ..graph.proxy import set_torch_call_handler
from . import updates as argument_updates
from .kinds import (_METADATA_ONLY, _RESTRIDE_INPLACE, INPLACE_FLAG_OPS, INPLACE_OPS, VIEW_OPS,  # noqa: F401
                    is_inplace, mark_inplace, mark_inplace_flag, mark_view)
from .overlap import memory_relation as _memory_relation, overlapping, shared_memory, uniform_fill
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
_recorder: Callable[[Tracer, Any, tuple, dict], Any] | None = None


def call(func: Any, args: tuple, kwargs: dict) -> Any:
    """Handle a torch call whose arguments include proxies (or any torch call while tracing)."""
    if isinstance(func, _OVERLOADS) and func not in DECOMPOSITIONS and _overload_route is not None:
        return _overload_route(func, args, kwargs)  # torch.ops.aten.add.Tensor is recorded as torch.add
    return call_as_is(func, args, kwargs)


def install_recorder(recorder: Callable[[Tracer, Any, tuple, dict], Any]) -> None:
    """Install kiln/ops/record.py's recording of a top-level torch call."""
    global _recorder
    _recorder = recorder


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
        assert _recorder is not None  # (kiln.ops.record installs it when kiln.ops is imported)
        return _recorder(tracer, func, args, kwargs)


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
