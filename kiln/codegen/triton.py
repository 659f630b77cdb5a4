"""Triton code generation: the fused groups of one segment → one Python module of `@triton.jit` kernels.

The Triton backend shares every stage above this one with the C++ backend: the same loop IR, the same
fusion (so the same kernels), the same memory plan. Only the emitter and the Target differ. A kernel is
a 2-D program over tiles of [XBLOCK, RBLOCK] elements: x runs over the group's outer ranges (flattened),
r over its inner ranges (flattened).

- A pure pointwise kernel tiles both axes: its grid is (r tiles, x tiles), one tile per program, masks for
  the tails. Transposed accesses stay coalesced along whichever axis is contiguous in memory.
- Any other kernel (reductions, epilogues, scans) gives each program XBLOCK rows and walks r in blocks of
  RBLOCK. Members run in phases: consecutive inner and reduction members share one loop over r; a member
  that reads a reduction of the open loop starts a new loop after it; an outer member (one value per row)
  runs between loops. When RBLOCK covers the whole row each loop runs once: a persistent reduction.
  A reduction keeps a tile of partial results (fp32 for half types) combined in the tile's order at the
  loop's end; argmax/argmin carry (value, index) pairs; scans carry the running total between blocks.
- A value computed in the kernel is read from registers when it is still live (a reduction's or an outer
  member's result, an inner member of the same loop); an inner member of an earlier loop is read back from
  memory after a barrier (`tl.debug_barrier()`: the threads of the program wrote it).
- bfloat16 and float16 are loaded into float32 and rounded back after every op or only where stored or
  converted (config bfloat16_rounding, float16_rounding), as the C++ backend computes them; bool is
  Triton's int1.

Static sizes are literals in the source; indices are int32 unless a buffer or the
iteration space needs int64. Transcendentals call libdevice on a GPU; under Triton's interpreter
(`TRITON_INTERPRET=1`, CPU tensors) `kiln.runtime.triton` supplies the same functions computed by torch.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import sympy
import torch

from ..lower.index import index_bounds, index_code, simplify_index
from ..lower.ir import Buffer, Reduction, Scan
from ..lower.ops import SCALAR_OP_TABLE, Handler, Result, keeps_register, rounded_once
from ..lower.target import LIBRARY_PRIMS, Target
from ..schedule.group import FusedGroup, Member, Role
from .triton_ops import (CODE_FOR_OP, EXACT, HALF_TYPES, ROUND, TL_TYPES, TType, literal,  # noqa: F401
                         reg_type, round_half)

# The Triton target: kernels compute these dtypes (halves in float32); matmul, convolution and attention
# call torch (cuBLAS, cuDNN, flash attention); every kernel runs on the whole device (no thread policy:
# the parallel threshold and inner split are off); a reduction's or epilogue's per-row value may stay in
# a register, a pointwise row buffer is computed again where a later loop reads it (no scratch rows);
# 16-byte vectors per thread.
TRITON_TARGET = Target(
    "triton",
    compute_dtypes=frozenset({torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int64,
                              torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool}),
    extern_prims=LIBRARY_PRIMS, parallel_threshold=0, min_parallel_outer=0,
    local_kinds=frozenset({"scalar", "recompute"}), vector_bytes=16)

# Triton's pointer type names (kernel signatures for compiling without a device)
SIGNATURE_TYPES = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32",
                   torch.float64: "*fp64", torch.int64: "*i64", torch.int32: "*i32", torch.int16: "*i16",
                   torch.int8: "*i8", torch.uint8: "*u8", torch.bool: "*i1"}
INT32_LIMIT = 2 ** 31 - 1
MAX_GRID_Y = 65535  # CUDA's limit on the second grid axis


def index_text(expr: Any) -> str:
    """Triton text of an integer index expression (non-negative operands: `//` and `%` are exact)."""
    return index_code(expr, "//", "triton codegen")


class TValue:
    __slots__ = ("name", "dtype")

    def __init__(self, name: str, dtype: torch.dtype):
        self.name = name
        self.dtype = dtype

    def __str__(self) -> str:
        return self.name


def convert(text: str, source: torch.dtype, dtype: torch.dtype) -> str:
    """Triton text of a value of `source` converted to `dtype`'s register (halves: rounded to the type)."""
    if source == dtype:
        return text
    if dtype == torch.bool:
        return f"({text} != 0)"
    if dtype in HALF_TYPES:
        return f"{ROUND[dtype]}({text}.to(tl.float32))"
    if source in HALF_TYPES and dtype == torch.float32:
        return text
    return f"{text}.to({TL_TYPES[dtype]})"


@dataclasses.dataclass
class Phase:
    kind: str  # "loop" (inner and reduction members over r), "outer" (one value per row), "scan"
    members: list[Member]
    barrier: bool = False  # reads a row buffer an earlier phase of the kernel wrote


class TritonHandler(Handler):
    """Emits one Triton statement per scalar op into `lines`, returning typed temporaries."""

    def __init__(self, kernel: "KernelWriter", shape: str, mask: str, indent: str):
        self.kernel = kernel
        self.shape = shape  # the tile the current code computes: "[XBLOCK, RBLOCK]" or "[XBLOCK, 1]"
        self.mask = mask  # the lanes that hold elements of the iteration space
        self.conditions: list[str] = []  # enclosing `masked` conditions: their loads must not run outside
        self.indent = indent
        self.lines: list[str] = []

    def tmp(self, text: str, dtype: torch.dtype) -> TValue:
        name = self.kernel.new_name()
        self.lines.append(f"{self.indent}{name} = {text}")
        return TValue(name, dtype)

    def load(self, name: str, index: sympy.Expr) -> TValue:
        dtype = self.kernel.buffers[name].dtype
        live = self.kernel.live.get(name)
        if live is not None:  # fusion checked the read is exactly the element written
            return TValue(live, dtype)
        if self.kernel.local.get(name) == "recompute":
            return self.kernel.recompute(name, self)
        if name in self.kernel.local:
            raise NotImplementedError(f"triton codegen: kernel-local {name} read outside its registers")
        index = simplify_index(sympy.expand(index), self.kernel.ranges)
        mask = " & ".join([self.mask] + self.conditions)
        pointer = f"tl.broadcast_to({self.kernel.pointer(name)} + {index_text(index)}, {self.shape})"
        value = f"tl.load({pointer}, {mask}, other=0)"
        if dtype in HALF_TYPES:
            value += ".to(tl.float32)"
        return self.tmp(value, dtype)

    def indirect(self, value: Any, size: Any, wrap: bool = False) -> Any:
        # (TRITON_TARGET.indirect_indexing is off: lookups through an index stay torch calls there)
        raise NotImplementedError("triton codegen: a load through an index read from a tensor")

    def constant(self, value: Any, dtype: torch.dtype) -> TValue:
        return self.tmp(f"tl.full([1, 1], {literal(value, dtype)}, {reg_type(dtype)})", dtype)

    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> TValue:
        expr = simplify_index(sympy.expand(expr), self.kernel.ranges)
        if expr.is_Integer:  # (a bare number is not a tensor broadcast_to takes: a one-element arange's 0)
            text = f"tl.full([1, 1], {int(expr)}, {TL_TYPES[self.kernel.index_dtype]})"
        else:
            text = f"tl.broadcast_to({index_text(expr)}, [1, 1])" if not expr.free_symbols else index_text(expr)
        return self.tmp(convert(f"({text})", self.kernel.index_dtype, dtype), dtype)

    def to_dtype(self, x: TValue, dtype: torch.dtype) -> TValue:
        if x.dtype == dtype:
            return x
        if keeps_register(x.dtype, dtype, self.kernel.round_once):
            return TValue(x.name, dtype)
        if x.dtype in self.kernel.round_once:
            x = self.tmp(round_half(x.name, x.dtype), x.dtype)
        if x.dtype == torch.bool:
            return self.tmp(convert(f"{x}.to(tl.int8)", torch.int8, dtype), dtype)
        return self.tmp(convert(str(x), x.dtype, dtype), dtype)

    def masked(self, cond: TValue, body: Any, other: Any, dtype: torch.dtype) -> TValue:
        self.conditions.append(str(cond))
        value = body()
        self.conditions.pop()
        fallback = other()
        return self.tmp(f"tl.where({cond}, {value}, {fallback})", dtype)

    def op(self, name: str, *args: Any) -> TValue:
        """A scalar op, spelled by `kiln.codegen.triton_ops.CODE_FOR_OP` (see there for what is done here)."""
        spec = SCALAR_OP_TABLE.get(name)
        dtype = args[1].dtype if name == "where" else args[0].dtype
        t = TType(dtype, self.kernel.libdevice)
        text = None
        if spec is not None and (t.is_float or not spec.float_only):
            text = CODE_FOR_OP[name](t, *args)
        if text is None:
            raise NotImplementedError(f"triton codegen: {name} on {dtype}")
        if isinstance(text, TValue):  # the identity on this dtype (abs of a bool)
            return text
        if spec.result is Result.BOOL:
            return self.tmp(text, torch.bool)
        if name in EXACT or dtype in self.kernel.round_once:
            return self.tmp(text, dtype)
        return self.tmp(round_half(text, dtype), dtype)


# ---- reductions ---------------------------------------------------------------------------------------

def acc_dtype(rtype: str, dtype: torch.dtype) -> torch.dtype:
    """What a reduction accumulates in: halves in float32 (as eager), bool max/min/any/all in int8."""
    if dtype in HALF_TYPES:
        return torch.float32
    if dtype == torch.bool or rtype in ("any", "all"):
        return torch.int8
    return dtype


def identity(rtype: str, dtype: torch.dtype) -> str:
    if rtype in ("sum", "any"):
        return literal(0, dtype)
    if rtype in ("prod", "all"):
        return literal(1, dtype)
    if dtype.is_floating_point:
        return 'float("-inf")' if rtype in ("max", "argmax") else 'float("inf")'
    info = torch.iinfo(dtype)
    return str(info.min if rtype in ("max", "argmax") else info.max)


_COMBINE = {"sum": "kiln_add", "prod": "kiln_mul", "any": "kiln_imax", "all": "kiln_imin"}


def combine_fn(rtype: str, dtype: torch.dtype) -> str:
    if rtype in _COMBINE:
        return _COMBINE[rtype]
    if rtype in ("max", "min"):
        return ("kiln_maximum" if rtype == "max" else "kiln_minimum") if dtype.is_floating_point else \
            ("kiln_imax" if rtype == "max" else "kiln_imin")
    return "kiln_argmax" if rtype == "argmax" else "kiln_argmin"


# ---- kernels -----------------------------------------------------------------------------------------

@dataclasses.dataclass
class KernelSource:
    name: str
    source: str
    pointwise: bool  # tiles x and r (grid of both); else rows of x per program, a loop over r
    xnumel: int
    rnumel: int
    params: list[str]  # pointer parameters (segment argument names), in order
    signature: dict[str, str]  # pointer parameter -> Triton pointer type


class KernelWriter:
    """Writes the Triton source of one fused group."""

    def __init__(self, group: FusedGroup, buffers: dict[str, Buffer], pointers: dict[str, str],
                 libdevice: str = "libdevice"):
        self.group = group
        self.buffers = buffers
        self.pointers = pointers
        self.libdevice = libdevice
        self.local = dict(group.local)
        self.ranges = group.var_ranges()
        self.live: dict[str, str] = {}  # buffer -> the temporary holding its current element
        self.lines: list[str] = []
        self.count = 0
        self.used: dict[str, None] = {}  # pointer parameters the kernel touches
        self.xnumel = math.prod(group.outer)
        self.rnumel = math.prod(group.inner or ())
        sizes = [self.xnumel * max(self.rnumel, 1)] + [
            buffers[m.buffer.name].layout.storage_size() for m in group.members] + [
            buffers[n].layout.storage_size() for m in group.members for n, _ in m.buffer.reads()
            if n in buffers]
        self.index_dtype = torch.int64 if max(sizes) > INT32_LIMIT // 2 else torch.int32
        # the half types rounded where stored or converted to a dtype other than float32, not after every
        # op (as the C++ kernels)
        self.round_once = rounded_once()

    def new_name(self) -> str:
        self.count += 1
        return f"t{self.count}"

    def pointer(self, name: str) -> str:
        param = self.pointers[name]
        self.used.setdefault(param, None)
        return param

    def emit(self, line: str, depth: int) -> None:
        self.lines.append("    " * depth + line)

    def _unravel(self, flat: str, variables: list, sizes: tuple, depth: int) -> None:
        rest = flat
        for d in reversed(range(len(sizes))):
            if d == 0:
                self.emit(f"{variables[d].name} = {rest}", depth)
            else:
                self.emit(f"{variables[d].name} = {rest} % {sizes[d]}", depth)
                rest = f"({rest} // {sizes[d]})"

    def _arange(self, axis: int, block: str, pid: str) -> str:
        offset = f"tl.program_id({pid})"
        if self.index_dtype == torch.int64:
            offset += ".to(tl.int64)"
        expand = "[:, None]" if axis == 0 else "[None, :]"
        return f"{offset} * {block} + tl.arange(0, {block}){expand}"

    def _body(self, member: Member, handler: TritonHandler) -> TValue:
        index, rindex = self.group.member_index(member)
        if member.role is Role.REDUCTION:
            return member.buffer.data.fn(handler, index, rindex)
        return member.buffer.data.fn(handler, index)

    def _store(self, member: Member, value: TValue, shape: str, mask: str, depth: int) -> None:
        buf = member.buffer
        if buf.name in self.local:
            return
        index = simplify_index(sympy.expand(self.group.store_index(member)), self.ranges)
        bounds = index_bounds(index, self.ranges)
        size = buf.layout.storage_size()
        if bounds is None or (size > 0 and (bounds[0] < 0 or bounds[1] >= size)):
            raise RuntimeError(f"kiln triton codegen: store to {buf.name} at {index} may leave its {size} "
                               f"elements (bounds {bounds}) in {self.group.describe()}")
        text = convert(str(value), value.dtype, buf.dtype)
        if buf.dtype in HALF_TYPES:
            if value.dtype == buf.dtype and buf.dtype in self.round_once:
                text = round_half(text, buf.dtype)
            text = f"{text}.to({TL_TYPES[buf.dtype]})"  # exact: the register holds a value of the type
        pointer = f"tl.broadcast_to({self.pointer(buf.name)} + {index_text(index)}, {shape})"
        self.emit(f"tl.store({pointer}, tl.broadcast_to({text}, {shape}), {mask})", depth)

    def _value(self, member: Member, handler: TritonHandler, depth: int) -> TValue:
        value = self._body(member, handler)
        self.lines.extend(handler.lines)
        handler.lines = []
        return value

    def write(self, name: str) -> KernelSource:
        group = self.group
        pointwise = all(m.role is Role.INNER for m in group.members) and bool(group.inner)
        header_at = len(self.lines)
        xvars, rvars = group.outer_vars(), group.inner_vars()
        if pointwise:
            self.emit(f"rindex = {self._arange(1, 'RBLOCK', '0')}", 1)
            self.emit(f"xindex = {self._arange(0, 'XBLOCK', '1')}", 1)
            self.emit(f"xmask = xindex < {self.xnumel}", 1)
            self.emit(f"rmask = rindex < {self.rnumel}", 1)
            self._unravel("xindex", xvars, group.outer, 1)
            self._unravel("rindex", rvars, group.inner, 1)
            handler = TritonHandler(self, "[XBLOCK, RBLOCK]", "xmask & rmask", "    ")
            for member in group.members:
                value = self._value(member, handler, 1)
                self.live[member.buffer.name] = value.name
                self._store(member, value, "[XBLOCK, RBLOCK]", "xmask & rmask", 1)
        else:
            self.emit(f"xindex = {self._arange(0, 'XBLOCK', '0')}", 1)
            self.emit(f"xmask = xindex < {self.xnumel}", 1)
            self._unravel("xindex", xvars, group.outer, 1)
            for phase in self.phases():
                if phase.barrier:
                    self.emit("tl.debug_barrier()", 1)
                if phase.kind == "outer":
                    member = phase.members[0]
                    handler = TritonHandler(self, "[XBLOCK, 1]", "xmask", "    ")
                    value = self._value(member, handler, 1)
                    value = self._hold(value, "[XBLOCK, 1]", 1)
                    self.live[member.buffer.name] = value.name
                    self._store(member, value, "[XBLOCK, 1]", "xmask", 1)
                elif phase.kind == "scan":
                    self.scan(phase.members[0], rvars)
                else:
                    self.loop(phase.members, rvars)
        params = list(self.used)
        signature = {}
        for buf_name, param in self.pointers.items():
            if param in self.used:
                signature[param] = SIGNATURE_TYPES[self.buffers[buf_name].dtype]
        head = ["@triton.jit", f"def {name}({', '.join(params + ['XBLOCK: tl.constexpr', 'RBLOCK: tl.constexpr'])}):",
                f"    # {group.describe()}"]
        self.lines[header_at:header_at] = head
        if len(self.lines) == len(head):
            self.lines.append("    pass")
        return KernelSource(name, "\n".join(self.lines), pointwise, self.xnumel, self.rnumel, params, signature)

    def recompute(self, name: str, handler: TritonHandler) -> TValue:
        """The current element of a "recompute" row buffer, computed again from its body (fusion checked
        that the read is exactly the element written; its own reads are live or in memory)."""
        member = next(m for m in self.group.members if m.buffer.name == name)
        return self._body(member, handler)

    def _hold(self, value: TValue, shape: str, depth: int) -> TValue:
        """A per-row value broadcast to its tile (a constant is [1, 1]; later phases index it by row)."""
        name = self.new_name()
        self.emit(f"{name} = tl.broadcast_to({value}, {shape})", depth)
        return TValue(name, value.dtype)

    def phases(self) -> list[Phase]:
        """The group's members in order, as loops, outer steps and scans (see the module docstring)."""
        phases: list[Phase] = []
        row_written: set[str] = set()  # inner/scan buffers of closed phases (read back from memory)
        open_loop: Phase | None = None
        for member in self.group.members:
            reads = self._reads(member)
            if member.role in (Role.OUTER, Role.SCAN):
                if open_loop is not None:
                    row_written |= {m.buffer.name for m in open_loop.members if m.role is Role.INNER}
                    open_loop = None
                phase = Phase(member.role.value, [member], barrier=bool(reads & row_written))
                phases.append(phase)
                if member.role is Role.SCAN:
                    row_written.add(member.buffer.name)
                continue
            if open_loop is not None:
                pending = {m.buffer.name for m in open_loop.members if m.role is Role.REDUCTION}
                if reads & pending:
                    row_written |= {m.buffer.name for m in open_loop.members if m.role is Role.INNER}
                    open_loop = None
            if open_loop is None:
                open_loop = Phase("loop", [])
                phases.append(open_loop)
            open_loop.members.append(member)
            if reads & row_written:
                open_loop.barrier = True
        return phases

    def _reads(self, member: Member) -> set[str]:
        """Buffers the member's code reads: its loads, and those of the recomputed buffers it reads."""
        reads: set[str] = set()
        todo = [member.buffer]
        while todo:
            for name, _ in todo.pop().reads():
                if name not in reads:
                    reads.add(name)
                    if self.local.get(name) == "recompute":
                        todo.append(self.buffers[name])
        return reads

    def _open_r_loop(self, rvars: list) -> TritonHandler:
        """`for roffset in range(0, rnumel, RBLOCK):` with the block's r indices and mask; the handler that
        writes the loop body."""
        self.emit(f"for roffset in range(0, {self.rnumel}, RBLOCK):", 1)
        self.emit("rindex = roffset + tl.arange(0, RBLOCK)[None, :]", 2)
        self.emit(f"rmask = rindex < {self.rnumel}", 2)
        self._unravel("rindex", rvars, self.group.inner or (), 2)
        return TritonHandler(self, "[XBLOCK, RBLOCK]", "xmask & rmask", "        ")

    def loop(self, members: list[Member], rvars: list) -> None:
        accs = {}
        for member in members:
            if member.role is not Role.REDUCTION:
                continue
            data: Reduction = member.buffer.data
            dtype = self._reduced_dtype(member)
            acc = acc_dtype(data.reduction_type, dtype)
            name = self.new_name()
            accs[member.buffer.name] = (name, acc, dtype)
            self.emit(f"{name} = tl.full([XBLOCK, RBLOCK], {identity(data.reduction_type, acc)}, "
                      f"{reg_type(acc)})", 1)
            if data.reduction_type in ("argmax", "argmin"):
                self.emit(f"{name}_i = tl.full([XBLOCK, RBLOCK], {2 ** 62}, tl.int64)", 1)
        handler = self._open_r_loop(rvars)
        in_loop = []
        for member in members:
            value = self._value(member, handler, 2)
            name = member.buffer.name
            if member.role is Role.INNER:
                self.live[name] = value.name
                in_loop.append(name)
                self._store(member, value, "[XBLOCK, RBLOCK]", "xmask & rmask", 2)
                continue
            acc, adtype, _ = accs[name]
            rtype = member.buffer.data.reduction_type
            v = convert(str(value), value.dtype, adtype) if value.dtype != torch.bool or adtype != torch.int8 \
                else f"{value}.to(tl.int8)"
            if rtype in ("any", "all"):
                v = f"({value} != 0).to(tl.int8)"
            fn = combine_fn(rtype, adtype)
            if rtype in ("argmax", "argmin"):
                self.emit(f"{acc}_n, {acc}_ni = {fn}({acc}, {acc}_i, tl.broadcast_to({v}, [XBLOCK, RBLOCK]), "
                          f"tl.broadcast_to(rindex.to(tl.int64), [XBLOCK, RBLOCK]))", 2)
                self.emit(f"{acc} = tl.where(xmask & rmask, {acc}_n, {acc})", 2)
                self.emit(f"{acc}_i = tl.where(xmask & rmask, {acc}_ni, {acc}_i)", 2)
            else:
                self.emit(f"{acc} = tl.where(xmask & rmask, {fn}({acc}, {v}), {acc})", 2)
        for name in in_loop:
            del self.live[name]
        for member in members:
            if member.role is not Role.REDUCTION:
                continue
            name = member.buffer.name
            acc, adtype, _ = accs[name]
            rtype = member.buffer.data.reduction_type
            fn = combine_fn(rtype, adtype)
            out = self.new_name()
            if rtype in ("argmax", "argmin"):
                self.emit(f"{out}_v, {out} = tl.reduce(({acc}, {acc}_i), 1, {fn})", 1)
                self.emit(f"{out} = {out}[:, None]", 1)
                value = TValue(out, torch.int64)
            elif rtype == "sum":
                self.emit(f"{out} = tl.sum({acc}, 1)[:, None]", 1)
                value = TValue(out, adtype)
            else:
                self.emit(f"{out} = tl.reduce({acc}, 1, {fn})[:, None]", 1)
                value = TValue(out, adtype)
            buf_dtype = member.buffer.dtype
            if value.dtype != buf_dtype:
                converted = self.new_name()
                self.emit(f"{converted} = {convert(out, value.dtype, buf_dtype)}", 1)
                value = TValue(converted, buf_dtype)
            self.live[name] = value.name
            self._store(member, value, "[XBLOCK, 1]", "xmask", 1)

    def _reduced_dtype(self, member: Member) -> torch.dtype:
        """The dtype of the values a reduction folds (an arg reduction's differs from its output's)."""
        data: Reduction = member.buffer.data
        if data.reduction_type not in ("argmax", "argmin"):
            return member.buffer.dtype
        probe = TritonHandler(self, "[XBLOCK, RBLOCK]", "xmask", "")
        saved = self.count, dict(self.used)
        index, rindex = self.group.member_index(member)
        dtype = data.fn(probe, index, rindex).dtype
        self.count, self.used = saved[0], saved[1]
        return dtype

    def scan(self, member: Member, rvars: list) -> None:
        """An inclusive scan along r, block by block, carrying the running total between blocks (floats in
        float64, as eager and the C++ backend accumulate)."""
        data: Scan = member.buffer.data
        dtype = member.buffer.dtype
        acc = torch.float64 if dtype.is_floating_point else dtype
        fn = "tl.cumsum" if data.scan_type == "sum" else "tl.cumprod"
        carry = self.new_name()
        start = "0" if data.scan_type == "sum" else "1"
        self.emit(f"{carry} = tl.full([XBLOCK, 1], {start}, {reg_type(acc)})", 1)
        handler = self._open_r_loop(rvars)
        value = self._value(member, handler, 2)
        tile = self.new_name()
        self.emit(f"{tile} = tl.where(xmask & rmask, tl.broadcast_to({convert(str(value), value.dtype, acc)}, "
                  f"[XBLOCK, RBLOCK]), {start})", 2)
        if data.scan_type == "sum":
            self.emit(f"{tile}_s = {fn}({tile}, 1) + {carry}", 2)
            self.emit(f"{carry} = {carry} + tl.sum({tile}, 1)[:, None]", 2)
        else:
            self.emit(f"{tile}_s = {fn}({tile}, 1) * {carry}", 2)
            self.emit(f"{carry} = {carry} * tl.reduce({tile}, 1, kiln_mul)[:, None]", 2)
        out = TValue(f"{tile}_s", acc)
        if acc != dtype:
            out = TValue(convert(out.name, acc, dtype), dtype)
        self._store(member, out, "[XBLOCK, RBLOCK]", "xmask & rmask", 2)


@dataclasses.dataclass
class SegmentSource:
    name: str
    source: str  # the kernels and the launcher `def <name>(...)`, a module of its own
    kernels: list[KernelSource]
    args: list[str]


# Tiles: a pointwise kernel's tile holds up to POINTWISE_TILE elements; a reduction is persistent (the whole
# row in one block) up to PERSISTENT_R elements, else walks RBLOCK = LOOP_R; rows per program fill up to
# REDUCTION_TILE. Under the interpreter every program is a round of numpy calls: tiles are larger there.
POINTWISE_TILE = {"device": 1024, "interpret": 16384}
REDUCTION_TILE = {"device": 4096, "interpret": 16384}
PERSISTENT_R = {"device": 2048, "interpret": 8192}
LOOP_R = {"device": 1024, "interpret": 4096}


def _pow2(n: int) -> int:
    return 1 << max(0, (max(n, 1) - 1).bit_length())


def launch_config(kernel: KernelSource, mode: str, tile: int = 0) -> dict:
    """XBLOCK, RBLOCK, num_warps and the grid of a kernel (`tile` > 0: at most that many elements per
    tile, for tests that want many programs and loops)."""
    x, r = kernel.xnumel, max(kernel.rnumel, 1)
    if kernel.pointwise:
        budget = tile or POINTWISE_TILE[mode]
        rblock = min(_pow2(r), budget)
        xblock = min(_pow2(x), max(1, budget // rblock))
        while -(-x // xblock) > MAX_GRID_Y:
            xblock *= 2
        grid = [-(-r // rblock), -(-x // xblock)]
    else:
        budget = tile or REDUCTION_TILE[mode]
        persistent = tile or PERSISTENT_R[mode]
        rblock = _pow2(r) if r <= persistent else (min(tile, LOOP_R[mode]) if tile else LOOP_R[mode])
        rblock = min(rblock, budget)
        xblock = min(_pow2(x), max(1, budget // rblock))
        grid = [-(-x // xblock)]
    warps = 8 if xblock * rblock >= 4096 else 4
    return {"XBLOCK": xblock, "RBLOCK": rblock, "num_warps": warps, "grid": grid}


def segment_source(entry: str, groups: list[FusedGroup], args: list[str], buffers: dict[str, Buffer],
                   aliases: dict[str, str] | None = None, mode: str = "device", tile: int = 0,
                   configs: dict | None = None) -> SegmentSource:
    """A module with one kernel per group and `entry(*args)`, which launches them in order.

    `aliases` maps a buffer written in place to the parameter it is stored through. `configs` (kernel name ->
    launch config) overrides the heuristic choice (autotuned configs).
    """
    pointers = {name: f"p_{name}" for name in args}
    pointers.update({name: f"p_{target}" for name, target in (aliases or {}).items()})
    kernels, parts, launches = [], [], []
    for i, group in enumerate(groups):
        if math.prod(group.outer) == 0:
            continue
        writer = KernelWriter(group, buffers, pointers)
        kernel = writer.write(f"{entry}_k{i}")
        if kernel.pointwise and kernel.rnumel == 0:
            continue
        kernels.append(kernel)
        parts.append(kernel.source)
        config = (configs or {}).get(kernel.name) or launch_config(kernel, mode, tile)
        grid = tuple(config["grid"])
        launches.append(f"    {kernel.name}[{grid}]({', '.join(kernel.params)}, XBLOCK={config['XBLOCK']}, "
                        f"RBLOCK={config['RBLOCK']}, num_warps={config['num_warps']})")
    params = ", ".join(f"p_{n}" for n in args)
    if mode == "interpret" and launches:  # numpy warns about lanes masked out (0/0 in a where's other branch)
        launches = ["    with kiln_quiet():"] + ["    " + line for line in launches]
    launcher = [f"def {entry}({params}):"] + (launches or ["    pass"])
    source = "\n\n\n".join(parts + ["\n".join(launcher)])
    return SegmentSource(entry, source, kernels, list(args))
