"""Frames kiln runs natively still have their callees captured.

A frame that kiln can neither capture nor resume (a graph break inside a loop or a try block) runs as
CPython runs it. Without a frame-evaluation hook, every function it calls would then run natively too,
and one unsupported line would cost every frame below it. `routed_function(fn, caller)` is a copy of fn
whose calls go through `caller` (the capture wrapper, `cache.CalleeCaller`), so each Python callee is
captured as its own frame.

The copy's bytecode differs from the original only at call sites. Each is overwritten in place by a jump
to a trampoline appended after the original code:

    LOAD_METHOD name             JUMP_FORWARD t; NOP...    t: LOAD_ATTR name; PUSH_NULL; SWAP 2; JUMP_BACKWARD
    [KW_NAMES k] PRECALL n; CALL n
                                 JUMP_FORWARD t; NOP...    t: SWAP n+1; LOAD_CONST router; SWAP 2;
                                                              BINARY_SUBSCR; SWAP n+1; [KW_NAMES k];
                                                              PRECALL n; CALL n; JUMP_BACKWARD
    <x>; CALL_FUNCTION_EX        the same, with the function below its argument tuple (and dict)

`router[f]` is f itself for builtins, classes and library code, and a small callable that calls the
capture wrapper for user functions, bound methods and modules. After the LOAD_METHOD rewrite every
callable sits directly above a NULL, which is what lets the trampoline reach it with SWAP. The routing
runs before KW_NAMES because a Python call between KW_NAMES and CALL would lose the keyword names.
Original instructions keep their offsets, so jumps, the exception table and the line table stay valid;
each trampoline gets line-table and exception-table entries copied from the instructions it replaces.
"""
from __future__ import annotations

import dis
import os
import sysconfig
import types
import weakref
from typing import Any

import torch

from ..counters import counters
from .bytecode import PY, cache_entries
from .resume import _write_varint, exception_entries

_OP = dis.opmap
_EXT = _OP["EXTENDED_ARG"]
_NOP = _OP["NOP"]
_JUMP_OPS = set(dis.hasjrel) | set(dis.hasjabs)
_NB_SUBSCR = next((i for i, (_, sym) in enumerate(dis._nb_ops) if sym == "[]"), None)  # type: ignore[attr-defined]
# instructions that may be moved into a trampoline in front of CALL_FUNCTION_EX (no jumps, no position)
_MOVABLE = {_OP[n] for n in ("LOAD_FAST", "LOAD_DEREF", "LOAD_CONST", "LOAD_GLOBAL", "LOAD_ATTR", "BUILD_MAP",
                             "BUILD_TUPLE", "BUILD_LIST", "LIST_TO_TUPLE", "DICT_MERGE", "DICT_UPDATE",
                             "LIST_EXTEND", "BINARY_SUBSCR", "LOAD_CLOSURE", "COPY", "BUILD_CONST_KEY_MAP",
                             "CALL_INTRINSIC_1", "LOAD_FAST_CHECK", "LOAD_FAST_LOAD_FAST", "LOAD_FAST_BORROW",
                             "LOAD_FAST_BORROW_LOAD_FAST_BORROW", "LOAD_SMALL_INT", "PUSH_NULL")
            if n in _OP}
_CO_GENERATOR_LIKE = 0x20 | 0x80 | 0x100 | 0x200
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_STDLIB_DIRS = tuple({sysconfig.get_paths()["stdlib"] + os.sep, sysconfig.get_paths()["platstdlib"] + os.sep})
# a venv's platstdlib is the venv's lib/pythonX.Y, which holds site-packages: installed libraries
# (transformers, timm) are user code, not the standard library
_SITE_MARKERS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
_KILN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class Routed:
    """A callee of a natively-run frame, called through the capture wrapper. It carries the callee's
    __module__ and __qualname__, which CPython prints in call errors (`f() argument after * must be ...`)."""

    def __init__(self, fn: Any, caller: Any):
        self.fn = fn
        self.caller = caller
        self.__module__ = getattr(fn, "__module__", None) or ""
        self.__qualname__ = getattr(fn, "__qualname__", None) or type(fn).__qualname__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.caller(self.fn, *args, **kwargs)


class Router:
    """`router[f]`: the callable a routed call site calls instead of f.

    It holds the caller weakly: the router is a constant of the routed code, and code objects are not
    tracked by the cyclic garbage collector, so a strong reference would make the cycle routed function ->
    code -> router -> caller -> (its captures' entries) -> routed function uncollectable, keeping a dropped
    model alive. The routed function holds the caller (`routed_function`)."""

    __slots__ = ("caller_ref",)

    def __init__(self, caller: Any):
        self.caller_ref = weakref.ref(caller)

    @property
    def caller(self) -> Any:
        return self.caller_ref()  # (alive while the routed function runs: it holds the caller)

    def __getitem__(self, fn: Any) -> Any:
        if routable(fn):
            caller = self.caller
            if caller is not None:
                return Routed(fn, caller)
        return fn


def _user_file(code: types.CodeType) -> bool:
    name = code.co_filename
    # code made by exec or a notebook (`<ipython-input-...>`) is the user's; kiln's entries are not
    if name.startswith(_TORCH_DIR) or name.startswith(_KILN_DIR) or name.startswith(("<kiln", "<frozen")):
        return False
    return not name.startswith(_STDLIB_DIRS) or any(marker in name for marker in _SITE_MARKERS)


MAX_CLOSURES = 4
_closures_seen: dict[types.CodeType, set[tuple]] = {}


def _few_closures(fn: types.FunctionType) -> bool:
    """A function made anew on every call (a lambda or inner function with a fresh closure) would be
    captured anew on every call: after MAX_CLOSURES distinct closures of one code it runs natively."""
    if not fn.__closure__:
        return True
    seen = _closures_seen.setdefault(fn.__code__, set())
    key = tuple(id(c) for c in fn.__closure__)
    if key in seen:
        return True
    if len(seen) >= MAX_CLOSURES:
        counters["callees_run_natively"][f"{fn.__qualname__} ({fn.__code__.co_filename}:"
                                         f"{fn.__code__.co_firstlineno}): a new closure on every call"] += 1
        return False
    seen.add(key)
    return True


def routable(fn: Any) -> bool:
    """User Python functions, their bound methods, and modules other than torch's own leaf modules."""
    kind = type(fn)
    if kind is types.MethodType:
        fn = fn.__func__
        kind = type(fn)
    if kind is types.FunctionType:
        return not fn.__code__.co_flags & _CO_GENERATOR_LIKE and _user_file(fn.__code__) and \
            _few_closures(fn)
    if isinstance(fn, torch.nn.Module):
        if type(fn).__module__.startswith("torch.nn.modules"):
            return bool(fn._modules)  # Sequential, ModuleList users: their children get captured
        return True
    return False


class _Inst:
    __slots__ = ("start", "op", "arg", "units", "body")

    def __init__(self, start: int, op: int, arg: int, units: int, body: int):
        self.start = start  # first code unit, EXTENDED_ARG prefixes included
        self.op = op
        self.arg = arg
        self.units = units  # all code units: prefixes, the instruction, its caches
        self.body = body  # unit of the instruction itself


def _decode(co_code: bytes) -> list[_Inst]:
    out = []
    i = 0
    start = 0
    ext = 0
    n = len(co_code) // 2
    while i < n:
        op, arg = co_code[2 * i], co_code[2 * i + 1]
        if op == _EXT:
            ext = (ext | arg) << 8
            i += 1
            continue
        full = ext | arg
        ext = 0
        units = i - start + 1 + cache_entries(op)
        out.append(_Inst(start, op, full, units, i))
        i = start = start + units
    return out


def _emit(op: int, arg: int = 0) -> bytes:
    """One instruction with the EXTENDED_ARG prefixes its argument needs, and zeroed caches."""
    prefix = bytearray()
    shifts = []
    value = arg >> 8
    while value:
        shifts.append(value & 0xFF)
        value >>= 8
    for byte in reversed(shifts):
        prefix += bytes((_EXT, byte))
    return bytes(prefix) + bytes((op, arg & 0xFF)) + bytes(2 * cache_entries(op))


def _jump_targets(code: types.CodeType) -> set[int]:
    targets = set()
    for inst in dis.get_instructions(code):
        if inst.opcode in _JUMP_OPS and isinstance(inst.argval, int):
            targets.add(inst.argval // 2)
    for entry in dis._parse_exception_table(code):  # type: ignore[attr-defined]
        targets.add(entry.target // 2)
    return targets


def _route(depth: int, router_index: int) -> bytes:
    """Replace the callable `depth` slots from the top of the stack with router[callable]."""
    out = bytearray()
    if depth > 1:
        out += _emit(_OP["SWAP"], depth)
    # router[callable]: BINARY_SUBSCR, a binary op on 3.14
    subscript = _emit(_OP["BINARY_SUBSCR"]) if "BINARY_SUBSCR" in _OP else _emit(_OP["BINARY_OP"], _NB_SUBSCR)
    out += _emit(_OP["LOAD_CONST"], router_index) + _emit(_OP["SWAP"], 2) + subscript
    if depth > 1:
        out += _emit(_OP["SWAP"], depth)
    return bytes(out)


def _copy(code: bytes, inst: _Inst) -> bytes:
    return code[2 * inst.start:2 * (inst.start + inst.units)]


def _sites(code: types.CodeType, insts: list[_Inst], router_index: int) -> list[tuple[int, int, list]]:
    """(window start unit, window units, [(trampoline bytes, origin unit)]) for each call site."""
    raw = code.co_code
    targets = _jump_targets(code)
    sites = []
    for k, inst in enumerate(insts):
        name = dis.opname[inst.op]
        if name == "LOAD_METHOD" or (PY == (3, 12) and name in ("LOAD_ATTR", "LOAD_SUPER_ATTR") and inst.arg & 1):
            # (3.11-3.12: a method load leaves (method, self); made (NULL, bound method) like every call)
            load = _emit(_OP["LOAD_ATTR"], inst.arg) if name == "LOAD_METHOD" else _emit(inst.op, inst.arg & ~1)
            body = load + _emit(_OP["PUSH_NULL"]) + _emit(_OP["SWAP"], 2)
            sites.append((inst.start, inst.units, [(body, inst.body)]))
        elif name == "CALL" and PY < (3, 12) and k >= 1 and dis.opname[insts[k - 1].op] == "PRECALL":
            precall = insts[k - 1]
            first = k - 1
            if k >= 2 and dis.opname[insts[k - 2].op] == "KW_NAMES":
                first = k - 2
            window = insts[first:k + 1]
            if any(w.start in targets for w in window[1:]):
                continue
            parts = [(_route(precall.arg + 1, router_index), inst.body)]
            parts += [(_copy(raw, w), w.body) for w in window]
            sites.append((window[0].start, sum(w.units for w in window), parts))
        elif name in ("CALL", "CALL_KW") and PY >= (3, 12):
            first = k
            if k >= 1 and dis.opname[insts[k - 1].op] == ("KW_NAMES" if PY == (3, 12) else "LOAD_CONST") and \
                    (name == "CALL_KW" or PY == (3, 12)):
                first = k - 1  # (the keyword names come with the call: the route goes before them)
            elif name == "CALL_KW":
                continue
            window = insts[first:k + 1]
            if any(w.start in targets for w in window[1:]):
                continue
            # the callable: above its NULL on 3.12, below it (or the self it was loaded with) on 3.13+
            depth = inst.arg + (1 if PY == (3, 12) else 2)
            parts = [(_route(depth, router_index), inst.body)]
            parts += [(_copy(raw, w), w.body) for w in window]
            sites.append((window[0].start, sum(w.units for w in window), parts))
        elif name == "CALL_FUNCTION_EX" and k >= 1:
            prev = insts[k - 1]
            if prev.op not in _MOVABLE or inst.start in targets:
                continue
            # (args[, kwargs]) above the callable, and its NULL on 3.13+; 3.14 always has the kwargs slot
            depth = (3 if inst.arg & 1 or PY >= (3, 14) else 2) + (0 if PY < (3, 13) else 1)
            parts = [(_copy(raw, prev), prev.body), (_route(depth, router_index), inst.body),
                     (_copy(raw, inst), inst.body)]
            sites.append((prev.start, prev.units + inst.units, parts))
    return sites


def _line_of_units(code: types.CodeType) -> dict[int, int | None]:
    lines: dict[int, int | None] = {}
    for start, end, line in code.co_lines():
        for unit in range(start // 2, end // 2):
            lines[unit] = line
    return lines


def _svarint(value: int) -> bytes:
    value = (value << 1) if value >= 0 else ((-value) << 1) | 1
    out = bytearray()
    while value >= 64:
        out.append((value & 63) | 64)
        value >>= 6
    out.append(value)
    return bytes(out)


def _skip_varint(table: bytes, i: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        b = table[i]
        i += 1
        value |= (b & 63) << shift
        shift += 6
        if not b & 64:
            return value, i


def _final_line(code: types.CodeType) -> int:
    """The line number the location table's state ends on (entries are deltas from it)."""
    table = code.co_linetable
    line = code.co_firstlineno
    i = 0
    while i < len(table):
        kind = (table[i] >> 3) & 15
        i += 1
        if kind == 15:
            continue
        if kind in (13, 14):
            raw, i = _skip_varint(table, i)
            line += -(raw >> 1) if raw & 1 else raw >> 1
            if kind == 14:
                for _ in range(3):
                    _, i = _skip_varint(table, i)
        elif kind >= 10:
            line += kind - 10
            i += 2
        else:
            i += 1
    return line


def _handlers(code: types.CodeType) -> list[tuple[int, int, int, int]]:
    """(start unit, end unit, target unit, depth << 1 | lasti) of the exception table."""
    return [(start, start + length, target, dl)
            for start, length, target, dl in exception_entries(code.co_exceptiontable)]


def routed_code(code: types.CodeType, router: Router) -> types.CodeType:
    """`code` with every call routed through `router` (see the module docstring)."""
    consts = code.co_consts + (router,)
    router_index = len(consts) - 1
    insts = _decode(code.co_code)
    sites = _sites(code, insts, router_index)
    body = bytearray(code.co_code)
    n_units = len(body) // 2
    tail = bytearray()
    origins: list[int] = []  # origin unit of each trampoline unit
    for start, units, parts in sites:
        tramp = n_units + len(tail) // 2
        jump = None
        for size in (1, 2, 3):
            delta = tramp - (start + size)
            if len(_emit(_OP["JUMP_FORWARD"], delta)) // 2 == size:
                jump = _emit(_OP["JUMP_FORWARD"], delta)
                break
        if jump is None or len(jump) // 2 > units:
            continue
        piece = bytearray()
        piece_origins: list[int] = []
        for chunk, origin in parts:
            piece += chunk
            piece_origins += [origin] * (len(chunk) // 2)
        back_origin = parts[-1][1]
        end = start + units
        for size in (1, 2, 3, 4):  # (3.13+: JUMP_BACKWARD has a cache unit)
            delta = tramp + len(piece) // 2 + size - end
            if len(_emit(_OP["JUMP_BACKWARD"], delta)) // 2 == size:
                piece += _emit(_OP["JUMP_BACKWARD"], delta)
                piece_origins += [back_origin] * size
                break
        body[2 * start:2 * end] = jump + bytes((_NOP, 0)) * (units - len(jump) // 2)
        tail += piece
        origins += piece_origins
    if not tail:
        return code
    lines = _line_of_units(code)
    line_table = bytearray(code.co_linetable)
    state = _final_line(code)
    i = 0
    while i < len(origins):
        line = lines.get(origins[i])
        j = i
        while j < len(origins) and j - i < 8 and lines.get(origins[j]) == line:
            j += 1
        if line is None:
            line_table.append(0x80 | (15 << 3) | (j - i - 1))
        else:
            line_table.append(0x80 | (13 << 3) | (j - i - 1))
            line_table += _svarint(line - state)
            state = line
        i = j
    handlers = _handlers(code)
    exc_table = bytearray(code.co_exceptiontable)
    i = 0
    while i < len(origins):
        found = next((h for h in handlers if h[0] <= origins[i] < h[1]), None)
        j = i
        while j < len(origins) and next((h for h in handlers if h[0] <= origins[j] < h[1]), None) == found:
            j += 1
        if found is not None:
            exc_table += _write_varint(n_units + i, True) + _write_varint(j - i, False)
            exc_table += _write_varint(found[2], False) + _write_varint(found[3], False)
        i = j
    return code.replace(co_code=bytes(body + tail), co_consts=consts, co_stacksize=code.co_stacksize + 2,
                        co_linetable=bytes(line_table), co_exceptiontable=bytes(exc_table))


def routed_function(fn: types.FunctionType, caller: Any) -> types.FunctionType:
    """A copy of fn whose calls go through `caller`; fn itself when its code cannot be routed."""
    code = fn.__code__
    if code.co_flags & _CO_GENERATOR_LIKE:
        return fn
    new = types.FunctionType(routed_code(code, Router(caller)), fn.__globals__, fn.__name__, fn.__defaults__,
                             fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    new.__dict__.update(fn.__dict__)
    new.__dict__["__kiln_caller__"] = caller  # (the router holds it weakly)
    return new
