"""Recording one torch call at the top level of a trace (`kiln.ops.registry.call` routes it here), in four
stages over an `OpCall`:

- classify: the call's tensors lifted to graph constants, autocast's casts recorded, refusals (ops that
  restride in place, grad-mode rules), an in-place op's target first and its memory checked;
- decompose: the op's decomposition built on fresh proxies of a sub-graph (`Decomposed`), or none (the
  op runs with torch: a fallback node, counted); a decomposition's error eager does not share falls back;
- ask eager (`EagerFacts`): what eager says of the call, without running it on the inputs' values. A
  decomposed op is run on stand-ins (zero-filled where small, else the meta device) for eager's checks, its
  result's metadata and its aliasing, and the examples of its results are deferred (`LazyRun`): computed
  only when something asks for one. Under `check_metas`, inside autocast regions and for fallbacks the op
  runs on its examples as it is recorded; a decomposition whose shapes or dtypes disagree with eager's
  falls back;
- emit: one `call_torch` node holding the decomposition (or the torch op), proxies for its results, the
  views and shared memory eager gives them noted, in-place updates applied to their targets and aliases.
"""
from __future__ import annotations

import dataclasses
import inspect
import itertools
from typing import Any

import torch

from ..counters import counters
from ..graph import DataDependentError, Graph, Proxy, TensorMeta, Tracer, dce, flatten, map_structure, tracing
from ..graph.node import Node, is_custom_op
from ..graph.symbolic import has_symbols, hint_of, specialize_all
from . import autocast, grad_flags
from . import updates as argument_updates
from .kinds import _RESTRIDE_INPLACE, VIEW_OPS, is_inplace
from .registry import (_OVERLOADS, DataDependentShape, NoDecomposition, UnsupportedError, _apply_inplace,
                       _check_inplace, _note_shared_storage, _op_name, _propagate_to_aliases,
                       aliases, install_recorder, log, lookup)
from .standins import CannotCheck, LazyRun, aliasing, run_on
from .targets import OnCopy, TensorLeaves

# ops without a decomposition whose output shape depends on their inputs' values (by name, as torch's
# Python wrappers, e.g. torch.unique, reach them under several names)
_DATA_DEPENDENT_FALLBACKS = {"unique", "_unique", "_unique2", "unique_dim", "unique_consecutive", "bincount"}


@dataclasses.dataclass
class OpCall:
    """One torch call being recorded, as classify leaves it."""
    tracer: Tracer
    func: Any
    name: str
    args: tuple
    kwargs: dict
    inplace: bool
    outer: list[Proxy]  # the proxies among the arguments, in flatten order
    region: tuple  # the autocast state it is recorded in (() when off)
    autocast_cast: Any  # whether autocast's policy cast its inputs

    @property
    def graph(self) -> Graph:
        return self.tracer.graph


@dataclasses.dataclass
class Decomposed:
    """The op's decomposition: `graph` None when the op runs with torch."""
    graph: Graph | None
    result: Any  # the decomposition's result, on the sub-graph's proxies
    sub_inputs: list[Proxy]  # the sub-graph's placeholders, one per proxy of the call
    targets: list[Proxy]  # arguments it updates in place through update_argument
    examples: bool  # whether every argument has an example value (computed or deferred)


@dataclasses.dataclass
class EagerFacts:
    """What eager says of the call: `real` its result (on the examples; on stand-ins when `deferred`, the
    examples of the results then computed when asked for), `owners_of` its aliasing (with `deferred`)."""
    real: Any = None
    deferred: LazyRun | None = None
    owners_of: list[int | None] | None = None


def record(tracer: Tracer, func: Any, args: tuple, kwargs: dict) -> Any:
    if kwargs.get("out") is not None:
        return _record_out(tracer, func, args, kwargs)
    op = _classify(tracer, func, args, kwargs)
    dec = _decompose(op)
    if dec.graph is not None and not any(isinstance(v, Proxy) for v in flatten(dec.result)):
        return dec.result  # a Python value (e.g. torch.numel); nothing to record
    for t in dec.targets:
        _check_inplace(op.graph, op.func, (t, *[o for o in op.outer if o is not t]))
    op.func = argument_updates.wrap(op.func, op.args, op.kwargs, dec.targets)
    facts = _ask_eager(op, dec)
    identity = _settle(op, dec, facts)
    if identity is not None:
        return identity
    return _emit(op, dec, facts)


def _classify(tracer: Tracer, func: Any, args: tuple, kwargs: dict) -> OpCall:
    args, kwargs = _lift(tracer, args, kwargs)
    # autocast's casts become nodes of the graph; the op then runs as it would with autocast off
    args, kwargs, autocast_cast = autocast.cast_inputs(func, args, kwargs)
    name = _op_name(func)
    flag_op = getattr(func, "__name__", "")
    if flag_op in _RESTRIDE_INPLACE and args and isinstance(args[0], Proxy):
        # they change the tensor's strides or shape, not its values: eager's storage stays where it is
        raise UnsupportedError(f"{name} changes the shape or strides of a traced tensor in place")
    refused = grad_flags.refusal(name, flag_op, args, kwargs, aliases(tracer.graph).updated_without_grad)
    if refused is not None:
        raise UnsupportedError(refused)
    inplace = is_inplace(func, kwargs)
    if inplace and not (args and isinstance(args[0], Proxy)):
        args, kwargs = _target_first(func, args, kwargs)
    if inplace:
        _check_inplace(tracer.graph, func, args)
    outer = [v for v in flatten((args, kwargs)) if isinstance(v, Proxy)]
    return OpCall(tracer, func, name, args, kwargs, inplace, outer, autocast.state(), autocast_cast)


def _decompose(op: OpCall) -> Decomposed:
    """Build the decomposition on fresh proxies of a sub-graph."""
    name, func = op.name, op.func
    sub = Graph(name.rsplit(".", 1)[-1])
    sub_inputs = [Proxy(sub.placeholder(f"a{i}", p.meta)) for i, p in enumerate(op.outer)]
    order = iter(sub_inputs)

    def to_sub(v: Any) -> Any:
        return next(order) if isinstance(v, Proxy) else v
    sub_args, sub_kwargs = map_structure(to_sub, op.args), map_structure(to_sub, op.kwargs)
    decomposition: Graph | None = None
    result: Any = None
    fn = lookup(func)
    failure: BaseException | None = None
    argument_updates.begin(sub)
    if fn is not None:
        try:
            with tracing(Tracer(sub, inline=True, options=op.tracer.options)), autocast.autocast_off():
                result = fn(*sub_args, **sub_kwargs)
            decomposition = sub
        except NoDecomposition as e:
            _refuse_data_dependent(op.tracer, name, isinstance(e, DataDependentShape))
            counters["no_decomposition"][f"{name} (needs {e})" if str(e) != name else name] += 1
        except UnsupportedError:
            raise  # the call cannot be traced at all (e.g. torch drops an argument): capture breaks the graph
        except DataDependentError as e:
            failure = e
        except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError, AssertionError,
                ZeroDivisionError, OverflowError) as e:
            failure = e
    else:
        _refuse_data_dependent(op.tracer, name, getattr(func, "__name__", "") in _DATA_DEPENDENT_FALLBACKS)
        counters["no_decomposition"][name] += 1

    result, updated = argument_updates.end(sub, result, sub_inputs, op.outer)
    if decomposition is not None and (updated is None or op.inplace and updated):  # (see end)
        counters["no_decomposition"][f"{name} (updates a constant or repeated argument)"] += 1
        decomposition = None
    targets = [op.outer[i] for i in updated] if decomposition is not None else []  # updated in place
    examples = _has_examples(op.args, op.kwargs)
    if failure is not None:
        _raise_eager_error(func, name, op.args, op.kwargs, failure, examples)
        counters["decomposition_error"][name] += 1
        log.warning("decomposition of %s failed where eager succeeds (%s: %s); running it as a fallback",
                    name, type(failure).__name__, failure)
        if op.tracer.flag("strict_decompositions"):
            raise failure
    return Decomposed(decomposition, result, sub_inputs, targets, examples)


def _ask_eager(op: OpCall, dec: Decomposed) -> EagerFacts:
    if not dec.examples:
        return EagerFacts()
    if dec.graph is not None and not op.region and not op.tracer.flag("check_metas"):
        # Recorded, not run. (Under autocast eager's result is checked as it runs: a composite such as
        # einsum reaches ops autocast casts inside it, which its decomposition, built with autocast off,
        # does not.)
        real, owners_of = _eager_checks(op.func, op.name, op.args, op.kwargs, dec.result)
        return EagerFacts(real, LazyRun(op.func, op.args, op.kwargs, protect=False),
                          owners_of)
    if dec.graph is None:
        facts = _fallback_on_meta(op)
        if facts is not None:
            return facts
    return EagerFacts(_run_on_examples(op, protect=dec.graph is None))


def _fallback_on_meta(op: OpCall) -> EagerFacts | None:
    """An op that runs with torch, recorded from its run on the meta device (its results' metadata and
    aliasing; the examples deferred) where that is eager's: every tensor on the CPU, no autocast region,
    not check_metas, and not a custom operator (its fake kernel may give sizes the op does not: the
    examples check them). The meta device refuses ops whose sizes depend on values; those, and ops it
    cannot run, run on their examples."""
    if op.region or op.tracer.flag("check_metas") or is_custom_op(op.func) or _custom_operator(op.func) or \
            "device" in op.kwargs or any(p.meta.device.type != "cpu" for p in op.outer):
        return None
    stand_ins: list = []
    try:
        real = run_on(op.func, op.args, op.kwargs, "meta", stand_ins=stand_ins)
    except Exception:
        return None
    if any(isinstance(v, (bool, int, float, complex)) for v in flatten(real)) or \
            any(t.device.type != "meta" for t in flatten(real) if isinstance(t, torch.Tensor)):
        return None  # (a number, or a tensor elsewhere: the examples tell)
    counters["capture"]["fallbacks recorded from the meta device"] += 1
    return EagerFacts(real, LazyRun(op.func, op.args, op.kwargs, protect=True), aliasing(real, stand_ins))


def _run_on_examples(op: OpCall, protect: bool = True) -> Any:
    try:
        return run_on(op.func, op.args, op.kwargs, "example", protect=protect)
    except Exception as e:  # bad input: eager's exception, naming the op and the shapes
        raise _named(e, op.name, op.args, op.kwargs) from None


def _settle(op: OpCall, dec: Decomposed, facts: EagerFacts) -> Proxy | None:
    """Keep the decomposition where its result agrees with eager's (shapes, dtypes), else the op runs with
    torch (counted). Returns the caller's own proxy when the decomposition returned its input unchanged."""
    if dec.graph is None:
        return None
    leaves = [v for v in flatten(dec.result) if isinstance(v, Proxy)]
    identity = _identity_output(dec.result, dec.sub_inputs, op.outer)
    if identity is not None and not op.inplace and (facts.real is None or _metas_agree(leaves, facts.real)):
        return identity  # (checked first: eager may not return its input, e.g. sum_to_size of a 0-d bool)
    if facts.real is not None and not _metas_agree(leaves, facts.real):
        counters["decomposition_mismatch"][op.name] += 1
        log.warning("decomposition of %s gives %s, eager gives %s; running it as a fallback", op.name,
                    [p.meta.short() for p in leaves],
                    [TensorMeta.of(t).short() for t in flatten(facts.real) if isinstance(t, torch.Tensor)])
        if op.tracer.flag("strict_decompositions"):
            raise AssertionError(f"decomposition of {op.name} disagrees with eager on metadata")
        dec.graph = None
        if facts.deferred is not None:  # the torch op runs: its results' examples are real values
            facts.deferred = facts.owners_of = None
            facts.real = _run_on_examples(op)
        return None
    dec.graph.output(map_structure(lambda v: v.node if isinstance(v, Proxy) else v, dec.result))
    dce(dec.graph)
    return None


def _fallback_result(op: OpCall, facts: EagerFacts) -> None:
    """The result of an op that runs with torch: eager's on the examples, else the meta device's."""
    name, args, kwargs = op.name, op.args, op.kwargs
    if facts.real is None:
        if op.region and not op.autocast_cast:  # (meta tensors do not see autocast)
            raise UnsupportedError(f"{name} runs with torch under torch.autocast with no example values")
        try:
            facts.real = run_on(op.func, args, kwargs, "meta")
        except Exception as e:
            raise UnsupportedError(f"{name} has no decomposition and no meta implementation, so kiln "
                                   f"cannot know its output shape ({type(e).__name__}: {e})") from None
    elif facts.deferred is None:
        _check_sizes_follow_metas(op.func, name, args, kwargs, facts.real)
    real = facts.real
    if any(isinstance(v, (bool, int, float, complex)) for v in flatten(real)):
        # a number computed by torch (torch.equal, aten.item): the graph would keep this call's value
        raise UnsupportedError(f"{name} returns a Python number; it runs outside the graph")
    counters["custom_op" if is_custom_op(op.func) else "fallback"][name] += 1
    if has_symbols((args, kwargs)) and not all(isinstance(v, bool) for v in flatten(real)):
        # a torch op kiln cannot see into: its output sizes (or values) are the example's, right only
        # at these sizes, so every symbol of its inputs is specialized (guarded), counted
        counters["dynamic_specialized"][f"{name} (runs with torch)"] += 1
        specialize_all((args, kwargs))


def _emit(op: OpCall, dec: Decomposed, facts: EagerFacts) -> Any:
    graph, func, args, kwargs = op.graph, op.func, op.args, op.kwargs
    decomposition = dec.graph
    if decomposition is not None:
        structure = dec.result
        metas = tuple(p.meta for p in flatten(structure) if isinstance(p, Proxy))
    else:
        _fallback_result(op, facts)
        structure = facts.real
        metas = tuple(TensorMeta.of(t) for t in flatten(structure) if isinstance(t, torch.Tensor))
        if facts.deferred is not None:  # (a run on the meta device of an op on CPU tensors)
            metas = tuple(m.with_(device=torch.device("cpu")) for m in metas)
    real, deferred = facts.real, facts.deferred
    node_args = map_structure(lambda v: v.node if isinstance(v, Proxy) else v, args)
    node_kwargs = map_structure(lambda v: v.node if isinstance(v, Proxy) else v, kwargs)
    single = isinstance(structure, (Proxy, torch.Tensor))
    target = func
    if op.inplace and decomposition is None:
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
    if decomposition is None and op.region and not op.autocast_cast:
        target = autocast.UnderAutocast(target, op.region)  # eager's result depends on the state
    if grad_flags.output_requires_grad(func, args, kwargs):
        metas = tuple(dataclasses.replace(m, requires_grad=True) if m.dtype.is_floating_point or
                      m.dtype.is_complex else m for m in metas)
    metas = argument_updates.own_requires_grad(metas, dec.targets)
    node = graph.call_torch(target, node_args, node_kwargs, metas[0] if single else metas, decomposition,
                            origin=op.tracer.origin)
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
    _note_aliasing(op, dec, facts, out)
    if op.inplace:
        updated = _apply_inplace(graph, args[0], out)
        _propagate_to_aliases(graph, updated)
        return updated
    for t, value in zip(dec.targets, out[1:] if dec.targets else ()):
        _apply_inplace(graph, t, value)
        _propagate_to_aliases(graph, t)
    return out[0] if dec.targets else out


def _note_aliasing(op: OpCall, dec: Decomposed, facts: EagerFacts, out: Any) -> None:
    """Results that share an argument's memory in eager are views of it: eager's run says which (on the
    stand-ins when deferred, on the examples otherwise)."""
    graph, func, args, kwargs, outer = op.graph, op.func, op.args, op.kwargs, op.outer
    if not outer:
        return
    if func in VIEW_OPS:
        _note_shared_storage(graph, outer, out, (func, args[1:], kwargs), facts.owners_of, view_op=True)
        return
    asked = (dec.graph is None or _views_an_input(dec.graph)) if facts.deferred is not None else \
        facts.real is not None
    if asked and not op.inplace:
        # (owners_of: the stand-ins' answer when deferred; else, or where they could not run, the examples')
        step = (func, args[1:], kwargs) if args and args[0] is outer[0] else None
        _note_shared_storage(graph, outer, out, step, facts.owners_of)


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


def _refuse_data_dependent(tracer: Tracer, name: str, data_dependent: bool) -> None:
    """A tracer marked `static_shapes` (the capture's) refuses ops whose output shape depends on values."""
    if data_dependent and getattr(tracer, "static_shapes", False):
        raise UnsupportedError(f"{name}: its output shape depends on the values of its inputs, so a graph "
                               f"cannot be reused for other values; it runs outside the graph")


def _has_examples(args: tuple, kwargs: dict) -> bool:
    return all(p.has_example() for p in flatten((args, kwargs)) if isinstance(p, Proxy))


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


def _custom_operator(func: Any) -> bool:
    """An operator a library registered (torch.library), not one of torch's own."""
    name = getattr(func, "_qualified_op_name", None) or getattr(getattr(func, "_schema", None), "name", "")
    return isinstance(func, _OVERLOADS) and name.partition("::")[0] not in ("aten", "prims")


def _shapes(args: tuple, kwargs: dict) -> str:
    parts = []
    for v in flatten((args, kwargs)):
        if isinstance(v, (Proxy, torch.Tensor)):
            parts.append(f"{str(v.dtype).removeprefix('torch.')}[{', '.join(str(s) for s in v.shape)}]")
    return ", ".join(parts)


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
    small = all(hint_of(p.meta).numel() <= 1 << 16 for p in flatten(result) if isinstance(p, Proxy))
    for on in ("zeros", "meta") if small else ("meta",):
        stand_ins: list = []
        try:
            out = run_on(func, args, kwargs, on, stand_ins=stand_ins)
            return out, aliasing(out, stand_ins)
        except CannotCheck:
            continue
        except NotImplementedError:
            if on == "meta":
                return None, None  # (no meta kernel)
        except Exception:
            pass
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
    result = record(tracer, func, args, kwargs)
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


install_recorder(record)
