"""Compiled graphs inside eager autograd: one `torch.autograd.Function` per graph whose inputs need gradients.

`compile_with_autograd(graph, example_inputs, context, compile_graph)` differentiates the graph ahead of
time (`kiln.autograd.joint`), compiles its forward (which also returns what the backward needs) with the
backend's `compile_graph`, and returns a callable:

- grad mode on: the forward kernels run inside `KilnFunction.forward`; outputs join eager autograd, so
  `.backward()`, `torch.autograd.grad`, hooks, gradient accumulation and `retain_graph` work as for any
  autograd function. The backward graph is compiled on the first backward (a forward whose outputs never
  get a backward costs no backward compile) and runs as kernels. `create_graph=True` runs the backward
  graph on the prim interpreter instead (its ops are differentiable torch calls), counted.
- grad mode off (`no_grad`, `inference_mode`): the forward kernels run alone, nothing is saved.

What cannot be differentiated ahead of time raises NotImplementedError: the caller runs the graph with
torch, counted with the reason.
"""
from __future__ import annotations

import dataclasses
import logging
import warnings
from typing import Any, Callable

import torch

from ..autograd.joint import Joint, differentiate
from ..autograd.partition import partition
from ..counters import counters
from ..graph import Graph, flatten, map_structure, run, to_prims
from ..graph.node import Node
from ..graph.passes import cse
from ..graph.pipeline import CompileContext
from ..graph.layout import contiguous_strides
from ..graph.meta import TensorMeta
from ..graph.specialize import size_bindings, specialize_graph, unbound_symbols
from ..graph.symbolic import SymInt, has_symbols, substitute
from ..ops import autocast

def _is_view_prim(node: Node) -> bool:
    return node.op == "call_prim" and "view" in node.target.tags


def _view_chain(node: Any) -> tuple[int, list[Node]] | None:
    """(input position, the view prims from it to `node`) when `node` is an input or a view of one made
    only of view prims with no other tensor argument; else None. An autograd Function must not return
    those: the wrapper makes them itself on the input with torch's own view ops, which autograd follows."""
    chain = []
    while isinstance(node, Node):
        if node.op == "placeholder":
            return node.graph.placeholders.index(node), chain[::-1]
        if not _is_view_prim(node):
            return None
        if any(isinstance(a, Node) for a in flatten((node.args[1:], node.kwargs))):
            return None
        chain.append(node)
        node = node.args[0]
    return None


def _nominally_differentiable(graph: Graph, needs: list[bool], positions: list[int]) -> list[int]:
    """Output leaves eager marks as requiring grad: float results of ops that read, at the torch level, an
    input needing a gradient (fill(x, v) and x * 0 among them, whose gradient is zero). Comparisons,
    integer results and argmax-like ops stop that, as in eager."""
    active: set[Node] = {p for p, n in zip(graph.placeholders, needs) if n}
    for node in graph.nodes:
        if node.op in ("call_torch", "call_prim", "getitem") and any(i in active for i in node.inputs()):
            metas = node.meta if isinstance(node.meta, tuple) else (node.meta,)
            if node.op == "call_torch" and isinstance(node.meta, TensorMeta) and not node.meta.requires_grad:
                continue  # the capture's rule for eager's flag said no: zeros_like(x), x.new_tensor(...)
            if node.op == "getitem" or any(getattr(m, "dtype", torch.int64).is_floating_point for m in metas):
                active.add(node)
    leaves = list(flatten(graph.output_value))
    return [i for i in positions if isinstance(leaves[i], Node) and leaves[i] in active and
            getattr(leaves[i].meta, "dtype", torch.int64).is_floating_point]


def _view_base(node: Node) -> Node:
    """The value a chain of view prims starts from (the node itself when it is no view)."""
    while _is_view_prim(node) and isinstance(node.args[0], Node):
        node = node.args[0]
    return node


def _replay(chain: list[Node], t: torch.Tensor, sizes: dict | None = None) -> torch.Tensor:
    for node in chain:
        args, kwargs = node.args[1:], node.kwargs
        if sizes:  # (symbolic sizes: this call's)
            args, kwargs = substitute(args, sizes), substitute(kwargs, sizes)
        t = node.target.ref(t, *args, **kwargs)
    return t


class _Sizes:
    """A graph with symbolic sizes inside autograd: where the forward reads each symbol, and the symbols
    the backward cannot read from its own inputs (a gradient of `x.sum()` has none of x's sizes). Those
    reach the backward as the shape of an empty tensor, its last input: `(0, s0, s1)`."""

    def __init__(self, prim: Graph, backward: Graph):
        self.bindings = size_bindings(prim)  # (symbol, forward input, dim)
        self.carried = unbound_symbols(backward)
        where = {sym: (i, d) for sym, i, d in self.bindings}
        if any(sym not in where for sym in self.carried + unbound_symbols(prim)):
            raise NotImplementedError("a symbolic size of the graph is no input's dim")
        self.carried_at = [where[sym] for sym in self.carried]
        if self.carried:
            env = next(s.env for p in prim.placeholders for s in getattr(p.meta, "shape", ())
                       if isinstance(s, SymInt))
            shape = (0, *(SymInt(sym, env) for sym in self.carried))
            meta = TensorMeta(shape, torch.float32, torch.device("cpu"), contiguous_strides(shape))
            name = backward._fresh("sizes")  # (placed after the other inputs, before the first computation)
            last = max((k for k, n in enumerate(backward.nodes) if n.op == "placeholder"), default=-1)
            backward.nodes.insert(last + 1, Node(backward, name, "placeholder", name, (), {}, meta))

    def values(self, inputs: tuple) -> dict:
        return {sym: inputs[i].shape[d] for sym, i, d in self.bindings}

    def carrier(self, inputs: tuple) -> torch.Tensor:
        return torch.empty((0, *(inputs[i].shape[d] for i, d in self.carried_at)))


class _State:
    """What one compiled graph's calls share: the compiled forward, the backward (compiled lazily)."""

    def __init__(self, joint: Joint, forward: Callable[..., Any], compile_graph: Callable[..., Any],
                 context: CompileContext, name: str, prim: Graph, needs: list[bool]):
        self.joint = joint
        self.prim = prim  # the graph before differentiation: create_graph=True recomputes it under autograd
        self.needs = needs
        self.mutated = {i for i, p in enumerate(prim.placeholders) if p.name in prim.mutated_inputs}
        self.forward = forward
        self.compile_graph = compile_graph
        self.context = context
        self.name = name
        self.backward: Callable[..., Any] | None = None
        self.sizes: _Sizes | None = None  # symbolic sizes (one compile for every size)
        self.backward_at: dict[tuple, Any] = {}  # symbolic backward that did not compile: run per size
        self.backward_bindings: list = []  # (symbol, backward input, dim), for the per-size backward

    def double_backward(self, inputs: list, grads: dict[int, Any]) -> tuple:
        """create_graph=True: the forward again on the prim interpreter from the saved inputs, under
        autograd (its ops are differentiable torch calls), and torch.autograd.grad with create_graph."""
        counters["autograd"]["create_graph: forward recomputed on the prim interpreter"] += 1
        if self.prim.mutated_inputs:
            raise RuntimeError("kiln: create_graph=True through a compiled graph that updates its inputs in "
                               "place is not supported (run it without kiln.compile)")
        prim = self.prim if self.sizes is None else specialize_graph(self.prim, self.sizes.values(inputs))
        outs = list(flatten(run(prim, inputs)))
        pairs = [(outs[i], g) for i, g in grads.items() if g is not None and i in self.joint.differentiable]
        wrt = [t for t, n in zip(inputs, self.needs) if n]
        got = iter(torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], create_graph=True,
                                       allow_unused=True))
        return tuple(next(got) if n else None for n in self.needs)

    def run_backward(self, inputs: list) -> Any:
        if self.backward is None:
            counters["autograd"]["backward graphs compiled"] += 1
            try:
                self.backward = self.compile_graph(self.joint.backward, list(inputs), self.context)
            except NotImplementedError as e:  # (a symbolic backward that cannot compile for every size)
                if self.sizes is None:
                    raise
                reason = f"{self.name} backward: {type(e).__name__}: {e}"
                counters["dynamic_symbolic_failed"][reason[:300]] += 1
                self.backward_bindings = size_bindings(self.joint.backward)
                self.backward = self._backward_per_size
        return self.backward(*inputs)

    def _backward_per_size(self, *inputs: Any) -> Any:
        """The symbolic backward specialized to this call's sizes (read from its inputs), one compile per
        size."""
        values = {sym: inputs[i].shape[d] for sym, i, d in self.backward_bindings}
        key = tuple(values.values())
        fn = self.backward_at.get(key)
        if fn is None:
            counters["dynamic_backend_compiles"][f"{self.name} backward"] += 1
            graph = specialize_graph(self.joint.backward, values)
            fn = self.backward_at[key] = self.compile_graph(graph, list(inputs), self.context)
        return fn(*inputs)


class KilnFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, state: _State, *inputs: Any) -> Any:
        joint = state.joint
        outs = state.forward(*inputs)
        user, saved = list(outs[:joint.user_leaves]), outs[joint.user_leaves:]
        for i in state.alias_leaves:
            user[i] = None  # made outside, on the input itself
        ctx.state = state
        # the inputs too (no copies), for create_graph=True; not those the graph updates in place
        kept = [t if i not in state.mutated else None for i, t in enumerate(inputs)]
        ctx.n_saved = len(saved)
        ctx.save_for_backward(*saved, *kept)
        ctx.carrier = state.sizes.carrier(inputs) if state.sizes is not None and state.sizes.carried else None
        tensors = [user[i] for i in state.node_leaves]  # constants in the output are made outside
        differentiable = {id(user[i]) for i in joint.differentiable} | {id(user[i]) for i in state.nominal}
        ctx.mark_non_differentiable(*[t for t in tensors if id(t) not in differentiable])
        ctx.tensor_positions = state.node_leaves
        return tuple(tensors)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        state: _State = ctx.state
        everything = ctx.saved_tensors
        saved, inputs_kept = everything[:ctx.n_saved], everything[ctx.n_saved:]
        by_leaf = dict(zip(ctx.tensor_positions, grads))
        # (backward() called inside a torch.autocast region: the backward graph's externs must not cast)
        with autocast.autocast_off():
            return KilnFunction._backward(ctx, state, saved, inputs_kept, by_leaf)

    @staticmethod
    def _backward(ctx: Any, state: _State, saved: tuple, inputs_kept: tuple, by_leaf: dict) -> Any:
        joint = state.joint
        if torch.is_grad_enabled():
            return (None,) + state.double_backward(list(inputs_kept), by_leaf)
        inputs = []
        for kind, k in joint.backward_inputs:
            if kind == "saved":
                inputs.append(saved[k])
            else:
                g = by_leaf[k]
                inputs.append(g.contiguous() if g is not None else None)
        if ctx.carrier is not None:
            inputs.append(ctx.carrier)
        result = state.run_backward(inputs)
        # A new tensor object per gradient (same memory): the generated wrapper keeps its output buffers for
        # reuse next call (it reuses one only when nothing else holds it), and autograd's AccumulateGrad
        # would copy a gradient whose tensor has another owner instead of keeping it as `.grad`.
        return (None,) + _distinct_gradients(result)


def _distinct_gradients(result: Any) -> tuple:
    """The backward's gradients, each a new tensor object (see KilnFunction.backward), none sharing memory
    with another: CSE can make two inputs' gradients one buffer (the biases of two BatchNorms added
    together), and eager gives each its own `.grad`, so an in-place update of one (clip_grad_norm_) must not
    reach the other. A later gradient overlapping an earlier one is copied."""
    grads = [g.detach() if isinstance(g, torch.Tensor) else g for g in result]
    # the usual case first: no two gradients' address ranges meet (a contiguous gradient's range is its
    # nbytes; ~40 us less per step for resnet_tiny's 37 gradients than the per-storage check below)
    spans = []
    for g in grads:
        if isinstance(g, torch.Tensor) and g.numel():
            start = g.data_ptr()
            if g.is_contiguous():
                spans.append((start, start + g.nbytes))
            else:
                spans.append((start, start + g.element_size() * (
                    1 + sum((n - 1) * abs(s) for n, s in zip(g.shape, g.stride())))))
    spans.sort()
    reach = 0
    for start, end in spans:
        if start < reach:
            break
        reach = max(reach, end)
    else:
        return tuple(grads)
    out, taken = [], {}
    for g in result:
        if not isinstance(g, torch.Tensor):
            out.append(g)
            continue
        g = g.detach()
        if g.numel():
            start = g.data_ptr()
            end = start + g.element_size() * (1 + sum((n - 1) * abs(s) for n, s in zip(g.shape, g.stride())))
            spans = taken.setdefault(g.untyped_storage().data_ptr(), [])
            if any(start < e and s < end for s, e in spans):
                g = g.clone()
            else:
                spans.append((start, end))
        out.append(g)
    return tuple(out)


def compile_with_autograd(graph: Graph, example_inputs: list, context: CompileContext,
                          compile_graph: Callable[..., Any]) -> Callable[..., Any]:
    """The graph compiled with its backward (see the module docstring); raises NotImplementedError."""
    prim = to_prims(graph)
    needs = [isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs]
    leaves = list(flatten(prim.output_value))
    for v in leaves:
        base = _view_base(v) if isinstance(v, Node) else None
        if base is not None and base.op == "getitem":
            base = base.args[0]
        if base is not None and base.op == "call_torch":
            # a torch op's result may be a view of its inputs (tensor_split, ...): returned from the
            # autograd Function it would hide that alias from eager autograd
            raise NotImplementedError(f"an output comes straight from the torch op {base.target_name()}")
    views = {}
    for i, v in enumerate(leaves):
        if isinstance(v, Node) and _view_base(v).op == "placeholder":
            chain = _view_chain(v)
            if chain is None:
                raise NotImplementedError("an output is a view of an input through other values")
            views[i] = chain
    # a replicated value fed to several column-parallel Linears (q, k, v; gate, up) is one grad_all_reduce:
    # its backward sums their gradients first and all-reduces once, not once per Linear
    cse(prim, only=lambda node: node.op == "call_prim" and node.target.name == "grad_all_reduce")
    joint = differentiate(prim, needs, frozenset(views))
    if context.flag("autograd_recompute"):
        joint = partition(joint)
    # no buffer pools: the forward's would stay full through the backward (peak memory over eager's)
    context = dataclasses.replace(context, options={**context.options, "pool_buffers": False})
    sizes = _Sizes(prim, joint.backward) if has_symbols([n.meta for n in prim.placeholders]) else None
    forward = compile_graph(joint.forward, list(example_inputs), context)
    state = _State(joint, forward, compile_graph, context, graph.name, prim, needs)
    state.sizes = sizes
    template = joint.output_template
    n_user = joint.user_leaves
    counters["autograd"]["graphs compiled with a backward"] += 1

    node_leaves = [i for i, v in enumerate(leaves) if isinstance(v, Node) and i not in views]
    state.alias_leaves = frozenset(views)
    state.node_leaves = node_leaves
    state.nominal = _nominally_differentiable(graph, needs, node_leaves)

    def repack(values: list) -> Any:
        """The output structure with its leaves, in order, taken from `values` (one per leaf)."""
        it = iter(values)
        return map_structure(lambda v: next(it), template)

    def call(*inputs: Any) -> Any:
        if not torch.is_grad_enabled():
            counters["autograd"]["forward-only calls (grad mode off)"] += 1
            return repack(list(forward(*inputs)[:n_user]))
        tensors = KilnFunction.apply(state, *inputs)
        values = list(leaves)
        for i, t in zip(node_leaves, tensors, strict=True):
            values[i] = t
        at = sizes.values(inputs) if sizes is not None and views else None
        for i, (position, chain) in views.items():  # views of inputs, as eager makes them
            values[i] = _replay(chain, inputs[position], at)
        return repack(values)
    return call


def needs_autograd(example_inputs: list) -> bool:
    """Grad mode is on and some input requires grad: the graph compiles with its backward."""
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in flatten(example_inputs))


def compile_or_run_with_torch(name: str, graph: Graph, example_inputs: list, context: CompileContext | None,
                              compile_graph: Callable[..., Any], log: logging.Logger,
                              check: Callable[[], None] | None = None) -> Callable[..., Any]:
    """A compiled backend's entry: `compile_graph` (with the backward when an input requires grad and grad
    mode is on); on failure the graph runs with torch, counted under `name` with the reason — warned for an
    internal error, raised when the compile asks for it. `check` may refuse first (NotImplementedError)."""
    context = context or CompileContext()
    needs_grad = needs_autograd(example_inputs)
    try:
        if check is not None:
            check()
        if needs_grad:
            return compile_with_autograd(graph, example_inputs, context, compile_graph)
        return compile_graph(graph, example_inputs, context)
    except Exception as e:
        # NotImplementedError: a graph the backend does not handle (a dtype, a device): not an error
        if context.raises and not isinstance(e, NotImplementedError):
            raise
        counters[name]["graphs run with torch"] += 1
        counters[name][f"ran with torch: {e}"] += 1
        if not isinstance(e, NotImplementedError):
            warnings.warn(f"kiln {name} backend could not compile graph {graph.name}, running it with torch: "
                          f"{type(e).__name__}: {e}", stacklevel=3)
        else:
            log.info("graph %s runs with torch: %s", graph.name, e)

        def run_eager(*inputs: Any) -> Any:
            return run(graph, inputs, torch_level=True)
        return run_eager
