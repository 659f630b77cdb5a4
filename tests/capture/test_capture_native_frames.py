"""A frame that runs natively (a break kiln cannot resume) still has its callees captured: its code is a
copy whose call sites go through the capture wrapper (kiln/capture/native.py)."""
from __future__ import annotations

import io
import types

import pytest
import torch
import torch.nn as nn
from capture_helpers import all_entries, check

import kiln
from kiln.capture.native import Routed, Router, routed_code, routed_function
from kiln.testing import pyfuzz

X = torch.randn(2, 8)
OUT = io.StringIO()


def helper(t, scale=2.0, *, shift=1.0):
    return torch.relu(t) * scale + shift


def star_helper(*args, **kwargs):
    return helper(*args, **kwargs)


class Obj:
    def method(self, t, k=1):
        return t * k


def native_frame(x, items):
    out = helper(x) + helper(x, 3.0, shift=0.5) + Obj().method(x, k=4) + star_helper(x, shift=2.0)
    for i in items:
        print(i, file=OUT)  # a break inside a loop: this frame runs natively
        try:
            out = out + helper(x * i)
            if i == 2:
                raise ValueError(i)
        except ValueError:
            out = out - helper(x)
        finally:
            out = out + 1
    return out


def test_routed_copy_gives_the_same_result_and_routes_user_calls():
    seen = []

    def caller(fn, *args, **kwargs):
        seen.append(getattr(fn, "__qualname__", type(fn).__name__))
        return fn(*args, **kwargs)
    routed = routed_function(native_frame, caller)
    torch.testing.assert_close(routed(X, [1, 2, 3]), native_frame(X, [1, 2, 3]))
    assert seen.count("helper") == 6 and "Obj.method" in seen and "star_helper" in seen
    assert "print" not in seen  # builtins are called directly


def test_routed_copy_keeps_tracebacks_on_user_lines():
    def bad(x):
        return helper(x) + undefined_name  # noqa: F821
    routed = routed_function(bad, lambda fn, *a, **k: fn(*a, **k))
    try:
        routed(X)
    except NameError as e:
        tb = e.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        assert tb.tb_frame.f_code.co_name == "bad"
        assert tb.tb_lineno == bad.__code__.co_firstlineno + 1
    else:
        raise AssertionError("expected NameError")


def test_router_leaves_builtins_classes_and_library_code_alone():
    def caller(fn, *a, **k):
        return fn(*a, **k)

    router = Router(caller)  # (holds the caller weakly: routed_function's function holds it)
    for fn in (len, torch.relu, dict, torch.nn.functional.gelu, nn.Linear(2, 2), io.StringIO):
        assert router[fn] is fn
    assert router[helper] is not helper
    assert router[nn.Sequential(nn.Linear(2, 2))] is not None


def test_native_frame_callees_are_captured():
    compiled = check(native_frame, X, [1, 2, 3], breaks=1)
    entries = all_entries(compiled)
    (native,) = [e for e in entries if e.brk is not None]
    assert not native.brk.resumed and native.brk.native_frame.startswith("native_frame")
    assert sum(1 for e in entries if e.graph is not None and e.ops) >= 3  # helper, method, star_helper


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2


class LoopWithPrint(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(3)])

    def forward(self, x):
        for block in self.blocks:
            print("block", file=OUT)
            x = block(x)
        return x


def test_module_loop_with_break_resumes_in_the_loop():
    """A break inside a loop over modules resumes inside the loop (the iterator goes on as a tuple of the
    modules left): the frame is captured around each break, no frame runs natively. (It ran natively,
    each block's forward captured as a callee.)"""
    torch.manual_seed(0)
    model = LoopWithPrint()
    with torch.no_grad():
        report = kiln.explain(model, X)
        assert report.graph_count == 3 and report.graph_break_count == 3, str(report)
        assert not report.frames_run_natively, str(report)
        assert all(b.resumed for b in report.breaks), str(report)
        kiln.reset()
        compiled = kiln.compile(model)
        for _ in range(2):
            torch.testing.assert_close(compiled(X), model(X))


def test_fresh_closures_stop_being_captured():
    def f(x):
        k = 2
        g = lambda t: t * k  # noqa: E731
        print("cell", file=OUT)
        return g(x)
    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    for _ in range(8):
        torch.testing.assert_close(compiled(X), f(X))
    graphs = sum(1 for e in all_entries(compiled) if e.graph is not None and e.ops)
    assert graphs <= 4
    assert any("a new closure on every call" in k for k in kiln.counters["callees_run_natively"])
    report = kiln.explain(f, X)  # counted and shown: the callee that is no longer captured
    assert report.native_callees and "callee run natively" in str(report)


class _RouteEverything(Router):
    """Routes every Python call (not only user files): the strictest test of the rewritten bytecode."""

    __slots__ = ()

    def __getitem__(self, fn):
        if isinstance(fn, (types.FunctionType, types.MethodType)):
            return Routed(fn, self.caller)
        return fn


def _route_everything(fn):
    if not isinstance(fn, types.FunctionType) or fn.__code__.co_flags & 0x3A0:
        return fn
    code = routed_code(fn.__code__, _RouteEverything(_call_routed))
    new = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    return new


def _call_routed(fn, *args, **kwargs):
    if isinstance(fn, types.MethodType):
        return _route_everything(fn.__func__)(fn.__self__, *args, **kwargs)
    return _route_everything(fn)(*args, **kwargs)


@pytest.mark.parametrize("chunk", range(4))
def test_routed_random_programs_behave_as_plain_python(chunk):
    """Random programs (loops, try/except/finally, closures, keyword and star calls, methods) give the same
    results, exceptions and argument state with every call routed through a Python wrapper."""
    for seed in range(chunk * 25, chunk * 25 + 25):
        results = []
        for tag in ("plain", "routed"):
            ns = pyfuzz.load(seed, tag)
            fn = ns["program"] if tag == "plain" else _route_everything(ns["program"])
            args = ns["inputs"](0)
            ok, value, out = pyfuzz._run(fn, args)
            results.append((ok, value if ok else type(value).__name__, args, out))
        (ok1, v1, a1, out1), (ok2, v2, a2, out2) = results
        assert ok1 == ok2 and out1 == out2, f"seed {seed}: {v1!r:.80} vs {v2!r:.80}"
        assert (pyfuzz._diff(v2, v1, "result", 1e-5) if ok1 else v1 == v2 or f"{v1} != {v2}") in (None, True)
        assert pyfuzz._diff(list(a2), list(a1), "arguments", 1e-5) is None, f"seed {seed}"


def test_functions_sharing_code_keep_their_own_defaults():
    def f(t):
        out = []
        for k in range(3):
            print(k, file=OUT)  # the frame runs natively; each lambda is captured as its own frame
            g = lambda u, k=k: u + k  # noqa: E731
            out.append(g(t))
        return out
    check(f, torch.zeros(2))
    kiln.reset()
    results = [kiln.compile(g)(torch.zeros(1)) for g in [(lambda u, k=k: u + k) for k in range(3)]]
    assert [float(r) for r in results] == [0.0, 1.0, 2.0]


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_nested_tensor_input_runs_the_frame_natively(counters):
    # regression: a nested tensor passed the plain-tensor check, and the guards then failed on its sizes
    nested = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)])
    out = kiln.compile(lambda x: x * 2 + 1)(nested)
    assert out.is_nested
    torch.testing.assert_close(out.to_padded_tensor(0.0), (nested * 2 + 1).to_padded_tensor(0.0))
    assert not counters["capture_errors"], dict(counters["capture_errors"])
    assert any("nested tensor" in k for k in counters["graph_breaks"]), dict(counters["graph_breaks"])


def test_installed_libraries_are_routed_not_the_standard_library(tmp_path, monkeypatch):
    """In a venv, sysconfig's platstdlib is the venv's lib/pythonX.Y, which holds site-packages: a
    transformers wrapper run natively (a break inside its try) had every callee run natively too (JetMoE,
    0 graphs). Installed libraries' functions are routed; the standard library's are not."""
    import sysconfig
    site = tmp_path / "lib" / "site-packages"
    site.mkdir(parents=True)
    (site / "kiln_test_installed_lib.py").write_text(
        "def inner(x):\n    return x * 2 + 1\n\n"
        "def wrapper(x, out):\n"
        "    try:\n"
        "        print('wrapped', file=out)\n"   # a break inside a try: this frame runs natively
        "        return inner(x)\n"
        "    finally:\n"
        "        pass\n")
    monkeypatch.syspath_prepend(str(site))
    import kiln.capture.native as native
    monkeypatch.setattr(native, "_STDLIB_DIRS", native._STDLIB_DIRS + (str(tmp_path) + "/",))
    import kiln_test_installed_lib as lib
    def caller(fn, *a, **k):
        return fn(*a, **k)

    router = Router(caller)  # (holds the caller weakly: routed_function's function holds it)
    assert router[lib.inner] is not lib.inner
    import json
    assert router[json.dumps] is json.dumps
    assert sysconfig.get_paths()["stdlib"]  # (the standard library's own folder stays unrouted)

    def f(x):
        return lib.wrapper(x, OUT) - 1
    check(f, X)
    assert kiln.counters["captures"]["inner"] == 1, dict(kiln.counters["captures"])
