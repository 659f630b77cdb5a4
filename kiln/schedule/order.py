"""Kernel order: run the fused schedule in a dependency-respecting order that keeps peak memory low.

Program order can hold many large buffers at once: `m1 = x @ w1; m2 = x @ w2; m3 = x @ w3` followed by one
reduction of each keeps all three products alive, where computing each product just before its reduction
keeps one. Two candidate orders are tried: greedy list scheduling (among the items whose inputs are
ready, run the one that allocates least net of what it frees: its results' bytes, less the bytes of the
buffers it reads last; ties go to program order) and a depth-first post-order that runs each item right
after its dependencies, the heavier ones first. A kernel (`FusedGroup`) is atomic: its members run together.

The constraints (read-after-write, and those of fallbacks) are `kiln.schedule.deps`'s, which fusion
asks too.

A candidate is taken only when the plan `memory.plan` makes for it (segments, frees after last use,
reuse of freed memory, in-place writes) has a strictly lower peak than program order's: an order that is
already good comes back unchanged, the same list object. Without extern calls the schedule is one segment,
whose buffers the plan allocates together and frees together: no order is tried.
"""
from __future__ import annotations

import heapq
import time

from .. import config
from ..graph.pipeline import FUEL
from ..lower.sizes import hint
from ..lower.ir import ExternNode, LoopGraph
from ..lower.target import Target
from .deps import dependencies
from .group import FusedGroup
from .locality import local_buffers
from .memory import plan

log = config.channel("fusion")


class _Items:
    """What the scheduler needs of each item of the schedule, by index."""

    def __init__(self, graph: LoopGraph, schedule: list[FusedGroup | ExternNode], target: Target):
        self.graph = graph
        self.target = target
        self.schedule = schedule
        self.kept = graph.kept_buffers()
        n = len(schedule)
        self.writes: list[list[str]] = []  # every buffer the item produces
        self.reads: list[list[str]] = []  # every buffer it loads, its own included (as plan counts them)
        self.readers: dict[str, set[int]] = {}
        for i, item in enumerate(schedule):
            if isinstance(item, FusedGroup):
                self.writes.append([m.buffer.name for m in item.members])
                names = [name for m in item.members for name, _ in m.buffer.reads()]
            else:
                self.writes.append([o.name for o in item.outputs])
                names = item.reads()
            # a read of a concatenation computed in place is a read of each of its parts
            self.reads.append(list(dict.fromkeys(s for name in names for s in graph.sources(name))))
            for name in self.reads[i]:
                self.readers.setdefault(name, set()).add(i)
        # buffers living inside one kernel, and windows of a concatenation's memory: never allocated alone
        self.local = set(local_buffers(schedule, self.kept, target))
        self.allocated = [[w for w in ws if w not in self.local and graph.storage_of(w) == w]
                          for ws in self.writes]
        self.nbytes = {name: hint(graph.buffers[name].nbytes()) for ws in self.allocated for name in ws}
        self.n = n

    def dependencies(self) -> list[set[int]]:
        """For each item, the items that must run before it (`kiln.schedule.deps`)."""
        return dependencies(self.writes, self.reads, [self.is_fallback(i) for i in range(self.n)])

    def is_fallback(self, i: int) -> bool:
        item = self.schedule[i]
        return isinstance(item, ExternNode) and item.kind == "fallback"

    def freeable(self, name: str) -> bool:
        return name in self.nbytes and name not in self.kept


def _greedy(items: _Items, before: list[set[int]]) -> list[int]:
    """Items in a dependency order; among the ready ones, the least net allocation first."""
    n = items.n
    after: list[list[int]] = [[] for _ in range(n)]
    waiting = [len(b) for b in before]
    for i, deps in enumerate(before):
        for j in deps:
            after[j].append(i)
    # bytes an item frees for good whatever the order: what it writes and no other item reads
    own: list[int] = []
    loads: list[list[str]] = []  # freeable buffers of other items it reads
    for i in range(n):
        written = set(items.writes[i])
        own.append(sum(items.nbytes[w] for w in items.allocated[i]
                       if items.freeable(w) and items.readers.get(w, set()) <= {i}))
        loads.append([r for r in items.reads[i] if r not in written and items.freeable(r)])
    left = {name: set(readers) for name, readers in items.readers.items() if items.freeable(name)}

    def score(i: int) -> int:
        alloc = sum(items.nbytes[w] for w in items.allocated[i])
        return alloc - own[i] - sum(items.nbytes[r] for r in loads[i] if len(left[r]) == 1)
    current: dict[int, int] = {}
    heap: list[tuple[int, int]] = []
    for i in range(n):
        if waiting[i] == 0:
            current[i] = score(i)
            heap.append((current[i], i))
    heapq.heapify(heap)
    result: list[int] = []
    while heap:
        s, i = heapq.heappop(heap)
        if current.get(i) != s:
            continue  # a stale entry: the item ran, or its score dropped since
        del current[i]
        result.append(i)
        for name in loads[i]:
            readers = left[name]
            readers.discard(i)
            if len(readers) == 1:  # its last reader now frees it
                (j,) = readers
                if j in current:
                    current[j] = score(j)
                    heapq.heappush(heap, (current[j], j))
        for j in after[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                current[j] = score(j)
                heapq.heappush(heap, (current[j], j))
    if len(result) != n:
        raise AssertionError(f"memory order: a dependency cycle among {n - len(result)} kernels")
    return result


def _depth_first(items: _Items, before: list[set[int]]) -> list[int]:
    """Depth-first post-order from the sinks (in program order): each item right after its dependencies,
    the heavier dependency subgraphs first (Sethi-Ullman's rule: what it leaves alive is then held while
    less is in flight). The weight of an item is its bytes plus its dependencies' weights."""
    weight: list[int] = []
    for i in range(items.n):  # program order is a dependency order
        weight.append(sum(items.nbytes[w] for w in items.allocated[i]) + sum(weight[j] for j in before[i]))
    has_successor = [False] * items.n
    for deps in before:
        for j in deps:
            has_successor[j] = True
    done = [False] * items.n
    result: list[int] = []
    for sink in range(items.n):
        if has_successor[sink] or done[sink]:
            continue
        stack = [(sink, iter(sorted(before[sink], key=lambda j: (-weight[j], j))))]
        while stack:
            i, deps = stack[-1]
            j = next(deps, None)
            if j is None:
                stack.pop()
                done[i] = True
                result.append(i)
            elif not done[j]:
                done[j] = True  # (on the stack: a DAG has no path back to it)
                stack.append((j, iter(sorted(before[j], key=lambda k: (-weight[k], k)))))
    return result


def _simulated_peak(items: _Items, sequence: list[int]) -> int:
    """Peak bytes of the plan `memory.plan` makes for this order."""
    return plan(items.graph, [items.schedule[i] for i in sequence], items.target,
                simulate=True).peak_bytes(items.graph)


def order(graph: LoopGraph, schedule: list[FusedGroup | ExternNode], target: Target,
          enabled: bool = True) -> list[FusedGroup | ExternNode]:
    """The schedule's items in an order that keeps the peak of live buffer bytes low.

    Returns `schedule` itself when not `enabled` (the `memory_order` option) or no order found beats
    program order. Taking a new order spends a unit of optimization fuel.
    """
    if not enabled or len(schedule) < 3 or \
            not any(isinstance(item, ExternNode) for item in schedule):
        return schedule
    start = time.perf_counter()
    items = _Items(graph, schedule, target)
    deps = items.dependencies()
    program = list(range(items.n))
    best, best_peak, program_peak = program, 0, None
    for sequence in (_greedy(items, deps), _depth_first(items, deps)):
        if sequence == program:
            continue
        if program_peak is None:
            program_peak = best_peak = _simulated_peak(items, program)
        peak = _simulated_peak(items, sequence)
        if peak < best_peak:
            best, best_peak = sequence, peak
    if best is program or not FUEL.take("order", f"reorder {items.n} items: peak {program_peak} -> "
                                                 f"{best_peak} bytes"):
        return schedule
    log.debug("memory order: peak %d -> %d bytes (%d items, %.1f ms)", program_peak, best_peak, items.n,
              (time.perf_counter() - start) * 1e3)
    return [schedule[i] for i in best]
