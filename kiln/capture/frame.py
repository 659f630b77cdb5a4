"""The symbolic interpreter over CPython bytecode (3.11 to 3.14): one `Frame` per code object being run.

The top frame is the compiled function; calls to Python functions and modules are inlined as child
frames. Each instruction is a method `op_<OPNAME>`; anything without one, or that cannot be followed
symbolically, raises `GraphBreak`. Calls are handled in `calls.py`, attribute reads and iteration in
`values.py`.
"""
from __future__ import annotations

import dis
import operator
import os
import types
from typing import Any

import torch

from ..graph import DataDependentError, Proxy
from ..graph.symbolic import SymInt
from ..ops import UnsupportedError
from . import bytecode
from . import sources as S
from .bytecode import PUSHES_NULL_FIRST, PY
from .errors import HINTS, GraphBreak, RaisedError
from .iterators import _STOP as STOP, EnumerateIter, GeneratorValue, Suspend, SymIter
from .state import Capture

CO_GENERATOR = 0x20
MAX_INLINE_DEPTH = 48
MAX_INSTRUCTIONS = 2_000_000

_BINARY = {
    "+": operator.add, "&": operator.and_, "//": operator.floordiv, "<<": operator.lshift,
    "@": operator.matmul, "*": operator.mul, "%": operator.mod, "|": operator.or_, "**": operator.pow,
    ">>": operator.rshift, "-": operator.sub, "/": operator.truediv, "^": operator.xor,
    "+=": operator.iadd, "&=": operator.iand, "//=": operator.ifloordiv, "<<=": operator.ilshift,
    "@=": operator.imatmul, "*=": operator.imul, "%=": operator.imod, "|=": operator.ior,
    "**=": operator.ipow, ">>=": operator.irshift, "-=": operator.isub, "/=": operator.itruediv,
    "^=": operator.ixor, "[]": operator.getitem,  # (3.14's subscript)
}
_BINARY_BY_ARG = [_BINARY[sym] for _, sym in dis._nb_ops]  # type: ignore[attr-defined]
_COMPARE = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt,
            ">=": operator.ge}

# Types whose operators kiln runs directly on symbolic values (user types with dunders break instead).
NATIVE_OPERAND_TYPES = (Proxy, SymInt, type(None), bool, int, float, complex, str, bytes, tuple, list, dict, set,
                        frozenset, slice, range, torch.Size, torch.dtype, torch.device, type,
                        type(Ellipsis), types.MappingProxyType)


_TORCH_DIR = os.path.dirname(torch.__file__)


class Null:
    """The NULL that PUSH_NULL / LOAD_GLOBAL push beside a callable."""

    def __repr__(self) -> str:
        return "NULL"


NULL = Null()


class Unbound:
    """What LOAD_FAST_AND_CLEAR (3.12+, an inlined comprehension) pushes for a local that has no value;
    STORE_FAST of it unbinds the local again."""

    def __repr__(self) -> str:
        return "<unbound>"


UNBOUND = Unbound()
_EXHAUSTED = object()  # what FOR_ITER leaves for END_FOR to pop (3.12+)


class _Instructions:
    """Decoded instructions of a code object, shared by every frame running it."""

    _cache: dict[types.CodeType, "_Instructions"] = {}

    def __init__(self, code: types.CodeType):
        self.insts = []
        self.index: dict[int, int] = {}
        pending: list[int] = []  # EXTENDED_ARG offsets: a jump to one lands on the instruction it extends
        for inst in bytecode.decode(code):
            pending.append(inst.offset)
            if inst.opname == "EXTENDED_ARG":
                continue
            for offset in pending:
                self.index.setdefault(offset, len(self.insts))  # (a split superinstruction: its first)
            pending.clear()
            self.insts.append(inst)
        self.lines: list[int] = []
        line = code.co_firstlineno
        for inst in self.insts:
            if inst.positions is not None and inst.positions.lineno is not None:
                line = inst.positions.lineno
            self.lines.append(line)
        # (start, end, target, depth, lasti) in bytes; CPython's tables do not overlap
        self.handlers = bytecode.exception_table(code)

    @classmethod
    def of(cls, code: types.CodeType) -> "_Instructions":
        found = cls._cache.get(code)
        if found is None:
            found = cls._cache[code] = cls(code)
        return found


def symbolic_break(e: BaseException, what: str, genuine: bool = True) -> GraphBreak:
    """Turn an error raised by running an operation symbolically into a graph break. `genuine`: the
    operation ran on real values (no tensor proxies), so `e` is the exception eager raises there and the
    program's own handlers may catch it (a `RaisedError`)."""
    if isinstance(e, GraphBreak):
        return e
    if isinstance(e, DataDependentError):
        text = str(e)
        key = "item" if (".item()" in text or ".tolist()" in text) else "data"
        return GraphBreak(f"data-dependent: {text.split(', which')[0]}", HINTS[key], e)
    if isinstance(e, UnsupportedError):
        return GraphBreak(f"unsupported: {e}", HINTS["call"], e)
    reason = f"{what} raised {type(e).__name__}: {e}"
    hint = "the code raises here; it runs eagerly, so the error is the same as without kiln"
    if genuine and isinstance(e, Exception):
        return RaisedError(e, reason, hint)
    brk = GraphBreak(reason, hint, e)
    brk.resumable = False
    return brk


def stop_iteration_error(exc: Any, flags: int) -> Any:
    """What leaves a generator (or coroutine) that let `exc` escape: a StopIteration becomes a
    RuntimeError (PEP 479), chained to it; anything else leaves as it is."""
    if not isinstance(exc, StopIteration):
        return exc
    kind = "coroutine" if flags & 0x80 else "async generator" if flags & 0x200 else "generator"
    error = RuntimeError(f"{kind} raised StopIteration")
    error.__cause__ = error.__context__ = exc
    return error


def has_proxy(value: Any, depth: int = 0) -> bool:
    """Whether a tensor proxy is among `value` (looking into lists, tuples and dicts a few levels)."""
    if isinstance(value, Proxy):
        return True
    if depth > 3:
        return False
    if isinstance(value, (list, tuple)):
        return any(has_proxy(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return any(has_proxy(v, depth + 1) for v in value.values())
    return False


class Frame:
    """A frame of the symbolic interpreter."""

    with_pending: "dict[int, tuple] | None" = None  # 3.14: a with-block's manager between its LOAD_SPECIALs

    def __init__(self, cap: Capture, code: types.CodeType, fn: Any, f_locals: dict[str, Any],
                 f_globals: dict[str, Any], parent: "Frame | None" = None, closure: tuple | None = None):
        self.cap = cap
        self.code = code
        self.fn = fn
        self.locals = f_locals
        self.globals = f_globals
        builtins = f_globals.get("__builtins__", __builtins__)
        self.builtins = builtins.__dict__ if isinstance(builtins, types.ModuleType) else builtins
        self.parent = parent
        self.depth = 0 if parent is None else parent.depth + 1
        self.closure = closure if closure is not None else (fn.__closure__ if fn is not None else None)
        self.cells: dict[str, Any] = {}
        self.stack: list[Any] = []
        self.kw_names: tuple = ()
        self.is_generator = bool(code.co_flags & CO_GENERATOR)
        decoded = _Instructions.of(code)
        self.handlers = decoded.handlers
        self.handled: BaseException | None = None  # the exception an `except` block is handling
        self.insts = decoded.insts
        self.index = decoded.index
        self.lines = decoded.lines
        self.pc = 0
        self.stop_at: int | None = None  # the top frame stops before this instruction (see cache.py)
        self.lineno = code.co_firstlineno
        self.user_code = not code.co_filename.startswith(_TORCH_DIR)
        if self.depth > MAX_INLINE_DEPTH:
            raise GraphBreak(f"calls nested deeper than {MAX_INLINE_DEPTH} frames (recursion?)")

    @staticmethod
    def instructions(code: types.CodeType) -> list[dis.Instruction]:
        """The decoded instructions of `code` (EXTENDED_ARG folded), as frames index them."""
        return _Instructions.of(code).insts

    # ---- running ----
    def run(self, throw: BaseException | None = None) -> Any:
        """Interpret the code until RETURN_VALUE; return the symbolic return value. A generator's frame
        also returns at each YIELD_VALUE, with a `Suspend`; `throw` raises an exception where the frame
        was suspended (generator.throw and close)."""
        steps = 0
        insts = self.insts
        if throw is not None and not self.unwind(throw):
            raise self.located(RaisedError(throw, f"the code raises {type(throw).__name__}: {throw}"))
        while True:
            if self.pc == self.stop_at:
                raise StopCapture(self)
            inst = insts[self.pc]
            self.lineno = self.lines[self.pc]
            if self.user_code:
                self.cap.tracer.origin = f"{self.code.co_filename}:{self.lineno}"
            self.pc += 1
            steps += 1
            if steps > MAX_INSTRUCTIONS:
                raise self.located(GraphBreak("too many instructions (a very long loop?)"))
            handler = getattr(self, "op_" + inst.opname, None)
            try:
                if handler is None:
                    what = bytecode.NOT_FOLLOWED.get(inst.opname)
                    raise GraphBreak(f"bytecode {inst.opname}{f' ({what})' if what else ''} is not supported "
                                     "by kiln's interpreter",
                                     "rewrite the construct, or call it outside the compiled function")
                result = handler(inst)
            except _Return as r:
                return r.value
            except Suspend as y:
                return y
            except RaisedError as e:
                handled = self.current_handled()
                if handled is not None and handled is not e.exc and e.exc.__context__ is None and \
                        isinstance(handled, BaseException):
                    e.exc.__context__ = handled  # raised while another exception was being handled
                if not self.unwind(e.exc):
                    raise self.located(e)
                continue
            except GraphBreak as e:
                raise self.located(e)
            except (DataDependentError, UnsupportedError) as e:
                raise self.located(symbolic_break(e, inst.opname))
            if result is not None:  # a jump target offset
                self.pc = self.index[result]

    def unwind(self, exc: BaseException) -> bool:
        """Jump to the handler of the exception table that covers the instruction that raised `exc`, as
        CPython does (drop the stack to the handler's depth, push lasti if asked, push the exception).
        False: no handler here; the exception leaves the frame."""
        offset = self.insts[self.pc - 1].offset
        for start, end, target, depth, lasti in self.handlers:
            if start <= offset < end:
                del self.stack[depth:]
                if lasti:
                    self.push(offset)
                self.push(exc)
                self.kw_names = ()
                self.pc = self.index[target]
                return True
        return False

    def located(self, brk: GraphBreak) -> GraphBreak:
        if self.parent is not None:
            brk.in_callee = True
        elif brk.top_index is None:
            brk.top_index = self.pc - 1
        if not brk.where or brk.where[-1] != (self.code.co_filename, self.lineno):
            brk.where.append((self.code.co_filename, self.lineno))
        return brk

    def push(self, value: Any) -> None:
        self.stack.append(value)

    def pop(self) -> Any:
        return self.stack.pop()

    def popn(self, n: int) -> list[Any]:
        if n == 0:
            return []
        values = self.stack[-n:]
        del self.stack[-n:]
        return values

    # ---- simple instructions ----
    def op_NOP(self, inst: dis.Instruction) -> None:
        pass

    op_RESUME = op_NOP
    op_PRECALL = op_NOP
    op_CACHE = op_NOP

    def op_POP_TOP(self, inst: dis.Instruction) -> None:
        self.pop()

    def op_PUSH_NULL(self, inst: dis.Instruction) -> None:
        self.push(NULL)

    def op_COPY(self, inst: dis.Instruction) -> None:
        self.push(self.stack[-inst.arg])

    def op_SWAP(self, inst: dis.Instruction) -> None:
        i = inst.arg
        self.stack[-1], self.stack[-i] = self.stack[-i], self.stack[-1]

    def op_LOAD_CONST(self, inst: dis.Instruction) -> None:
        self.push(inst.argval)

    def op_LOAD_FAST(self, inst: dis.Instruction) -> None:
        try:
            self.push(self.locals[inst.argval])
        except KeyError:
            if inst.argval in self.cells and PY >= (3, 13):  # (3.13 spells LOAD_CLOSURE so)
                self.push(self.cells[inst.argval])
                return
            raise GraphBreak(f"local variable {inst.argval!r} is read before it is assigned") from None

    def op_STORE_FAST(self, inst: dis.Instruction) -> None:
        value = self.pop()
        if value is UNBOUND:
            self.locals.pop(inst.argval, None)
        else:
            self.locals[inst.argval] = value

    def op_LOAD_FAST_AND_CLEAR(self, inst: dis.Instruction) -> None:
        self.push(self.locals.pop(inst.argval, UNBOUND))

    def op_DELETE_FAST(self, inst: dis.Instruction) -> None:
        self.locals.pop(inst.argval, None)

    def op_RETURN_VALUE(self, inst: dis.Instruction) -> None:
        raise _Return(self.pop())

    def op_RETURN_CONST(self, inst: dis.Instruction) -> None:
        raise _Return(inst.argval)

    def op_TO_BOOL(self, inst: dis.Instruction) -> None:
        """3.13+: always followed by a conditional jump or UNARY_NOT, which test truth themselves (so a
        data-dependent break lands on the jump, as on 3.11)."""

    op_NOT_TAKEN = op_TO_BOOL

    def op_CALL_INTRINSIC_1(self, inst: dis.Instruction) -> None:
        kind = dis._intrinsic_1_descs[inst.arg]  # type: ignore[attr-defined]
        if kind == "INTRINSIC_LIST_TO_TUPLE":
            self.push(tuple(self.pop()))
        elif kind == "INTRINSIC_UNARY_POSITIVE":
            self.op_UNARY_POSITIVE(inst._replace(opname="UNARY_POSITIVE"))  # type: ignore[attr-defined]
        elif kind == "INTRINSIC_STOPITERATION_ERROR":  # 3.12+: a generator's handler around its body
            self.push(stop_iteration_error(self.pop(), self.code.co_flags))
        else:
            raise GraphBreak(f"{kind.lower().replace('intrinsic_', '')} is not supported by kiln's interpreter")

    # ---- globals ----
    def op_LOAD_GLOBAL(self, inst: dis.Instruction) -> None:
        if inst.arg & 1 and PUSHES_NULL_FIRST:
            self.push(NULL)
        self.push(self.load_global(inst.argval))
        if inst.arg & 1 and not PUSHES_NULL_FIRST:
            self.push(NULL)

    def load_global(self, name: str) -> Any:
        cap = self.cap
        written = cap.global_writes.get((id(self.globals), name))
        if written is not None:
            return written[2]
        if name in self.globals:
            return cap.wrap(self.globals[name], S.global_(cap.ns, self.globals, name))
        if name in self.builtins:
            gname = cap.ns.hold(self.globals, "G")
            cap.guards.add(f"{name!r} not in {gname}", f"global {name!r} is not defined (builtin)", "global")
            value = self.builtins[name]
            # (and the builtin is still the one read: `builtins.len = ...` changes what the frame calls)
            cap.guards.identity(S.builtin(cap.ns, self.builtins, name), value)
            return value
        raise GraphBreak(f"name {name!r} is not defined")

    def op_STORE_GLOBAL(self, inst: dis.Instruction) -> None:
        value = self.pop()
        source = S.global_(self.cap.ns, self.globals, inst.argval)
        self.cap.global_writes[(id(self.globals), inst.argval)] = (self.globals, source, value)

    # ---- cells ----
    def op_MAKE_CELL(self, inst: dis.Instruction) -> None:
        name = inst.argval
        cell = types.CellType(self.locals.pop(name)) if name in self.locals else types.CellType()
        self.cap.local_cells[id(cell)] = cell
        self.cells[name] = cell

    def op_COPY_FREE_VARS(self, inst: dis.Instruction) -> None:
        for name, cell in zip(self.code.co_freevars, self.closure or ()):
            self.cells[name] = cell

    def op_LOAD_CLOSURE(self, inst: dis.Instruction) -> None:
        self.push(self.cells[inst.argval])

    def op_LOAD_DEREF(self, inst: dis.Instruction) -> None:
        cell = self.cells[inst.argval]
        cap = self.cap
        if id(cell) in cap.local_cells:
            try:
                self.push(cell.cell_contents)
            except ValueError:
                raise GraphBreak(f"free variable {inst.argval!r} is read before it is assigned") from None
            return
        written = cap.cell_writes.get(id(cell))
        if written is not None:
            self.push(written[2])
            return
        source = S.cell(cap.ns, cell, inst.argval)
        try:
            value = cell.cell_contents
        except ValueError:
            raise GraphBreak(f"free variable {inst.argval!r} is empty") from None
        self.push(cap.wrap(value, source))

    def op_STORE_DEREF(self, inst: dis.Instruction) -> None:
        cell = self.cells[inst.argval]
        value = self.pop()
        if id(cell) in self.cap.local_cells:
            cell.cell_contents = value
        else:
            self.cap.cell_writes[id(cell)] = (cell, S.cell(self.cap.ns, cell, inst.argval), value)

    # ---- containers ----
    def op_BUILD_TUPLE(self, inst: dis.Instruction) -> None:
        self.push(tuple(self.popn(inst.arg)))

    def op_BUILD_LIST(self, inst: dis.Instruction) -> None:
        self.push(self.cap.new_local(self.popn(inst.arg)))

    def op_BUILD_SET(self, inst: dis.Instruction) -> None:
        self.push(self.cap.new_local(set(self.native_items(self.popn(inst.arg)))))

    def op_BUILD_MAP(self, inst: dis.Instruction) -> None:
        items = self.popn(2 * inst.arg)
        self.push(self.cap.new_local(dict(zip(self.native_items(items[::2], True), items[1::2]))))

    def op_BUILD_CONST_KEY_MAP(self, inst: dis.Instruction) -> None:
        keys = self.native_items(list(self.pop()), True)
        values = self.popn(inst.arg)
        self.push(self.cap.new_local(dict(zip(keys, values))))

    def op_BUILD_SLICE(self, inst: dis.Instruction) -> None:
        self.push(slice(*self.popn(inst.arg)))

    def op_BUILD_STRING(self, inst: dis.Instruction) -> None:
        self.push("".join(self.popn(inst.arg)))

    def op_LIST_APPEND(self, inst: dis.Instruction) -> None:
        value = self.pop()
        self.stack[-inst.arg].append(value)

    def op_SET_ADD(self, inst: dis.Instruction) -> None:
        value = self.pop()
        self.stack[-inst.arg].add(*self.native_items([value]))

    def op_MAP_ADD(self, inst: dis.Instruction) -> None:
        value = self.pop()
        key = self.pop()
        self.stack[-inst.arg][self.native_items([key], True)[0]] = value

    def op_LIST_EXTEND(self, inst: dis.Instruction) -> None:
        values = self.pop()
        self.stack[-inst.arg].extend(self.iterate(values))

    def op_SET_UPDATE(self, inst: dis.Instruction) -> None:
        values = self.pop()
        self.stack[-inst.arg].update(self.native_items(list(self.iterate(values))))

    def op_DICT_UPDATE(self, inst: dis.Instruction) -> None:
        values = self.pop()
        self.stack[-inst.arg].update(self.as_mapping(values))

    def op_DICT_MERGE(self, inst: dis.Instruction) -> None:
        values = self.as_mapping(self.pop())
        target = self.stack[-inst.arg]
        for key in values:
            if not isinstance(key, str):
                raise RaisedError(TypeError("keywords must be strings"), "** with a non-string key")
            if key in target:
                raise GraphBreak(f"got multiple values for keyword argument {key!r}")
        target.update(values)

    def op_LIST_TO_TUPLE(self, inst: dis.Instruction) -> None:
        self.push(tuple(self.pop()))

    def op_UNPACK_SEQUENCE(self, inst: dis.Instruction) -> None:
        items = list(self.iterate(self.pop()))
        if len(items) != inst.arg:
            raise GraphBreak(f"cannot unpack {len(items)} values into {inst.arg}")
        self.stack.extend(reversed(items))

    def op_UNPACK_EX(self, inst: dis.Instruction) -> None:
        items = list(self.iterate(self.pop()))
        before, after = inst.arg & 0xFF, inst.arg >> 8
        if len(items) < before + after:
            raise GraphBreak(f"not enough values to unpack (expected at least {before + after})")
        middle = self.cap.new_local(items[before:len(items) - after])
        values = items[:before] + [middle] + items[len(items) - after:]
        self.stack.extend(reversed(values))

    def as_mapping(self, value: Any) -> dict:
        if isinstance(value, dict):
            return value
        raise GraphBreak(f"** on a {type(value).__name__} is not supported")

    def op_BINARY_SUBSCR(self, inst: dis.Instruction) -> None:
        index = self.pop()
        container = self.pop()
        self.push(self.subscript(container, index))

    def op_BINARY_SLICE(self, inst: dis.Instruction) -> None:
        end = self.pop()
        start = self.pop()
        container = self.pop()
        self.push(self.subscript(container, slice(start, end)))

    def op_STORE_SLICE(self, inst: dis.Instruction) -> None:
        end = self.pop()
        start = self.pop()
        self.push(slice(start, end))
        self.op_STORE_SUBSCR(inst)

    def op_STORE_SUBSCR(self, inst: dis.Instruction) -> None:
        index = self.pop()
        container = self.pop()
        value = self.pop()
        method = self.python_dunder(container, "__setitem__")
        if method is not None:
            self.call(method, [container, index, value], {})
            return
        self.check_mutable(container)
        self.native_op(operator.setitem, container, index, value)

    def op_DELETE_SUBSCR(self, inst: dis.Instruction) -> None:
        index = self.pop()
        container = self.pop()
        method = self.python_dunder(container, "__delitem__")
        if method is not None:
            self.call(method, [container, index], {})
            return
        self.check_mutable(container)
        self.native_op(operator.delitem, container, index)

    def python_dunder(self, obj: Any, name: str) -> Any:
        """The Python function implementing `name` for obj's class (it is inlined), or None."""
        if isinstance(obj, (Proxy, torch.nn.Module)) or type(obj).__module__ == "builtins":
            return None
        for klass in type(obj).__mro__:
            if name in klass.__dict__:
                found = klass.__dict__[name]
                return found if isinstance(found, types.FunctionType) else None
        return None

    def check_mutable(self, container: Any) -> None:
        cap = self.cap
        if id(container) in cap.mirrors:
            cap.check_mirror_write(container)
            return
        if isinstance(container, Proxy) or cap.is_local(container):
            return
        raise GraphBreak(f"mutating a {type(container).__name__} kiln cannot replay")

    # ---- jumps ----
    def op_JUMP_FORWARD(self, inst: dis.Instruction) -> int:
        return inst.argval

    op_JUMP_BACKWARD = op_JUMP_FORWARD
    op_JUMP_BACKWARD_NO_INTERRUPT = op_JUMP_FORWARD

    def _jump_if(self, inst: dis.Instruction, when: bool) -> int | None:
        return inst.argval if self.truth(self.pop()) == when else None

    def op_POP_JUMP_FORWARD_IF_TRUE(self, inst: dis.Instruction) -> int | None:
        return self._jump_if(inst, True)

    def op_POP_JUMP_FORWARD_IF_FALSE(self, inst: dis.Instruction) -> int | None:
        return self._jump_if(inst, False)

    op_POP_JUMP_BACKWARD_IF_TRUE = op_POP_JUMP_FORWARD_IF_TRUE
    op_POP_JUMP_BACKWARD_IF_FALSE = op_POP_JUMP_FORWARD_IF_FALSE

    def op_POP_JUMP_FORWARD_IF_NONE(self, inst: dis.Instruction) -> int | None:
        return inst.argval if self.pop() is None else None

    def op_POP_JUMP_FORWARD_IF_NOT_NONE(self, inst: dis.Instruction) -> int | None:
        return inst.argval if self.pop() is not None else None

    op_POP_JUMP_BACKWARD_IF_NONE = op_POP_JUMP_FORWARD_IF_NONE
    op_POP_JUMP_BACKWARD_IF_NOT_NONE = op_POP_JUMP_FORWARD_IF_NOT_NONE

    def op_JUMP_IF_TRUE_OR_POP(self, inst: dis.Instruction) -> int | None:
        if self.truth(self.stack[-1]):
            return inst.argval
        self.pop()
        return None

    def op_JUMP_IF_FALSE_OR_POP(self, inst: dis.Instruction) -> int | None:
        if not self.truth(self.stack[-1]):
            return inst.argval
        self.pop()
        return None

    # ---- iteration ----
    def op_GET_ITER(self, inst: dis.Instruction) -> None:
        value = self.pop()
        here = self.index[inst.offset]
        if isinstance(value, EnumerateIter) and here > 0 and not getattr(inst, "is_jump_target", True) and \
                self.insts[here - 1].opname in ("CALL", "CALL_KW"):
            value.loop_owned = True  # `for ... in enumerate(...)`: the call's result, held by nothing else
        self.push(self.loop_iterator(value))

    def op_GET_YIELD_FROM_ITER(self, inst: dis.Instruction) -> None:
        self.push(self.get_iterator(self.pop()))

    def op_FOR_ITER(self, inst: dis.Instruction) -> int | None:
        it = self.stack[-1]
        if not isinstance(it, SymIter):
            it = self.get_iterator(it)  # a resume function's stack: an iterator from outside breaks
        value = it.advance(self)
        if value is STOP:
            if self.insts[self.index[inst.argval]].opname == "END_FOR":
                self.push(_EXHAUSTED)  # 3.12+: END_FOR (and POP_TOP / POP_ITER) clean up
            else:
                self.pop()
            return inst.argval
        self.push(value)
        return None

    def op_END_FOR(self, inst: dis.Instruction) -> None:
        self.pop()
        if PY == (3, 12):  # 3.12's END_FOR pops the iterator too
            self.pop()

    op_POP_ITER = op_POP_TOP

    def op_END_SEND(self, inst: dis.Instruction) -> None:
        del self.stack[-2]

    # ---- generators: a frame suspended at each yield (iterators.GeneratorValue) ----
    def op_RETURN_GENERATOR(self, inst: dis.Instruction) -> None:
        self.push(None)

    def op_YIELD_VALUE(self, inst: dis.Instruction) -> None:
        if not self.is_generator:
            raise GraphBreak("yield outside a generator kiln runs")
        raise Suspend(self.pop())

    def op_SEND(self, inst: dis.Instruction) -> int | None:
        """`yield from` / await: send the value on top into the iterator below it."""
        value = self.pop()
        it = self.stack[-1]
        if isinstance(it, GeneratorValue):
            item = it.resume(value, None)
            if item is STOP:
                return self._sent_all(it.returned, inst.argval)
        elif isinstance(it, SymIter):
            if value is not None:
                raise GraphBreak(f"send() of a value into a {it.describe()}")
            item = it.advance(self)
            if item is STOP:
                return self._sent_all(None, inst.argval)
        else:
            raise GraphBreak(f"yield from a {type(it).__name__}")
        self.push(item)
        return None

    def _sent_all(self, returned: Any, target: int) -> int:
        """The iterator SEND drove returned: 3.11 replaces it with the value, 3.12+ pushes the value
        above it for END_SEND to drop the iterator."""
        if PY < (3, 12):
            self.stack[-1] = returned
        else:
            self.push(returned)
        return target

    # ---- formatting ----
    def op_CONVERT_VALUE(self, inst: dis.Instruction) -> None:
        value = self.pop()
        self.check_formattable(value)
        self.push((str, repr, ascii)[inst.arg - 1](value))

    def op_FORMAT_SIMPLE(self, inst: dis.Instruction) -> None:
        value = self.pop()
        self.check_formattable(value)
        self.push(format(value))

    def op_FORMAT_WITH_SPEC(self, inst: dis.Instruction) -> None:
        spec = self.pop()
        value = self.pop()
        self.check_formattable(value)
        self.push(format(value, spec))

    def check_formattable(self, value: Any) -> None:
        if isinstance(value, Proxy) or not isinstance(value, NATIVE_OPERAND_TYPES):
            raise GraphBreak(f"formatting a {type(value).__name__} into a string", HINTS["print"])

    def op_FORMAT_VALUE(self, inst: dis.Instruction) -> None:
        spec = self.pop() if inst.arg & 0x04 else ""
        value = self.pop()
        self.check_formattable(value)
        conv = inst.arg & 0x03
        if conv == 1:
            value = str(value)
        elif conv == 2:
            value = repr(value)
        elif conv == 3:
            value = ascii(value)
        self.push(format(value, spec))

    # ---- imports ----
    def op_IMPORT_NAME(self, inst: dis.Instruction) -> None:
        fromlist = self.pop()
        level = self.pop()
        try:
            module = __import__(inst.argval, self.globals, None, fromlist, level)
        except ImportError as e:
            raise GraphBreak(f"import {inst.argval} failed: {e}") from None
        self.push(module)

    def op_IMPORT_FROM(self, inst: dis.Instruction) -> None:
        module = self.stack[-1]
        try:
            self.push(getattr(module, inst.argval))
        except AttributeError:
            raise GraphBreak(f"cannot import {inst.argval} from {module}") from None

    # ---- implemented in values.py / calls.py ----
    def iterate(self, value: Any) -> list:  # pragma: no cover - replaced below
        raise NotImplementedError

    def get_iterator(self, value: Any) -> SymIter:  # pragma: no cover
        raise NotImplementedError

    def subscript(self, container: Any, index: Any) -> Any:  # pragma: no cover
        raise NotImplementedError

    def call(self, fn: Any, args: list, kwargs: dict) -> Any:  # pragma: no cover
        raise NotImplementedError


class StopCapture(Exception):
    """The top frame reached the instruction it was told to stop before (the graph break)."""

    def __init__(self, frame: Frame):
        super().__init__("stop")
        self.frame = frame


class _Return(Exception):
    def __init__(self, value: Any):
        self.value = value

