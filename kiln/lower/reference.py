"""The reference handler: loop bodies executed with torch, one whole iteration space at a time.

Index variables are int64 tensors broadcast over the iteration space (`grid((4,), (8,))` gives `i0` of shape
[4, 1] and `r0` of shape [1, 8]), so a body runs once per buffer, not once per element: `load` gathers from
the named buffer's flat storage at the evaluated index, the math runs as torch ops in the dtypes the body
names, `reduce` and `scan` fold the trailing (reduction) dims, `store` scatters into the buffer at its
layout. It is the meaning of the loop IR in executable form: the modules printed by
`kiln.lower.printer.loop_python` and `kiln.schedule.printer.schedule_python` run on it, and a kernel that
disagrees with it is wrong. Indices count elements from a tensor's first element (its data pointer), as
the kernels' pointers do. Loads and stores check their bounds; a `masked` branch's loads outside its
condition read element 0 instead (the branch's value there is discarded).
"""
from __future__ import annotations

import importlib
import math
from typing import Any, Callable, Sequence

import sympy
import torch

from ..graph.interpreter import write_back as _write_back
from ..graph.layout import storage_size
from .index import FloorDiv, ModularIndexing, index_var, linear_index
from .ir import ComputedBuffer, Reduction, Scan
from .ops import COMPARISONS, Handler

_TORCH_NAMES = {"shift_left": "bitwise_left_shift", "shift_right": "bitwise_right_shift"}
_HALF = (torch.float16, torch.bfloat16)


def floordiv(base: Any, divisor: Any) -> Any:
    """FloorDiv of the loop IR: integer division of a non-negative index (ints or int64 tensors)."""
    return base // divisor


def modular_indexing(base: Any, modulus: Any) -> Any:
    """ModularIndexing of the loop IR: `base % modulus` for a non-negative index."""
    return base % modulus


def evaluate_index(expr: Any, env: dict[sympy.Symbol, Any]) -> Any:
    """The value of an index expression with each loop variable bound to an int or an int64 tensor."""
    if not isinstance(expr, sympy.Basic):
        return expr
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        if expr not in env:
            raise NameError(f"index variable {expr} is not bound (bound: {sorted(map(str, env))})")
        return env[expr]
    args = [evaluate_index(a, env) for a in expr.args]
    if expr.is_Add:
        return sum(args[1:], args[0])
    if expr.is_Mul:
        return math.prod(args[1:], start=args[0])
    if expr.is_Pow and expr.exp.is_Integer and int(expr.exp) >= 0:
        return args[0] ** int(expr.exp)
    if isinstance(expr, FloorDiv):
        return floordiv(*args)
    if isinstance(expr, ModularIndexing):
        return modular_indexing(*args)
    raise NotImplementedError(f"reference: cannot evaluate index expression {expr} ({type(expr).__name__})")


def resolve(path: str) -> Any:
    """The object a printed module names: `prims.NAME` (the prim's reference implementation), a dotted name
    under `torch`, or `module:qualname`."""
    if path.startswith("prims."):
        from ..prims.registry import PRIMS
        return PRIMS[path[len("prims."):]].ref
    if ":" in path:
        module, qualname = path.split(":", 1)
        obj: Any = importlib.import_module(module)
        parts = qualname.split(".")
    else:
        obj, parts = torch, path.split(".")[1:]
        if not path.startswith("torch."):
            raise ValueError(f"reference: cannot resolve {path!r} (expected prims.X, torch.X or module:name)")
    for part in parts:
        obj = getattr(obj, part)
    return obj


def rebuild(cls: type, state: dict, slots: dict | None = None) -> Any:
    """An instance of `cls` with these attributes, made without calling its constructor (as unpickling
    makes it): how a printed module spells an object an extern takes, such as a wrapped torch op."""
    obj = cls.__new__(cls)
    if state:
        obj.__dict__.update(state)
    for name, value in (slots or {}).items():
        setattr(obj, name, value)
    return obj


def unprintable(what: str) -> Callable[..., Any]:
    """Stands where the printer met an object it cannot spell; calling it says which."""
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"the printed loop IR cannot call {what}: it has no importable name")
    return fail


def _poison(dtype: torch.dtype) -> Any:
    """What a fresh buffer holds before it is written (a read before the write shows)."""
    if dtype.is_floating_point:
        return float("nan")
    if dtype == torch.bool:
        return True
    return torch.iinfo(dtype).max


def _identity(rtype: str, dtype: torch.dtype) -> Any:
    """A reduction's value over no elements (what the C++ kernel's accumulator starts from)."""
    if rtype in ("sum", "any"):
        return 0
    if rtype in ("prod", "all"):
        return 1
    if rtype in ("argmax", "argmin"):
        return 0
    if dtype == torch.bool:
        return rtype == "min"
    if dtype.is_floating_point:
        return -math.inf if rtype == "max" else math.inf
    info = torch.iinfo(dtype)
    return info.min if rtype == "max" else info.max


def _accumulator(kind: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype a sum, product or scan accumulates in (as the C++ kernels do)."""
    if dtype in _HALF:
        return torch.float32
    if dtype == torch.float32:
        return torch.float64
    if dtype == torch.bool:
        return torch.int64
    return dtype


class Reference(Handler):
    """Runs loop bodies with torch over whole iteration spaces; holds the buffers by name."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}  # name -> the strided tensor (what externs see)
        self.flat: dict[str, torch.Tensor] = {}  # name -> 1-D view from the tensor's first element
        self.shape: tuple[int, ...] = ()  # the current iteration space
        self.reduced = 0  # how many trailing dims of it `reduce` folds
        self.env: dict[sympy.Symbol, torch.Tensor] = {}  # loop variables, for sympy index expressions
        self._masks: list[torch.Tensor] = []
        self.direct = False  # running a body directly (`compute`): index expressions are sympy

    # -- buffers --
    def input(self, name: str, tensor: torch.Tensor, shape: tuple, strides: tuple,
              dtype: torch.dtype) -> None:
        """Bind a graph input or constant; its layout must be the one the IR was lowered for."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"input {name}: expected a tensor, got {type(tensor).__name__}")
        # a size-1 dim's stride is never multiplied by anything but 0
        moved = any(size > 1 and a != b for size, a, b in zip(shape, tensor.stride(), strides))
        if tuple(tensor.shape) != tuple(shape) or tensor.dtype != dtype or moved:
            raise ValueError(f"input {name}: the loop IR was lowered for {dtype}{list(shape)} strides "
                             f"{tuple(strides)}, got {tensor.dtype}{list(tensor.shape)} strides "
                             f"{tuple(tensor.stride())}")
        self._bind(name, tensor, strides)

    def allocate(self, name: str, shape: tuple, strides: tuple, dtype: torch.dtype, offset: int = 0) -> None:
        """A fresh buffer with exactly this layout (filled with a poison value until written)."""
        flat = torch.full((storage_size(shape, strides, offset),), _poison(dtype), dtype=dtype)
        self.tensors[name] = flat.as_strided(shape, strides, offset)
        self.flat[name] = flat

    def window(self, name: str, storage: str, shape: tuple, strides: tuple, offset: int) -> None:
        """Name a window of an allocated buffer's memory (a concatenation's part or a run of its parts):
        its indices count from the storage's first element, as its IR layout's offset does."""
        flat = self.flat[storage]
        self.flat[name] = flat
        self.tensors[name] = flat.as_strided(shape, strides, flat.storage_offset() + offset)

    def _bind(self, name: str, tensor: torch.Tensor, strides: tuple) -> None:
        self.tensors[name] = tensor
        size = storage_size(tuple(tensor.shape), tuple(strides))
        self.flat[name] = tensor.as_strided((size,), (1,), tensor.storage_offset())

    def tensor(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    def view(self, name: str, shape: tuple, strides: tuple, offset: int) -> torch.Tensor:
        """A strided view of a buffer's memory, `offset` counted from where its indices count (the data
        pointer the kernels get: an input's first element, a fresh buffer's first slot), as the wrapper."""
        flat = self.flat[name]
        return flat.as_strided(shape, strides, flat.storage_offset() + offset)

    def extern(self, outputs: Sequence[tuple], target: Callable[..., Any], args: tuple, kwargs: dict,
               multi_output: bool = False) -> None:
        """Run a torch callable on whole tensors; `outputs` = (name, shape, strides, dtype) of each result.
        A result with other strides is copied to the declared ones (as the wrapper's `_restride`)."""
        result = target(*args, **kwargs)
        results = list(result) if multi_output else [result]
        if len(results) != len(outputs):
            raise ValueError(f"extern {target}: {len(results)} results for outputs {[o[0] for o in outputs]}")
        for (name, shape, strides, dtype), value in zip(outputs, results):
            if tuple(value.shape) != tuple(shape) or value.dtype != dtype:
                raise ValueError(f"extern {name}: expected {dtype}{list(shape)}, the call gave "
                                 f"{value.dtype}{list(value.shape)}")
            if value.numel() > 1 and tuple(value.stride()) != tuple(strides):
                fresh = torch.empty_strided(shape, strides, dtype=dtype)
                fresh.copy_(value)
                value = fresh
            self._bind(name, value, strides)

    @staticmethod
    def write_back(target: torch.Tensor, value: torch.Tensor) -> None:
        """A mutated input receives its final value (as the graph interpreter and the wrapper do)."""
        _write_back(target, value)

    def compute(self, buf: ComputedBuffer) -> None:
        """Allocate and compute a buffer by running its body directly (its index expressions stay sympy and
        are evaluated here): what the printed `ops.store(name, index, bufN(ops, i0, ...))` lines do."""
        data = buf.data
        index = [index_var("i", d) for d in range(len(data.ranges))]
        rindex = [index_var("r", d) for d in range(len(data.reduction_ranges))] if buf.is_reduction else []
        self.allocate(buf.name, buf.shape, buf.layout.strides, buf.dtype, buf.layout.offset)
        self.bind(index + rindex, self.grid(data.ranges, data.reduction_ranges if rindex else ()))
        self.direct = True
        try:
            if isinstance(data, Reduction):
                value = self.reduce(data.reduction_type, data.fn(self, index, rindex), buf.dtype)
            elif isinstance(data, Scan):
                value = self.scan(data.scan_type, data.fn(self, index), data.dim, buf.dtype)
            else:
                value = data.fn(self, index)
        finally:
            self.direct = False
        self.store(buf.name, linear_index(index, buf.layout.strides, buf.layout.offset), value)

    # -- iteration spaces --
    def grid(self, ranges: Sequence[int], reduction_ranges: Sequence[int] = ()) -> tuple[torch.Tensor, ...]:
        """One int64 tensor per loop variable, each varying along its own dim of the space."""
        shape = tuple(int(s) for s in ranges) + tuple(int(s) for s in reduction_ranges)
        self.shape, self.reduced = shape, len(reduction_ranges)
        variables = []
        for d, size in enumerate(shape):
            view = [1] * len(shape)
            view[d] = size
            variables.append(torch.arange(size, dtype=torch.int64).view(view))
        return tuple(variables)

    def bind(self, symbols: Sequence[sympy.Symbol], values: Sequence[torch.Tensor]) -> None:
        """Name the loop variables for bodies run directly (their index expressions are sympy)."""
        self.env = dict(zip(symbols, values))

    def _index(self, index: Any) -> torch.Tensor:
        if isinstance(index, sympy.Basic):
            index = evaluate_index(index, self.env)
        return torch.as_tensor(index, dtype=torch.int64)

    @staticmethod
    def _value(v: Any) -> torch.Tensor:
        return v if isinstance(v, torch.Tensor) else torch.as_tensor(v)

    def _check_bounds(self, what: str, name: str, index: torch.Tensor, size: int) -> None:
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= size):
            raise IndexError(f"{what} {name}: index in [{int(index.min())}, {int(index.max())}] leaves its "
                             f"{size} elements")

    def store(self, name: str, index: Any, value: Any) -> None:
        """Write `value` at `index` of a buffer. The value may be constant along a dim of the space where
        the index varies (it is broadcast), not the other way round (one element would be written twice)."""
        flat = self.flat[name]
        index, value = self._index(index), self._value(value)
        shape = torch.broadcast_shapes(index.shape, value.shape)
        padded = (1,) * (len(shape) - index.dim()) + tuple(index.shape)
        if any(i == 1 and s > 1 for i, s in zip(padded, shape)):
            raise ValueError(f"store {name}: the value varies along a dim of {list(shape)} where the index "
                             f"{list(index.shape)} does not: one element would be written more than once")
        index = index.expand(shape)
        self._check_bounds("store", name, index, flat.numel())
        flat[index] = value.expand(shape).to(flat.dtype)

    # -- the scalar op set --
    def load(self, name: str, index: Any) -> torch.Tensor:
        flat = self.flat[name]
        index = self._index(index)
        if 0 in self.shape:  # an empty space reads nothing (its index may still name elements)
            return torch.zeros(torch.broadcast_shapes(index.shape, self.shape), dtype=flat.dtype)
        if self._masks:
            mask = self._masks[-1]
            if flat.numel() == 0:  # an empty buffer: no lane may be live
                shape = torch.broadcast_shapes(mask.shape, index.shape)
                if bool(mask.expand(shape).any()):
                    raise IndexError(f"load {name}: reads an empty buffer where its condition holds")
                return torch.zeros(shape, dtype=flat.dtype)
            index = torch.where(mask, index, 0)
        self._check_bounds("load", name, index, flat.numel())
        return flat[index]

    def constant(self, value: Any, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(value, dtype=dtype)

    def index_expr(self, expr: Any, dtype: torch.dtype) -> torch.Tensor:
        return self._index(expr).to(dtype)

    def to_dtype(self, x: Any, dtype: torch.dtype) -> torch.Tensor:
        return self._value(x).to(dtype)

    def indirect(self, value: Any, size: Any, wrap: bool = False) -> Any:
        """The checked index (a tensor over the space): an index outside the dim where the current
        condition holds raises IndexError; elsewhere it reads as 0. A body run directly (`compute`) gets a
        symbol bound to it, for its sympy index expressions."""
        index = self._value(value).to(torch.int64)
        size = int(evaluate_index(sympy.sympify(size), self.env))
        if wrap:
            index = torch.where(index < 0, index + size, index)
        outside = (index < 0) | (index >= size)
        if bool((outside & self._masks[-1] if self._masks else outside).any()):
            raise IndexError(f"indirect index out of range for a dim of size {size}")
        index = torch.where(outside, 0, index)
        if not self.direct:
            return index
        symbol = super().indirect(value, size, wrap)
        self.env[symbol] = index
        return symbol

    def masked(self, cond: Any, body: Callable[[], Any], other: Callable[[], Any], dtype: torch.dtype) -> Any:
        """`body()` where cond holds, else `other()`: both run, each with its loads kept in bounds."""
        cond = self._value(cond).to(torch.bool)
        outer = self._masks[-1] if self._masks else None
        inside, outside = (cond, ~cond) if outer is None else (cond & outer, ~cond & outer)
        self._masks.append(inside)
        try:
            taken = self._value(body())
        finally:
            self._masks.pop()
        self._masks.append(outside)
        try:
            otherwise = self._value(other())
        finally:
            self._masks.pop()
        return torch.where(cond, taken.to(dtype), otherwise.to(dtype))

    def op(self, name: str, *args: Any) -> torch.Tensor:
        args = tuple(self._value(a) for a in args)
        if name == "where":
            cond, a, b = args
            return torch.where(cond.to(torch.bool), a, b.to(a.dtype))
        first = args[0]
        out = torch.bool if name in COMPARISONS else first.dtype
        if first.dtype == torch.bool and name in ("abs", "sign"):
            return first
        if name == "div" and not first.dtype.is_floating_point:
            result = torch.div(first, args[1], rounding_mode="trunc")
        else:
            fn = getattr(torch, _TORCH_NAMES.get(name, name), None)
            if fn is None:
                raise NotImplementedError(f"reference: no torch op for scalar op {name!r}")
            result = fn(*args)
        return result if result.dtype == out else result.to(out)

    # -- folds over the iteration space --
    def _rows(self, value: Any) -> tuple[torch.Tensor, tuple[int, ...]]:
        """`value` over the whole space, its reduced dims flattened into one: [outer..., n]."""
        outer = self.shape[:len(self.shape) - self.reduced]
        inner = self.shape[len(outer):]
        full = self._value(value).expand(self.shape)
        return full.reshape(outer + (math.prod(inner),)), outer

    def reduce(self, rtype: str, value: Any, dtype: torch.dtype) -> torch.Tensor:
        """Fold the reduced dims of the space (kept, as size 1); `dtype` is the result buffer's."""
        rows, outer = self._rows(value)
        keep = outer + (1,) * self.reduced
        if rows.shape[-1] == 0:
            fill_dtype = torch.int64 if rtype in ("argmax", "argmin") else dtype
            return torch.full(keep, _identity(rtype, rows.dtype), dtype=fill_dtype)
        if rtype in ("sum", "prod"):
            acc = _accumulator(rtype, dtype)
            fold = torch.sum if rtype == "sum" else torch.prod
            result = fold(rows.to(acc), -1, dtype=acc).to(dtype)
        elif rtype in ("max", "min"):
            result = (torch.amax if rtype == "max" else torch.amin)(rows, -1)
        elif rtype in ("argmax", "argmin"):
            rows = rows.float() if rows.dtype in _HALF else rows.to(torch.uint8) if rows.dtype == torch.bool \
                else rows
            result = (torch.argmax if rtype == "argmax" else torch.argmin)(rows, -1)
        elif rtype in ("any", "all"):
            result = (torch.any if rtype == "any" else torch.all)(rows.to(torch.bool), -1)
        else:
            raise NotImplementedError(f"reference: reduction {rtype!r}")
        return result.reshape(keep)

    def scan(self, scan_type: str, value: Any, dim: int, dtype: torch.dtype) -> torch.Tensor:
        """The inclusive scan of `value` along `dim` of the space; `dtype` is the result buffer's."""
        full = self._value(value).expand(self.shape)
        acc = _accumulator(scan_type, dtype)
        if scan_type == "sum":
            return torch.cumsum(full.to(acc), dim, dtype=acc).to(dtype)
        if scan_type == "prod":
            return torch.cumprod(full.to(acc), dim, dtype=acc).to(dtype)
        raise NotImplementedError(f"reference: scan {scan_type!r}")
