"""Runs: consecutive steps of a memory plan called as one C++ entry, matrix products inside them.

A compiled graph's wrapper used to make one ctypes call per segment of kernels and one torch call per
extern; between them, Python. For a small graph (a decode step of a language model) that glue costs more
than the kernels. Here:

- **Native products.** A float32 `mm`, `addmm` (the biased Linear, `torch.addmm` from lower.patterns) or
  `bmm` extern whose operands are views of kiln's buffers calls BLAS's `sgemm_` from C++: the very routine
  torch's CPU matmul calls, given the same transposition and leading dimensions torch derives from the
  strides (aten's `addmm_impl_cpu_`), so a product's values are eager's. The bias is copied into the result
  first and the product added (beta 1), as torch does. Operands BLAS cannot take (a stride that is no
  leading dimension) go through a plain loop in C++ instead; torch copies them first.
- **Runs.** Consecutive plan steps that are segments or native products become one `extern "C"` entry
  (`kiln_runN`) calling each in order: one ctypes call where there were several ctypes and torch calls. The
  wrapper allocates every buffer of a run's steps before the call and frees them after it, so a run holds
  at most `native_run_max_bytes` of fresh buffers beyond its first step's (a longer one is cut).

`sgemm_`'s address comes from torch's own library at run time (`kiln.codegen.wrapper_runtime.blas_sgemm`),
passed as the run's first argument: nothing links against torch, and a cached library holds no address.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import sympy
import torch

from ..graph.layout import is_contiguous
from ..graph.symbolic import SymInt
from ..lower.ir import BufferRef, ExternNode, LoopGraph, ViewRef
from ..lower.sizes import hint
from ..schedule.memory import Plan, Segment, Step
from .cpp import CTYPES, ERROR_FLAG, TIMES_PARAM, cexpr

GEMM_TARGETS = ("prims.mm", "prims.addmm", "torch.addmm", "prims.bmm")
SGEMM_PARAM = "kiln_sgemm"
ARENA_PARAM = "kiln_arena"

# C++ of the product helper (in the header of a source that calls it)
HEADER_GEMM = r"""
typedef void (*kiln_sgemm_fn)(const char*, const char*, const int*, const int*, const int*, const float*,
                              const float*, const int*, const float*, const int*, const float*, float*,
                              const int*);

// A matrix of rows x cols (element (i, j) at i * sr + j * sc) as BLAS's column-major operand op(X): 'n' with
// X the matrix itself, 't' with X its transpose; false where no leading dimension fits (aten's rule).
static inline bool kiln_blas_operand(int64_t rows, int64_t cols, int64_t sr, int64_t sc, char* op,
                                     int64_t* ld) {
  const int64_t one = 1;
  if (sr == 1 && sc >= (rows > one ? rows : one)) { *op = 'n'; *ld = sc; return true; }
  if (sc == 1 && sr >= (cols > one ? cols : one)) { *op = 't'; *ld = sr; return true; }
  return false;
}

// c (m x n, at i * cr + j * cc) = a (m x k, at i * ar + p * ac) @ b (k x n, at p * br + j * bc) + beta * c
static void kiln_gemm(void* fn, int64_t m, int64_t n, int64_t k, const float* a, int64_t ar, int64_t ac,
                      const float* b, int64_t br, int64_t bc, float* c, int64_t cr, int64_t cc, float beta) {
  if (m <= 0 || n <= 0) return;
  const int64_t one = 1, big = 2147483647;
  bool blas = true;
  if (cr == 1 && (n == 1 || cc >= (m > one ? m : one))) {
    // c column-major as it is
  } else if (cc == 1 && (m == 1 || cr >= (n > one ? n : one))) {
    // c row-major: compute c^T = b^T a^T, column-major
    int64_t t = m; m = n; n = t;
    const float* tp = a; a = b; b = tp;
    t = ar; ar = bc; bc = t;
    t = ac; ac = br; br = t;
    t = cr; cr = cc; cc = t;
  } else {
    blas = false;
  }
  char opa = 'n', opb = 'n';
  int64_t lda = 0, ldb = 0;
  blas = blas && k > 0 && m < big && n < big && k < big && cc < big && cc >= (m > one ? m : one) &&
         kiln_blas_operand(m, k, ar, ac, &opa, &lda) && kiln_blas_operand(k, n, br, bc, &opb, &ldb) &&
         lda < big && ldb < big;
  if (blas) {
    const int im = (int)m, in = (int)n, ik = (int)k, ilda = (int)lda, ildb = (int)ldb, ildc = (int)cc;
    const float alpha = 1.0f;
    ((kiln_sgemm_fn)fn)(&opa, &opb, &im, &in, &ik, &alpha, a, &ilda, b, &ildb, &beta, c, &ildc);
    return;
  }
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      float acc = 0.0f;
      for (int64_t p = 0; p < k; p++) acc += a[i * ar + p * ac] * b[p * br + j * bc];
      float* out = c + i * cr + j * cc;
      *out = beta == 0.0f ? acc : *out + acc;
    }
}

// c (m x n) = the bias (n, at j * bs) in every row
static inline void kiln_fill_rows(int64_t m, int64_t n, const float* bias, int64_t bs, float* c, int64_t cr,
                                  int64_t cc) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) c[i * cr + j * cc] = bias[j * bs];
}
"""


@dataclasses.dataclass(frozen=True)
class Operand:
    """A product's operand or result: `storage`'s pointer plus `offset` elements, with `shape`/`strides`."""

    storage: str
    offset: Any
    shape: tuple
    strides: tuple


@dataclasses.dataclass(frozen=True)
class NativeGemm:
    """A float32 product an extern node computes, called through BLAS from a run: out = a @ b (+ bias)."""

    node: str
    a: Operand
    b: Operand
    out: Operand
    bias: Operand | None  # (n,), copied into each row of `out` before the product is added


@dataclasses.dataclass
class Run:
    """Consecutive plan steps (`steps`, their indices) called as one C++ entry `name`.

    Buffers born and dead inside the run (with every buffer that reuses their memory) live in its arena:
    one block of bytes the wrapper passes (kept across calls with the wrapper's pool), each such buffer at
    `arena[name]` bytes into it, so the wrapper makes no tensor for them at all."""

    name: str
    steps: list[int]
    args: list[str]  # pointer parameters after the sgemm address, in order
    gemm: bool  # takes the sgemm address first
    arena: dict[str, Any] = dataclasses.field(default_factory=dict)  # buffer -> byte offset (sizes' expr)
    arena_bytes: Any = 0


def _size(v: Any) -> Any:
    return v.expr if isinstance(v, SymInt) else v


def _operand(graph: LoopGraph, ref: Any) -> Operand | None:
    """The operand a buffer or view names, where it is float32 memory of kiln's (not a concatenation's)."""
    if isinstance(ref, BufferRef):
        buf = graph.buffers.get(ref.name)
        if buf is None or buf.layout.offset != 0:
            return None
        shape, strides, offset = tuple(buf.layout.shape), tuple(buf.layout.strides), 0
    elif isinstance(ref, ViewRef):
        buf = graph.buffers.get(ref.name)
        shape, strides, offset = tuple(ref.shape), tuple(ref.strides), ref.offset
    else:
        return None
    if buf is None or buf.dtype != torch.float32 or graph.storage_of(ref.name) != ref.name:
        return None
    return Operand(ref.name, _size(offset), tuple(_size(s) for s in shape), tuple(_size(s) for s in strides))


def native_gemm(graph: LoopGraph, node: ExternNode) -> NativeGemm | None:
    """The product `node` computes as a BLAS call from C++, or None where it stays a torch call."""
    if node.kind != "extern" or node.target_name not in GEMM_TARGETS or node.multi_output or \
            len(node.outputs) != 1:
        return None
    bias = None
    if node.target_name in ("prims.mm", "prims.bmm") and len(node.args) == 2 and not node.kwargs:
        a, b = node.args
    elif node.target_name == "prims.addmm" and len(node.args) == 3 and not node.kwargs:
        bias, a, b = node.args
    elif node.target_name == "torch.addmm" and len(node.args) == 3 and set(node.kwargs) == {"shape"}:
        bias, a, b = node.args
    else:
        return None
    ops = [_operand(graph, x) for x in (a, b)]
    out = graph.buffers[node.outputs[0].name]
    if any(o is None for o in ops) or out.dtype != torch.float32 or out.layout.offset != 0 or \
            graph.storage_of(out.name) != out.name:
        return None
    a_op, b_op = ops
    rank = 3 if node.target_name == "prims.bmm" else 2
    if len(a_op.shape) != rank or len(b_op.shape) != rank:
        return None
    result = Operand(out.name, 0, tuple(_size(s) for s in out.layout.shape),
                     tuple(_size(s) for s in out.layout.strides))
    if node.target_name == "torch.addmm":  # the 2-d product viewed as `shape`: a row-major result only
        m, n = a_op.shape[0], b_op.shape[1]
        rows = tuple(_size(s) for s in out.layout.shape)
        if not is_contiguous(rows, result.strides) or sympy.expand(sympy.Mul(*rows) - m * n) != 0 or \
                sympy.expand(rows[-1] - n) != 0:
            return None
        result = Operand(out.name, 0, (m, n), (n, 1))
    if len(result.shape) != rank:
        return None
    bias_op = None
    if bias is not None:
        bias_op = _operand(graph, bias)
        if bias_op is None or len(bias_op.shape) != 1:
            return None
    return NativeGemm(node.name, a_op, b_op, result, bias_op)


def step_allocs(step: Step, gemms: dict[str, NativeGemm]) -> list[tuple[str, str | None]]:
    """A step's allocations as the wrapper makes them: the plan's, and a native product's result (a torch
    extern's result was torch's own allocation)."""
    if isinstance(step.node, ExternNode) and step.node.name in gemms:
        return step.allocs + [(o.name, None) for o in step.node.outputs]
    return step.allocs


def native_gemms(graph: LoopGraph, plan: Plan) -> dict[str, NativeGemm]:
    """The plan's extern steps that run as BLAS calls from C++, by node name."""
    found = {}
    for step in plan.steps:
        if isinstance(step.node, ExternNode):
            spec = native_gemm(graph, step.node)
            if spec is not None:
                found[step.node.name] = spec
    return found


def plan_runs(graph: LoopGraph, plan: Plan, gemms: dict[str, NativeGemm], max_bytes: int) -> list[Run]:
    """Runs of two or more consecutive segments and native products (or one native product alone), each
    holding at most `max_bytes` of fresh buffers beyond its first step's."""
    runs: list[Run] = []
    current: list[int] = []
    held = 0
    taken_at = {reuse: i for i, step in enumerate(plan.steps) for _, reuse in step.allocs if reuse is not None}

    def close() -> None:
        steps = list(current)
        current.clear()
        if not steps or (len(steps) == 1 and isinstance(plan.steps[steps[0]].node, Segment)):
            return
        arena, arena_bytes = _arena(graph, plan, gemms, steps, taken_at)
        args, gemm = _pointers(plan, gemms, steps)
        runs.append(Run(f"run{len(runs)}", steps, [a for a in args if a not in arena], gemm, arena, arena_bytes))

    for i, step in enumerate(plan.steps):
        node = step.node
        runnable = isinstance(node, Segment) or node.name in gemms
        if not runnable:
            close()
            continue
        fresh = sum(hint(graph.buffers[name].nbytes()) for name, reuse in step_allocs(step, gemms)
                    if reuse is None)
        if current and held + fresh > max_bytes:
            close()
        held = held + fresh if current else 0
        current.append(i)
    close()
    return runs


def _arena(graph: LoopGraph, plan: Plan, gemms: dict[str, NativeGemm], steps: list[int],
           taken_at: dict[str, int]) -> tuple[dict, Any]:
    """The run's arena: each block of memory (a fresh buffer and those that reuse it, kiln.schedule.memory)
    whose buffers are all allocated and freed by the run's steps, none kept, none a concatenation's memory.
    Blocks are laid out by item size, largest first, so each starts aligned to its type (static sizes are
    padded to 64 bytes). `taken_at`: the step carving a buffer from each freed one."""
    windowed = {graph.storage_of(n) for n in graph.buffers if graph.storage_of(n) != n}
    # an index a kernel loads through stays a tensor: a bad index value is found in it by the wrapper
    checked = {c.index for i in steps if isinstance(plan.steps[i].node, Segment)
               for g in plan.steps[i].node.groups for m in g.members
               for c in graph.index_checks.get(m.buffer.name, ())}
    root: dict[str, str] = {}
    members: dict[str, list[str]] = {}
    freed: set[str] = set()
    for i in steps:
        step = plan.steps[i]
        for name, reuse in step_allocs(step, gemms):
            if reuse is None:
                root[name] = name
                members[name] = [name]
            elif reuse in root:  # (memory of a buffer allocated before the run stays a tensor)
                root[name] = root[reuse]
                members[root[name]].append(name)
        freed.update(step.frees)
    # memory a step outside the run takes over (a buffer carved from a freed one) stays a tensor
    inside = set(steps)
    taken = {name for name, i in taken_at.items() if i not in inside}
    blocks = []
    for block, names in members.items():
        if any(n not in freed or n in plan.kept or n in windowed or n in checked or n in taken for n in names):
            continue
        buf = graph.buffers[block]
        blocks.append((-buf.dtype.itemsize, len(blocks), block, names))
    offsets: dict[str, Any] = {}
    at: Any = sympy.Integer(0)
    for _, _, block, names in sorted(blocks):
        size = sympy.sympify(graph.buffers[block].nbytes())
        if size.is_Integer:
            size = sympy.Integer((int(size) + 63) // 64 * 64)
        for n in names:
            offsets[n] = at
        at = sympy.expand(at + size)
    return offsets, at


def _pointers(plan: Plan, gemms: dict[str, NativeGemm], steps: list[int]) -> tuple[list[str], bool]:
    """The buffers the run's steps take pointers to, in order, and whether any step is a product."""
    args: dict[str, None] = {}
    gemm = False
    for i in steps:
        node = plan.steps[i].node
        if isinstance(node, Segment):
            args.update(dict.fromkeys(node.args))
        else:
            spec = gemms[node.name]
            gemm = True
            for op in (spec.a, spec.b, spec.out, spec.bias):
                if op is not None:
                    args[op.storage] = None
    return list(args), gemm


def _gemm_lines(spec: NativeGemm, timing: str | None) -> list[str]:
    """C++ statements computing one product (with `timing`, its seconds into that array's slot 0)."""
    def ptr(op: Operand) -> str:
        return f"p_{op.storage} + ({cexpr(sympy.sympify(op.offset))})"

    def dims(op: Operand) -> list[str]:
        return [cexpr(sympy.sympify(s)) for s in op.strides]
    a, b, out = spec.a, spec.b, spec.out
    lines = ["{"]
    if timing:
        lines.append("  const double kiln_t = omp_get_wtime();")
    batched = len(out.shape) == 3
    m, k = (cexpr(sympy.sympify(s)) for s in a.shape[-2:])
    n = cexpr(sympy.sympify(b.shape[-1]))
    sa, sb, sc = dims(a), dims(b), dims(out)
    indent = "  "
    if batched:
        lines.append(f"  for (int64_t kiln_q = 0; kiln_q < {cexpr(sympy.sympify(out.shape[0]))}; kiln_q++) {{")
        indent = "    "
        pa, pb, pc = (f"{ptr(x)} + kiln_q * ({s[0]})" for x, s in ((a, sa), (b, sb), (out, sc)))
        sa, sb, sc = sa[1:], sb[1:], sc[1:]
    else:
        pa, pb, pc = ptr(a), ptr(b), ptr(out)
    beta = "0.0f"
    if spec.bias is not None:
        bs = cexpr(sympy.sympify(spec.bias.strides[0]))
        lines.append(f"{indent}kiln_fill_rows({m}, {n}, {ptr(spec.bias)}, {bs}, {pc}, {sc[0]}, {sc[1]});")
        beta = "1.0f"
    lines.append(f"{indent}kiln_gemm({SGEMM_PARAM}, {m}, {n}, {k}, {pa}, {sa[0]}, {sa[1]}, {pb}, {sb[0]}, "
                 f"{sb[1]}, {pc}, {sc[0]}, {sc[1]}, {beta});")
    if batched:
        lines.append("  }")
    if timing:
        lines.append(f"  {timing}[0] = omp_get_wtime() - kiln_t;")
    lines.append("}")
    return lines


def run_source(run: Run, plan: Plan, graph: LoopGraph, gemms: dict[str, NativeGemm], flagged: set[str],
               timing: bool, sizes: list) -> str:
    """The C++ of a run's entry: each segment's entry called in turn (a segment whose kernels reported a bad
    index ends the run there, its flag the result), each product computed in place."""
    params = [f"void* {SGEMM_PARAM}"] if run.gemm else []
    params += [f"{CTYPES[graph.buffers[n].dtype]}* p_{n}" for n in run.args]
    if run.arena:
        params.append(f"char* {ARENA_PARAM}")
    if timing:
        params += [f"double* {TIMES_PARAM}{i}" for i in run.steps]
    params += [f"const int64_t {s.name}" for s in sizes]
    lines = [f'extern "C" int kiln_{run.name}({", ".join(params)}) {{']
    for n, offset in run.arena.items():
        ctype = CTYPES[graph.buffers[n].dtype]
        lines.append(f"  {ctype}* p_{n} = reinterpret_cast<{ctype}*>({ARENA_PARAM} + {cexpr(offset)});")
    for i in run.steps:
        node = plan.steps[i].node
        if isinstance(node, Segment):
            call = [f"p_{a}" for a in node.args] + ([f"{TIMES_PARAM}{i}"] if timing else [])
            call += [s.name for s in sizes]
            text = f"kiln_{node.name}({', '.join(call)})"
            if node.name in flagged:
                lines.append(f"  if (int {ERROR_FLAG} = {text}) return {ERROR_FLAG};")
            else:
                lines.append(f"  {text};")
        else:
            lines += ["  " + line for line in _gemm_lines(gemms[node.name],
                                                          f"{TIMES_PARAM}{i}" if timing else None)]
    lines += ["  return 0;", "}"]
    return "\n".join(lines)
