"""Fusion: group the loop graph's computed buffers into kernels (`kiln.schedule.group.FusedGroup`).

Every computed buffer starts as a kernel of its own. Candidate pairs come from the dependencies: a producer
and its consumer, and two kernels reading the same buffer (siblings). A pair is legal when no path between
them in the dependency graph (`kiln.schedule.deps`: read-after-write and the fallbacks' order) runs through
a third item: an extern, a fallback or a kernel that cannot join them (else the merged kernel would have
to run both before and after it). It fuses when the later kernel's members fit the earlier one's loop
nest one by one (iteration spaces, and every read of a buffer the kernel writes hits the element written
for the current outer index: then no other thread is involved). Candidates merge by the bytes they save,
highest first (a producer's output and a shared input read once instead of twice); then, in program
order, each kernel joins the latest earlier one it legally fits, which saves only a launch. Softmax over the
last dim (max, sum of exp, divide) and layer_norm (mean, variance, normalize) each become one kernel; so do
two sibling reductions with an independent matrix product between them. A pointwise chain was already
inlined into one body by lowering.
"""
from __future__ import annotations

import dataclasses
import heapq
from typing import Any

import sympy

from .. import config
from ..graph.pipeline import FUEL
from ..lower.index import FloorDiv, ModularIndexing, index_var, linear_index, simplify_index
from ..lower.ir import ComputedBuffer, ConcatBuffer, ExternNode, LoopGraph, Pointwise, Reduction, Scan
from ..lower.ops import DepsHandler
from ..lower.sizes import hint, size_symbols
from ..lower.target import Target
from .deps import dependencies
from .group import FusedGroup, IndexMap, Member, Role

__all__ = ["FusedGroup", "IndexMap", "Member", "Role", "fuse", "is_pointwise"]

log = config.channel("fusion")


def _role(group: FusedGroup, buf: ComputedBuffer) -> Role | None:
    """How `buf` would sit in `group`, or None if its iteration space does not fit."""
    data = buf.data
    if isinstance(data, Scan):
        return None  # a scan starts its own kernel (later pointwise may join it)
    if isinstance(data, Reduction):
        if group.inner is None:
            return Role.REDUCTION if group.outer == data.ranges and not _has_inner(group) else None
        return Role.REDUCTION if (group.outer, group.inner) == (data.ranges, data.reduction_ranges) else None
    if group.inner is None:
        return Role.OUTER if data.ranges == group.outer else None
    if data.ranges == group.outer + group.inner:
        return Role.INNER
    if data.ranges == group.outer:
        return Role.OUTER
    return None


def _has_inner(group: FusedGroup) -> bool:
    return any(m.role is not Role.OUTER for m in group.members)


def _reads_are_local(group: FusedGroup, member: Member, joined: dict[str, list[str]]) -> bool:
    """Every read of a buffer of `group` hits the element written for the current outer index. A read of a
    concatenation (`joined`: its parts) that `group` writes a part of never is (kept simple)."""
    written = {m.buffer.name: m for m in group.members}
    # a size-1 loop variable is always 0, whether or not an index expression mentions it
    ones = {v: 0 for v, size in group.var_ranges().items() if size == 1}
    for name, expr in group.member_loads(member):
        if any(part in written for part in joined.get(name, ())):
            return False
        producer = written.get(name)
        if producer is None:
            continue
        if producer.role is Role.INNER and member.role is Role.OUTER:
            return False  # an inner loop's buffer is complete, but read at a single point: keep it simple
        want = simplify_index(sympy.expand(group.store_index(producer)), group.var_ranges())
        if sympy.expand(expr - want).xreplace(ones) != 0:
            return False
    return True


def _with(group: FusedGroup, buf: ComputedBuffer, joined: dict[str, list[str]]) -> FusedGroup | None:
    """`group` with `buf` as its last member, or None where it does not fit."""
    if group.inner is not None and group.has_role(Role.SCAN):
        scan = next(m.buffer.data for m in group.members if m.role is Role.SCAN)
        if scan.dim != len(scan.ranges) - 1 or isinstance(buf.data, (Reduction, Scan)):
            return None  # only when the scanned dim is the last one is the kernel's O+I the tensor's shape
    role = _role(group, buf)
    if role is None and group.inner is None and isinstance(buf.data, Reduction):
        # a pointwise group over O+I turns into a reduction group (outer O, inner I)
        data = buf.data
        if group.outer == data.ranges + data.reduction_ranges and data.reduction_ranges:
            candidate = FusedGroup(group.name, data.ranges, data.reduction_ranges,
                                   tuple(Member(m.buffer, Role.INNER) for m in group.members))
            member = Member(buf, Role.REDUCTION)
            if all(_reads_are_local(candidate, m, joined) for m in candidate.members + (member,)):
                return dataclasses.replace(candidate, members=candidate.members + (member,))
        return None
    if role is None:
        return None
    member = Member(buf, role)
    inner = buf.data.reduction_ranges if role is Role.REDUCTION and group.inner is None else group.inner
    trial = dataclasses.replace(group, inner=inner)
    if not _reads_are_local(trial, member, joined):
        return None
    return dataclasses.replace(trial, members=group.members + (member,))


def _merged(first: FusedGroup, second: FusedGroup, joined: dict[str, list[str]]) -> FusedGroup | None:
    """One kernel running `first`'s members, then `second`'s, or None where they do not fit together."""
    group: FusedGroup | None = first
    for member in second.members:
        group = _with(group, member.buffer, joined)
        if group is None:
            return None
    return group


def _new_group(name: str, buf: ComputedBuffer) -> FusedGroup:
    data = buf.data
    if isinstance(data, Scan):
        outer = tuple(s for d, s in enumerate(data.ranges) if d != data.dim)
        return FusedGroup(name, outer, (data.ranges[data.dim],), (Member(buf, Role.SCAN),))
    if isinstance(data, Reduction):
        return FusedGroup(name, data.ranges, data.reduction_ranges, (Member(buf, Role.REDUCTION),))
    return FusedGroup(name, data.ranges, None, (Member(buf, Role.OUTER),))


class _Fusion:
    """The items of the schedule while kernels merge. An item is named by its first node's index (its
    representative); `ancestors[r]` and `descendants[r]` are bit sets of representatives, read through
    `live` (the representatives still standing): a merged-away item's bit may stay in others' sets, so
    that a merge updates only the items whose closure it changes (a model of 12k nodes spent 118 s
    rewriting every item's sets at each of 10k merges)."""

    def __init__(self, graph: LoopGraph):
        self.graph = graph
        self.joined = {name: buf.parts for name, buf in graph.buffers.items() if isinstance(buf, ConcatBuffer)}
        nodes = list(graph.nodes)
        self.nodes = nodes
        writes: list[list[str]] = []
        reads: list[list[str]] = []
        for node in nodes:
            if isinstance(node, ExternNode):
                writes.append([o.name for o in node.outputs])
                names = node.reads()
            else:
                writes.append([node.name])
                names = [name for name, _ in node.reads()]
            # a read of a concatenation computed in place waits for each of its parts
            reads.append(list(dict.fromkeys(s for name in names for s in graph.sources(name))))
        fallback = [isinstance(node, ExternNode) and node.kind == "fallback" for node in nodes]
        self.before = dependencies(writes, reads, fallback)
        # while merging, a kernel is named after its representative (`kernel{r}`); the schedule renumbers
        self.groups: dict[int, FusedGroup] = {i: _new_group(f"kernel{i}", node) for i, node in enumerate(nodes)
                                              if not isinstance(node, ExternNode)}
        self.alive = list(range(len(nodes)))  # representatives, in program order
        self.rep = list(range(len(nodes)))
        self.members = {i: [i] for i in range(len(nodes))}  # representative -> the nodes it stands for
        self.live = (1 << len(nodes)) - 1
        self.reads = {i: set(r) for i, r in enumerate(reads)}
        self.writes = {i: set(w) for i, w in enumerate(writes)}
        self.version = {i: 0 for i in range(len(nodes))}
        self.ancestors: dict[int, int] = {}
        for i in range(len(nodes)):  # program order is a dependency order
            bits = 0
            for j in self.before[i]:
                bits |= self.ancestors[j] | (1 << j)
            self.ancestors[i] = bits
        self.descendants = {i: 0 for i in range(len(nodes))}
        for i in reversed(range(len(nodes))):
            for j in self.before[i]:
                self.descendants[j] |= self.descendants[i] | (1 << i)
        self.readers: dict[str, set[int]] = {}
        self.writer: dict[str, int] = {}
        for i in range(len(nodes)):
            for name in reads[i]:
                self.readers.setdefault(name, set()).add(i)
            for name in writes[i]:
                self.writer[name] = i
        self.nbytes: dict[str, int] = {}

    def size(self, name: str) -> int:
        if name not in self.nbytes:
            buf = self.graph.buffers.get(name)
            self.nbytes[name] = int(hint(buf.nbytes())) if buf is not None else 0
        return self.nbytes[name]

    def legal(self, a: int, b: int) -> bool:
        """No path between the two runs through a third item."""
        return not (self.descendants[a] & self.ancestors[b] & self.live) and \
            not (self.descendants[b] & self.ancestors[a] & self.live)

    def score(self, a: int, b: int) -> int:
        """Bytes the pair's fusion saves: what one writes and the other reads, what both read."""
        shared = (self.writes[a] & self.reads[b]) | (self.writes[b] & self.reads[a]) | \
            (self.reads[a] & self.reads[b])
        return sum(self.size(name) for name in shared)

    def neighbours(self, a: int) -> list[int]:
        """Kernels sharing a buffer with `a` (its producers, consumers and siblings), in program order."""
        found: set[int] = set()
        for name in self.reads[a] | self.writes[a]:
            found |= {self.rep[r] for r in self.readers.get(name, ())}
            if name in self.writer:
                found.add(self.rep[self.writer[name]])
        found.discard(a)
        return sorted(b for b in found if b in self.groups)

    def try_merge(self, a: int, b: int) -> bool:
        """Fuse the kernels `a` and `b` when legal, they fit, and fuel allows: the merged kernel runs the
        members of the one that must (or, if neither must, does in program order) come first first."""
        if not self.legal(a, b):
            return False
        first, second = (b, a) if self.ancestors[a] >> b & 1 or (not self.ancestors[b] >> a & 1 and b < a) \
            else (a, b)
        group = _merged(self.groups[first], self.groups[second], self.joined)
        if group is None:
            return False
        names = self.groups[second].buffer_names()
        keep = min(first, second)  # the merged kernel's representative (and name: kernel{keep})
        if not FUEL.take("fuse", lambda: f"fuse {names[0]} into kernel{keep}"):
            return False
        self.join(first, second, group)
        log.debug("fuse %s into %s", ", ".join(names), self.groups[keep].describe())
        return True

    def join(self, first: int, second: int, group: FusedGroup) -> None:
        """Merge `second` into `first`'s kernel. The closures change only where an item was before or after
        one of the two and not the other: each such item gains the other's side (an item before or after
        both already holds everything the merged one has; the merged-away bit it holds is not `live`)."""
        keep, gone = min(first, second), max(first, second)
        both = (1 << keep) | (1 << gone)
        anc_k, anc_g = self.ancestors[keep], self.ancestors[gone]
        desc_k, desc_g = self.descendants[keep], self.descendants[gone]
        ancestors = (anc_k | anc_g) & ~both
        descendants = (desc_k | desc_g) & ~both
        self.alive.remove(gone)
        self.live &= ~(1 << gone)
        del self.groups[gone], self.ancestors[gone], self.descendants[gone]
        self.groups[keep] = dataclasses.replace(group, name=self.groups[keep].name)
        self.ancestors[keep], self.descendants[keep] = ancestors, descendants
        for x in _bits(desc_g & ~desc_k & self.live & ~both):   # after `gone` only: now after `keep` too
            self.ancestors[x] |= (1 << keep) | ancestors
        for x in _bits(desc_k & ~desc_g & self.live & ~both):   # after `keep` only: after `gone`'s past too
            self.ancestors[x] |= anc_g
        for x in _bits(anc_g & ~anc_k & self.live & ~both):
            self.descendants[x] |= (1 << keep) | descendants
        for x in _bits(anc_k & ~anc_g & self.live & ~both):
            self.descendants[x] |= desc_g
        self.reads[keep] |= self.reads.pop(gone)
        self.writes[keep] |= self.writes.pop(gone)
        for i in self.members[gone]:
            self.rep[i] = keep
        self.members[keep] += self.members.pop(gone)
        self.version[keep] += 1

    def by_score(self) -> None:
        """Merge candidate pairs, the most bytes saved first (ties: the nearer pair, then program order)."""
        def pairs(a: int) -> list[tuple[int, int, int, int, int, int]]:
            found = []
            for b in self.neighbours(a):
                lo, hi = min(a, b), max(a, b)
                saved = self.score(lo, hi)
                if saved > 0:
                    found.append((-saved, hi - lo, lo, hi, self.version[lo], self.version[hi]))
            return found
        heap = sorted({pair for a in self.groups for pair in pairs(a)})  # (a sorted list is a heap)
        while heap:
            _, _, lo, hi, vlo, vhi = heapq.heappop(heap)
            if lo not in self.groups or hi not in self.groups or \
                    (self.version[lo], self.version[hi]) != (vlo, vhi):
                continue  # stale: one side has merged since
            if self.try_merge(lo, hi):
                for pair in pairs(lo):
                    heapq.heappush(heap, pair)

    def first_fit(self) -> None:
        """What still stands alone or apart joins the latest earlier kernel it legally fits (the kernels
        share no data: the fusion saves a launch)."""
        for b in list(self.alive):
            if b not in self.groups:
                continue
            for a in reversed([x for x in self.alive if x < b and x in self.groups]):
                if self.try_merge(a, b):
                    break

    def schedule(self) -> list[FusedGroup | ExternNode]:
        """The kernels and externs in a dependency order, each as early as its first node allows."""
        items = list(self.alive)
        waiting: dict[int, set[int]] = {r: set() for r in items}
        for i, deps in enumerate(self.before):
            r = self.rep[i]
            waiting[r] |= {self.rep[j] for j in deps} - {r}
        after: dict[int, list[int]] = {r: [] for r in items}
        for r, deps in waiting.items():
            for d in deps:
                after[d].append(r)
        count = {r: len(deps) for r, deps in waiting.items()}
        ready = [r for r in items if count[r] == 0]
        heapq.heapify(ready)
        result: list[FusedGroup | ExternNode] = []
        kernels = 0
        while ready:
            r = heapq.heappop(ready)
            if r in self.groups:
                result.append(_finish(dataclasses.replace(self.groups[r], name=f"kernel{kernels}")))
                kernels += 1
            else:
                result.append(self.nodes[r])
            for s in after[r]:
                count[s] -= 1
                if count[s] == 0:
                    heapq.heappush(ready, s)
        if len(result) != len(items):
            raise AssertionError(f"fusion made a dependency cycle among {len(items) - len(result)} items")
        return result


_BYTE_BITS = tuple(tuple(j for j in range(8) if value >> j & 1) for value in range(256))


def _bits(mask: int) -> list[int]:
    """The positions of a bit set's ones, lowest first (byte by byte: a loop over the ones themselves
    costs a pass over the whole number per one)."""
    data = mask.to_bytes((mask.bit_length() + 7) // 8, "little")
    return [8 * i + j for i, byte in enumerate(data) if byte for j in _BYTE_BITS[byte]]


def fuse(graph: LoopGraph, target: Target) -> list[FusedGroup | ExternNode]:
    """The graph's nodes grouped into kernels (in an order that respects every dependency).

    Candidate pairs sharing data merge by the bytes they save, then each kernel joins the latest earlier
    one it legally fits (see the module docstring). Each fusion spends a unit of optimization fuel. What
    may fuse does not depend on the target today (a kernel is a loop nest on every target); `target` is
    where a target-specific limit would come from.
    """
    fusion = _Fusion(graph)
    fusion.by_score()
    fusion.first_fit()
    return fusion.schedule()


class _IndexProbe(DepsHandler):
    """Records loads and index expressions (what collapsing dims must keep affine)."""

    def index_expr(self, expr: sympy.Expr, dtype: Any) -> None:
        self.loads.append(("", expr))


def _collapse(group: FusedGroup) -> FusedGroup:
    """Merge adjacent dims every access walks contiguously (e.g. [N, C, 7] → [N * C * 7])."""
    shape = group.outer
    if len(shape) < 2:
        return group
    variables = [index_var("x", d) for d in range(len(shape))]
    exprs = []
    for m in group.members:
        probe = _IndexProbe()
        m.buffer.data.fn(probe, variables)
        exprs += [sympy.expand(e) for _, e in probe.loads]
        layout = m.buffer.layout
        exprs.append(linear_index(variables, layout.strides, layout.offset))

    def mergeable(prev: int, d: int) -> bool:
        for e in exprs:
            for v in (variables[prev], variables[d]):
                if any(f.has(v) for f in e.atoms(FloorDiv, ModularIndexing)):
                    return False
            outer, inner = sympy.diff(e, variables[prev]), sympy.diff(e, variables[d])
            # affine in both (coefficients free of loop variables; symbolic sizes allowed), and the outer
            # dim steps over the inner one exactly
            if (outer.free_symbols | inner.free_symbols) - size_symbols((outer, inner)) or \
                    sympy.expand(outer - inner * shape[d]) != 0:
                return False
        return True
    # size-1 dims always have index 0: leave them out, and merge the others where memory allows; the loops
    # follow the first member's stored layout (an NHWC output walks C innermost, contiguously)
    dims = _store_order(group, [d for d in range(len(shape)) if shape[d] != 1])
    runs: list[list[int]] = []
    for d in dims:
        if runs and mergeable(runs[-1][-1], d):
            runs[-1].append(d)
        else:
            runs.append([d])
    if len(runs) == len(shape) and dims == sorted(dims):
        return group
    new_shape = []
    for run in runs:
        size = 1
        for d in run:
            size *= shape[d]
        new_shape.append(size)
    # each original dim is indexed by the variable of the run it ends, or is 0 (see IndexMap)
    position = {run[-1]: k for k, run in enumerate(runs)}
    index_map = IndexMap(tuple(position.get(d) for d in range(len(shape))))
    log.debug("%s: dims %s collapse to %s", group.name, list(shape), new_shape)
    return dataclasses.replace(group, outer=tuple(new_shape), index_map=index_map)


def _store_order(group: FusedGroup, dims: list[int]) -> list[int]:
    """`dims` ordered by the first member's strides, largest first (stable: row-major stays as it is)."""
    strides = group.members[0].buffer.layout.strides
    if not all(isinstance(strides[d], int) for d in dims):
        return dims  # symbolic strides: the logical order
    return sorted(dims, key=lambda d: -strides[d])


def _finish(group: FusedGroup) -> FusedGroup:
    """A pure pointwise kernel iterates its last dim as the inner (vectorized) loop."""
    if group.inner is not None:
        return group
    group = _collapse(group)
    if not group.outer:
        return dataclasses.replace(group, inner=())
    return dataclasses.replace(group, outer=group.outer[:-1], inner=group.outer[-1:],
                               members=tuple(Member(m.buffer, Role.INNER) for m in group.members))


def is_pointwise(buf: Any) -> bool:
    return isinstance(buf, ComputedBuffer) and isinstance(buf.data, Pointwise)
