"""Lowering that remembers which user lines went into each buffer (the nodes' `origin`, file:line).

`OriginLowering(prim_graph, target).run()` lowers like `Lowering` and fills `.origins`: buffer name -> the
origins of the nodes lowered into it. kiln.check and kiln.profile name a kernel's user lines with it, and
the cpp backend uses it when a compile report is traced (KILN_TRACE_DIR), so the report lists the lines
fused into each kernel.
"""
from __future__ import annotations

from typing import Any

from ..graph import Graph
from .ir import ExternNode
from .lowering import Lowering


class OriginLowering(Lowering):
    """Lowering that credits each buffer it adds with the origins (user lines) of the nodes lowered into it.

    A node's ops are inlined into the buffer that materializes them later, so the nodes lowered since the
    last buffer are pending: a buffer a node computes itself (a reduction, a scan) takes them with the node;
    an operand the node has realized takes them without it; an extern or fallback takes only its node.
    """

    def __init__(self, graph: Graph, target: Any):
        super().__init__(graph, target)
        self.origins: dict[str, list[str]] = {}
        self._pending: list[str] = []
        self._current: str | None = None
        self._realizing = 0

    def _lowering(self, node: Any, lower: Any, *args: Any) -> Any:
        outer, self._current = self._current, node.origin
        if node.origin and node.origin not in self._pending:
            self._pending.append(node.origin)
        try:
            return lower(node, *args)
        finally:
            self._current = outer

    def call_prim(self, node: Any) -> Any:
        return self._lowering(node, super().call_prim)

    def fallback(self, node: Any, target: Any, target_name: str, kind: str,
                 inplace_target: Any = None) -> Any:
        return self._lowering(node, super().fallback, target, target_name, kind, inplace_target)

    def realize(self, box: Any, meta: Any = None, node: Any = None) -> str:
        self._realizing += 1
        try:
            return super().realize(box, meta, node)
        finally:
            self._realizing -= 1

    def add_node(self, node: Any) -> None:
        super().add_node(node)
        current = [self._current] if self._current else []
        if isinstance(node, ExternNode):
            for out in node.outputs:
                self.origins[out.name] = current
            self._pending = [o for o in self._pending if o != self._current]
        elif self._realizing:  # an operand of the current node: what was lowered before it
            self.origins[node.name] = [o for o in self._pending if o != self._current]
            self._pending = [o for o in current if o in self._pending]
        else:
            self.origins[node.name] = list(dict.fromkeys(self._pending + current))
            self._pending = []
