"""Entries for frames that break: run the graph so far, restore the stack and locals, run the breaking
instruction natively, continue in a resume function.

    def __entry(x):
        <guards>
        __out = __graph(x)                  # the graph captured before the break
        __v0 = __out[0]                     # live locals and stack values, rebuilt
        __v1 = __out[1]
        __self_3.count = 2                  # side effects so far, replayed before the instruction
        __r = __call(__B_print, __v0)       # the instruction kiln could not follow, run natively
        return __resume_4(__v1)             # the rest of the frame: a function captured on its first call

A data-dependent branch ends in `if __v0: return __resume_a(...)` / `return __resume_b(...)`.
"""
from __future__ import annotations

import dis
import operator
import types
from typing import Any, Callable

import torch

from ..graph import Proxy
from ..ops.registry import aliases
from .entry import Reconstructor, _entry_source, _checks_source, _exec, _fix_setitem_nodes, \
    _guard_mutated_aliasing, compile_for_entry, graph_call, parameters, side_effect_writes
from .errors import GraphBreak
from .frame import _BINARY_BY_ARG, _COMPARE, NULL, Frame
from .bytecode import PUSHES_NULL_FIRST, PY
from .iterators import EnumerateIter, SymIter
from .resume import ITER_SLOT, NULL_SLOT, VALUE_SLOT, NotResumable, check_resumable, in_loop, live_locals, \
    resume_arguments, resume_code
from .state import Capture

_UNARY = {"UNARY_NOT": operator.not_, "UNARY_NEGATIVE": operator.neg, "UNARY_POSITIVE": operator.pos,
          "UNARY_INVERT": operator.invert}
_CONVERSIONS = {0: None, 1: str, 2: repr, 3: ascii}


class Continuation:
    """Where the frame goes on after the native instruction: a byte offset and the values it pushed."""

    def __init__(self, offset: int, pushed: list[str | None]):
        self.offset = offset
        self.pushed = pushed  # names of new stack values (None: a NULL)


def native_instruction(frame: Frame, inst: dis.Instruction, stack: list[str | None],
                       ns: Any) -> tuple[int, list[str], list[tuple[str | None, Continuation]]]:
    """Python source running `inst` on the rebuilt stack (names of temps, None for NULL).

    Returns (values consumed from the stack, source lines, [(condition or None, continuation)])."""
    name = inst.opname
    nxt = _next_offset(frame, inst)

    def hold(obj: Any, hint: str) -> str:
        return ns.hold(obj, hint)

    def top(n: int) -> list[str | None]:
        if len(stack) < n:
            raise NotResumable(f"{name} with a short stack")
        return stack[len(stack) - n:]

    if name in ("CALL", "CALL_KW"):
        argc = inst.arg
        names = 1 if name == "CALL_KW" else 0  # (3.13+: the keyword names on top)
        first, second, *rest = top(argc + 2 + names)[:argc + 2]
        if first is None:
            callee, args = second, rest
        elif second is None:
            callee, args = first, rest
        else:
            callee, args = first, [second] + rest
        kw = list(frame.stack[-1] if names else frame.kw_names)
        if None in args or callee is None:
            raise NotResumable("a call with a NULL argument")
        positional = args[:len(args) - len(kw)]
        keywords = [f"{k}={v}" for k, v in zip(kw, args[len(args) - len(kw):])]
        call_args = ", ".join([callee] + positional + keywords)
        return argc + 2 + names, [f"__r = __call({call_args})"], [(None, Continuation(nxt, ["__r"]))]
    if name == "CALL_FUNCTION_EX":
        n = 3 if inst.arg & 1 else 2
        if PUSHES_NULL_FIRST:
            items = top(n)
            consumed = n + (1 if len(stack) > n and stack[-n - 1] is None else 0)
        else:  # the callable, its NULL, the arguments
            items = top(n + 1)
            if items[1] is not None:
                raise NotResumable("CALL_FUNCTION_EX without its NULL")
            items = [items[0]] + items[2:]
            consumed = n + 1
        kwargs = f", **{items[2]}" if n == 3 and items[2] is not None else ""  # (3.14: NULL for none)
        lines = [f"__r = __call({items[0]}, *{items[1]}{kwargs})"]
        return consumed, lines, [(None, Continuation(nxt, ["__r"]))]
    if name in ("POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_FORWARD_IF_FALSE"):
        (cond,) = top(1)
        jump = Continuation(inst.argval, [])
        fall = Continuation(nxt, [])
        if name.endswith("TRUE"):
            return 1, [], [(cond, jump), (None, fall)]
        return 1, [], [(cond, fall), (None, jump)]
    if name in ("JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP"):
        (cond,) = top(1)
        jump = Continuation(inst.argval, [cond])
        fall = Continuation(nxt, [])
        if name == "JUMP_IF_TRUE_OR_POP":
            return 1, [], [(cond, jump), (None, fall)]
        return 1, [], [(cond, fall), (None, jump)]
    if name in _UNARY:
        (a,) = top(1)
        return 1, [f"__r = {hold(_UNARY[name], name)}({a})"], [(None, Continuation(nxt, ["__r"]))]
    if name in ("BINARY_OP", "COMPARE_OP", "BINARY_SUBSCR", "CONTAINS_OP"):
        a, b = top(2)
        if name == "BINARY_OP":
            fn = _BINARY_BY_ARG[inst.arg]
        elif name == "COMPARE_OP":
            fn = _COMPARE[inst.argval]
        elif name == "BINARY_SUBSCR":
            fn = operator.getitem
        else:
            lines = [f"__r = {a} {'not in' if inst.arg else 'in'} {b}"]
            return 2, lines, [(None, Continuation(nxt, ["__r"]))]
        call = f"{hold(fn, fn.__name__)}({a}, {b})"
        if name == "COMPARE_OP" and PY >= (3, 13) and inst.arg & 16:
            call = f"bool({call})"  # (3.13's compare-and-test: the jump after it reads an exact bool)
        return 2, [f"__r = {call}"], [(None, Continuation(nxt, ["__r"]))]
    if name == "STORE_SUBSCR":
        value, container, index = top(3)
        return 3, [f"{container}[{index}] = {value}"], [(None, Continuation(nxt, []))]
    if name == "STORE_ATTR":
        value, obj = top(2)
        return 2, [f"setattr({obj}, {inst.argval!r}, {value})"], [(None, Continuation(nxt, []))]
    if name == "LOAD_ATTR":
        (obj,) = top(1)
        return 1, [f"__r = getattr({obj}, {inst.argval!r})"], [(None, Continuation(nxt, ["__r"]))]
    if name == "LOAD_METHOD":
        (obj,) = top(1)
        pushed = [None, "__r"] if PUSHES_NULL_FIRST else ["__r", None]
        return 1, [f"__r = getattr({obj}, {inst.argval!r})"], [(None, Continuation(nxt, pushed))]
    if name in ("FORMAT_SIMPLE", "FORMAT_WITH_SPEC"):
        items = top(2 if name == "FORMAT_WITH_SPEC" else 1)
        spec = items[1] if len(items) == 2 else "''"
        return len(items), [f"__r = format({items[0]}, {spec})"], [(None, Continuation(nxt, ["__r"]))]
    if name == "CONVERT_VALUE":
        (a,) = top(1)
        conv = _CONVERSIONS[inst.arg]
        return 1, [f"__r = {hold(conv, conv.__name__)}({a})"], [(None, Continuation(nxt, ["__r"]))]
    if name == "BINARY_SLICE":
        a, lo, hi = top(3)
        return 3, [f"__r = {a}[{lo}:{hi}]"], [(None, Continuation(nxt, ["__r"]))]
    if name == "FORMAT_VALUE":
        has_spec = bool(inst.arg & 0x04)
        items = top(2 if has_spec else 1)
        conv = _CONVERSIONS[inst.arg & 0x03]
        value = items[0] if conv is None else f"{hold(conv, conv.__name__)}({items[0]})"
        spec = items[1] if has_spec else "''"
        return len(items), [f"__r = format({value}, {spec})"], [(None, Continuation(nxt, ["__r"]))]
    raise NotResumable(f"kiln cannot run {name} natively between graphs")


def _next_offset(frame: Frame, inst: dis.Instruction) -> int:
    i = frame.index[inst.offset]
    return frame.insts[i + 1].offset if i + 1 < len(frame.insts) else inst.offset + 2


def _returns_at(frame: Frame, offset: int) -> bool:
    i = frame.index.get(offset)
    return i is not None and frame.insts[i].opname == "RETURN_VALUE"


def _skip_pop_top(frame: Frame, cont: Continuation) -> Continuation:
    """A value the next instruction discards (a statement's call result) is not passed on."""
    i = frame.index.get(cont.offset)
    if i is not None and cont.pushed and cont.pushed[-1] is not None and \
            frame.insts[i].opname == "POP_TOP" and i + 1 < len(frame.insts):
        return Continuation(frame.insts[i + 1].offset, cont.pushed[:-1])
    return cont


def make_break_entry(cap: Capture, fn: Any, code: types.CodeType, frame: Frame, brk: GraphBreak,
                     compile_graph: Callable[..., Any], resume_factory: Callable[[types.CodeType], Any],
                     callee_caller: Any, grad_changed: bool) -> tuple[Any, list, str, list]:
    """Build the entry of a frame that broke at `frame.pc` (the top frame, stopped before that
    instruction): graph, restore, native instruction, resume functions. Raises GraphBreak (NotResumable
    among them) when the frame cannot be continued this way; the caller then runs it natively."""
    inst = frame.insts[frame.pc]
    call = inst.opname in CALL_OPS
    if not brk.resumable and not (brk.in_callee and call):
        raise NotResumable("the break raises an exception")
    check_resumable(code, inst.offset, call)
    if grad_changed:
        raise NotResumable("grad mode changed before the break")
    graph = cap.graph
    _fix_setitem_nodes(graph)
    _guard_mutated_aliasing(cap)
    ns = cap.ns
    temps: list[str] = []

    def temp(expr: str) -> str:
        name = f"__v{len(temps)}"
        temps.append(f"{name} = {expr}")
        return name
    rec = Reconstructor(cap, temp)
    for source, tensor, by_identity in cap.inputs:
        if by_identity:
            rec.held_inputs[source.expr] = ns.hold(tensor, "input")
    # in a loop, the loop's iterator (below the call's values) goes on as a tuple of the items it has left
    # (the resume code's prologue makes an iterator of it, ITER_SLOT; a tuple: its items are fixed, so the
    # resumed capture iterates it as such)
    iter_slots = _loop_iterators(frame) if in_loop(code, inst.offset) else {}
    late: list[str] = []  # a module container's items left, read after the native call (it may change them)
    stack = []
    for i, v in enumerate(frame.stack):
        if v is NULL:
            stack.append(None)
        elif i in iter_slots:
            live = _live_rest(cap, rec, v)
            if live is None:
                stack.append(temp(rec.value(tuple(iter_slots[i]))))
            else:
                stack.append(f"__loop{len(late)}")
                late.append(f"__loop{len(late)} = {live}")
        else:
            stack.append(temp(rec.value(v)))
    consumed, native, branches = native_instruction(frame, inst, stack, ns)
    below = stack[:len(stack) - consumed]
    if any(i >= len(below) for i in iter_slots):
        raise NotResumable("the break's instruction takes the loop's iterator")
    conts = [(cond, _skip_pop_top(frame, c)) for cond, c in branches]
    local_names: dict[int, tuple[str, ...]] = {}
    local_temps: dict[str, str] = {}
    for _, cont in conts:
        values = below + cont.pushed
        if _returns_at(frame, cont.offset) and values and values[-1] is not None:
            continue  # `return x.tolist()`: the entry returns the value, nothing is left to resume
        live = live_locals(code, cont.offset)
        names = tuple(n for n in code.co_varnames if n in live and n in frame.locals)
        local_names[cont.offset] = names
        for n in names:
            if n not in local_temps:
                local_temps[n] = temp(rec.value(frame.locals[n]))
    writes = side_effect_writes(cap, rec, temp)
    if not getattr(compile_graph, "keeps_views", False) or cap.graph.mutated_inputs:
        # (a view kept as a view is still a view of the graph's copy of a mutated input, not of the input)
        _check_no_live_views(cap, rec)
    body = temps + writes + native + late
    resumes = []
    for cond, cont in conts:
        values = below + cont.pushed
        if cont.offset not in local_names:
            call = f"return {values[-1]}"
        else:
            layout = tuple(NULL_SLOT if v is None else ITER_SLOT if i in iter_slots else VALUE_SLOT
                           for i, v in enumerate(values))
            rcode = resume_code(code, cont.offset, local_names[cont.offset], layout)
            resumed = resume_factory(rcode)
            resumes.append(resumed)
            call_args = ["None" if n is None else local_temps[n]
                         for n in resume_arguments(code, local_names[cont.offset])]
            call_args += [v for v in values if v is not None]
            call = f"return {ns.hold(resumed, 'resume')}({', '.join(call_args)})"
        if cond is None:
            body.append(call)
        else:
            body += [f"if {cond}:", "    " + call]
    graph.output(tuple(rec.outputs))
    extra: dict[str, Any] = {"__call": callee_caller}
    if rec.outputs or any(n.op in ("call_torch", "call_prim") for n in graph.nodes):
        inputs = [rec.held_inputs[s.expr] if by_id else s.expr for s, _, by_id in cap.inputs]
        extra["__graph"] = compile_for_entry(cap, graph, compile_graph, inputs)
        body = graph_call(cap, inputs, fn, code, compile_graph, extra) + body
    _, params, _ = parameters(code)
    source = _entry_source(cap, params, body) + _checks_source(cap, params)
    env = _exec(cap, source, fn, extra, (code.co_filename, frame.lines[frame.pc]))
    return env["__entry"], env["__checks"], source, resumes


CALL_OPS = ("CALL", "CALL_KW", "CALL_FUNCTION_EX")


def _loop_iterators(frame: Frame) -> dict[int, list]:
    """The iterators on the stack of a frame that broke inside a loop, by stack position: the items each has
    left. Only a loop over modules resumes (a model's `for layer in self.layers`, `enumerate` of them: as
    many resumes as layers at most): a break inside any other loop (a `while`, a `for` over a range of
    steps, where each iteration would be a capture of its own) raises NotResumable, as does an iterator
    whose items are not fixed (a live list, a generator, a zip) or that is also held elsewhere (a local:
    advancing the tuple would not advance it)."""
    found: dict[int, list] = {}
    held = [id(v) for v in frame.locals.values()] + [id(v) for v in frame.stack]
    for i, v in enumerate(frame.stack):
        if not isinstance(v, SymIter):
            continue
        rest = v.remaining()
        if rest is not None and not all(isinstance(item[-1] if type(item) is tuple and item else item,
                                                   torch.nn.Module) for item in rest):
            raise NotResumable("the break is inside a loop that is not over modules")
        inner = getattr(v, "inner", None)
        if rest is None or not v.loop_owned or held.count(id(v)) > 1 or (inner is not None and id(inner) in held):
            raise NotResumable(f"the break is inside a loop over a {v.describe()} kiln cannot pass on")
        found[i] = rest
    if not found:
        raise NotResumable("the break is inside a loop that is not over modules")
    return found


def loop_rest(container: Any, pos: int, size: int, start: int | None) -> tuple:
    """The modules a `for` loop over a module container has left after a break, read from the container as
    it is now (the break's call may have replaced one: eager's iterator would yield the new one), as
    eager's iterator over its dict of modules does: a changed number of modules raises its RuntimeError.
    With `start`, as `enumerate(..., start)` pairs."""
    items = tuple(container._modules.values())
    if len(items) != size:
        raise RuntimeError("dictionary changed size during iteration")
    return items[pos:] if start is None else tuple(enumerate(items[pos:], start))


def _live_rest(cap: Capture, rec: Reconstructor, it: SymIter) -> str | None:
    """Source reading what a loop over an existing module container has left, after the break's call; None
    for a tuple or a container the compiled code made itself (nothing else can change those)."""
    inner, start = (it.inner, it.count) if isinstance(it, EnumerateIter) else (it, None)
    container = inner.container
    if not isinstance(container, torch.nn.Module) or cap.is_local(container):
        return None
    args = [rec.value(container), str(inner.pos), str(len(inner.items)), repr(start)]
    return f"{cap.ns.hold(loop_rest, 'loop_rest')}({', '.join(args)})"


def _check_no_live_views(cap: Capture, rec: Reconstructor) -> None:
    """Tensors that are views of each other leave the graph as separate outputs; a backend that does not
    return them as views would lose an in-place update made through one of them after the break (or read
    through a view an update made after it). Every tensor leaving the graph is checked, wherever it lives
    past the break: a local, a stack value, inside a container or a bound method (`y.mul_` on the stack
    holds y), or an object attribute written back."""
    al = aliases(cap.graph)
    aliased = {id(p.node) for p in al.base.keys() + al.has_views.keys()
               if isinstance(p, Proxy) and id(p) not in cap.proxy_sources}
    for node in rec.outputs:  # alive (the graph holds them), so their ids are theirs
        if id(node) in aliased:
            raise NotResumable(f"tensor {node.name} lives past the break as a view (or base) of another "
                               "tensor, and this backend may return it as a copy")
