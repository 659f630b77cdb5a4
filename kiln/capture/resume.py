"""Resume functions: code objects that continue a frame at an instruction after a graph break.

A resume code object is the original code with a short prologue in front of it:

    COPY_FREE_VARS n          (when the function has free variables)
    RESUME 0
    PUSH_NULL / LOAD_FAST __stack_i   (rebuild the value stack, bottom first)
    EXTENDED_ARG hi; JUMP_FORWARD lo  (to the instruction where the frame continues)
    <the original bytecode, unchanged>

Its parameters are the locals live at that point followed by the stack values (`__stack_0`, ...). Locals
are renumbered so the parameters come first; jumps in 3.11 are relative, so the original bytecode keeps
working behind the prologue; the exception table is shifted by the prologue's length and the line table
gets entries for it at the function's first line. Tracebacks inside a resume function point at the user's
lines. Stack parameters get names unused by the code (a resume of a resume code already has `__stack_i`);
locals whose names are no identifiers (pytest's `@py_assert0`) get identifiers.
"""
from __future__ import annotations

import dis
import keyword
import re
import types
from typing import Any

from .bytecode import PY, cache_entries, closure, exception_table, flow, index_at, reachable
from .errors import GraphBreak

_OP = dis.opmap
_LOCAL_OPS = set(dis.haslocal)
_FREE_OPS = set(dis.hasfree)
CO_VARARGS, CO_VARKEYWORDS, CO_GENERATOR = 0x04, 0x08, 0x20
_PACKED = {"LOAD_FAST_LOAD_FAST", "STORE_FAST_LOAD_FAST", "STORE_FAST_STORE_FAST",
           "LOAD_FAST_BORROW_LOAD_FAST_BORROW"}
_NOT_RESUMABLE_FLAGS = 0x20 | 0x80 | 0x100 | 0x200  # generators, coroutines, async generators


class NotResumable(GraphBreak):
    """The frame broke where kiln cannot continue in a resume function; it runs natively instead."""


# A break inside a loop resumes in a resume code that continues the loop; when the next iteration breaks
# again, in a resume code of that one. Each is a capture of its own, and each resume runs inside the one
# before it (about three Python frames deeper each: 64 resumes add ~200 frames to the stack, a fifth of
# Python's recursion limit); past this many resumes of one frame the rest of a loop runs natively.
MAX_LOOP_RESUMES = 64
_DEPTH: dict[types.CodeType, int] = {}  # resume code -> how many resumes of its frame it is


def in_loop(code: types.CodeType, offset: int) -> bool:
    """Whether the instruction at `offset` (bytes) can run again: it is inside a loop."""
    here = index_at(code, offset)
    return here in closure(code, flow(code)[1][here])


def check_resumable(code: types.CodeType, offset: int, call: bool = True) -> None:
    """Raise NotResumable when a break at `offset` (bytes) cannot be resumed: inside a try or with block,
    in a generator, in a frame with cell variables, or inside a loop where the break is not at a call
    (`call`) or the frame was resumed MAX_LOOP_RESUMES times already. (A loop's iterator on the stack must
    also be one make_break_entry can pass on: stitch checks that.)"""
    if code.co_flags & _NOT_RESUMABLE_FLAGS:
        raise NotResumable("the break is in a generator or coroutine")
    if code.co_cellvars:
        names = ", ".join(code.co_cellvars)
        raise NotResumable(f"the frame has variables captured by inner functions ({names})")
    if any(start <= offset < end for start, end, *_ in exception_table(code)):
        raise NotResumable("the break is inside a try or with block")
    if in_loop(code, offset):
        if not call:
            raise NotResumable("the break is inside a loop, not at a call")
        if _DEPTH.get(code, 0) >= MAX_LOOP_RESUMES:
            raise NotResumable(f"the break is inside a loop and the frame was resumed {MAX_LOOP_RESUMES} "
                               "times already (the rest of the loop runs natively)")


def live_locals(code: types.CodeType, offset: int) -> set[str]:
    """Locals possibly read once the instruction at `offset` runs: read by an instruction reachable from it
    through jumps and handlers. (Not by offset order: 3.12+ moves an exit block that a handler shares with
    the code after it behind a backward jump; a local read only there was passed as unbound, and CPython's
    LOAD_FAST, which does not check, crashed on it.)"""
    return {inst.argval for inst in reachable(code, offset)
            if inst.opname in ("LOAD_FAST", "DELETE_FAST", "LOAD_FAST_AND_CLEAR")}


def resume_arguments(code: types.CodeType, local_names: tuple[str, ...]) -> tuple[str | None, ...]:
    """The local each leading parameter of a resume code of `code` receives, None for a local passed as
    None and unbound by the prologue (3.12+ keeps every local's slot; see `_build_in_place`)."""
    if PY < (3, 12):
        return local_names
    return tuple(n if n in local_names else None for n in code.co_varnames)


_RESUME_CODES: dict[tuple, types.CodeType] = {}


NULL_SLOT, VALUE_SLOT, ITER_SLOT = 0, 1, 2


def resume_code(code: types.CodeType, target: int, local_names: tuple[str, ...],
                stack: tuple[int, ...]) -> types.CodeType:
    """The code object continuing `code` at byte offset `target`.

    `local_names` become the first parameters; `stack` says for each stack slot (bottom first) whether it
    is a value (VALUE_SLOT: a parameter `__stack_i`), a NULL (NULL_SLOT: pushed by the prologue) or a loop's
    iterator (ITER_SLOT: the parameter is a tuple of the items it has left, and the prologue pushes
    `iter()` of it). Cached per arguments."""
    key = (code, target, local_names, stack)
    found = _RESUME_CODES.get(key)
    if found is None:
        build = _build if PY < (3, 12) else _build_in_place
        found = _RESUME_CODES[key] = build(code, target, local_names, stack)
        _DEPTH[found] = _DEPTH.get(code, 0) + 1
    return found


def _build_in_place(code: types.CodeType, target: int, local_names: tuple[str, ...],
                    stack: tuple[int, ...]) -> types.CodeType:
    """3.12+: every local keeps its slot and becomes a parameter (3.13's superinstructions pack two slots
    of at most 15 into one argument, so locals cannot be renumbered); the stack values follow them. The
    prologue unbinds the locals the frame had no value for."""
    if code.co_cellvars:
        raise NotResumable("the frame has cell variables")
    old_names = code.co_varnames
    n_old = len(old_names)
    stack_names = _fresh_names(sum(1 for slot in stack if slot), set(old_names))
    n_stack = len(stack_names)

    def shift(op: int, full: int) -> int | None:
        if dis.opname[op] in _PACKED:  # two slots of 4 bits each
            hi, lo = (v + n_stack if v >= n_old else v for v in (full >> 4, full & 15))
            if hi > 15 or lo > 15:
                raise NotResumable("the frame has too many local variables to renumber")
            return hi << 4 | lo
        if (op in _FREE_OPS or op in _LOCAL_OPS) and full >= n_old:
            # free variables follow the locals (3.13's LOAD_FAST of one pushes its cell)
            return full + n_stack
        return None
    body = _rewrite_args(code, shift)
    unbound = [slot for slot, name in enumerate(old_names) if name not in local_names]
    prologue = _prologue(code, unbound, stack, range(n_old, n_old + n_stack))
    return _finish(code, target, prologue, _identifiers(old_names + stack_names), n_old + n_stack, body)


def _rewrite_args(code: types.CodeType, fix: Any) -> bytearray:
    """co_code with each instruction's argument replaced by `fix(opcode, argument)` where that is not
    None (EXTENDED_ARG folded; a new argument must fit the one byte the old one had)."""
    body = bytearray(code.co_code)
    i = 0
    ext = 0
    while i < len(body):
        op, arg = body[i], body[i + 1]
        if op == _OP["EXTENDED_ARG"]:
            ext = (ext | arg) << 8
            i += 2
            continue
        full = ext | arg
        ext = 0
        new = fix(op, full)
        if new is not None:
            if full > 255 or new > 255:
                raise NotResumable("the frame has too many local variables to renumber")
            body[i + 1] = new
        i += 2 + 2 * cache_entries(op)
    return body


def _prologue(code: types.CodeType, unbound: list[int], stack: tuple[int, ...], stack_slots: Any) -> bytearray:
    """The resume prologue before its jump: free variables copied, RESUME, the `unbound` local slots
    deleted, then the stack rebuilt bottom first (LOAD_FAST from `stack_slots` for a value, followed by
    GET_ITER for an iterator's items; PUSH_NULL)."""
    out = bytearray()
    if code.co_freevars:
        out += bytes((_OP["COPY_FREE_VARS"], len(code.co_freevars)))
    out += bytes((_OP["RESUME"], 0))
    for slot in unbound:
        if slot > 255:
            raise NotResumable("the frame has too many local variables to unbind")
        out += bytes((_OP["DELETE_FAST"], slot))
    slots = iter(stack_slots)
    for kind in stack:
        if kind:
            slot = next(slots)
            if slot > 255:
                raise NotResumable("too many values on the stack to pass")
            out += bytes((_OP["LOAD_FAST"], slot))
            if kind == ITER_SLOT:
                out += bytes((_OP["GET_ITER"], 0))
        else:
            out += bytes((_OP["PUSH_NULL"], 0))
    return out


def _finish(code: types.CodeType, target: int, prologue: bytearray, new_names: tuple[str, ...],
            n_args: int, body: bytes | None = None) -> types.CodeType:
    """The resume code: `prologue`, a jump to `target`, the original code (or `body`) behind it."""
    units = len(prologue) // 2 + 2  # EXTENDED_ARG + JUMP_FORWARD
    delta = target // 2  # relative to the instruction after the jump (the first original one)
    if delta > 0xFFFF:
        raise NotResumable("the frame's code is too long")
    prologue += bytes((_OP["EXTENDED_ARG"], delta >> 8, _OP["JUMP_FORWARD"], delta & 0xFF))
    flags = code.co_flags & ~(CO_VARARGS | CO_VARKEYWORDS)
    return code.replace(
        co_code=bytes(prologue) + bytes(code.co_code if body is None else body), co_varnames=new_names,
        co_argcount=n_args, co_posonlyargcount=0, co_kwonlyargcount=0, co_flags=flags,
        co_nlocals=len(new_names), co_stacksize=code.co_stacksize + 1,
        co_name=f"__resume_{code.co_name}_at_{target}",
        co_qualname=resume_qualname(code, target),
        co_linetable=_prologue_location(units) + code.co_linetable,
        co_exceptiontable=_shift_exception_table(code.co_exceptiontable, units))


def _build(code: types.CodeType, target: int, local_names: tuple[str, ...],
           stack: tuple[int, ...]) -> types.CodeType:
    if code.co_cellvars:
        raise NotResumable("the frame has cell variables")
    old_names = code.co_varnames
    stack_names = _fresh_names(sum(1 for slot in stack if slot), set(old_names) | set(local_names))
    rest = tuple(n for n in old_names if n not in local_names)
    new_names = tuple(local_names) + stack_names + rest
    index = {name: i for i, name in enumerate(new_names)}
    n_old, n_new = len(old_names), len(new_names)

    def remap(op: int, arg: int) -> int | None:
        if op in _LOCAL_OPS or (op in _FREE_OPS and arg < n_old):
            return index[old_names[arg]]
        if op in _FREE_OPS:
            return arg - n_old + n_new
        return None
    body = _rewrite_args(code, remap)
    prologue = _prologue(code, [], stack, (index[n] for n in stack_names))
    return _finish(code, target, prologue, _identifiers(new_names), len(local_names) + len(stack_names), body)


def resume_qualname(code: types.CodeType, target: int) -> str:
    """The readable name of the resume code of `code` at byte offset `target`: `f (resumed at line 12)`,
    the source line it continues at (a resume of a resume names the frame once)."""
    base = _RESUMED.sub("", code.co_qualname)
    line = next((line for start, end, line in code.co_lines() if start <= target < end), None)
    return f"{base} (resumed at line {line})" if line is not None else f"{base} (resumed at offset {target})"


_RESUMED = re.compile(r" \(resumed at (line|offset) \d+\)$")


def _identifiers(names: tuple[str, ...]) -> tuple[str, ...]:
    """`names` with each one that is no identifier renamed to a fresh one (`@py_assert0`, a local of
    pytest's rewritten asserts, becomes `__local_py_assert0`): the parameters of a resume code are read by
    name in the guards and entry function kiln writes for it. Only its name changes (locals are read by
    index)."""
    used = set(names)
    out = []
    for name in names:
        if not name.isidentifier() or keyword.iskeyword(name):
            base = "__local_" + "".join(c if c.isalnum() or c == "_" else "_" for c in name).strip("_")
            name, i = base, 0
            while name in used:
                i += 1
                name = f"{base}_{i}"
            used.add(name)
        out.append(name)
    return tuple(out)


def _fresh_names(count: int, used: set[str]) -> tuple[str, ...]:
    """`count` names `__stack_i` not in `used` (a resume of a resume code still has the old ones)."""
    names: list[str] = []
    i = 0
    while len(names) < count:
        name = f"__stack_{i}"
        if name not in used:
            names.append(name)
        i += 1
    return tuple(names)


def _prologue_location(units: int) -> bytes:
    """Line table entries for the prologue: the function's first line, no columns (a line delta of 0, so
    the original table that follows keeps its meaning). A frame stopped in the prologue has a line number,
    which traceback printers need."""
    out = bytearray()
    while units > 0:
        n = min(units, 8)
        out += bytes((0x80 | (13 << 3) | (n - 1), 0))
        units -= n
    return bytes(out)


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    b = data[i]
    value = b & 63
    i += 1
    while b & 64:
        b = data[i]
        value = (value << 6) | (b & 63)
        i += 1
    return value, i


def _write_varint(value: int, first: bool) -> bytes:
    chunks = [value & 63]
    value >>= 6
    while value:
        chunks.append(value & 63)
        value >>= 6
    chunks.reverse()
    out = bytearray(c | 64 for c in chunks[:-1]) + bytes((chunks[-1],))
    if first:
        out[0] |= 0x80
    return bytes(out)


def exception_entries(table: bytes) -> list[tuple[int, int, int, int]]:
    """The raw entries of a 3.11 exception table: (start, length, target, depth << 1 | lasti), in units."""
    out = []
    i = 0
    while i < len(table):
        start, i = _read_varint(table, i)
        length, i = _read_varint(table, i)
        target, i = _read_varint(table, i)
        depth_lasti, i = _read_varint(table, i)
        out.append((start, length, target, depth_lasti))
    return out


def _shift_exception_table(table: bytes, units: int) -> bytes:
    out = bytearray()
    for start, length, target, depth_lasti in exception_entries(table):
        out += _write_varint(start + units, True) + _write_varint(length, False)
        out += _write_varint(target + units, False) + _write_varint(depth_lasti, False)
    return bytes(out)


def make_resume_function(fn: Any, code: types.CodeType) -> types.FunctionType:
    """A function running `code` (a resume code of fn's code) with fn's globals and closure."""
    return types.FunctionType(code, fn.__globals__, code.co_name, None, fn.__closure__)
