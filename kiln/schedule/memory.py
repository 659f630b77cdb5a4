"""Memory planning: split the schedule into steps, free each buffer after its last use, reuse freed memory.

A step is a `Segment` (consecutive kernels, one C++ entry call) or an `ExternNode` (a torch call). The
buffers a segment writes are allocated just before it; a buffer is released after the step that reads it
last, unless it is an output (or the base of an output view, or the final value of a mutated input).
A buffer allocated later reuses released memory of the same dtype and storage size (never within one
segment: its pointers are `__restrict__`).
A buffer may also be written in place of one its kernel reads last (`_in_place`): then it is no pointer
parameter of its own, the kernel stores through the source's pointer. Each such write, over an
intermediate or into a mutated input, spends a unit of optimization fuel (`kiln bisect` can refuse it alone).
A window of a concatenation's memory (a part computed in place, or a concatenation of some of its parts,
kiln.lower.concat) is never allocated or freed itself: its storage buffer is allocated before the first
step touching it and lives until the last step touching any of its windows; kernels reach a window through
the storage's pointer (`Segment.aliases`).
"""
from __future__ import annotations

import dataclasses

import sympy

from .. import config
from ..lower.index import simplify_index
from ..graph.layout import is_non_overlapping_and_dense, numel
from ..graph.pipeline import FUEL
from ..lower.sizes import dense, hint, is_static
from ..graph import flatten
from ..lower.ir import (BufferRef, ComputedBuffer, ConcatBuffer, ExternNode, InputBuffer, LoopGraph,
                       OutputView, Pointwise)
from ..lower.target import Target
from .group import FusedGroup, Role
from .locality import local_buffers

log = config.channel("fusion")


@dataclasses.dataclass
class Segment:
    name: str
    groups: list[FusedGroup]
    writes: list[str]
    args: list[str] = dataclasses.field(default_factory=list)  # pointer parameters, in order
    aliases: dict[str, str] = dataclasses.field(default_factory=dict)  # in-place buffer -> pointer param

    def loads_through_index(self) -> bool:
        """A kernel of it loads through an index tensor: its entry returns a flag for an index outside its
        dim (kiln.lower.indirect), from which the wrapper raises eager's error."""
        return any(m.buffer.loads_through_index() for g in self.groups for m in g.members)


@dataclasses.dataclass
class Step:
    node: Segment | ExternNode
    allocs: list[tuple[str, str | None]]  # (buffer, buffer whose memory it reuses, or None)
    frees: list[str]
    inplace: dict[str, str] = dataclasses.field(default_factory=dict)  # buffer -> source it overwrites


@dataclasses.dataclass
class Plan:
    steps: list[Step]
    kept: set[str]  # buffers alive at the end (outputs, output view bases, mutation sources)

    def schedule(self) -> list[FusedGroup | ExternNode]:
        """The planned kernels (each with the buffers it keeps inside, `FusedGroup.local`) and externs."""
        return [item for s in self.steps for item in (s.node.groups if isinstance(s.node, Segment) else [s.node])]

    def allocations(self) -> int:
        return sum(1 for s in self.steps for _, reuse in s.allocs if reuse is None)

    def peak_bytes(self, graph: LoopGraph) -> int:
        """The most bytes of kiln-allocated buffers (intermediates, outputs, extern results) held at once."""
        return peak_bytes(graph, self.steps)


def peak_bytes(graph: LoopGraph, steps: list[Step]) -> int:
    """The peak of the bytes the steps hold: what `Plan.peak_bytes` reports.

    Memory is counted in blocks. A fresh allocation (before its segment) and each extern result (made by
    torch while the extern's arguments are alive) is a new block. A buffer carved from a freed one
    (`allocs` with a reuse) takes over its block: the freed buffer keeps the block until then, so its free
    releases nothing. A buffer written in place (`inplace`) shares its source's block, which the source's
    free (after the same step) leaves to it. A block is released when its last buffer is freed. Graph
    inputs and constants are not counted; the peak is taken after each step's allocations, before its frees.
    Symbolic sizes count at their hints.
    (The wrapper's cross-call recycling of fresh buffers is not modelled: this is the plan's memory.)
    """
    handed_on = {reuse for s in steps for name, reuse in s.allocs
                 if reuse is not None and name not in s.inplace}
    block: dict[str, int] = {}
    size: list[int] = []
    refs: list[int] = []
    live = peak = 0

    def fresh(name: str, nbytes: int) -> None:
        nonlocal live
        block[name] = len(size)
        size.append(nbytes)
        refs.append(1)
        live += nbytes

    for step in steps:
        for name, reuse in step.allocs:
            if reuse is None:
                fresh(name, hint(graph.buffers[name].nbytes()))
            elif reuse not in block:
                continue  # written into a graph input's memory (inputs are not counted)
            else:
                block[name] = block[reuse]
                if name in step.inplace:
                    refs[block[name]] += 1
        if isinstance(step.node, ExternNode):
            for out in step.node.outputs:
                fresh(out.name, hint(out.nbytes()))
        peak = max(peak, live)
        for name in step.frees:
            b = block.get(name)
            if b is None or name in handed_on:
                continue
            refs[b] -= 1
            if refs[b] == 0:
                live -= size[b]
    return peak


def _segment_reads(seg: Segment) -> list[str]:
    names: dict[str, None] = {}
    for group in seg.groups:
        for member in group.members:
            for name, _ in member.buffer.reads():
                names.setdefault(name, None)
    return list(names)


def _dense(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Each element at its own address, no gaps (a permutation of a contiguous layout), not empty."""
    if not is_static((shape, strides)):
        return dense(shape, strides)
    return numel(shape) > 0 and is_non_overlapping_and_dense(shape, strides)


def _in_place(graph: LoopGraph, seg: Segment, name: str, candidates: set[str]) -> str | None:
    """A buffer of `candidates` that `name` may overwrite in place, or None.

    `candidates` are dead after this segment, kiln-allocated intermediates (no input, output, view base,
    extern argument). Conservative: `name` is a pointwise member of a kernel whose members are all
    pointwise; it is the only reader of the source in the rest of the segment (its own kernel included),
    and every load of the source uses exactly the store index over the same layout and dtype.
    """
    buf = graph.buffers[name]
    at = next(k for k, g in enumerate(seg.groups) if name in g.buffer_names())
    group = seg.groups[at]
    member = next(m for m in group.members if m.buffer.name == name)
    if name in group.local or not all(isinstance(m.buffer.data, Pointwise) for m in group.members):
        return None
    if member.role not in (Role.INNER, Role.OUTER) or group.has_role(Role.SCAN):
        return None
    loads = group.member_loads(member)
    store = simplify_index(sympy.expand(group.store_index(member)), group.var_ranges())
    for source in dict.fromkeys(n for n, _ in loads):
        if source not in candidates or source in group.buffer_names():
            continue
        src = graph.buffers[source]
        if src.dtype != buf.dtype or src.layout != buf.layout or not _dense(src.layout.shape,
                                                                           src.layout.strides):
            continue
        if any(n == source and sympy.expand(e - store) != 0 for n, e in loads):
            continue
        others = [m for m in group.members if m is not member] + \
            [m for g in seg.groups[at + 1:] for m in g.members]
        if any(n == source for m in others for n, _ in m.buffer.reads()):
            continue
        return source
    return None


def _mutation_targets(graph: LoopGraph, kept: set[str]) -> dict[str, str]:
    """Buffer holding a mutated input's final value -> that input's buffer, for inputs nothing else keeps
    (not an output, not the base of an output view) whose new value is a kernel's own buffer, written back
    into this one input only."""
    by_position = {b.position: b.name for b in graph.inputs if isinstance(b, InputBuffer) and b.position >= 0}
    values = [getattr(v, "name", None) for _, v in graph.mutations]
    out: dict[str, str] = {}
    for position, value in graph.mutations:
        name, source = getattr(value, "name", None), by_position.get(position)
        if not isinstance(value, BufferRef) or source is None or source in kept or values.count(name) != 1 \
                or not isinstance(graph.buffers.get(name), ComputedBuffer) or graph.storage_of(name) != name:
            continue
        out[name] = source
    return out


def _extern_into_input(graph: LoopGraph, node: ExternNode, i: int, nodes: list, kept: set[str],
                       last_use: dict[str, int]) -> str | None:
    """The graph input a fallback with an in-place reference (`ExternNode.inplace_target`) may run in place
    of, or None. Its one result must be the new value of that input alone (written back into it, kept by
    nothing else), its first argument that input's whole buffer in the result's layout, read by no other
    argument, no other extern, and nothing after this step: then the new value is made in the input's
    memory (a static KV cache's index_copy_ writes one position, not a copy of the whole cache twice)."""
    storage = graph.storage_of
    if node.inplace_target is None or node.multi_output or len(node.outputs) != 1 or not node.args:
        return None
    out = node.outputs[0]
    positions = [p for p, value in graph.mutations if isinstance(value, BufferRef) and value.name == out.name]
    outputs = {v.name for v in flatten(graph.output) if isinstance(v, (BufferRef, OutputView))}
    if len(positions) != 1 or out.name in outputs:
        return None
    by_position = {b.position: b.name for b in graph.inputs if isinstance(b, InputBuffer) and b.position >= 0}
    target = by_position.get(positions[0])
    first = node.args[0]
    if target is None or target in kept or not (isinstance(first, BufferRef) and first.name == target) or \
            [storage(n) for n in node.reads()].count(target) != 1 or last_use.get(target, -1) > i:
        return None
    mine, theirs = out.layout, graph.buffers[target].layout
    if (mine.shape, mine.strides, mine.offset) != (theirs.shape, theirs.strides, theirs.offset):
        return None
    if any(other is not node and isinstance(other, ExternNode) and
           target in {storage(n) for n in other.reads()} for other in nodes):
        return None
    return target


def plan(graph: LoopGraph, schedule: list[FusedGroup | ExternNode], target: Target, in_place: bool = True,
         simulate: bool = False) -> Plan:
    """Steps with allocations and frees for the scheduled kernels of `graph`.

    `in_place`: a pointwise kernel may write over the buffer it reads last (each such write spends a unit of
    optimization fuel, except in a `simulate`d plan, which only measures an order's peak for `order`).
    Which buffers never leave their kernel is `locality.local_buffers`'s decision for `target`.
    """
    nodes: list[Segment | ExternNode] = []
    for item in schedule:
        if isinstance(item, ExternNode):
            nodes.append(item)
            continue
        if not nodes or not isinstance(nodes[-1], Segment):
            nodes.append(Segment(f"segment{sum(isinstance(n, Segment) for n in nodes)}", [], []))
        nodes[-1].groups.append(item)
        nodes[-1].writes.extend(m.buffer.name for m in item.members)

    kept = graph.kept_buffers()
    storage = graph.storage_of
    kept |= {storage(name) for name in kept}

    reads: list[list[str]] = []  # per step, the buffers whose memory it reads (a window: its storage's)
    for node in nodes:
        if isinstance(node, Segment):
            r = _segment_reads(node)
            node.args = list(dict.fromkeys(r + node.writes))
        else:
            r = node.reads()
        reads.append(list(dict.fromkeys(storage(name) for name in r)))
    local_all = local_buffers(schedule, kept, target)
    # each step that touches a concatenation's memory (a window written or read): the storage is alive there
    touches: list[set[str]] = []
    for i, node in enumerate(nodes):
        names = node.args if isinstance(node, Segment) else node.reads()
        touches.append({storage(n) for n in names if storage(n) != n or isinstance(graph.buffers.get(n),
                                                                                   ConcatBuffer)})
        if isinstance(node, Segment):
            # (a kernel with its locals is a new group: the schedule's groups are never changed)
            node.groups = [group.with_locals({m.buffer.name: local_all[m.buffer.name] for m in group.members
                                              if m.buffer.name in local_all}) for group in node.groups]
            node.writes = [n for n in node.writes if n not in local_all]
            node.args = [n for n in node.args if n not in local_all]
            node.aliases.update({n: storage(n) for n in node.args if storage(n) != n})
            node.args = list(dict.fromkeys(storage(n) for n in node.args))
    last_use: dict[str, int] = {}
    for i, r in enumerate(reads):
        for name in list(r) + sorted(touches[i]):
            last_use[name] = i

    extern_inputs = {storage(name) for node in nodes
                     if isinstance(node, ExternNode) and node.kind == "fallback" for name in node.reads()}
    extern_reads = {storage(name) for node in nodes if isinstance(node, ExternNode) for name in node.reads()}
    kernel_written = {name for node in nodes if isinstance(node, Segment) for name in node.writes}
    into_input = _mutation_targets(graph, kept)
    free_pool: dict[tuple, list[str]] = {}
    steps: list[Step] = []
    allocated: set[str] = set()  # concatenation memory allocated so far
    for i, node in enumerate(nodes):
        allocs: list[tuple[str, str | None]] = []
        inplace: dict[str, str] = {}
        for name in sorted(touches[i] - allocated):  # before the first step storing into (or reading) it
            allocated.add(name)
            pool = free_pool.get((graph.buffers[name].dtype, graph.buffers[name].layout.storage_size()))
            allocs.append((name, pool.pop() if pool else None))
        if isinstance(node, Segment):
            dead = {n for n in reads[i] if last_use.get(n) == i and n in kernel_written and n not in kept
                    and n not in local_all and n not in extern_reads and n in graph.buffers
                    and isinstance(graph.buffers[n], ComputedBuffer) and graph.buffers[n].data is not None}
            for name in node.writes:
                buf = graph.buffers[name]
                if storage(name) != name:
                    continue  # a window of a concatenation's memory, allocated above
                source = None
                if in_place:  # over an intermediate it reads last at the same index
                    source = _in_place(graph, node, name, dead - set(inplace.values()))
                target = into_input.get(name)
                if in_place and source is None and target is not None and last_use.get(target, -1) <= i \
                        and target not in extern_reads and target not in inplace.values():
                    # the final value of a mutated input, computed where the input is last read at the
                    # same index: written into the input's own memory (no write-back copy)
                    source = _in_place(graph, node, name, {target})
                if source is not None and not simulate and \
                        not FUEL.take("plan", f"write {name} in place of {source}"):
                    source = None  # (refused: a buffer of its own, as with in_place off)
                if source is not None:
                    inplace[name] = source
                    node.aliases[name] = node.aliases.get(source, source)
                    allocs.append((name, source))
                    log.debug("%s is written in place of %s", name, source)
                    continue
                key = (buf.dtype, buf.layout.storage_size())
                pool = free_pool.get(key)
                reuse = pool.pop() if pool else None
                allocs.append((name, reuse))
                if reuse is not None:
                    log.debug("%s reuses the memory of %s", name, reuse)
        elif in_place and node.kind == "fallback":
            source = _extern_into_input(graph, node, i, nodes, kept, last_use)
            decision = f"{node.outputs[0].name}: {node.target_name} in place of {source}"
            if source is not None and (simulate or FUEL.take("plan", decision)):
                inplace[node.outputs[0].name] = source
                log.debug("%s runs %s in place of %s", node.outputs[0].name, node.target_name, source)
        frees = []
        written = node.writes if isinstance(node, Segment) else [o.name for o in node.outputs]
        candidates = set(reads[i]) | touches[i] | {w for w in written if storage(w) == w}
        for name in sorted(candidates):
            buf = graph.buffers[name]
            if name in kept or name in local_all or isinstance(buf, InputBuffer) and buf.position >= 0 or \
                    isinstance(buf, InputBuffer) and buf.constant is not None:
                continue
            if last_use.get(name, -1) <= i:
                frees.append(name)
                # a fallback's result may alias its inputs (a view op run by torch): never reuse them
                if isinstance(buf, (ComputedBuffer, ConcatBuffer)) and \
                        hint(buf.layout.storage_size()) > 0 and \
                        name not in extern_inputs and name not in inplace.values():
                    free_pool.setdefault((buf.dtype, buf.layout.storage_size()), []).append(name)
        if inplace and isinstance(node, Segment):
            node.args = [n for n in node.args if n not in node.aliases]
        steps.append(Step(node, allocs, frees, inplace))
    return Plan(steps, kept)
