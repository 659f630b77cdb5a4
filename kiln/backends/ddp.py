"""DistributedDataParallel's gradient buckets as graph boundaries.

DDP all-reduces gradients in buckets: a bucket's all-reduce starts once every parameter in it has its
gradient. A compiled graph is one `torch.autograd.Function`, whose backward hands back every parameter's
gradient at the very end; DDP then finds all its buckets ready at once and nothing overlaps the backward.
So under `kiln.compile(DDP(model))` each captured graph of the wrapped module is cut into pieces, each
piece its own compiled graph (and autograd Function), such that the parameters whose gradients a piece's
backward completes add up to about one bucket: while the backward of the earlier pieces runs, the
finished pieces' buckets are already being reduced.

The plan (the idea of Dynamo's DDPOptimizer, written for kiln's graphs): walk the graph's nodes backwards,
the order the backward runs them. A parameter's gradient is complete after the backward of its *first*
use in the forward (a tied weight used again at the end is counted where its gradient is finished), so it
joins the current bucket there, with its bytes. When the current bucket holds its limit (DDP's
first-bucket size for the first, the last in the forward; `bucket_bytes_cap` for the others) and a node
brings new parameters, the graph is cut after that node. A cut is moved towards the output when a value
crossing it could not leave a compiled graph (not a dense tensor, or straight from a torch fallback op) and is
dropped when no position up to the next cut works. `plan_pieces` is pure (it reads the graph and which
inputs are parameters); `BucketSplitCompiler` compiles the pieces with the user's backend, lazily on the
first call with the real inputs, and records each plan for `kiln.explain` and the counters (`ddp`).

Gradients are unchanged: the pieces compute the graph's operations in the graph's order, and autograd
accumulates each parameter's gradient from the pieces that read it, as it does from eager ops.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from ..counters import counters
from ..graph import Graph, Node, TensorMeta, contiguous_strides, flatten, map_structure

_BODY_OPS = ("call_prim", "call_torch", "getitem")


@dataclasses.dataclass
class Piece:
    """One piece of a split graph: its parameters (names, first use in this piece) and their bytes."""
    params: list[str]
    nbytes: int
    nodes: int


@dataclasses.dataclass
class SplitPlan:
    """How one captured graph was cut: pieces in forward order (the last one's bucket is reduced first)."""
    graph: str
    pieces: list[Piece]
    bucket_bytes_cap: int
    first_bucket_bytes_cap: int
    not_split: str | None = None  # why the graph stays whole, when it does

    def __str__(self) -> str:
        head = (f"DDP bucket split of graph {self.graph}: {len(self.pieces)} piece(s) "
                f"(bucket_bytes_cap={self.bucket_bytes_cap}, first bucket {self.first_bucket_bytes_cap})")
        if self.not_split:
            head += f"; not split: {self.not_split}"
        lines = [head]
        for i, p in enumerate(self.pieces):
            shown = ", ".join(p.params[:6]) + (f", ... ({len(p.params)} in all)" if len(p.params) > 6 else "")
            lines.append(f"    piece {i + 1}: {p.nodes} nodes, {len(p.params)} parameter(s), "
                         f"{p.nbytes} bytes: {shown}")
        return "\n".join(lines)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _can_cross(node: Node) -> bool:
    """A value one piece may return and the next take: a dense tensor not straight from a torch fallback op
    (a compiled graph hands that to torch). Non-contiguous values (a transpose) stay inside a piece: the
    gradient arriving for such an output is made contiguous, which its backward does not expect."""
    meta = node.meta
    if not isinstance(meta, TensorMeta) or tuple(meta.strides) != tuple(contiguous_strides(meta.shape)):
        return False
    source = node.args[0] if node.op == "getitem" else node
    return not (source.op == "call_torch" and source.is_fallback)


def plan_pieces(graph: Graph, example_inputs: list, param_names: dict[int, str], bucket_bytes_cap: int,
                first_bucket_bytes_cap: int) -> tuple[dict[Node, int], SplitPlan]:
    """Assign each body node of `graph` a piece (0 = first in the forward). `param_names` maps id() of each
    parameter DDP reduces to its name. Returns (piece of each node, the plan)."""
    body = [n for n in graph.nodes if n.op in _BODY_OPS]
    position = {n: i for i, n in enumerate(body)}
    params: dict[Node, tuple[str, int]] = {}
    for ph, value in zip(graph.placeholders, example_inputs):
        if isinstance(value, torch.Tensor) and id(value) in param_names:
            params[ph] = (param_names[id(value)], _nbytes(value))
    introduced: dict[int, list[Node]] = {}
    seen: set[Node] = set()
    for i, node in enumerate(body):
        for inp in node.inputs():
            if inp in params and inp not in seen:
                seen.add(inp)
                introduced.setdefault(i, []).append(inp)

    # backwards, as the backward runs: a cut after node i when node i brings parameters to a full bucket
    cuts: list[int] = []
    held, holding = 0, False
    for i in range(len(body) - 1, -1, -1):
        new = introduced.get(i)
        if not new:
            continue
        limit = first_bucket_bytes_cap if not cuts else bucket_bytes_cap
        if holding and held >= limit and i < len(body) - 1:
            cuts.append(i)
            held = 0
        held += sum(params[p][1] for p in new)
        holding = True
    cuts.sort()

    source_position = {n: position[n.args[0]] if n.op == "getitem" else i for n, i in position.items()}

    def crossing_ok(cut: int) -> bool:
        for node in body:
            if source_position[node] <= cut:
                continue
            for inp in node.inputs():
                if inp in source_position and source_position[inp] <= cut:
                    if not _can_cross(inp):
                        return False
        return True

    kept: list[int] = []
    for k, cut in enumerate(cuts):
        stop = cuts[k + 1] if k + 1 < len(cuts) else len(body) - 1
        start = max(cut, kept[-1] + 1 if kept else cut)
        for c in range(start, stop):
            if crossing_ok(c):
                kept.append(c)
                break
    piece_of: dict[Node, int] = {}
    for node in body:
        piece_of[node] = sum(1 for c in kept if source_position[node] > c)

    not_split = _mutation_conflict(graph, piece_of)
    if not_split:
        piece_of = {n: 0 for n in body}
    n_pieces = 1 + max(piece_of.values(), default=0)
    pieces = [Piece([], 0, 0) for _ in range(n_pieces)]
    for node, k in piece_of.items():
        pieces[k].nodes += 1
    for i, new in sorted(introduced.items()):
        piece = pieces[piece_of[body[i]]]
        for p in new:
            piece.params.append(params[p][0])
            piece.nbytes += params[p][1]
    plan = SplitPlan(graph.name, pieces, bucket_bytes_cap, first_bucket_bytes_cap, not_split)
    return piece_of, plan


def _mutation_conflict(graph: Graph, piece_of: dict[Node, int]) -> str | None:
    """An input updated in place must be read and written back inside one piece: a later piece reading it
    would see the new value where the graph means the old one."""
    if not graph.mutated_inputs or len(set(piece_of.values())) < 2:
        return None
    by_name = {p.name: p for p in graph.placeholders}
    users = graph.users()
    for name, final in graph.mutated_inputs.items():
        ph = by_name[name]
        where = {piece_of[u] for u in users[ph] if u in piece_of}
        if final in piece_of:
            where.add(piece_of[final])
        if len(where) > 1:
            return f"input {name} is updated in place and read across a bucket boundary"
    return None


@dataclasses.dataclass
class _PieceGraph:
    graph: Graph
    inputs: list[tuple[str, Any]]   # ("input", position in the whole graph) or ("value", node of the whole)
    exports: list[Node]             # nodes of the whole graph this piece returns, in order


def split_graph(graph: Graph, piece_of: dict[Node, int]) -> list[_PieceGraph]:
    """The pieces as graphs of their own: each reads the whole graph's inputs it uses and the values earlier
    pieces export, and returns what later pieces or the output need."""
    n_pieces = 1 + max(piece_of.values(), default=0)
    placeholder_index = {p: i for i, p in enumerate(graph.placeholders)}
    output_leaves = [v for v in flatten(graph.output_value) if isinstance(v, Node)]
    needed_later: dict[Node, int] = {}  # node -> last piece that reads it
    for node, k in piece_of.items():
        for inp in node.inputs():
            if inp in piece_of and piece_of[inp] != k:
                needed_later[inp] = max(needed_later.get(inp, -1), k)
    for v in output_leaves:
        if v in piece_of:
            needed_later[v] = n_pieces
    written_back = {final: name for name, final in graph.mutated_inputs.items()}
    by_name = {p.name: p for p in graph.placeholders}
    result = []
    for k in range(n_pieces):
        sub = Graph(f"{graph.name}_bucket{k}", graph.origin)
        mapping: dict[Node, Node] = {}
        inputs: list[tuple[str, Any]] = []
        members = [n for n in graph.nodes if piece_of.get(n) == k]

        def bind(inp: Node) -> None:
            if inp in mapping:
                return
            if inp.op == "placeholder":
                mapping[inp] = sub.placeholder(inp.name, inp.meta)
                inputs.append(("input", placeholder_index[inp]))
            elif inp.op == "constant":
                mapping[inp] = sub.constant(inp.target, inp.name)
            else:
                mapping[inp] = sub.placeholder(inp.name, inp.meta)
                inputs.append(("value", inp))

        for node in members:
            for inp in node.inputs():
                if piece_of.get(inp) != k:
                    bind(inp)
        for final, name in written_back.items():
            if piece_of.get(final) == k:
                bind(by_name[name])

        def m(v: Any) -> Any:
            return mapping[v] if isinstance(v, Node) else v

        for node in members:
            args, kwargs = map_structure(m, node.args), map_structure(m, node.kwargs)
            if node.op == "getitem":
                mapping[node] = sub.getitem(mapping[node.args[0]], node.args[1])
            elif node.op == "call_prim":
                mapping[node] = sub.call_prim(node.target, args, kwargs, node.meta, node.origin)
            else:
                mapping[node] = sub.call_torch(node.target, args, kwargs, node.meta, node.decomposition,
                                               node.origin)
        exports = [n for n in members if needed_later.get(n, -1) > k]
        for final, name in written_back.items():
            if piece_of.get(final) == k:
                sub.mutated_inputs[mapping[by_name[name]].name] = mapping[final]
        sub.output(tuple(mapping[n] for n in exports))
        result.append(_PieceGraph(sub, inputs, exports))
    return result


class BucketSplitCompiler:
    """What capture calls to compile a graph of the module DDP wraps: the graph cut at DDP's buckets, each
    piece compiled by `inner` (the user's backend, its options bound) on the first call."""

    keeps_views = False

    def __init__(self, inner: Callable[..., Any], ddp: torch.nn.Module):
        self.inner = inner
        self.ddp = ddp
        self.splits: list[SplitPlan] = []

    def bucket_caps(self) -> tuple[int, int]:
        """(bucket_bytes_cap, first bucket's cap) of the DDP module, as its reducer uses them."""
        ddp = self.ddp
        cap = int(ddp.bucket_bytes_cap)
        config = getattr(ddp, "_bucket_config", None)
        if config is not None:
            return cap, int(config.first_bucket_bytes_cap)
        default_first = getattr(torch.distributed, "_DEFAULT_FIRST_BUCKET_BYTES", cap)
        return cap, (min(cap, default_first) if getattr(ddp, "bucket_bytes_cap_default", False) else cap)

    def param_names(self) -> dict[int, str]:
        ignored = set(getattr(self.ddp, "parameters_to_ignore", ()) or ())
        return {id(p): name for name, p in self.ddp.module.named_parameters()
                if p.requires_grad and name not in ignored}

    def __call__(self, graph: Graph, example_inputs: list) -> Callable[..., Any]:
        cap, first = self.bucket_caps()
        piece_of, plan = plan_pieces(graph, example_inputs, self.param_names(), cap, first)
        self.splits.append(plan)
        if plan.not_split:
            counters["ddp"][f"not split: {plan.not_split}"] += 1
        if len(plan.pieces) < 2:
            counters["ddp"]["graphs left whole (one bucket)"] += 1
            return self.inner(graph, example_inputs)
        counters["ddp"]["graphs split at bucket boundaries"] += 1
        counters["ddp"]["pieces"] += len(plan.pieces)
        return _SplitRunner(graph, split_graph(graph, piece_of), self.inner)


class _SplitRunner:
    """Runs the pieces in order, each compiled on its first call from the values it is given."""

    def __init__(self, graph: Graph, pieces: list[_PieceGraph], inner: Callable[..., Any]):
        self.pieces = pieces
        self.inner = inner
        self.compiled: list[Callable[..., Any] | None] = [None] * len(pieces)
        self.template = graph.output_value
        placeholder_index = {p: i for i, p in enumerate(graph.placeholders)}
        self.placeholder_index = placeholder_index

    def __call__(self, *inputs: Any) -> Any:
        values: dict[Node, Any] = {}
        for k, piece in enumerate(self.pieces):
            args = [inputs[ref] if kind == "input" else values[ref] for kind, ref in piece.inputs]
            fn = self.compiled[k]
            if fn is None:
                fn = self.compiled[k] = self.inner(piece.graph, args)
            outs = fn(*args)
            for node, value in zip(piece.exports, outs, strict=True):
                values[node] = value

        def leaf(v: Any) -> Any:
            if not isinstance(v, Node):
                return v
            if v.op == "placeholder":
                return inputs[self.placeholder_index[v]]
            if v.op == "constant":
                return v.target
            return values[v]
        return map_structure(leaf, self.template)
