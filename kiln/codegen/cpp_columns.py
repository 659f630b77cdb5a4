"""C++ column reductions: a reduction whose reduced axis is strided while the output index is contiguous.

`(x * x).sum(0)` of a row-major [R, L] tensor, written like a row reduction (a loop over the L outputs, each
summing R elements 4*L bytes apart), touches a new cache line on every step and vectorizes nothing. Here the
loops turn around: the outputs are cut into tiles of at most COLUMN_TILE contiguous elements, each tile keeps
one accumulator per element (stack arrays: L1-resident), and the reduced axis runs in the outer loop while
the tile is the inner, vectorized loop, reading each row's slice contiguously. Threads take tiles (times the
other outer dims); when there are fewer tiles than threads and the reduced axis is long, it is cut into
chunks as well, each (tile, chunk) writing partial accumulators that a second pass combines per element in
chunk order (deterministic for a given thread count).

Every output element is still combined in the order of the reduced index, so only the loop order changes.
A float32 sum adds each element's values in float over blocks of COLUMN_BLOCK rows and the blocks in double
(as the row path's blocks); NaN propagates through max/min as kiln_max/kiln_min do. Members run in order per
tile (a member reads what an earlier member wrote for the same output element, never another tile's), so a
kernel of reductions and epilogues (mean, var, `sum(0) + b`) keeps its semantics; argmax/argmin, inner
pointwise members and scans keep the general path.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import sympy
import torch

from ..lower.sizes import is_static
from ..lower.index import FloorDiv, ModularIndexing, has_indirect, index_bounds, index_code
from ..schedule.group import FusedGroup, Member, Role
from ..schedule.locality import runs_parallel, splits_inner

# Output elements per tile: the accumulators (double + float block: 12 bytes each) stay in L1, and a tile's
# slice of a row is a run of whole cache lines long enough for the hardware prefetcher.
COLUMN_TILE = 256
# Half-precision reductions (float accumulators, 4 bytes; rows of 2-byte elements): 4 KB of accumulators and
# a row slice of 2 KB. At 256 the bf16 (x*x).sum(0) of 4096x4096 ran 2-4x slower than at 1024 (one thread).
COLUMN_TILE_HALF = 1024
# A float32 sum runs in float over this many rows per element, blocks added up in double.
COLUMN_BLOCK = 64
# The narrowest tile worth turning the loops around for (narrower outputs vectorize nothing either way).
MIN_COLUMNS = 8
# Splitting the reduced axis across threads: at least this many rows per chunk.
SPLIT_MIN_ROWS = 128
# More tiles than this feed any machine's threads: no split variant is emitted.
SPLIT_MAX_UNITS = 256
_COMBINE = {"sum": "+", "prod": "*"}
SIGNED = (torch.int64, torch.int32, torch.int16, torch.int8)
SIGNED_CTYPES = {"int64_t", "int32_t", "int16_t", "int8_t"}


def wrapping(a: str, symbol: str, b: str, ctype: str) -> str:
    """C++ of `a symbol b` on a signed integer type in two's complement, wrapping on overflow as eager's
    kernels do. Computed unsigned: the same instructions, without C++'s undefined signed overflow, which g++
    folded into a saturated result for `(torch.arange(5) + 2**62) * 4`."""
    unsigned = f"std::make_unsigned<{ctype}>::type"
    return f"static_cast<{ctype}>(static_cast<{unsigned}>({a}) {symbol} static_cast<{unsigned}>({b}))"


@dataclasses.dataclass
class ColumnPlan:
    tile: int                           # output elements per tile along the last outer dim
    steps: list[tuple[str, list[Member]]]  # ("reduce", reductions in one pass) | ("outer", epilogues)
    split: bool                         # the reduced axis may be split across threads


def column_plan(group: FusedGroup, target: Any) -> ColumnPlan | None:
    """How to write `group` as a column reduction, or None when the general path should (or must) run it.

    Only kernels of plain reductions (no arg reductions), inner members stored to memory (a pointwise
    producer over the reduced loops too: BatchNorm+SiLU before a channels-last channel mean) and outer
    (epilogue) members, whose reductions and inner members read their inputs contiguously along the last
    outer dim and never contiguously along the innermost reduced dim."""
    if not group.inner or not group.outer or group.index_map is not None or splits_inner(group, target):
        return None
    if not is_static((group.outer, group.inner)):
        return None  # tiles are sized from the sizes: symbolic kernels take the general path
    if any(m.role not in (Role.REDUCTION, Role.OUTER, Role.INNER) for m in group.members):
        return None
    inners = [m for m in group.members if m.role is Role.INNER]
    inner_names = {m.buffer.name for m in inners}
    # kernel-local buffers: an outer member's is a tile array here, an inner member's a variable of its
    # element's iteration (read only there: checked with the passes below)
    if any(kind != ("array" if name in inner_names else "scalar") for name, kind in group.local.items()):
        return None
    reductions = [m for m in group.members if m.role is Role.REDUCTION]
    if not reductions or any(m.buffer.data.reduction_type not in ("sum", "prod", "max", "min")
                             for m in reductions):
        return None
    width = group.outer[-1]
    if width < MIN_COLUMNS:
        return None
    x_last = group.outer_vars()[-1]
    reduced = [r for r, size in zip(group.inner_vars(), group.inner) if size > 1]
    written = set(group.buffer_names())
    # the loads the reduced loops move: contiguous along the tile (columns) or strided along it. Loads they
    # do not move (per-channel parameters) are read once per element either way and decide nothing: an
    # NCHW depthwise convolution + BatchNorm + mean at batch 2 read its input with stride H*W along the
    # channels, and took this path on its parameters' evidence alone (2x slower than the general path)
    columns = strided = 0
    for member in reductions + inners:
        for name, expr in group.member_loads(member):
            if name in written:
                continue  # read at the current output element (fusion checked it)
            if has_indirect(expr) or \
                    any(a.has(v) for a in expr.atoms(FloorDiv, ModularIndexing) for v in [x_last] + reduced):
                return None  # not affine where it matters (or a loaded index): keep the general path
            step = sympy.diff(expr, x_last)
            if not step.is_Integer:
                return None
            if step != 0 and step != 1 and any(abs(sympy.diff(expr, r)) == 1 for r in reduced):
                return None  # an operand contiguous along the reduced axis (a transposed product): mixed
            if not any(expr.has(r) for r in group.inner_vars()):
                continue
            if step == 1:
                columns += 1
            elif step != 0:
                strided += 1
    if columns == 0 or strided > columns:
        return None
    steps: list[tuple[str, list[Member]]] = []
    for member in group.members:
        kind = "outer" if member.role is Role.OUTER else "reduce"
        # an inner member runs in its pass's element loop before the reductions that read it (at the same
        # element); a member that reads a reduction of the current pass needs that pass finished
        if steps and steps[-1][0] == kind and (kind == "outer" or not _reads_any(
                group, member, [m for m in steps[-1][1] if m.role is Role.REDUCTION])):
            steps[-1][1].append(member)
        else:
            steps.append((kind, [member]))
    for kind, members in steps:
        held = [m for m in members if m.buffer.name in group.local and m.role is Role.INNER]
        if held and any(_reads_any(group, m, held) for k, ms in steps if ms is not members for m in ms):
            return None  # a later pass reads an inner member the kernel does not store
    independent = not inners and not any(_reads_any(group, m, group.members) for m in reductions)
    half = all(m.buffer.dtype in (torch.bfloat16, torch.float16) for m in reductions)
    ntiles = math.ceil(width / min(width, COLUMN_TILE_HALF if half else COLUMN_TILE))
    tile = -(-math.ceil(width / ntiles) // 16) * 16 if ntiles > 1 else width
    units = math.prod(group.outer[:-1]) * ntiles
    split = independent and runs_parallel(group, target) and units <= SPLIT_MAX_UNITS and \
        group.inner[0] >= 2 * SPLIT_MIN_ROWS
    return ColumnPlan(tile, steps, split)


def _reads_any(group: FusedGroup, member: Member, producers: list[Member]) -> bool:
    names = {m.buffer.name for m in producers}
    return any(name in names for name, _ in group.member_loads(member))


class ColumnWriter:
    """Writes one column-reduction kernel through a `kiln.codegen.cpp.KernelWriter` (`w`): its `emit`,
    `store` of a member's value, `handler` (a C++ handler at some depth), `ctype` and `acc_type`."""

    def __init__(self, w: Any, group: FusedGroup, plan: ColumnPlan, parallel: bool):
        self.w = w
        self.group = group
        self.plan = plan
        self.parallel = parallel
        self.width = group.outer[-1]
        self.ntiles = math.ceil(self.width / plan.tile)
        self.units = math.prod(group.outer[:-1]) * self.ntiles
        self.outputs = math.prod(group.outer)
        self.slots = {id(m): i for i, m in enumerate(group.members)}
        self.x_last = f"x{len(group.outer) - 1}"
        # kernel-local buffers: an inner member's is a variable of its element's iteration, an outer
        # member's an array over the tile
        self.held = {m.buffer.name for m in group.members
                     if m.role is Role.INNER and m.buffer.name in group.local}
        self.tile_locals = [name for name in group.local if name not in self.held]
        self.preloaded: dict[tuple[str, sympy.Expr], str] = {}  # the current pass's (see _preloads)

    def emit(self, line: str, depth: int) -> None:
        self.w.emit(line, depth)

    def write(self) -> None:
        self.emit(f"// column reduction: tiles of {self.plan.tile} along {self.x_last}", 2)
        if not self.plan.split:
            self.tiled(2)
            return
        rows = self.group.inner[0]
        self.emit("const int64_t kiln_nt = omp_get_max_threads();", 2)
        self.emit(f"const int64_t kiln_ns = {self.units} >= kiln_nt ? 1 : "
                  f"kiln_imin((kiln_nt + {self.units - 1}) / {self.units}, {rows // SPLIT_MIN_ROWS});", 2)
        self.emit("if (kiln_ns > 1) {", 2)
        self.split(3)
        self.emit("} else {", 2)
        self.tiled(3)
        self.emit("}", 2)

    # ---- the pieces -----------------------------------------------------------------------------------

    def _parallel_for(self, count: str, var: str, depth: int) -> None:
        if self.parallel:
            self.emit("#pragma omp parallel for schedule(static)", depth)
        self.emit(f"for (int64_t {var} = 0; {var} < {count}; ++{var}) {{", depth)

    def _tile_header(self, depth: int, locals_: bool = True) -> None:
        """The tile `xo` stands for: its first element `xt`, its width `kn`, the other outer indices."""
        tile, ntiles = self.plan.tile, self.ntiles
        if ntiles == 1:
            self.emit("const int64_t xt = 0;", depth)
            self.emit(f"const int64_t kn = {self.width};", depth)
        else:
            self.emit(f"const int64_t xt = (xo % {ntiles}) * {tile};", depth)
            if self.width % tile == 0:
                self.emit(f"const int64_t kn = {tile};", depth)
            else:
                self.emit(f"const int64_t kn = kiln_imin({tile}, {self.width} - xt);", depth)
        rest = f"(xo / {ntiles})" if ntiles > 1 else "xo"
        outer = self.group.outer
        for d in reversed(range(len(outer) - 1)):
            if d == 0:
                self.emit(f"const int64_t x{d} = {rest};", depth)
            else:
                self.emit(f"const int64_t x{d} = {rest} % {outer[d]};", depth)
                rest = f"({rest} / {outer[d]})"
        for name in self.tile_locals if locals_ else ():
            ctype = self.w.local_ctype(self.w.buffers[name].dtype)
            self.emit(f"{ctype} loc_{name}[{tile}];", depth)

    def _element(self, depth: int) -> None:
        self.emit(f"const int64_t {self.x_last} = xt + kj;", depth)

    def _linear(self) -> str:
        """C++ of the current output element's position in a dense row-major array of the outer shape."""
        outer, terms, stride = self.group.outer, [], 1
        for d in reversed(range(len(outer))):
            if outer[d] != 1:
                terms.append(f"x{d}" if stride == 1 else f"x{d} * {stride}")
            stride *= outer[d]
        return " + ".join(reversed(terms)) or "0"

    def _preloads(self, members: list[Member]) -> list[tuple[str, sympy.Expr]]:
        """The members' loads that the reduced loops do not move and that step through memory along the
        tile by more than one element (a depthwise convolution's weights [C, 1, 3, 3] read at 9 * c + k
        over a channels-last input): read once per tile into arrays. g++ vectorizes no loop that reads
        such an interleaved group of 9 (or 25) addresses; nor ones that need a gather per row."""
        written = set(self.group.buffer_names())
        reduced = set(self.group.inner_vars())
        x_last = self.group.outer_vars()[-1]
        ranges = self.group.var_ranges()
        found: list[tuple[str, sympy.Expr]] = []
        for member in members:
            for name, expr in self.group.member_loads(member):
                buf = self.w.buffers[name]
                if name in written or (name, expr) in found:
                    continue
                if buf.dtype not in (torch.float32, torch.float64):
                    continue
                if expr.free_symbols & reduced or expr.atoms(FloorDiv, ModularIndexing):
                    continue
                step = sympy.diff(expr, x_last)
                if not step.is_Integer or step in (0, 1, -1):
                    continue
                bounds, size = index_bounds(expr, ranges), buf.layout.storage_size()
                if bounds is None or not is_static((bounds, size)) or bounds[0] < 0 or bounds[1] >= size:
                    continue  # a load a mask may guard: read where the loop reads it
                found.append((name, expr))
        return found

    def _emit_preloads(self, members: list[Member], depth: int) -> None:
        self.preloaded = {}
        for n, (name, expr) in enumerate(self._preloads(members)):
            ctype = self.w.ctype(self.w.buffers[name].dtype)
            self.emit(f"alignas(64) {ctype} pre{n}[{self.plan.tile}];", depth)
            self.emit("for (int64_t kj = 0; kj < kn; ++kj) {", depth)
            self._element(depth + 1)
            element = f"{self.w.pointers[name]}[{index_code(expr, '/', 'cpp codegen')}]"
            self.emit(f"pre{n}[kj] = {element};", depth + 1)
            self.emit("}", depth)
            self.preloaded[(name, expr)] = f"pre{n}[kj]"

    def _body(self, member: Member, depth: int) -> str:
        local = {n: "scalar" if n in self.held else "array" for n in self.group.local}
        handler = self.w.handler(self.group, depth, local, "kj")
        handler.preloaded = self.preloaded
        index, rindex = self.group.member_index(member)
        if member.role is Role.REDUCTION:
            value = member.buffer.data.fn(handler, index, rindex)
        else:
            value = member.buffer.data.fn(handler, index)
        self.w.lines.extend(handler.lines)
        return str(value)

    def _store(self, member: Member, value: str, depth: int) -> None:
        name = member.buffer.name
        if name in self.held:
            self.emit(f"loc_{name} = {self.w.local_value(value, member.buffer.dtype)};", depth)
        elif name in self.group.local:
            self.emit(f"loc_{name}[kj] = {self.w.local_value(value, member.buffer.dtype)};", depth)
        else:
            self.w.store(self.group, member, value, depth)

    def _acc(self, member: Member) -> tuple[str, str, bool]:
        """(C type, initial value, blocked: a float32 sum in float blocks) of a reduction's accumulators."""
        dtype, init = self.w.acc_type(self.group, member)
        blocked = member.buffer.data.reduction_type == "sum" and dtype == torch.float64 and \
            member.buffer.dtype == torch.float32
        return self.w.ctype(dtype), init, blocked

    @staticmethod
    def _combine(rtype: str, acc: str, value: str, ctype: str) -> str:
        if rtype in _COMBINE and ctype in SIGNED_CTYPES:
            return f"{acc} = {wrapping(acc, _COMBINE[rtype], value, ctype)};"
        if rtype in _COMBINE:
            return f"{acc} = {acc} {_COMBINE[rtype]} {value};"
        return f"{acc} = kiln_{rtype}<{ctype}>({acc}, {value});"

    def reduce_pass(self, members: list[Member], lo: str, hi: str, depth: int) -> None:
        """Declare the reductions' accumulator arrays and run the reduced loops over them, the outermost
        reduced dim from `lo` to `hi` (a chunk of it when split); an inner member is computed and stored
        at each element, in member order. Leaves `acc{i}[kj]` in scope."""
        inner = self.group.inner
        tile = self.plan.tile
        everything = members
        members = [m for m in everything if m.role is Role.REDUCTION]
        accs = {id(m): self._acc(m) for m in members}
        for m in members:
            i = self.slots[id(m)]
            ctype, init, blocked = accs[id(m)]
            self.emit(f"alignas(64) {ctype} acc{i}[{tile}];", depth)
            if blocked:
                self.emit(f"alignas(64) float accb{i}[{tile}];", depth)
            self.emit(f"for (int64_t kj = 0; kj < kn; ++kj) acc{i}[kj] = {init};", depth)
        self._emit_preloads(everything, depth)
        blocked = [m for m in members if accs[id(m)][2]]
        # block at the outermost reduced dim whose inner rows fit in a block
        block_dim = next(d for d in range(len(inner)) if math.prod(inner[d + 1:]) <= COLUMN_BLOCK)
        block_rows = max(1, COLUMN_BLOCK // max(1, math.prod(inner[block_dim + 1:])))
        closers = []
        for d, size in enumerate(inner):
            first, last = (lo, hi) if d == 0 else ("0", str(size))
            if blocked and d == block_dim:
                self.emit(f"for (int64_t rb{d} = {first}; rb{d} < {last}; rb{d} += {block_rows}) {{", depth)
                for m in blocked:
                    self.emit(f"for (int64_t kj = 0; kj < kn; ++kj) accb{self.slots[id(m)]}[kj] = 0.0f;",
                              depth + 1)
                self.emit(f"const int64_t re{d} = kiln_imin({last}, rb{d} + {block_rows});", depth + 1)
                self.emit(f"for (int64_t r{d} = rb{d}; r{d} < re{d}; ++r{d}) {{", depth + 1)
                closers.append(("block", depth))
                depth += 2
            else:
                self.emit(f"for (int64_t r{d} = {first}; r{d} < {last}; ++r{d}) {{", depth)
                closers.append(("loop", depth))
                depth += 1
        pragma_at = len(self.w.lines)
        self.emit("for (int64_t kj = 0; kj < kn; ++kj) {", depth)
        self._element(depth + 1)
        for m in everything:
            if m.role is Role.INNER:
                if m.buffer.name in self.held:
                    ctype = self.w.local_ctype(m.buffer.dtype)
                    self.emit(f"{ctype} loc_{m.buffer.name};", depth + 1)
                self._epilogue(m, depth + 1)
                continue
            i = self.slots[id(m)]
            ctype, _, is_blocked = accs[id(m)]
            self.emit("{", depth + 1)
            value = self._body(m, depth + 2)
            if is_blocked:
                self.emit(f"accb{i}[kj] = accb{i}[kj] + static_cast<float>({value});", depth + 2)
            else:
                rtype = m.buffer.data.reduction_type
                self.emit(self._combine(rtype, f"acc{i}[kj]", f"static_cast<{ctype}>({value})", ctype),
                          depth + 2)
            self.emit("}", depth + 1)
        self.emit("}", depth)
        self.preloaded = {}  # (the arrays stay in scope for the pass's own loops only)
        # (half-precision values are floats here, never a struct local, which GCC would privatize into an
        # array under the pragma and copy as an aggregate, unvectorized: kiln.codegen.cpp.reg_ctype)
        self.w.lines.insert(pragma_at, "  " * depth + "#pragma omp simd")
        for kind, at in reversed(closers):
            if kind == "block":
                self.emit("}", at + 1)
                self.emit("#pragma omp simd", at + 1)
                self.emit("for (int64_t kj = 0; kj < kn; ++kj) {", at + 1)
                for m in blocked:
                    i = self.slots[id(m)]
                    self.emit(f"acc{i}[kj] = acc{i}[kj] + static_cast<double>(accb{i}[kj]);", at + 2)
                self.emit("}", at + 1)
            self.emit("}", at)

    def _epilogue(self, member: Member, depth: int) -> None:
        self.emit("{", depth)
        value = self._body(member, depth + 1)
        self._store(member, value, depth + 1)
        self.emit("}", depth)

    def tiled(self, depth: int) -> None:
        """Threads take whole tiles; each tile runs the steps in order."""
        self.emit("{", depth)
        self._parallel_for(str(self.units), "xo", depth + 1)
        self._tile_header(depth + 2)
        steps = self.plan.steps
        at = 0
        while at < len(steps):
            kind, members = steps[at]
            self.emit("{", depth + 2)
            if kind == "reduce":
                self.reduce_pass(members, "0", str(self.group.inner[0]), depth + 3)
            self.emit("for (int64_t kj = 0; kj < kn; ++kj) {", depth + 3)
            self._element(depth + 4)
            if kind == "reduce":
                for m in members:
                    if m.role is Role.REDUCTION:
                        self._store(m, f"acc{self.slots[id(m)]}[kj]", depth + 4)
                if at + 1 < len(steps) and steps[at + 1][0] == "outer":
                    at += 1  # the epilogues after a pass run in its store loop
            for m in steps[at][1] if steps[at][0] == "outer" else []:
                self._epilogue(m, depth + 4)
            self.emit("}", depth + 3)
            self.emit("}", depth + 2)
            at += 1
        self.emit("}", depth + 1)
        self.emit("}", depth)

    def split(self, depth: int) -> None:
        """The reduced axis cut into `kiln_ns` chunks: partial accumulators per (tile, chunk), then per
        output element the chunks combined in order and the members stored in order."""
        rows = self.group.inner[0]
        reductions = [m for m in self.group.members if m.role is Role.REDUCTION]
        self.emit(f"const int64_t kiln_chunk = ({rows} + kiln_ns - 1) / kiln_ns;", depth)
        for m in reductions:
            ctype = self._acc(m)[0]
            i = self.slots[id(m)]
            self.emit(f"kiln_array<{ctype}> part{i}(kiln_ns * {self.outputs});", depth)
        self._parallel_for(f"{self.units} * kiln_ns", "xq", depth)
        self.emit("const int64_t xo = xq / kiln_ns;", depth + 1)
        self.emit("const int64_t kc = xq % kiln_ns;", depth + 1)
        self.emit(f"const int64_t rlo = kiln_imin({rows}, kc * kiln_chunk);", depth + 1)
        self.emit(f"const int64_t rhi = kiln_imin({rows}, rlo + kiln_chunk);", depth + 1)
        self._tile_header(depth + 1, locals_=False)
        self.reduce_pass(reductions, "rlo", "rhi", depth + 1)
        self.emit("for (int64_t kj = 0; kj < kn; ++kj) {", depth + 1)
        self._element(depth + 2)
        for m in reductions:
            i = self.slots[id(m)]
            self.emit(f"part{i}[kc * {self.outputs} + {self._linear()}] = acc{i}[kj];", depth + 2)
        self.emit("}", depth + 1)
        self.emit("}", depth)
        self._parallel_for(str(self.units), "xo", depth)
        self._tile_header(depth + 1)
        self.emit("for (int64_t kj = 0; kj < kn; ++kj) {", depth + 1)
        self._element(depth + 2)
        self.emit(f"const int64_t ko = {self._linear()};", depth + 2)
        for m in self.group.members:
            if m.role is not Role.REDUCTION:
                self._epilogue(m, depth + 2)
                continue
            i = self.slots[id(m)]
            ctype = self._acc(m)[0]
            self.emit("{", depth + 2)
            self.emit(f"{ctype} total = part{i}[ko];", depth + 3)
            self.emit("for (int64_t kc = 1; kc < kiln_ns; ++kc) {", depth + 3)
            self.emit(self._combine(m.buffer.data.reduction_type, "total", f"part{i}[kc * {self.outputs} + ko]",
                                    ctype), depth + 4)
            self.emit("}", depth + 3)
            self._store(m, "total", depth + 3)
            self.emit("}", depth + 2)
        self.emit("}", depth + 1)
        self.emit("}", depth)
