"""Ahead-of-time autograd: a prim graph → a forward graph that also returns what the backward needs, and a
backward graph built from the prims' VJP rules.

`differentiate(graph, needs_grad)` walks the prim graph in reverse. Every node that depends on an input
needing a gradient (and is floating point) gets its output gradients accumulated (`prims.add`); its rule
(`@rule("vjp", prim)`, called as `rule(grads, outputs, *args, **kwargs)`) is traced into the backward
graph on proxies. A rule marked `takes_grad_mask` also gets `grad_mask=` (one bool per positional argument:
whether it needs a gradient; eager's grad_input_mask), so that it skips the gradients nobody reads (the
convolution's). A forward value a rule reads becomes a backward input ("saved"); the forward graph returns
it after the user's outputs. `kiln.autograd.partition` then decides which saved values the backward
recomputes instead. Fallback nodes (torch ops kiln cannot decompose) get an opaque backward: the op run
again under torch.autograd inside the backward (counted).

Refused (NotImplementedError, so the caller runs the graph with torch, counted): a prim without a VJP
rule, or whose rule refuses; an input updated in place that needs a gradient. Everything else in the
graph (in-place updates of buffers such as BatchNorm's running statistics, random prims, non-float values)
stays in the forward exactly as it was.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from ..counters import counters
from ..graph import Graph, Node, Proxy, TensorMeta, contiguous_strides, dce, flatten, map_structure, tracing
from .layout import in_input_layout


@dataclasses.dataclass
class Joint:
    forward: Graph  # inputs as the original; output: (user output leaves..., saved values...)
    backward: Graph  # inputs: backward_inputs; output: a tuple with one gradient (or None) per forward input
    user_leaves: int  # how many leading forward outputs are the user's
    backward_inputs: list[tuple[str, int]]  # ("saved", k) = forward output user_leaves + k; ("grad", i)
    differentiable: list[int]  # user output leaves that can carry a gradient
    output_template: Any  # the original output structure (leaves replaced in order)
    opaque: int = 0  # fallback nodes with an opaque backward


def _float(meta: Any) -> bool:
    return isinstance(meta, TensorMeta) and (meta.dtype.is_floating_point or meta.dtype.is_complex)


def _active_nodes(graph: Graph, needs_grad: list[bool]) -> set[Node]:
    """Nodes whose value depends on an input that needs a gradient (through float values)."""
    active: set[Node] = set()
    for node, needs in zip(graph.placeholders, needs_grad, strict=True):
        if needs and _float(node.meta):
            active.add(node)
    for node in graph.nodes:
        if node.op in ("call_prim", "call_torch", "getitem") and any(i in active for i in node.inputs()):
            metas = node.meta if isinstance(node.meta, tuple) else (node.meta,)
            if node.op == "getitem" or any(_float(m) for m in metas):
                active.add(node)
    return active


class _Builder:
    """Traces the backward graph; forward values the rules read become its inputs."""

    def __init__(self, forward: Graph):
        self.forward = forward
        self.graph = Graph(f"{forward.name}_backward", forward.origin)
        self.values: dict[Node, Proxy] = {}  # forward node -> its value in the backward graph
        self.inputs: list[tuple[str, Any]] = []  # ("saved", forward node) | ("grad", leaf index)
        self.getitems: dict[tuple[Node, int], Node] = {}

    def value(self, v: Any) -> Any:
        if not isinstance(v, Node):
            return v
        proxy = self.values.get(v)
        if proxy is None:
            if v.op == "constant":
                proxy = Proxy(self.graph.constant(v.target, v.name))
            else:
                proxy = Proxy(self.graph.placeholder(f"saved_{v.name}", v.meta))
                self.inputs.append(("saved", v))
            self.values[v] = proxy
        return proxy

    def grad_input(self, index: int, meta: TensorMeta) -> Proxy:
        """The gradient of output `index`, contiguous whatever the output's layout: the glue passes it
        `.contiguous()` (eager's autograd gives gradients in any layout). Traced with the output's strides,
        the backward of a transposed output (MultiheadAttention's batch_first result) saw a contiguous
        gradient as a changed layout at every call and ran with torch, where a view of it then failed."""
        meta = meta.with_(strides=contiguous_strides(meta.shape), storage_offset=0, requires_grad=False)
        proxy = Proxy(self.graph.placeholder(f"grad_{index}", meta))
        self.inputs.append(("grad", index))
        return proxy


def _needs_gradient(arg: Any, active: set[Node]) -> bool:
    """Whether a prim argument (a value, or a list of them) leads back to an input needing a gradient."""
    if isinstance(arg, (list, tuple)):
        return any(_needs_gradient(a, active) for a in arg)
    return isinstance(arg, Node) and arg in active


def _accumulate(grads: dict[Node, Any], node: Node, g: Any) -> None:
    if g is None:
        return
    from .. import prims
    meta = node.meta
    if isinstance(meta, TensorMeta):
        gm = g.meta if isinstance(g, Proxy) else TensorMeta.of(g)
        if tuple(gm.shape) != tuple(meta.shape) or gm.dtype != meta.dtype:
            raise NotImplementedError(f"a vjp rule gave a gradient {gm.dtype}{list(gm.shape)} for "
                                      f"{node.name} ({meta.dtype}{list(meta.shape)})")
    previous = grads.get(node)
    grads[node] = g if previous is None else prims.add(previous, g)


def _multi_outputs(forward: Graph) -> dict[Node, dict[int, Node]]:
    found: dict[Node, dict[int, Node]] = {}
    for node in forward.nodes:
        if node.op == "getitem":
            found.setdefault(node.args[0], {})[node.args[1]] = node
    return found


def _opaque_vjp(node: Node, wanted: list[bool]) -> Callable[..., Any]:
    """A backward for a torch op without a decomposition: run it again under autograd, take its VJP with
    respect to the tensor arguments marked in `wanted` (zeros for the others). Called with the op's tensor
    arguments, then one gradient per output (None where no gradient flows)."""
    fn, template = node.target.fn, (node.args, node.kwargs)
    n_args = len(wanted)

    def vjp(*values: Any) -> tuple:
        tensors, rng_state, out_grads = values[:n_args], values[n_args], values[n_args + 1:]
        it = iter(zip(tensors, wanted))
        leaves = []

        def fill(v: Any) -> Any:
            if isinstance(v, Node):
                t, want = next(it)
                t = t.detach().clone()  # the op may update arguments in place (batch_norm's running stats)
                if want:
                    t.requires_grad_(True)
                leaves.append(t)
                return t
            return v
        with torch.enable_grad(), torch.random.fork_rng(devices=[]):
            torch.set_rng_state(rng_state)
            args, kwargs = map_structure(fill, template)
            out = fn(*args, **kwargs)
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
            pairs = [(o, g) for o, g in zip(outs, out_grads)
                     if g is not None and isinstance(o, torch.Tensor) and o.requires_grad]
            wrt = [t for t in leaves if t.requires_grad]
            got = iter(torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True)
                       if wrt and pairs else [None] * len(wrt))
        result = []
        for t in leaves:
            g = next(got) if t.requires_grad else None
            result.append(torch.zeros_like(t) if g is None else g)
        return tuple(result)
    vjp.__name__ = f"vjp_of_{getattr(fn, '__name__', 'op')}"
    return vjp


def differentiate(graph: Graph, needs_grad: list[bool], skip_leaves: frozenset[int] = frozenset()) -> Joint:
    """The forward and backward graphs of prim graph `graph` for the inputs marked in `needs_grad`.
    Output leaves in `skip_leaves` get no gradient input (the caller makes them outside, e.g. views of
    inputs that eager autograd differentiates itself)."""
    for name, value in graph.mutated_inputs.items():
        ph = next(p for p in graph.placeholders if p.name == name)
        if needs_grad[graph.placeholders.index(ph)]:
            raise NotImplementedError(f"an input that needs a gradient ({name}) is updated in place")
    graph = _with_all_outputs(graph, _active_nodes(graph, needs_grad))
    active = _active_nodes(graph, needs_grad)
    builder = _Builder(graph)
    outputs = graph.output_value
    leaves = list(flatten(outputs))
    grads: dict[Node, Any] = {}
    differentiable = []
    with tracing(builder.graph, inline=True):
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, Node) and leaf in active and _float(leaf.meta) and i not in skip_leaves:
                differentiable.append(i)
                _accumulate(grads, leaf, builder.grad_input(i, leaf.meta))
        multi = _multi_outputs(graph)
        opaque = 0
        for node in reversed(graph.nodes):
            if node not in active or node.op in ("placeholder", "getitem", "output"):
                continue
            if isinstance(node.meta, tuple):
                children = multi.get(node, {})
                out_grads = tuple(grads.get(children[k]) if k in children else None
                                  for k in range(len(node.meta)))
                outs = tuple(builder.value(children[k]) if k in children else None for k in range(len(node.meta)))
            else:
                out_grads = (grads.get(node),)
                outs = (builder.value(node),)
            if all(g is None for g in out_grads):
                continue
            if node.op == "call_torch":
                opaque += _opaque_backward(builder, node, out_grads, grads, active, multi.get(node, {}))
                continue
            rule = node.target.rules.get("vjp")
            if rule is None:
                raise NotImplementedError(f"prims.{node.target.name} has no vjp rule")
            args = map_structure(builder.value, node.args)
            kwargs = map_structure(builder.value, node.kwargs)
            if getattr(rule, "takes_grad_mask", False):
                # eager's grad_input_mask: the rule computes only the gradients some input needs
                kwargs = dict(kwargs, grad_mask=tuple(_needs_gradient(a, active) for a in node.args))
            result = rule(out_grads, outs, *args, **kwargs)
            if not isinstance(result, (tuple, list)) or len(result) != len(node.args):
                raise NotImplementedError(f"the vjp rule of prims.{node.target.name} returned {len(result)} "
                                          f"gradients for {len(node.args)} arguments")
            # a float value some input's gradient depends on, given no gradient where eager gives one
            # (None from the rule, or a keyword argument, which rules never differentiate), would leave
            # that input's .grad short: refused, so the graph runs with torch (rules of prims eager gives
            # no or a zero gradient say so: `gives_no_gradient`)
            if not getattr(rule, "gives_no_gradient", False):
                dropped = [a for a, g in zip(node.args, result) if g is None] + list(flatten(node.kwargs))
                for arg in dropped:
                    if isinstance(arg, Node) and arg in active and _float(arg.meta):
                        raise NotImplementedError(f"the vjp rule of prims.{node.target.name} gives no "
                                                  f"gradient for {arg.name}, which needs one")
            for arg, g in zip(node.args, result):
                if isinstance(arg, (list, tuple)):
                    for a, ga in zip(arg, g if g is not None else [None] * len(arg)):
                        if isinstance(a, Node) and a in active:
                            _accumulate(grads, a, ga)
                elif isinstance(arg, Node) and arg in active:
                    _accumulate(grads, arg, g)
        input_grads = tuple(in_input_layout(grads.get(p), p.meta) if needs else None
                            for p, needs in zip(graph.placeholders, needs_grad))
        builder.graph.output(tuple(g.node if isinstance(g, Proxy) else g for g in input_grads))
    dce(builder.graph)  # gradients no input needs (a rule computes all of its own), and the rewritten ones
    if opaque:
        counters["autograd"]["opaque backward of a fallback op"] += opaque
    _drop_unused_inputs(builder)
    saved = [node for kind, node in builder.inputs if kind == "saved"]
    forward = _forward_with_saved(graph, leaves, saved)
    k = 0
    backward_inputs = []
    for kind, what in builder.inputs:
        if kind == "saved":
            backward_inputs.append(("saved", k))
            k += 1
        else:
            backward_inputs.append(("grad", what))
    return Joint(forward, builder.graph, len(leaves), backward_inputs, differentiable, outputs, opaque)


def _drop_unused_inputs(builder: _Builder) -> None:
    """Saved values no rule ended up reading are not saved (the gradient placeholders stay)."""
    graph = builder.graph
    used = {id(i) for n in graph.nodes for i in n.inputs()}
    placeholders = graph.placeholders
    keep = [(entry, ph) for entry, ph in zip(builder.inputs, placeholders)
            if entry[0] == "grad" or id(ph) in used]
    dropped = {id(ph) for entry, ph in zip(builder.inputs, placeholders)} - {id(ph) for _, ph in keep}
    graph.nodes = [n for n in graph.nodes if id(n) not in dropped]
    builder.inputs = [entry for entry, _ in keep]


def _opaque_backward(builder: _Builder, node: Node, out_grads: tuple, grads: dict[Node, Any],
                     active: set[Node], children: dict[int, Node]) -> int:
    tensor_args = node.tensor_args()
    # output 0 of a wrapped fallback is the generator state before it ran: no gradient, replayed
    values = [builder.value(a) for a in tensor_args] + [builder.value(children[0])] + list(out_grads[1:])
    metas = tuple(a.meta for a in tensor_args)
    g = builder.graph
    wanted = [a in active and _float(a.meta) for a in tensor_args]
    vjp_node = g.call_torch(_opaque_vjp(node, wanted), tuple(v.node if v is not None else None for v in values),
                            {}, metas, None,
                            f"backward of {node.target_name()}")
    for k, a in enumerate(tensor_args):
        if a in active:
            _accumulate(grads, a, Proxy(g.getitem(vjp_node, k)))
    return 1


def _copy_node(out: Graph, node: Node, sub: Callable[[Any], Any]) -> Node:
    """`node` appended to `out` under its own name, its arguments passed through `sub`."""
    copy = Node(out, node.name, node.op, node.target, map_structure(sub, node.args),
                map_structure(sub, node.kwargs), node.meta, node.decomposition, node.origin)
    out._names.add(node.name)
    out.nodes.append(copy)
    return copy


def _copy_nodes(graph: Graph, out: Graph, mapping: dict[Node, Node]) -> None:
    """Every node of `graph` but its output, copied into `out` (`mapping`: original -> copy)."""
    def sub(v: Any) -> Any:
        return mapping[v] if isinstance(v, Node) else v
    for node in graph.nodes:
        if node.op == "output":
            return
        mapping[node] = _copy_node(out, node, sub)


class _WithRngState:
    """A fallback torch op that also returns the CPU generator's state from just before it ran: its opaque
    backward runs it again from that state, so a random op (dropout inside attention, rrelu, ...) draws
    the same numbers in the backward as in the forward."""

    def __init__(self, fn: Callable[..., Any], multi: bool):
        self.fn, self.multi = fn, multi
        self.__name__ = f"with_rng_state_{getattr(fn, '__name__', 'op')}"

    def __call__(self, *args: Any, **kwargs: Any) -> tuple:
        state = torch.get_rng_state()
        out = self.fn(*args, **kwargs)
        return (state, *out) if self.multi else (state, out)


_RNG_META = TensorMeta(tuple(torch.get_rng_state().shape), torch.uint8)


def _with_all_outputs(graph: Graph, active: set[Node]) -> Graph:
    """A copy of `graph` with a getitem node for every output of every multi-output prim (the rules see
    all of a prim's outputs), and every `active` fallback torch op (one that gets a backward) returning the
    generator state before it as its output 0 (`_WithRngState`), its own outputs after it."""
    out = Graph(graph.name, graph.origin)
    mapping: dict[Node, Node] = {}
    present = {(n.args[0], n.args[1]) for n in graph.nodes if n.op == "getitem"}
    wrapped: dict[Node, Node] = {}  # original fallback node -> its wrapped copy

    def sub(v: Any) -> Any:
        return mapping[v] if isinstance(v, Node) else v
    for node in graph.nodes:
        if node.op == "output":
            break
        if node.op == "getitem" and node.args[0] in wrapped:
            mapping[node] = out.getitem(wrapped[node.args[0]], node.args[1] + 1)
            continue
        if node.is_fallback and node in active and isinstance(node.meta, (TensorMeta, tuple)):
            multi = isinstance(node.meta, tuple)
            metas = (_RNG_META,) + (node.meta if multi else (node.meta,))
            w = out.call_torch(_WithRngState(node.target, multi), map_structure(sub, node.args),
                               map_structure(sub, node.kwargs), metas, None, node.origin)
            wrapped[node] = w
            out.getitem(w, 0)
            if not multi:
                mapping[node] = out.getitem(w, 1)
            continue
        copy = mapping[node] = _copy_node(out, node, sub)
        if node.op == "call_prim" and isinstance(node.meta, tuple):
            for k in range(len(node.meta)):
                if (node, k) not in present:
                    out.getitem(copy, k)
    out.output(map_structure(sub, graph.output_value))
    out.mutated_inputs = {k: mapping[v] for k, v in graph.mutated_inputs.items()}
    return out


def _forward_with_saved(graph: Graph, leaves: list, saved: list[Node]) -> Graph:
    """A copy of `graph` whose output is (its output leaves..., the saved values...)."""
    out = Graph(graph.name, graph.origin)
    mapping: dict[Node, Node] = {}
    _copy_nodes(graph, out, mapping)
    out.output(tuple(mapping[v] if isinstance(v, Node) else v for v in leaves) + tuple(mapping[n] for n in saved))
    out.mutated_inputs = {k: mapping[v] for k, v in graph.mutated_inputs.items()}
    return out
