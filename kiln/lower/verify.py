"""The loop IR's verifier (run between passes with KILN_VERIFY=1): names, definitions before use, shapes."""
from __future__ import annotations

from ..graph import flatten
from .ir import (BufferRef, ComputedBuffer, ConcatBuffer, ExternNode, LoopGraph, OutputView, Pointwise,
                 Reduction, Scan, ViewRef)


class LoopVerifyError(AssertionError):
    pass


def verify_loop(loop: LoopGraph) -> None:
    """Raise LoopVerifyError naming the node when the loop graph is malformed."""
    def fail(where: str, msg: str) -> None:
        raise LoopVerifyError(f"loop graph {loop.name}: {where}: {msg}")

    defined = {b.name for b in loop.inputs + loop.constants}

    def written(name: str) -> bool:  # (a concatenation computed in place: once all its parts are)
        buf = loop.buffers.get(name)
        if isinstance(buf, ConcatBuffer):
            return all(p in defined for p in buf.parts)
        return name in defined

    for b in loop.inputs + loop.constants:
        if loop.buffers.get(b.name) is not b:
            fail(b.name, "an input or constant missing from the buffer table")
    for node in loop.nodes:
        if isinstance(node, ExternNode):
            for name in node.reads():
                if not written(name):
                    fail(node.name, f"reads {name} before it is written")
            for out in node.outputs:
                if out.name in defined:
                    fail(node.name, f"writes {out.name} a second time")
                if loop.buffers.get(out.name) is not out:
                    fail(node.name, f"output {out.name} missing from the buffer table")
                defined.add(out.name)
            continue
        if not isinstance(node, ComputedBuffer) or node.data is None:
            fail(getattr(node, "name", repr(node)), "neither an extern nor a computed buffer")
        for name, _ in node.reads():
            if not written(name):
                fail(node.name, f"reads {name} before it is written")
        data = node.data
        expect = data.ranges + data.reduction_ranges if isinstance(data, Reduction) else data.ranges
        space = data.ranges if isinstance(data, (Pointwise, Scan, Reduction)) else ()
        if tuple(space) != tuple(node.shape):
            fail(node.name, f"iterates {list(expect)} but has shape {list(node.shape)}")
        if node.name in defined:
            fail(node.name, "written a second time")
        if loop.buffers.get(node.name) is not node:
            fail(node.name, "missing from the buffer table")
        if node.storage is not None and not isinstance(loop.buffers.get(node.storage), ConcatBuffer):
            fail(node.name, f"stores into the memory of {node.storage}, which is no concatenation")
        defined.add(node.name)
    refs = flatten((loop.output, [m[1] for m in loop.mutations]))
    for ref in refs:
        if isinstance(ref, (BufferRef, OutputView, ViewRef)) and not written(ref.name):
            fail("output", f"returns {ref.name}, which nothing defines")
    for position, _ in loop.mutations:
        if not 0 <= position < len(loop.inputs):
            fail("mutations", f"input position {position} out of range")
