"""C++ code generation: fused groups → one `extern "C"` function per segment of kernels.

Each kernel is an OpenMP loop over its outer ranges; inside it, each member runs its own inner loop (the
innermost loop is written so the compiler vectorizes it, tails included). When the outer ranges are too
small to feed the threads (a full reduction to a scalar), the inner loops are split across threads instead,
reductions keeping one accumulator per thread combined in thread order (deterministic). A reduction over a
strided axis into contiguous outputs (`x.sum(0)`) turns the loops around instead (kiln.codegen.cpp_columns:
the outputs in vectorized tiles, the reduced axis outside). Large outputs
(>= STREAM_BYTES, written contiguously along the innermost loop) are computed into a stack tile and copied
out with non-temporal stores: no read-for-ownership of lines that are about to be overwritten.
"""
from __future__ import annotations

import math
from typing import Any

import sympy
import torch

from ..graph.layout import contiguous_strides
from ..lower.index import index_bounds, index_code, indirect_var, simplify_index
from ..lower.ir import Buffer, ComputedBuffer, Reduction
from ..lower.ops import SCALAR_OP_TABLE, Handler, Result, keeps_register, rounded_once
from ..lower.sizes import SizeDecision, hint, is_static, known_lt, nonnegative
from ..lower.target import Target
from ..schedule.group import FusedGroup, Member, Role
from ..schedule.locality import runs_parallel, splits_inner
from .cpp_columns import SIGNED, SIGNED_CTYPES, ColumnWriter, column_plan, wrapping
from .cpp_ops import CODE_FOR_OP, EXACT, WRAPPING, CType, is_nan

# the C++ backend's target, in .cpp_target (a graph-cache hit reads it without this module)
from .cpp_target import CPP_TARGET  # noqa: E402,F401

CTYPES = {torch.bfloat16: "kiln_bf16", torch.float16: "kiln_fp16", torch.float32: "float",
          torch.float64: "double", torch.int64: "int64_t", torch.int32: "int32_t", torch.int16: "int16_t",
          torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "bool"}
HALF_TYPES = (torch.bfloat16, torch.float16)
# half-precision values live in float registers (rounded by ROUND_HALF after every op, or only where a value
# is stored or converted: config bfloat16_rounding, float16_rounding) and in memory as their bits: loaded
# with HALF_FROM_BITS, stored with HALF_TO_BITS. No local of
# the half types' struct: GCC privatizes a simd loop's locals into arrays and copies a struct local as an
# aggregate, which it does not vectorize.
ROUND_HALF = {torch.bfloat16: "kiln_round_bf16", torch.float16: "kiln_round_fp16"}
HALF_FROM_BITS = {torch.bfloat16: "kiln_bf16_to_float", torch.float16: "kiln_fp16_to_float"}
HALF_TO_BITS = {torch.bfloat16: "kiln_float_to_bf16", torch.float16: "kiln_float_to_fp16"}


def reg_ctype(dtype: torch.dtype) -> str:
    """The C++ type a kernel holds a value of `dtype` in (a variable, a kernel-local buffer): float for the
    half types."""
    return "float" if dtype in HALF_TYPES else CTYPES[dtype]


def round_half(text: str, dtype: torch.dtype) -> str:
    """C++ of a float value rounded to `dtype`'s values when it is a half type (kept in a float)."""
    return f"{ROUND_HALF[dtype]}({text})" if dtype in HALF_TYPES else text


def store_code(target: str, value: str, dtype: torch.dtype) -> str:
    """The C++ statement storing `value` into the element `target` of a buffer of `dtype` (in memory)."""
    if dtype in HALF_TYPES:
        return f"{target}.x = {HALF_TO_BITS[dtype]}({value});"
    return f"{target} = static_cast<{CTYPES[dtype]}>({value});"


def cexpr(expr: Any) -> str:
    """C++ text of an integer index expression (or size: symbolic sizes are the kernel's int64 arguments)."""
    return index_code(expr, "/", "cpp codegen")


def csize(size: Any) -> str:
    return cexpr(sympy.sympify(size))


def cconst(value: Any, dtype: torch.dtype) -> str:
    ctype = CTYPES[dtype]
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        value = float(value)
        if math.isnan(value):
            return f"std::numeric_limits<{ctype}>::quiet_NaN()"
        if math.isinf(value):
            sign = "" if value > 0 else "-"
            return f"{sign}std::numeric_limits<{ctype}>::infinity()"
        return f"static_cast<{ctype}>({value!r})"
    value = int(value)
    if value == -(2 ** 63):
        return "std::numeric_limits<int64_t>::min()"
    return f"static_cast<{ctype}>({value}LL)"


class CppValue:
    __slots__ = ("name", "dtype")

    def __init__(self, name: str, dtype: torch.dtype):
        self.name = name
        self.dtype = dtype

    def __str__(self) -> str:
        return self.name


class CppHandler(Handler):
    """Emits one C++ statement per scalar op into `lines`, returning typed temporaries."""

    def __init__(self, buffers: dict[str, Buffer], pointers: dict[str, str], ranges: dict, indent: str,
                 local: dict[str, str] | None = None, inner_index: str = "0"):
        self.local = local or {}
        self.inner_index = inner_index
        self.buffers = buffers
        self.pointers = pointers
        self.ranges = ranges
        self.lines: list[str] = []
        self.indent = indent
        self.counter = 0
        self.guard: str | None = None  # inside a masked branch: the condition its loads need (see `masked`)
        # (buffer, simplified index) -> C++ of an element read earlier into an array (a column kernel's
        # loads invariant along the reduced loops: kiln.codegen.cpp_columns)
        self.preloaded: dict[tuple[str, sympy.Expr], str] = {}
        # the half types rounded where they leave the kernel's float registers (a store, a kernel-local
        # buffer, a conversion to a dtype other than float), not after every op as eager rounds
        self.round_once = rounded_once()

    def tmp(self, expr: str, dtype: torch.dtype) -> CppValue:
        self.counter += 1
        name = f"t{self.counter}"
        self.lines.append(f"{self.indent}{reg_ctype(dtype)} {name} = {expr};")
        return CppValue(name, dtype)

    def _load_tmp(self, name: str, index: sympy.Expr, expr: str, dtype: torch.dtype) -> CppValue:
        """A load; inside a masked branch, one that may fall out of bounds reads only where the branch's
        condition holds (zero elsewhere), and one in bounds on every iteration of the loops reads always."""
        if self.guard is None or self._in_bounds(name, index):
            return self.tmp(expr, dtype)
        return self.tmp(f"({self.guard}) ? {expr} : {reg_ctype(dtype)}(0)", dtype)

    def _in_bounds(self, name: str, index: sympy.Expr) -> bool:
        size = self.buffers[name].layout.storage_size()
        bounds = index_bounds(index, self.ranges)
        return isinstance(size, int) and bounds is not None and isinstance(bounds[0], int) and \
            isinstance(bounds[1], int) and 0 <= bounds[0] and bounds[1] < size

    def load(self, name: str, index: sympy.Expr) -> CppValue:
        # fusion checked that a kernel-local buffer is read exactly where it was written
        # (a kernel-local buffer of a half type is held in floats: reg_ctype)
        if self.local.get(name) == "scalar":
            return CppValue(f"loc_{name}", self.buffers[name].dtype)
        if self.local.get(name) == "array":
            return self.tmp(f"loc_{name}[{self.inner_index}]", self.buffers[name].dtype)
        index = simplify_index(sympy.expand(index), self.ranges)
        dtype = self.buffers[name].dtype
        if (name, index) in self.preloaded:
            return self.tmp(self.preloaded[(name, index)], dtype)
        if dtype == torch.bool:
            # read as its byte: g++ finds no vector type for a bool load in a loop that calls a SIMD math
            # function (a causal mask before exp), and leaves that loop scalar
            return self._load_tmp(name, index, f"(reinterpret_cast<const uint8_t*>({self.pointers[name]})"
                                  f"[{cexpr(index)}] != 0)", dtype)
        element = f"{self.pointers[name]}[{cexpr(index)}]"
        if dtype in HALF_TYPES:
            element = f"{HALF_FROM_BITS[dtype]}({element}.x)"
        return self._load_tmp(name, index, element, dtype)

    def indirect(self, value: CppValue, size: Any, wrap: bool = False) -> sympy.Symbol:
        """`kiln_index` of the value (see the header): a checked int64 local named as the symbol it stands
        for; within the kernel's index expressions its range is the dim's (loads through it are in bounds)."""
        self.counter += 1
        symbol = indirect_var(self.counter)  # (numbered with the temporaries: unique in the kernel)
        live = "true" if self.guard is None else f"({self.guard})"
        self.lines.append(f"{self.indent}const int64_t {symbol.name} = kiln_index(static_cast<int64_t>({value}), "
                          f"{csize(size)}, {'true' if wrap else 'false'}, {live}, &{BAD_FLAG});")
        self.ranges = {**self.ranges, symbol: size}
        return symbol

    def constant(self, value: Any, dtype: torch.dtype) -> CppValue:
        if dtype in HALF_TYPES:
            # the half type's value, rounded here (through float, as a C++ float constant would be)
            value = torch.tensor(float(value), dtype=torch.float32).to(dtype).item()
            return CppValue(cconst(value, torch.float32), dtype)
        return CppValue(cconst(value, dtype), dtype)

    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> CppValue:
        expr = simplify_index(sympy.expand(expr), self.ranges)
        if dtype in HALF_TYPES:
            return self.tmp(round_half(f"static_cast<float>({cexpr(expr)})", dtype), dtype)
        return self.tmp(f"static_cast<{CTYPES[dtype]}>({cexpr(expr)})", dtype)

    def to_dtype(self, x: CppValue, dtype: torch.dtype) -> CppValue:
        if keeps_register(x.dtype, dtype, self.round_once):
            return CppValue(x.name, dtype)
        if x.dtype in self.round_once and x.dtype != dtype:
            x = self.tmp(round_half(x.name, x.dtype), x.dtype)
        if dtype == torch.bool:
            return self.tmp(f"({x} != 0)", dtype)
        if dtype in HALF_TYPES:
            if x.dtype == dtype:
                return x
            # (from double: through float, as eager's conversion to a half type goes)
            return self.tmp(round_half(f"static_cast<float>({x})", dtype), dtype)
        return self.tmp(f"static_cast<{CTYPES[dtype]}>({x})", dtype)

    def masked(self, cond: CppValue, body: Any, other: Any, dtype: torch.dtype) -> CppValue:
        """Both branches computed on every lane, then a select: only the loads that could leave their
        buffer are conditional (`_load_tmp`). An `if` around the branch leaves the loop scalar whenever it
        reads an address the inner loop does not move (g++ 12 cannot vectorize such a masked load: a
        BatchNorm parameter in a padding kernel ran ~10x slower), and g++ sinks loads hoisted above the
        `if` back into it. Nothing in a branch can trap on the lanes it does not own: every load is in
        bounds or conditional, and integer division by zero is defined (kiln_idiv)."""
        outer = self.guard
        self.guard = str(cond) if outer is None else f"({outer}) & ({cond})"
        taken = body()
        self.guard = f"!({cond})" if outer is None else f"({outer}) & !({cond})"
        otherwise = other()
        self.guard = outer
        return self.tmp(f"{cond} ? {taken} : {otherwise}", dtype)

    def op(self, name: str, *args: Any) -> CppValue:
        """A scalar op, spelled by `kiln.codegen.cpp_ops.CODE_FOR_OP` (see there for what is done here)."""
        spec = SCALAR_OP_TABLE.get(name)
        if name != "where" and args[0].dtype in HALF_TYPES:
            # compute in float; round the result back to the half type here only when rounding after every op
            # (and not when it is one of the operands)
            dtype = args[0].dtype
            result = self.op(name, *[CppValue(a.name, torch.float32) for a in args])
            if result.dtype == torch.bool:
                return result
            if name in EXACT or dtype in self.round_once:
                return CppValue(result.name, dtype)
            return self.tmp(round_half(result.name, dtype), dtype)
        dtype = args[1].dtype if name == "where" else args[0].dtype
        t = CType(dtype, CTYPES[dtype])
        text = None
        if spec is not None and (t.is_float or not spec.float_only):
            if dtype in SIGNED and name in WRAPPING:  # wrapping, as eager's integers do
                a, b = (f"{t.ctype}(0)", args[0]) if spec.arity == 1 else args
                text = wrapping(str(a), WRAPPING[name], str(b), t.ctype)
            else:
                text = CODE_FOR_OP[name](t, *args)
        if text is None:
            raise NotImplementedError(f"cpp codegen: {name} on {dtype}")
        return self.tmp(text, torch.bool if spec.result is Result.BOOL else dtype)


# ---- reductions -----------------------------------------------------------------------------------------

# A float sum runs in float (vectorized) over blocks of this many elements, blocks added up in double.
BLOCK = 4096
# Outputs of at least STREAM_BYTES (far beyond the caches: a later kernel rereads them from memory anyway)
# are written with non-temporal stores, through a stack tile of STREAM_TILE elements.
STREAM_BYTES = 16 * 1024 * 1024
STREAM_TILE = 1024


def _acc_type(rtype: str, dtype: torch.dtype) -> torch.dtype:
    if dtype in HALF_TYPES:
        return torch.float32  # as eager: half-precision reductions accumulate in float
    if rtype in ("sum", "prod") and dtype == torch.float32:
        return torch.float64  # float sums accumulate in double: as accurate as eager's cascade sums
    return dtype


def _init(rtype: str, dtype: torch.dtype) -> str:
    ctype = CTYPES[dtype]
    if rtype == "sum":
        return cconst(0, dtype)
    if rtype == "prod":
        return cconst(1, dtype)
    if rtype in ("max", "argmax"):
        if dtype.is_floating_point:
            return f"-std::numeric_limits<{ctype}>::infinity()"
        return f"std::numeric_limits<{ctype}>::lowest()"
    if dtype.is_floating_point:
        return f"std::numeric_limits<{ctype}>::infinity()"
    return f"std::numeric_limits<{ctype}>::max()"


def _combine(rtype: str, acc: str, value: str, ctype: str) -> str:
    if rtype in ("sum", "prod") and ctype in SIGNED_CTYPES:
        return f"{acc} = {wrapping(acc, '+' if rtype == 'sum' else '*', value, ctype)};"
    if rtype == "sum":
        return f"{acc} = {acc} + {value};"
    if rtype == "prod":
        return f"{acc} = {acc} * {value};"
    if rtype == "max":
        return f"{acc} = kiln_max<{ctype}>({acc}, {value});"
    return f"{acc} = kiln_min<{ctype}>({acc}, {value});"


# ---- kernels ------------------------------------------------------------------------------------------

class KernelWriter:
    """Writes the C++ of the kernels of one segment."""

    def __init__(self, buffers: dict[str, Buffer], pointers: dict[str, str], target: Target):
        self.buffers = buffers
        self.pointers = pointers
        self.target = target
        self.lines: list[str] = []

    def emit(self, line: str, depth: int) -> None:
        self.lines.append("  " * depth + line)

    def kernel(self, group: FusedGroup) -> None:
        if is_static(group.outer) and math.prod(group.outer) == 0:
            return
        self.emit(f"// {group.describe()}", 1)
        self.emit("{", 1)
        columns = column_plan(group, self.target)
        if columns is not None:
            ColumnWriter(self, group, columns, runs_parallel(group, self.target)).write()
        elif splits_inner(group, self.target):
            self.split_inner(group)
        elif not is_static((group.outer, group.inner)):
            # threads or not is decided per call, from this call's sizes
            work = math.prod(group.outer) * math.prod(group.inner or ())
            self.split_outer(group, f"if({csize(work)} >= {self.target.parallel_threshold})")
        else:
            self.split_outer(group, runs_parallel(group, self.target))
        self.emit("}", 1)

    def _outer_header(self, group: FusedGroup, depth: int) -> None:
        outer_n = math.prod(group.outer)
        self.emit(f"for (int64_t xo = 0; xo < {csize(outer_n)}; ++xo) {{", depth)
        rest = "xo"
        for d in reversed(range(len(group.outer))):
            size = group.outer[d]
            if d == 0:
                self.emit(f"  const int64_t x{d} = {rest};", depth)
            else:
                self.emit(f"  const int64_t x{d} = {rest} % {csize(size)};", depth)
                rest = f"({rest} / {csize(size)})"
        if _loads_through_index(group):
            self.emit(f"  int {BAD_FLAG} = 0;", depth)

    def _close_outer(self, group: FusedGroup, depth: int) -> None:
        """End the outer loop's body (opened by _outer_header): a bad index found in it goes to the entry's
        result."""
        if _loads_through_index(group):
            self.emit(f"  if ({BAD_FLAG}) __atomic_store_n(&{ERROR_FLAG}, 1, __ATOMIC_RELAXED);", depth)
        self.emit("}", depth)

    def split_outer(self, group: FusedGroup, parallel: bool | str) -> None:
        """The outer loop over threads when `parallel` (a string: the OpenMP `if` clause deciding it)."""
        clause = f" {parallel}" if isinstance(parallel, str) else ""
        arrays = [n for n, kind in group.local.items() if kind == "array"]
        inner_n = math.prod(group.inner or ())
        depth = 2
        if arrays:
            # per-thread scratch rows for buffers that never leave the kernel
            if parallel:
                self.emit(f"#pragma omp parallel{clause}", depth)
            self.emit("{", depth)
            for name in arrays:
                ctype = reg_ctype(self.buffers[name].dtype)
                rows = max(inner_n, 1) if is_static(inner_n) else f"kiln_imax({csize(inner_n)}, 1)"
                self.emit(f"kiln_array<{ctype}> vec_{name}({rows});", depth + 1)
                self.emit(f"{ctype}* __restrict__ loc_{name} = vec_{name}.get();", depth + 1)
            depth += 1
            if parallel:
                self.emit("#pragma omp for schedule(static)", depth)
        elif parallel:
            self.emit(f"#pragma omp parallel for schedule(static){clause}", depth)
        self._outer_header(group, depth)
        for name, kind in group.local.items():
            if kind == "scalar":
                self.emit(f"  {reg_ctype(self.buffers[name].dtype)} loc_{name};", depth)
        for member in group.members:
            self.member(group, member, depth + 1, split=False)
        self._close_outer(group, depth)
        if arrays:
            self.emit("}", depth - 1)

    def split_inner(self, group: FusedGroup) -> None:
        self.emit("const int kiln_nt = omp_get_max_threads();", 2)
        for i, member in enumerate(group.members):
            if member.role is Role.REDUCTION:
                acc = self._acc_dtype(group, member)
                # one slot per thread (never std::vector<bool>: its packed bits race between threads)
                self.emit(f"kiln_array<{CTYPES[acc]}> part{i}(kiln_nt);", 2)
                if member.buffer.data.reduction_type in ("argmax", "argmin"):
                    self.emit(f"kiln_array<int64_t> parti{i}(kiln_nt);", 2)
        self.emit("#pragma omp parallel", 2)
        self.emit("{", 2)
        self.emit("const int kiln_tid = omp_get_thread_num();", 3)
        self._outer_header(group, 3)
        for i, member in enumerate(group.members):
            self.member(group, member, 4, split=True, slot=i)
        self._close_outer(group, 3)
        self.emit("}", 2)

    # what kiln.codegen.cpp_columns writes through
    def ctype(self, dtype: torch.dtype) -> str:
        return CTYPES[dtype]

    def handler(self, group: FusedGroup, depth: int, local: dict[str, str], inner_index: str) -> CppHandler:
        return CppHandler(self.buffers, self.pointers, group.var_ranges(), "  " * depth, local, inner_index)

    def acc_type(self, group: FusedGroup, member: Member) -> tuple[torch.dtype, str]:
        """A (non-arg) reduction member's accumulator dtype and the C++ of its initial value."""
        dtype = self._acc_dtype(group, member)
        return dtype, _init(member.buffer.data.reduction_type, dtype)

    def store(self, group: FusedGroup, member: Member, value: str, depth: int) -> None:
        self._store(group, member, value, depth)

    def local_ctype(self, dtype: torch.dtype) -> str:
        """The C++ type of a kernel-local buffer's elements (float for the half types)."""
        return reg_ctype(dtype)

    def local_value(self, value: str, dtype: torch.dtype) -> str:
        """C++ of `value` as an element of a kernel-local buffer of `dtype` (a half type's: rounded, as it
        would be stored in memory; an accumulator is not yet)."""
        return round_half(f"static_cast<float>({value})", dtype) if dtype in HALF_TYPES else \
            f"static_cast<{CTYPES[dtype]}>({value})"

    def _body(self, group: FusedGroup, member: Member, depth: int) -> CppValue:
        handler = CppHandler(self.buffers, self.pointers, group.var_ranges(), "  " * depth, group.local,
                             _inner_linear(group))
        index, rindex = group.member_index(member)
        if member.role is Role.REDUCTION:
            value = member.buffer.data.fn(handler, index, rindex)
        else:
            value = member.buffer.data.fn(handler, index)
        self.lines.extend(handler.lines)
        return value

    def _store(self, group: FusedGroup, member: Member, value: str, depth: int) -> None:
        buf = member.buffer
        kind = group.local.get(buf.name)
        if kind is not None:
            target = f"loc_{buf.name}" + (f"[{_inner_linear(group)}]" if kind == "array" else "")
            self.emit(f"{target} = {self.local_value(value, buf.dtype)};", depth)
            return
        index = simplify_index(sympy.expand(group.store_index(member)), group.var_ranges())
        bounds = index_bounds(index, group.var_ranges())
        size = buf.layout.storage_size()
        if not _inside(bounds, size):
            if not is_static((bounds, size, index)):  # not provable for every size: compile per size
                raise SizeDecision(f"cpp codegen: store to {buf.name} at {index} within its {size} elements "
                                   "is not proved for every size")
            # never write outside a buffer: a kiln bug must fail the compile (the graph then runs on torch)
            raise RuntimeError(f"kiln cpp codegen: store to {buf.name} at {index} may leave its {size} "
                               f"elements (bounds {bounds}) in {group.describe()}")
        self.emit(store_code(f"{self.pointers[buf.name]}[{cexpr(index)}]", value, buf.dtype), depth)

    def _inner_loops(self, group: FusedGroup, depth: int, pragma: str | None, split: bool = False,
                     block: str | None = None) -> int:
        """Open the inner loops (the innermost gets `pragma`). Split across threads: a single loop is cut
        into one contiguous chunk per thread (in thread order, so reductions combine deterministically);
        nested loops share their outermost one with `omp for`. With `block` (a C type), the innermost loop
        runs in blocks of BLOCK elements, each summed into a fresh `accb` of that type (see `reduction`)."""
        inner = group.inner or ()
        if split and len(inner) == 1:
            size = csize(inner[0])
            self.emit("const int64_t kiln_chunk = "
                      f"({size} + omp_get_num_threads() - 1) / omp_get_num_threads();", depth)
            self.emit(f"const int64_t kiln_lo = kiln_imin({size}, kiln_tid * kiln_chunk);", depth)
            self.emit(f"const int64_t kiln_hi = kiln_imin({size}, kiln_lo + kiln_chunk);", depth)
            return self._innermost(0, "kiln_lo", "kiln_hi", pragma, block, depth)
        for d, size in enumerate(inner):
            if split and d == 0:
                self.emit("#pragma omp for schedule(static)", depth)
            if d == len(inner) - 1:
                return self._innermost(d, "0", csize(size), pragma, block, depth)
            self.emit(f"for (int64_t r{d} = 0; r{d} < {csize(size)}; ++r{d}) {{", depth)
            depth += 1
        return depth

    def _innermost(self, d: int, lo: str, hi: str, pragma: str | None, block: str | None, depth: int) -> int:
        if block is not None:
            self.emit(f"for (int64_t rb{d} = {lo}; rb{d} < {hi}; rb{d} += {BLOCK}) {{", depth)
            self.emit(f"{block} accb = {block}(0);", depth + 1)
            self.emit(f"const int64_t re{d} = kiln_imin({hi}, rb{d} + {BLOCK});", depth + 1)
            depth += 1
            lo, hi = f"rb{d}", f"re{d}"
        if pragma:
            self.emit(pragma, depth)
        self._innermost_bounds = (lo, hi)
        self.emit(f"for (int64_t r{d} = {lo}; r{d} < {hi}; ++r{d}) {{", depth)
        return depth + 1

    def _close(self, group: FusedGroup, depth: int) -> None:
        for _ in group.inner or ():
            depth -= 1
            self.emit("}", depth)

    def member(self, group: FusedGroup, member: Member, depth: int, split: bool, slot: int = 0) -> None:
        inner = group.inner or ()
        if member.role is Role.OUTER:
            if split:
                self.emit("#pragma omp single", depth)
            self.emit("{", depth)
            value = self._body(group, member, depth + 1)
            self._store(group, member, str(value), depth + 1)
            self.emit("}", depth)
            return
        if member.role is Role.SCAN:
            self.scan(group, member, depth)
            return
        if member.role is Role.INNER:
            stream = self._stream_target(group, member)
            if stream is not None:
                self.streamed(group, member, depth, split, stream)
                return
            self.emit("{", depth)
            inner_depth = self._inner_loops(group, depth + 1, "#pragma omp simd", split)
            value = self._body(group, member, inner_depth)
            self._store(group, member, str(value), inner_depth)
            self._close(group, inner_depth)
            if split and len(inner) == 1:
                self.emit("#pragma omp barrier", depth + 1)  # later members read other threads' chunks
            self.emit("}", depth)
            return
        self.reduction(group, member, depth, split, slot)

    def _stream_target(self, group: FusedGroup, member: Member) -> str | None:
        """C++ address of the member's first element in the innermost loop (`r{d}` replaced by `rt`),
        when its store should go through a tile and non-temporal stores: a large output, written
        contiguously along the innermost loop."""
        buf = member.buffer
        inner = group.inner or ()
        if not inner or buf.name in group.local:
            return None
        if hint(buf.layout.storage_size()) * buf.dtype.itemsize < STREAM_BYTES:
            return None
        if hint(inner[-1]) < STREAM_TILE // 4:
            return None
        ranges = group.var_ranges()
        index = simplify_index(sympy.expand(group.store_index(member)), ranges)
        bounds = index_bounds(index, ranges)
        if not _inside(bounds, buf.layout.storage_size()):
            return None  # the plain store path refuses it loudly
        r = group.inner_vars()[-1]
        if r not in index.free_symbols or sympy.expand(index.subs(r, r + 1) - index) != 1:
            return None
        rt = sympy.Symbol("rt", integer=True)
        return f"{self.pointers[buf.name]} + {cexpr(sympy.expand(index.subs(r, rt)))}"

    def streamed(self, group: FusedGroup, member: Member, depth: int, split: bool, target: str) -> None:
        """An inner member whose innermost loop runs in tiles of STREAM_TILE elements: each tile is computed
        into a stack array (vectorized as usual), then copied to the output with non-temporal stores."""
        inner = group.inner or ()
        d = len(inner) - 1
        buf = member.buffer
        # (a half type's tile holds its bits: uint16_t)
        ctype = "uint16_t" if buf.dtype in HALF_TYPES else CTYPES[buf.dtype]
        self.emit("{", depth)
        loop_depth = self._inner_loops(group, depth + 1, None, split)
        # _inner_loops opened `for (r{d} = lo; r{d} < hi; ++r{d}) {`: turn it into the tile loop
        self.lines.pop()
        lo, hi = self._innermost_bounds
        tile_depth = loop_depth - 1
        self.emit(f"for (int64_t rt = {lo}; rt < {hi}; rt += {STREAM_TILE}) {{", tile_depth)
        self.emit(f"const int64_t rte = kiln_imin({hi}, rt + {STREAM_TILE});", loop_depth)
        self.emit(f"alignas({self.target.vector_bytes}) {ctype} kiln_tile[{STREAM_TILE}];", loop_depth)
        self.emit("#pragma omp simd", loop_depth)
        self.emit(f"for (int64_t r{d} = rt; r{d} < rte; ++r{d}) {{", loop_depth)
        value = self._body(group, member, loop_depth + 1)
        tile = f"kiln_tile[r{d} - rt]"
        if buf.dtype in HALF_TYPES:
            self.emit(f"{tile} = {HALF_TO_BITS[buf.dtype]}({value});", loop_depth + 1)
        else:
            self.emit(f"{tile} = static_cast<{ctype}>({value});", loop_depth + 1)
        self.emit("}", loop_depth)
        self.emit(f"kiln_stream_store({target}, kiln_tile, (rte - rt) * sizeof({ctype}));", loop_depth)
        self.emit("}", tile_depth)
        # order the non-temporal stores before any barrier (an `omp for` ends in one) lets others read them
        self.emit("kiln_stream_fence();", tile_depth)
        for level in range(tile_depth - 1, tile_depth - len(inner), -1):
            self.emit("}", level)  # the enclosing inner loops
        if split and len(inner) == 1:
            self.emit("#pragma omp barrier", depth + 1)  # later members read other threads' chunks
        self.emit("}", depth)

    def scan(self, group: FusedGroup, member: Member, depth: int) -> None:
        """Inclusive scan along the inner loop, in order (floats accumulate in double, as eager)."""
        data = member.buffer.data
        dtype = member.buffer.dtype
        acc = torch.float64 if dtype.is_floating_point else dtype
        self.emit("{", depth)
        self.emit(f"{CTYPES[acc]} acc = {_init(data.scan_type, acc)};", depth + 1)
        inner_depth = self._inner_loops(group, depth + 1, None)
        value = self._body(group, member, inner_depth)
        self.emit(_combine(data.scan_type, "acc", f"static_cast<{CTYPES[acc]}>({value})", CTYPES[acc]),
                  inner_depth)
        self._store(group, member, "acc", inner_depth)
        self._close(group, inner_depth)
        self.emit("}", depth)

    def _acc_dtype(self, group: FusedGroup, member: Member) -> torch.dtype:
        data: Reduction = member.buffer.data
        if data.reduction_type in ("argmax", "argmin"):
            # an arg reduction accumulates values of its input's dtype: find it by a dry run
            probe = CppHandler(self.buffers, self.pointers, group.var_ranges(), "", group.local)
            index, rindex = group.member_index(member)
            dtype = data.fn(probe, index, rindex).dtype
            return torch.float32 if dtype in HALF_TYPES else dtype
        return _acc_type(data.reduction_type, member.buffer.dtype)

    def reduction(self, group: FusedGroup, member: Member, depth: int, split: bool, slot: int) -> None:
        data: Reduction = member.buffer.data
        rtype = data.reduction_type
        buf: ComputedBuffer = member.buffer
        acc_dtype = _acc_type(rtype, buf.dtype)
        inner = group.inner or ()
        self.emit("{", depth)
        depth += 1
        is_arg = rtype in ("argmax", "argmin")
        acc_dtype = self._acc_dtype(group, member)
        actype = CTYPES[acc_dtype]
        self.emit(f"{actype} acc = {_init('max' if rtype == 'argmax' else rtype, acc_dtype)};", depth)
        if is_arg:
            self.emit("int64_t acci = 0;", depth)
        blocked = rtype == "sum" and acc_dtype == torch.float64 and buf.dtype == torch.float32
        if blocked:
            pragma = "#pragma omp simd reduction(+:accb)"
        elif rtype == "sum" and not is_arg:
            pragma = "#pragma omp simd reduction(+:acc)"
        elif rtype == "prod":
            pragma = "#pragma omp simd reduction(*:acc)"
        elif rtype in ("max", "min") and acc_dtype.is_floating_point:
            # a plain max/min (one vector op per step) plus a NaN flag: the NaN-propagating select chain
            # of kiln_max is a long loop-carried dependency and made softmax's max pass latency-bound
            self.emit("int accn = 0;", depth)
            pragma = f"#pragma omp simd reduction({rtype}:acc) reduction(|:accn)"
        elif rtype in ("max", "min"):
            pragma = f"#pragma omp simd reduction(k{rtype}:acc)"
        else:
            pragma = None
        inner_depth = self._inner_loops(group, depth, pragma, split, "float" if blocked else None)
        value = self._body(group, member, inner_depth)
        if is_arg:
            strides = contiguous_strides(inner)
            rlin = " + ".join(f"r{d} * {csize(s)}" for d, s in enumerate(strides)) or "0"
            self.emit(f"kiln_{rtype}<{actype}>(acc, acci, {value}, {rlin});", inner_depth)
        elif blocked:
            self.emit(f"accb = accb + static_cast<float>({value});", inner_depth)
        elif rtype in ("max", "min") and acc_dtype.is_floating_point:
            self.emit(f"const {actype} kv = static_cast<{actype}>({value});", inner_depth)
            self.emit(f"acc = kv {'>' if rtype == 'max' else '<'} acc ? kv : acc;", inner_depth)
            self.emit(f"accn |= ({is_nan('kv')});", inner_depth)
        else:
            self.emit(_combine(rtype, "acc", f"static_cast<{actype}>({value})", actype), inner_depth)
        if blocked:
            self.emit("}", inner_depth - 1)
            self.emit("acc = acc + static_cast<double>(accb);", inner_depth - 1)
            inner_depth -= 1
        self._close(group, inner_depth)
        if rtype in ("max", "min") and acc_dtype.is_floating_point:
            self.emit(f"if (accn) acc = {cconst(math.nan, acc_dtype)};", depth)
        result = "acci" if is_arg else "acc"
        if split:
            self.emit(f"part{slot}[kiln_tid] = acc;", depth)
            if is_arg:
                self.emit(f"parti{slot}[kiln_tid] = acci;", depth)
            self.emit("#pragma omp barrier", depth)
            self.emit("#pragma omp single", depth)
            self.emit("{", depth)
            self.emit(f"{actype} total = part{slot}[0];", depth + 1)
            if is_arg:
                self.emit(f"int64_t totali = parti{slot}[0];", depth + 1)
            self.emit("for (int t = 1; t < omp_get_num_threads(); ++t) {", depth + 1)
            if is_arg:
                self.emit(f"kiln_{rtype}<{actype}>(total, totali, part{slot}[t], parti{slot}[t]);", depth + 2)
            else:
                self.emit(_combine(rtype, "total", f"part{slot}[t]", actype), depth + 2)
            self.emit("}", depth + 1)
            self._store(group, member, "totali" if is_arg else "total", depth + 1)
            self.emit("}", depth)
        else:
            self._store(group, member, result, depth)
        depth -= 1
        self.emit("}", depth)


def _loads_through_index(group: FusedGroup) -> bool:
    return any(m.buffer.loads_through_index() for m in group.members)


def _inside(bounds: tuple | None, size: Any) -> bool:
    """Index bounds [lo, hi] inside a buffer of `size` elements (proved for every size when symbolic); an
    empty buffer is never written."""
    if isinstance(size, int) and size <= 0:
        return True
    if bounds is None:
        return False
    if is_static((bounds, size)):
        return bounds[0] >= 0 and bounds[1] < size
    return nonnegative(bounds[0]) and known_lt(bounds[1], size)


TIMES_PARAM = "kiln_times"  # the profiling entry's extra parameter: one double per kernel
ERROR_FLAG = "kiln_err"  # an entry's result: 1 where a loaded index fell outside its dim (kiln_index)
BAD_FLAG = "kiln_bad"  # the same, per outer iteration of a kernel (a private local g++ vectorizes around)


def _inner_linear(group: FusedGroup) -> str:
    strides = contiguous_strides(group.inner or ())
    return " + ".join(f"r{d} * {csize(s)}" for d, s in enumerate(strides)) or "0"


def segment_source(entry: str, groups: list[FusedGroup], args: list[str], buffers: dict[str, Buffer],
                   aliases: dict[str, str] | None = None, target: Target = CPP_TARGET,
                   timing: bool = False, sizes: list | None = None) -> str:
    """The C++ of one `extern "C"` entry running `groups` in order; `args` name its pointer parameters,
    `sizes` the symbolic sizes it takes after them (`const int64_t s0`: what the kernels' loops and index
    expressions read).

    `aliases` maps a buffer written in place to the parameter (of the same dtype) it is stored through.
    With `timing` (the profiling compile of kiln.profile) the entry takes one more parameter, `double*
    kiln_times`, and stores there each kernel's wall seconds, in order; without it no timing code is emitted.
    """
    pointers = {name: f"p_{name}" for name in args}
    pointers.update({name: f"p_{target}" for name, target in (aliases or {}).items()})
    writer = KernelWriter(buffers, pointers, target)
    params = [f"{CTYPES[buffers[n].dtype]}* __restrict__ p_{n}" for n in args]
    if timing:
        params.append(f"double* __restrict__ {TIMES_PARAM}")
    params += [f"const int64_t {s.name}" for s in sizes or ()]
    writer.lines.append(f'extern "C" int {entry}({", ".join(params)}) {{')
    head = len(writer.lines)
    for k, group in enumerate(groups):
        if timing:  # omp_get_wtime: a monotonic wall clock, from <omp.h> which every source includes
            writer.emit(f"const double kiln_t{k} = omp_get_wtime();", 1)
        writer.kernel(group)
        if timing:
            writer.emit(f"{TIMES_PARAM}[{k}] = omp_get_wtime() - kiln_t{k};", 1)
    if any(_loads_through_index(group) for group in groups):
        writer.lines.insert(head, f"  int {ERROR_FLAG} = 0;")
        writer.lines.append(f"  return {ERROR_FLAG};")
    else:
        writer.lines.append("  return 0;")
    writer.lines.append("}")
    return "\n".join(writer.lines)

