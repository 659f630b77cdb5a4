"""The one place that knows which CPython runs: code objects decoded into the instruction forms the symbolic
interpreter implements, and the version's facts that bytecode writers need.

Where versions differ only in spelling, `decode` normalizes once, so each instruction's meaning lives in
one handler (frame.py and its mixins):

- 3.12+ `LOAD_ATTR` with its method bit becomes 3.11's `LOAD_METHOD` (the handler pushes in the running
  version's order, `PUSHES_NULL_FIRST`).
- 3.13's superinstructions `LOAD_FAST_LOAD_FAST`, `STORE_FAST_LOAD_FAST` and `STORE_FAST_STORE_FAST` become
  two instructions at the same offset (jumps land on the first; no break can fall between them).
- `LOAD_FAST_CHECK` (3.12+) and `LOAD_FAST_BORROW` (3.14) become `LOAD_FAST`; 3.12+ `POP_JUMP_IF_*` are
  3.11's forward forms (dis already gives the absolute target); `COMPARE_OP`'s argval loses 3.13's
  `bool(...)` (the consumer tests truth either way).
- 3.14: `BINARY_OP []` becomes `BINARY_SUBSCR`, `LOAD_SMALL_INT` `LOAD_CONST`, and `CALL_FUNCTION_EX` always
  has its kwargs slot (arg 1; the handler reads a NULL there as none).

What differs in meaning is a handler reading `PY` (the stack order of a callable and its NULL, END_FOR's
pops, MAKE_FUNCTION's flags, the forms of SEND and the with-block's exit).
"""
from __future__ import annotations

import dis
import sys
import types

PY = sys.version_info[:2]
# 3.11 and 3.12 push the NULL below a callable (`PUSH_NULL; LOAD_FAST f`); 3.13+ above it (`f; NULL`)
PUSHES_NULL_FIRST = PY < (3, 13)

_CACHES = dis._inline_cache_entries  # type: ignore[attr-defined]


def cache_entries(op: int) -> int:
    """Inline cache units following opcode `op` (a list indexed by opcode up to 3.12, a dict by name
    from 3.13)."""
    if isinstance(_CACHES, dict):
        return _CACHES.get(dis.opname[op], 0)
    return _CACHES[op]


_SAME = {"LOAD_FAST_CHECK": "LOAD_FAST", "LOAD_FAST_BORROW": "LOAD_FAST",
         "POP_JUMP_IF_TRUE": "POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_IF_FALSE": "POP_JUMP_FORWARD_IF_FALSE",
         "POP_JUMP_IF_NONE": "POP_JUMP_FORWARD_IF_NONE",
         "POP_JUMP_IF_NOT_NONE": "POP_JUMP_FORWARD_IF_NOT_NONE"}
_PAIRS = {"LOAD_FAST_LOAD_FAST": ("LOAD_FAST", "LOAD_FAST"),
          "LOAD_FAST_BORROW_LOAD_FAST_BORROW": ("LOAD_FAST", "LOAD_FAST"),
          "STORE_FAST_LOAD_FAST": ("STORE_FAST", "LOAD_FAST"),
          "STORE_FAST_STORE_FAST": ("STORE_FAST", "STORE_FAST")}


# Instructions the interpreter does not follow, and what they are: each breaks the graph where it runs (the
# frame runs natively there). tests/capture/test_bytecode.py checks every opcode of the running Python is
# handled, normalized here, or listed.
NOT_FOLLOWED = {
    **dict.fromkeys(("GET_LEN", "MATCH_CLASS", "MATCH_KEYS", "MATCH_MAPPING", "MATCH_SEQUENCE"),
                    "a match statement"),
    **dict.fromkeys(("GET_AITER", "GET_ANEXT", "BEFORE_ASYNC_WITH", "END_ASYNC_FOR", "GET_AWAITABLE",
                     "ASYNC_GEN_WRAP"), "async code"),
    **dict.fromkeys(("CHECK_EG_MATCH", "PREP_RERAISE_STAR"), "except*"),
    "CALL_INTRINSIC_2": "except* or type parameters",
    **dict.fromkeys(("LOAD_BUILD_CLASS", "SETUP_ANNOTATIONS", "STORE_NAME", "DELETE_NAME", "LOAD_NAME",
                     "LOAD_LOCALS", "LOAD_FROM_DICT_OR_DEREF", "LOAD_FROM_DICT_OR_GLOBALS", "LOAD_CLASSDEREF",
                     "IMPORT_STAR", "PRINT_EXPR"), "a class body or module-level code"),
    **dict.fromkeys(("BUILD_TEMPLATE", "BUILD_INTERPOLATION"), "a template string (t-string)"),
    "DELETE_GLOBAL": "deleting a global variable",
    "DELETE_DEREF": "deleting a closure variable",
    "CLEANUP_THROW": "generator.throw() into a `yield from`",
    **dict.fromkeys(("EXIT_INIT_CHECK", "INTERPRETER_EXIT", "ENTER_EXECUTOR", "RESERVED"),
                    "an instruction of CPython's own (its compiler does not emit it into functions)"),
}
NORMALIZED = set(_SAME) | set(_PAIRS) | {"LOAD_SMALL_INT"}  # (and forms of ops that keep a handler)


_SPECIAL_NAMES = ("__enter__", "__exit__", "__aenter__", "__aexit__")  # LOAD_SPECIAL's argument (3.14)


def decode(code: types.CodeType) -> list[dis.Instruction]:
    """The instructions of `code` in interpreter form (EXTENDED_ARG kept: frames fold it)."""
    out = []
    for inst in dis.get_instructions(code):
        name = inst.opname
        if name in _PAIRS:
            first, second = _PAIRS[name]
            a, b = inst.argval
            out.append(inst._replace(opname=first, argval=a, arg=inst.arg >> 4, argrepr=a))
            out.append(inst._replace(opname=second, argval=b, arg=inst.arg & 15, argrepr=b))
            continue
        if name in _SAME:
            inst = inst._replace(opname=_SAME[name])
        elif name == "LOAD_ATTR" and PY >= (3, 12) and inst.arg & 1:
            inst = inst._replace(opname="LOAD_METHOD")
        elif name == "COMPARE_OP" and isinstance(inst.argval, str) and inst.argval.startswith("bool("):
            inst = inst._replace(argval=inst.argval[5:-1])
        elif name == "BINARY_OP" and inst.argrepr == "[]":  # 3.14: subscripts are a binary op
            inst = inst._replace(opname="BINARY_SUBSCR")
        elif name == "LOAD_SPECIAL" and isinstance(inst.argval, int):  # 3.14: the method's name
            inst = inst._replace(argval=_SPECIAL_NAMES[inst.arg])
        elif name == "LOAD_SMALL_INT":  # 3.14
            inst = inst._replace(opname="LOAD_CONST", argval=inst.arg)
        elif name == "CALL_FUNCTION_EX" and PY >= (3, 14):  # the kwargs slot is always there (NULL: none)
            inst = inst._replace(arg=1)
        out.append(inst)
    return out


def exception_table(code: types.CodeType) -> list[tuple[int, int, int, int, bool]]:
    """(start, end, target, depth, lasti) in bytes."""
    return [(e.start, e.end, e.target, e.depth, e.lasti)
            for e in dis._parse_exception_table(code)]  # type: ignore[attr-defined]


_JUMPS = set(dis.hasjrel) | set(dis.hasjabs)
_ALWAYS_JUMPS = {"JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP_ABSOLUTE", "JUMP"}
_ENDS = {"RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE"}
_FLOW: dict[types.CodeType, tuple[list[dis.Instruction], list[tuple[int, ...]]]] = {}


def flow(code: types.CodeType) -> tuple[list[dis.Instruction], list[tuple[int, ...]]]:
    """The decoded instructions of `code` (EXTENDED_ARG dropped) and, for each, the indices of the
    instructions that may run next: the fall-through, a jump's target, and the handler of an exception
    raised there."""
    found = _FLOW.get(code)
    if found is not None:
        return found
    insts = [i for i in decode(code) if i.opname != "EXTENDED_ARG"]
    index: dict[int, int] = {}
    for k, inst in enumerate(insts):
        index.setdefault(inst.offset, k)
    handlers = exception_table(code)

    def at(offset: int) -> int:  # (a target on an EXTENDED_ARG lands on the instruction it extends)
        while offset not in index and offset < 2 * len(code.co_code):
            offset += 2
        return index[offset]
    succ = []
    for k, inst in enumerate(insts):
        nxt: list[int] = []
        if inst.opname not in _ENDS and inst.opname not in _ALWAYS_JUMPS and k + 1 < len(insts):
            nxt.append(k + 1)
        if inst.opcode in _JUMPS and isinstance(inst.argval, int):
            nxt.append(at(inst.argval))
        nxt += [at(target) for start, end, target, _, _ in handlers if start <= inst.offset < end]
        succ.append(tuple(nxt))
    found = _FLOW[code] = (insts, succ)
    return found


def index_at(code: types.CodeType, offset: int) -> int:
    """The index in `flow(code)` of the instruction at (or first after) byte `offset`."""
    return next(k for k, inst in enumerate(flow(code)[0]) if inst.offset >= offset)


def closure(code: types.CodeType, starts: "list[int] | tuple[int, ...]") -> set[int]:
    """Indices (in `flow(code)`) of the instructions that may run once any of `starts` does, them among them."""
    succ = flow(code)[1]
    seen = set(starts)
    todo = list(starts)
    while todo:
        for n in succ[todo.pop()]:
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def reachable(code: types.CodeType, offset: int) -> list[dis.Instruction]:
    """The instructions that may run once the one at `offset` starts (it among them)."""
    insts = flow(code)[0]
    return [insts[k] for k in sorted(closure(code, [index_at(code, offset)]))]
