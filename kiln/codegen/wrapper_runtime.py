"""What a generated wrapper (kiln.codegen.wrapper) calls at run time: its helpers, its buffer pool, the
callables it holds as constants, and the ctypes entry points of its kernels.

Apart from the generator because a graph-cache hit (kiln.backends.graph_cache) runs a stored wrapper with
these alone: nothing here imports the loop IR or sympy (a symbolic extern call imports sympy when called).
The constants a wrapper holds must pickle: `StructureBuilder` and `ExternCall` take templates whose
buffers and views are `SLOT`s, filled in order by the tensors of each call.
"""
from __future__ import annotations

import ctypes
import os
import sys
import weakref
from typing import Any, Callable

import torch

from .. import config
from ..counters import counters
from ..graph import map_structure
from ..graph.interpreter import write_back
from ..graph.lazy import is_basic
from ..graph.symbolic import has_symbols, substitute


def _restride(t: torch.Tensor, strides: tuple) -> torch.Tensor:
    """`t` with the given strides (a copy unless it already has them: a size-1 dim's stride, which no
    address uses, may differ — torch picks those by its own rules, at a batch of 1 for instance)."""
    have = tuple(t.stride())
    if t.layout != torch.strided or have == strides or t.numel() <= 1:
        return t
    if all(a == b or n == 1 for a, b, n in zip(have, strides, t.shape)):
        return t
    out = torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def _view(t: torch.Tensor, shape: tuple, strides: tuple, offset: int) -> torch.Tensor:
    """A strided view of `t`'s memory: `offset` counts from `t`'s first element (as the kernels' pointers
    do), not from the start of its storage — an input or constant may itself be a view into a larger one."""
    return t.as_strided(shape, strides, t.storage_offset() + offset)


_use_count = getattr(torch._C, "_storage_Use_Count", None)

# Fresh buffers of at least HUGE_BYTES ask the kernel for transparent huge pages before their first touch:
# a 64 MB output then takes 32 page faults instead of 16384 (eager a*b into a fresh tensor: 28 ms -> 8 ms
# on one thread). Advisory only: where madvise or THP is missing the call does nothing.
HUGE_BYTES = 4 << 20
_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14


def _load_madvise() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_madvise = _load_madvise()


def _fresh(shape: tuple, strides: tuple, dtype: torch.dtype) -> torch.Tensor:
    """`torch.empty_strided`, with the whole huge pages inside a large buffer advised MADV_HUGEPAGE."""
    t = torch.empty_strided(shape, strides, dtype=dtype)
    if _madvise is not None:
        start = t.data_ptr()
        end = start + t.untyped_storage().nbytes()
        lo = (start + _HUGE_PAGE - 1) // _HUGE_PAGE * _HUGE_PAGE
        hi = end // _HUGE_PAGE * _HUGE_PAGE
        if hi > lo:
            _madvise(lo, hi - lo, _MADV_HUGEPAGE)
    return t


def _storage_refs(t: torch.Tensor) -> int:
    """Python references to `t`'s storage object, as seen from here (torch keeps one object per storage)."""
    storage = t.untyped_storage()
    return sys.getrefcount(storage)


# What `_storage_refs` gives for a tensor nobody else touches (depends on how torch preserves the object).
_FREE_STORAGE_REFS = _storage_refs(torch.empty(1))


class BufferPool:
    """The buffers one generated wrapper freed, by name, kept for its next call."""

    def __init__(self) -> None:
        self.buffers: dict[str, torch.Tensor] = {}
        self.nbytes = 0
        _POOLS.add(self)

    def clear(self) -> None:
        global _kept_bytes
        _kept_bytes -= self.nbytes
        self.buffers.clear()
        self.nbytes = 0

    def __del__(self) -> None:
        global _kept_bytes
        try:
            _kept_bytes -= self.nbytes
        except (NameError, TypeError):  # at interpreter exit the module may be gone
            pass


_POOLS: "weakref.WeakSet[BufferPool]" = weakref.WeakSet()
_kept_bytes = 0  # held by all pools together


def pooled_bytes() -> int:
    """Bytes of buffers the wrappers keep across calls now (all pools)."""
    return _kept_bytes


def release_pools() -> None:
    """Free every buffer the wrappers keep across calls (their next call allocates afresh)."""
    for pool in list(_POOLS):
        pool.clear()


def _keep(pool: BufferPool, name: str, t: torch.Tensor, nbytes: int) -> None:
    """Keep `t` for the next call, unless the pools would then hold more than `pool_max_bytes`."""
    global _kept_bytes
    limit = config.get("pool_max_bytes")
    if name in pool.buffers or 0 <= limit < _kept_bytes + nbytes:
        return
    pool.buffers[name] = t
    pool.nbytes += nbytes
    _kept_bytes += nbytes


def _recycle(pool: BufferPool, name: str, nbytes: int) -> torch.Tensor | None:
    """The tensor this graph made for `name` last call, if nothing else references it or its memory.

    Freshly mapped memory page-faults on first touch, which costs more than a memory-bound kernel's
    arithmetic; reusing a buffer the caller has dropped avoids that. Safe: the Python object has no other
    reference (getrefcount: our local and the call's argument) and no weak reference; its storage no other
    tensor (views, numpy arrays: use count is this tensor and the storage object) and its storage object no
    other holder (`out.untyped_storage()` kept by the caller).
    """
    global _kept_bytes
    t = pool.buffers.pop(name, None)
    if t is None:
        return None
    pool.nbytes -= nbytes
    _kept_bytes -= nbytes
    if _use_count is None:
        return None
    if sys.getrefcount(t) == 2 and weakref.getweakrefcount(t) == 0 and \
            _use_count(t.untyped_storage()._cdata) == 2 and _storage_refs(t) == _FREE_STORAGE_REFS:
        return t
    return None


def _arena(pool: BufferPool, key: str, nbytes: int) -> torch.Tensor:
    """Bytes for a run's arena (kiln.codegen.cpp_native): the one this wrapper kept from its last call where
    it is large enough (taken out of the pool while in use, so a nested or concurrent call makes its own),
    else a new one. Nothing outside the run ever sees it."""
    global _kept_bytes
    t = pool.buffers.pop(key, None)
    if t is not None:
        pool.nbytes -= t.numel()
        _kept_bytes -= t.numel()
        if t.numel() >= nbytes:
            return t
    return torch.empty((max(nbytes, 1),), dtype=torch.uint8)


def _keep_arena(pool: BufferPool, key: str, t: torch.Tensor) -> None:
    """Keep a run's arena for the next call where it is at least `pool_min_bytes` (a smaller one costs less
    to allocate than to keep, as any buffer)."""
    if t.numel() >= config.get("pool_min_bytes"):
        _keep(pool, key, t, t.numel())


def _index_error(checks: tuple) -> None:
    """Raise eager's error for the first index outside its dim among `checks` ((kind, index tensor, size,
    dim, wrap) of the lookups a segment made, in program order), after a kernel reported one."""
    counters["cpp"]["index out of range (eager's error raised)"] += 1
    for kind, index, size, dim, wrap in checks:
        flat = index.reshape(-1)
        low = -size if wrap else 0
        bad = ((flat < low) | (flat >= size)).nonzero()
        if bad.numel():
            value = int(flat[int(bad[0])])
            if kind == "index_select":
                raise IndexError("index out of range in self")
            error = RuntimeError if kind == "gather" else IndexError
            raise error(f"index {value} is out of bounds for dimension {dim} with size {size}")
    raise IndexError("index out of range in self")


_SGEMM: list = []


def blas_sgemm() -> int | None:
    """The address of BLAS's `sgemm_` in torch's CPU library (the routine its float32 matmul calls), or None
    where torch's library exports none. Looked up once per process."""
    if not _SGEMM:
        address = None
        try:
            lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
            address = ctypes.cast(lib.sgemm_, ctypes.c_void_p).value
        except (OSError, AttributeError):
            address = None
        _SGEMM.append(address)
    return _SGEMM[0]


def helper_globals() -> dict[str, Any]:
    """The globals every wrapper reads besides its own constants (a fresh buffer pool each time)."""
    return {"torch": torch, "_restride": _restride, "_recycle": _recycle, "_fresh": _fresh, "_view": _view,
            "_write_back": write_back, "_keep": _keep, "_pool": BufferPool(),
            "_bump_version": torch.autograd.graph.increment_version, "_linear": torch.nn.functional.linear,
            "_index_error": _index_error, "_sgemm": blas_sgemm(), "_arena": _arena,
            "_keep_arena": _keep_arena}


# globals a wrapper gets from its compile rather than from its source's constants
HELPER_NAMES = frozenset(helper_globals()) | {"_fallback", "_kiln_now", "_kiln_timing"}


class _Slot:
    """Where a template holds a buffer or a view: each call puts its tensor there."""

    def __reduce__(self) -> str:
        return "SLOT"

    def __repr__(self) -> str:
        return "SLOT"


SLOT = _Slot()


class StructureBuilder:
    """The output structure: each `SLOT` of its template replaced, in order, by a tensor."""

    def __call__(self, template: Any, tensors: list) -> Any:
        it = iter(tensors)
        return map_structure(lambda v: next(it) if v is SLOT else v, template)


class ExternCall:
    """An extern call whose arguments are rebuilt per call: each `SLOT` of the template replaced, in order,
    by the tensors passed; with `symbolic`, the first argument holds the call's symbolic sizes."""

    def __init__(self, target: Callable[..., Any], template: tuple, symbolic: bool, symbols: list):
        self.target, self.template, self.symbolic, self.symbols = target, template, symbolic, symbols

    def __call__(self, *tensors: Any) -> Any:
        if self.symbolic:
            sizes, tensors = tensors[0], tensors[1:]
            args, kwargs = _at_sizes(self.template, dict(zip(self.symbols, sizes)))
        else:
            args, kwargs = self.template
        it = iter(tensors)
        args, kwargs = map_structure(lambda v: next(it) if v is SLOT else v, (args, kwargs))
        return self.target(*args, **kwargs)


def _at_sizes(template: Any, values: dict) -> Any:
    """An extern's arguments with each symbolic size (a SymInt of the graph, or an expression the lowering
    made) evaluated at this call's sizes."""
    import sympy
    subs = {s: sympy.Integer(v) for s, v in values.items()}

    def leaf(v: Any) -> Any:
        if is_basic(v):
            return int(v.xreplace(subs))
        return substitute(v, values) if has_symbols(v) else v
    return map_structure(leaf, template)



def load_entry(lib: ctypes.CDLL, name: str, nargs: int, nsizes: int = 0) -> Any:
    """The ctypes function of a segment: `nargs` pointers, then `nsizes` int64 symbolic sizes."""
    fn = getattr(lib, name)
    fn.argtypes = [ctypes.c_void_p] * nargs + [ctypes.c_int64] * nsizes
    fn.restype = ctypes.c_int
    return fn
