"""Rewrites of the lowered loop graph that hand work back to torch's kernels where they do it for free.

`fold_bias_into_mm`: a matrix product whose only reader is a kernel computing exactly `mm + bias` (a
`Linear` whose result is materialized: fed to attention, to another matmul through a view, or returned)
becomes one `torch.addmm(bias, a, b)` call. BLAS adds the bias while it writes the product, so the pass
that would read the product back and add the bias disappears — and the result is eager's, bit for bit,
since eager's `F.linear` calls `addmm` too. When the sum feeds a further pointwise op (`gelu(x @ w + b)`),
lowering has inlined the add into that op's kernel and nothing here matches.
"""
from __future__ import annotations

from typing import Any

import sympy
import torch

from .. import config
from ..graph.layout import is_contiguous
from ..graph.pipeline import FUEL
from .index import linear_index, simplify_index
from .ir import ComputedBuffer, ExternNode, InputBuffer, LoopGraph, Pointwise, ViewRef
from .ops import Handler

log = config.channel("fusion")

_FOLD_DTYPES = (torch.float32, torch.float64)


class _TreeHandler(Handler):
    """Runs a body into a nested tuple: ("load", name, index), ("add", a, b), ...; anything else is opaque."""

    def op(self, name: str, *args: Any) -> Any:
        return (name,) + args

    def load(self, name: str, index: sympy.Expr) -> Any:
        return ("load", name, index)

    def constant(self, value: Any, dtype: Any) -> Any:
        return ("constant", value, dtype)

    def index_expr(self, expr: sympy.Expr, dtype: Any) -> Any:
        return ("index_expr", expr, dtype)

    def to_dtype(self, x: Any, dtype: Any) -> Any:
        return ("to_dtype", x, dtype)

    def masked(self, cond: Any, body: Any, other: Any, dtype: Any) -> Any:
        return ("masked",)


def _addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.addmm(bias, a, b).view(shape)


def _readers(graph: LoopGraph) -> dict[str, int]:
    count: dict[str, int] = {}
    for node in graph.nodes:
        names = node.reads() if isinstance(node, ExternNode) else [n for n, _ in node.reads()]
        for name in set(names):
            count[name] = count.get(name, 0) + 1
    return count


def _contiguous(layout: Any) -> bool:
    """Row-major from the buffer's first element (what addmm's result and argument views assume)."""
    return is_contiguous(layout.shape, layout.strides) and layout.offset == 0


def _bias_operand(graph: LoopGraph, load: Any, index: list, n: int) -> Any:
    """The extern argument for a load that reads a length-n vector at the last index, or None."""
    if not (isinstance(load, tuple) and load[0] == "load"):
        return None
    _, name, expr = load
    buf = graph.buffers.get(name)
    if buf is None or not index:
        return None
    last = index[-1]
    coeff = sympy.expand(expr).coeff(last)
    rest = sympy.expand(expr - coeff * last)
    if not (coeff.is_Integer and rest.is_Integer and int(coeff) >= 0 and int(rest) >= 0):
        return None
    stride, offset = int(coeff), int(rest)
    if offset + (n - 1) * stride >= buf.layout.storage_size():
        return None
    return ViewRef(name, (n,), (stride,), offset)


def fold_bias_into_mm(graph: LoopGraph) -> int:
    """Rewrite mm-then-bias-add pairs into addmm calls in place; returns how many it rewrote."""
    if not any(isinstance(n, ExternNode) and n.target_name == "prims.mm" for n in graph.nodes):
        return 0
    readers = _readers(graph)
    kept = graph.kept_buffers()
    producers = {o.name: node for node in graph.nodes if isinstance(node, ExternNode) for o in node.outputs}
    folded = 0
    for node in list(graph.nodes):
        if not (isinstance(node, ComputedBuffer) and isinstance(node.data, Pointwise)):
            continue
        if node.dtype not in _FOLD_DTYPES or not _contiguous(node.layout) or not node.shape or \
                node.storage is not None:  # (a window of a concatenation: stored into its memory)
            continue
        index = [sympy.Symbol(f"q{d}", integer=True, nonnegative=True) for d in range(len(node.shape))]
        tree = node.data.fn(_TreeHandler(), index)
        if not (isinstance(tree, tuple) and tree[0] == "add" and len(tree) == 3):
            continue
        ranges = dict(zip(index, node.shape))
        want = linear_index(index, node.layout.strides)
        for prod, bias in ((tree[1], tree[2]), (tree[2], tree[1])):
            if not (isinstance(prod, tuple) and prod[0] == "load"):
                continue
            mm = producers.get(prod[1])
            if mm is None or mm.target_name != "prims.mm" or mm.multi_output or mm.kwargs:
                continue
            out = mm.outputs[0]
            n = out.shape[-1] if len(out.shape) == 2 else 0
            if out.dtype != node.dtype or not _contiguous(out.layout) or out.numel() != node.numel() or \
                    node.shape[-1] != n or readers.get(out.name) != 1 or out.name in kept:
                continue
            if sympy.expand(simplify_index(sympy.expand(prod[2]), ranges) - want) != 0:
                continue
            operand = _bias_operand(graph, bias, index, n)
            if operand is None or graph.buffers[operand.name].dtype != node.dtype:
                continue
            if not FUEL.take("fold_bias", lambda: f"{node.name} = addmm({operand.name}, mm {out.name})"):
                break
            a, b = mm.args
            result = InputBuffer(node.name, node.dtype, node.layout)
            # the shape is an argument (not baked into the target): symbolic sizes in it are evaluated per call
            extern = ExternNode(node.name, "extern", _addmm, "torch.addmm", (operand, a, b),
                                {"shape": tuple(node.shape)}, [result], False)
            graph.nodes[next(i for i, x in enumerate(graph.nodes) if x is node)] = extern
            graph.nodes.remove(mm)
            del graph.buffers[out.name]
            graph.buffers[node.name] = result
            folded += 1
            log.debug("%s = addmm(%s, mm %s): the bias add joins the matmul", node.name, operand.name, out.name)
            break
    return folded

