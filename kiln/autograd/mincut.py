"""A minimum s-t cut for the partitioner: max flow by blocking flows on level graphs (Dinic's method).

Written here rather than imported: networkx, the obvious choice, adds ~11 MB of resident memory and its
import time to every training compile; on the zoo's tiny models that is more than their whole training
step adds over eager's RSS (issue 10 aims at a peak at or under eager's). The partitioner's graphs have a
few thousand vertices at most.

The source side returned is every vertex that cannot reach the sink in the residual graph of a maximum
flow: of the minimum cuts, the one closest to the sink (the partitioner saves values as late as a tie
allows), as networkx's `minimum_cut` chooses; it does not depend on which maximum flow was found.
Capacities are floats, `math.inf` allowed; a path of infinite capacity from source to sink raises
`Unbounded`.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Hashable

EPS = 1e-9   # a residual capacity at or under this is exhausted (float capacities: bytes and fractions)


class Unbounded(ValueError):
    """The source reaches the sink along edges of infinite capacity only: no cut is finite."""


class FlowGraph:
    def __init__(self) -> None:
        self._index: dict[Hashable, int] = {}
        self._keys: list[Hashable] = []
        self._adj: list[list[int]] = []     # vertex -> its edges' indices (forward and reverse)
        self._to: list[int] = []            # edge -> its head; edge e ^ 1 is e's reverse
        self._cap: list[float] = []         # edge -> residual capacity

    def __contains__(self, key: Hashable) -> bool:
        return key in self._index

    def _vertex(self, key: Hashable) -> int:
        v = self._index.get(key)
        if v is None:
            v = self._index[key] = len(self._keys)
            self._keys.append(key)
            self._adj.append([])
        return v

    def add_edge(self, u: Hashable, v: Hashable, capacity: float) -> None:
        if capacity < 0 or math.isnan(capacity):
            raise ValueError(f"min cut: capacity must be >= 0, got {capacity}")
        a, b = self._vertex(u), self._vertex(v)
        self._adj[a].append(len(self._to))
        self._to.append(b)
        self._cap.append(capacity)
        self._adj[b].append(len(self._to))
        self._to.append(a)
        self._cap.append(0.0)

    def _levels(self, s: int, t: int) -> list[int] | None:
        level = [-1] * len(self._keys)
        level[s] = 0
        todo = deque([s])
        while todo:
            u = todo.popleft()
            for e in self._adj[u]:
                v = self._to[e]
                if level[v] < 0 and self._cap[e] > EPS:
                    level[v] = level[u] + 1
                    todo.append(v)
        return level if level[t] >= 0 else None

    def _blocking_flow(self, s: int, t: int, level: list[int]) -> float:
        """Augment along shortest paths of the level graph until none is left (iterative: paths can be
        thousands of edges long, past Python's recursion limit)."""
        adj, to, cap = self._adj, self._to, self._cap
        nxt = [0] * len(self._keys)    # per vertex: the first of its edges not yet found dead
        total = 0.0
        path: list[int] = []
        u = s
        while True:
            if u == t:
                pushed = min(cap[e] for e in path)
                if pushed == math.inf:
                    raise Unbounded("min cut: an infinite-capacity path joins source and sink")
                for e in path:
                    cap[e] -= pushed
                    cap[e ^ 1] += pushed
                total += pushed
                path.clear()
                u = s
                continue
            edges = adj[u]
            while nxt[u] < len(edges):
                e = edges[nxt[u]]
                if cap[e] > EPS and level[to[e]] == level[u] + 1:
                    break
                nxt[u] += 1
            else:   # a dead end: retreat one edge and skip it from now on
                if not path:
                    return total
                level[u] = -1
                e = path.pop()
                u = to[e ^ 1]
                nxt[u] += 1
                continue
            e = edges[nxt[u]]
            path.append(e)
            u = to[e]

    def min_cut(self, source: Hashable, sink: Hashable) -> tuple[float, set[Hashable]]:
        """(the cut's capacity, the source side: every vertex that no longer reaches the sink in the
        residual graph)."""
        s, t = self._vertex(source), self._vertex(sink)
        flow = 0.0
        while (level := self._levels(s, t)) is not None:
            flow += self._blocking_flow(s, t, level)
        reaches = [False] * len(self._keys)   # what still reaches the sink in the residual graph
        reaches[t] = True
        todo = [t]
        while todo:
            v = todo.pop()
            for e in self._adj[v]:         # e leaves v; its reverse e ^ 1 enters v from u
                u = self._to[e]
                if not reaches[u] and self._cap[e ^ 1] > EPS:
                    reaches[u] = True
                    todo.append(u)
        return flow, {self._keys[v] for v in range(len(self._keys)) if not reaches[v]}
