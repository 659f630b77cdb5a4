"""The bytecode layer (kiln.capture.bytecode) against the running CPython: every opcode is handled by the
interpreter, normalized at decode time, or listed as not followed with what it is; a decoded instruction
always names a handler. Runs on each Python CI runs (3.11 and 3.13)."""
from __future__ import annotations

import dis
import sys

import pytest
import torch

import kiln
from kiln.capture import bytecode
from kiln.capture.interpreter import Interpreter

# pseudo-instructions (3.12+: numbered from 256, never in a code object) and instrumented forms (what
# sys.monitoring writes over the adaptive code; co_code never shows them)
_NEVER_IN_CO_CODE = {name for name, op in dis.opmap.items() if op >= 256 or name.startswith("INSTRUMENTED_")}


def test_every_opcode_is_handled_normalized_or_listed():
    unaccounted = sorted(name for name in dis.opmap
                         if not hasattr(Interpreter, "op_" + name) and name not in bytecode.NORMALIZED
                         and name not in bytecode.NOT_FOLLOWED and name not in _NEVER_IN_CO_CODE
                         and name != "EXTENDED_ARG")
    assert unaccounted == [], f"Python {sys.version.split()[0]}: opcodes kiln neither follows nor lists"


def test_listed_opcodes_have_no_handler():
    # a handler added for a listed opcode: the list must shrink with it
    assert not [name for name in bytecode.NOT_FOLLOWED if hasattr(Interpreter, "op_" + name)]


def _sample(x, ys, k=2, *rest, key=None, **kw):
    a = [t * 2 for t in ys if t is not None]
    b = {i: v for i, v in enumerate(a)}
    s = x[1:3]
    x = x.clone()
    x[0:1] = 3
    if key is None and not kw:
        z = f"{k!r}:{len(a):>3}"
    with torch.no_grad():
        w = x.sum()
    total = 0
    for i in range(k):
        total += i
    try:
        q = b[k]
    except KeyError:
        q = None

    def inner(m=1):
        return m + k
    return s, x, z, w, total, q, inner(), super


def test_decoded_instructions_name_handlers():
    for code in (_sample.__code__, test_every_opcode_is_handled_normalized_or_listed.__code__):
        for inst in bytecode.decode(code):
            assert inst.opname == "EXTENDED_ARG" or hasattr(Interpreter, "op_" + inst.opname), inst


def test_sample_runs_the_same_compiled():
    x, ys = torch.randn(4), [torch.randn(2), None, torch.randn(2)]
    expected = _sample(x, ys)
    got = kiln.compile(_sample, backend="eager")(x, ys)
    for e, g in zip(expected, got):
        if isinstance(e, torch.Tensor):
            torch.testing.assert_close(g, e)
        else:
            assert g == e


def test_an_unfollowed_instruction_breaks_with_what_it_is():
    def f(x, v):
        match v:
            case [a, b]:
                return x + a + b
        return x
    report = kiln.explain(f, torch.ones(2), [1, 2])
    assert any("a match statement" in str(brk) for brk in report.breaks), report.breaks
    torch.testing.assert_close(kiln.compile(f)(torch.ones(2), [1, 2]), torch.ones(2) + 3)


@pytest.mark.skipif(sys.version_info[:2] < (3, 12), reason="3.12+ only: inlined comprehensions, in-place resume")
def test_resume_keeps_local_slots_on_312_and_later():
    from kiln.capture.resume import resume_arguments, resume_code

    def f(a, b):
        c = a + 1
        print("break")
        return c + b
    code = f.__code__
    target = next(i.offset for i in bytecode.decode(code) if i.opname == "LOAD_FAST" and i.argval == "c"
                  and i.offset > 0)
    resumed = resume_code(code, target, ("b", "c"), ())
    assert resumed.co_varnames[:3] == code.co_varnames[:3]
    assert resume_arguments(code, ("b", "c")) == (None, "b", "c")
    fn = type(f)(resumed, f.__globals__)
    assert fn(None, 2, 5) == 7
