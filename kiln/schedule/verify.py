"""Verifiers of the schedule and the memory plan (run between passes with KILN_VERIFY=1)."""
from __future__ import annotations

from ..lower.ir import ComputedBuffer, ConcatBuffer, ExternNode, InputBuffer, LoopGraph
from .group import FusedGroup
from .locality import item_reads
from .memory import Plan, Segment


class ScheduleVerifyError(AssertionError):
    pass


def verify_schedule(loop: LoopGraph, schedule: list) -> None:
    """Every loop node is scheduled exactly once, each after the items producing what it reads."""
    def fail(msg: str) -> None:
        raise ScheduleVerifyError(f"schedule of {loop.name}: {msg}")

    available = {b.name for b in loop.inputs + loop.constants}
    seen: set[int] = set()
    for item in schedule:
        if isinstance(item, FusedGroup):
            nodes = [m.buffer for m in item.members]
            written = [m.buffer.name for m in item.members]
        elif isinstance(item, ExternNode):
            nodes, written = [item], [o.name for o in item.outputs]
        else:
            fail(f"item {item!r} is neither a kernel nor an extern")
        for node in nodes:
            if id(node) in seen:
                fail(f"{node.name} is scheduled twice")
            seen.add(id(node))
        for name in item_reads(item):
            for source in loop.sources(name):  # (a concatenation computed in place: each of its parts)
                if source not in available and source not in written:
                    fail(f"{getattr(item, 'name', item)} reads {name} before the item producing {source}")
        available.update(written)
    missing = [n.name for n in loop.nodes if id(n) not in seen]
    if missing:
        fail(f"nodes never scheduled: {', '.join(missing)}")


def verify_plan(loop: LoopGraph, plan: Plan) -> None:
    """Each buffer is allocated before its first step, used only while alive, freed at most once."""
    def fail(msg: str) -> None:
        raise ScheduleVerifyError(f"memory plan of {loop.name}: {msg}")

    alive = {b.name for b in loop.inputs + loop.constants}
    freed: set[str] = set()
    for step in plan.steps:
        for name, reuse in step.allocs:
            if reuse is not None and reuse not in freed and reuse not in step.inplace.values():
                fail(f"{name} reuses the memory of {reuse}, which is still alive")
            alive.add(name)
        node = step.node
        if isinstance(node, Segment):
            reads = [n for g in node.groups for n in item_reads(g)]
            local = {n for g in node.groups for n in g.local}
            writes = [m.buffer.name for g in node.groups for m in g.members]
        else:
            reads, local, writes = node.reads(), set(), [o.name for o in node.outputs]
        for name in dict.fromkeys(loop.storage_of(n) for n in reads):  # (a window: its storage's memory)
            if name in freed:
                fail(f"{name} is read after it was freed")
            if name not in alive and name not in local and name not in writes:
                fail(f"{name} is read but never allocated")
        for name in writes:
            if loop.storage_of(name) != name and loop.storage_of(name) not in alive:
                fail(f"{name} is stored into the memory of {loop.storage_of(name)}, which is not allocated")
        alive.update(writes)
        for name in step.frees:
            if name in freed:
                fail(f"{name} is freed twice")
            if name in plan.kept:
                fail(f"{name} is kept (an output) but freed")
            buf = loop.buffers.get(name)
            if isinstance(buf, InputBuffer) and (buf.position >= 0 or buf.constant is not None):
                fail(f"graph input or constant {name} is freed")
            if not isinstance(buf, (ComputedBuffer, ConcatBuffer, InputBuffer)):
                fail(f"frees {name}, which is no buffer")
            freed.add(name)
