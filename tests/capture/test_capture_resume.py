"""Graph breaks with resume functions: the graph before the break runs, the breaking instruction runs
natively, and the rest of the frame continues in a resume function captured on its first call. Each
program is checked against eager (values, mutated arguments and state), with graph and break counts."""
from __future__ import annotations

import io
import zlib

import pytest
import torch
from capture_helpers import all_entries, assert_same, check

import kiln
from kiln.graph import run

X = torch.randn(4, 8)
Y = torch.randn(4, 8)
OUT = io.StringIO()
LOG: list = []
STATE = {"n": 0}
G_VALUE = 0


class Box:
    def __init__(self):
        self.n = 0

    def __repr__(self):
        return f"Box(n={self.n})"


BOX = Box()


def breaking_helper(t):
    t = t * 3
    print("in helper", file=OUT)
    return t - 1


def branching_helper(t):
    if t.sum() > 0:
        return t * 2
    return t * -2


def two_levels(t):
    return breaking_helper(t + 1) * 2


def make_printer(k):
    def scaled(t):
        u = t * k
        print("scaled", k, file=OUT)
        return u + k
    return scaled


SCALED = make_printer(3)


# ---- programs: (fn, args, graphs, breaks) ------------------------------------------------------------------
def r_print_between(x):
    y = x * 2
    print("between", file=OUT)
    return y + 1


def r_print_tensor(x):
    y = x.relu()
    print(y.shape, y.sum(), file=OUT)
    return y * y


def r_two_prints(x):
    a = x + 1
    print("one", file=OUT)
    b = a * 2
    print("two", file=OUT)
    return a + b


def r_branch(x):
    y = x * 2
    if y.sum() > 0:
        return y + 1
    return y - 1


def r_branch_fallthrough(x, z):
    y = x * 2
    if y.mean() > 0:
        y = y + z
    return y.relu()


def r_branch_and(x, z):
    if x.sum() > 0 and z.sum() > 0:
        return x + z
    return x - z


def r_not_any(x):
    if not (x > 10).any():
        return x + 1
    return x


def r_item_arith(x):
    s = x.sum().item()
    scale = s * 2 + 1
    return x * scale


def r_item_inline(x):
    return x * x.abs().max().item() + 1


def r_float_on_stack(x):
    return (x * 2) + float(x.sum())


def r_int_shape(x):
    n = int(x.abs().argmax())
    return x.flatten()[: n + 1].sum() + x.mean()


def r_tolist_loop(x):
    total = x.sum(0)
    for v in x[0].tolist():
        total = total + v
    return total


def r_c_function(x):
    y = x + 1
    code = zlib.crc32(b"kiln")
    return y * (code % 7)


def r_kwargs_call(x):
    y = x - 1
    print("a", "b", sep="|", file=OUT)
    return y


def r_module_helper(x):
    a = x + 1
    b = breaking_helper(a)
    return b * 2


def r_nested_def(x):
    def inner(t):
        t = t + 2
        print("inner", file=OUT)
        return t * t
    return inner(x) - 1


def r_helper_branch(x):
    return branching_helper(x + 1) + 1


def r_two_levels(x):
    return two_levels(x) / 2


def r_closure_fn(x):
    return SCALED(x) + 1


def r_locals_survive(x):
    outs = [x + 1, x * 2]
    meta = {"k": 3}
    print("survive", file=OUT)
    outs.append(x - meta["k"])
    return torch.stack(outs), meta


def r_aliasing_list(x):
    a = [x]
    b = a
    print("alias", file=OUT)
    b.append(x + 1)
    return len(a), a[-1]


def r_list_side_effect(x, log):
    log.append(1)
    print(log, file=OUT)  # the append is replayed before print runs
    log.append(2)
    return x + len(log)


def r_global_list(x):
    LOG.append("a")
    print(LOG, file=OUT)
    return x * len(LOG)


def r_attr_side_effect(x):
    BOX.n = BOX.n + 1
    print(BOX, file=OUT)  # print calls Box.__repr__, which must see n updated
    return x + BOX.n


def r_global_side_effect(x):
    global G_VALUE
    G_VALUE = G_VALUE + 1
    print(STATE, file=OUT)
    STATE["n"] = G_VALUE
    return x * G_VALUE


def r_inplace_input(x):
    x.mul_(2)
    print("inplace", file=OUT)
    x.add_(1)
    return x.sum()


def r_tensor_data(x):
    y = x.data * 2
    return y + x


def r_fstring_tensor(x):
    text = f"{x.sum():.3f}"
    return x * len(text)


def r_stack_below_call(x):
    return torch.cat([x, breaking_helper(x)], 0)


def r_delete_local(x):
    y = x * 2
    z = y + 1
    del y
    print("deleted", file=OUT)
    return z


def r_kw_only(x, *, scale=2.0):
    y = x * scale
    print(scale, file=OUT)
    return y + scale


def r_varargs(x, *rest, **opts):
    y = x + sum(rest)
    print(opts, file=OUT)
    return y * opts.get("k", 1)


PROGRAMS = [
    (r_print_between, (X,), 2, 1),
    (r_print_tensor, (X,), 2, 1),
    (r_two_prints, (X,), 3, 2),
    (r_branch, (X,), 2, 1),
    (r_branch, (-X.abs(),), 2, 1),
    (r_branch_fallthrough, (X, Y), 2, 1),
    (r_branch_and, (X.abs(), Y.abs()), 3, 2),
    (r_not_any, (X,), 2, 1),
    (r_item_arith, (X,), 2, 1),
    (r_item_inline, (X,), 2, 1),
    (r_float_on_stack, (X,), 2, 1),
    (r_int_shape, (X,), 2, 1),
    (r_tolist_loop, (X,), 2, 1),
    (r_c_function, (X,), 2, 1),
    (r_kwargs_call, (X,), 1, 1),
    (r_module_helper, (X,), 4, 2),
    (r_nested_def, (X,), 3, 2),
    (r_helper_branch, (X,), 4, 2),
    (r_two_levels, (X,), 5, 3),
    (r_closure_fn, (X,), 3, 2),
    (r_locals_survive, (X,), 2, 1),
    (r_aliasing_list, (X,), 1, 1),
    (r_list_side_effect, (X, [0]), 1, 1),
    (r_inplace_input, (X.clone(),), 2, 1),
    (r_tensor_data, (X,), 1, 1),
    (r_fstring_tensor, (X,), 2, 1),
    (r_stack_below_call, (X,), 3, 2),
    (r_delete_local, (X,), 1, 1),
    (r_kw_only, (X,), 2, 1),
    (r_varargs, (X, 1, 2), 2, 1),
]


@pytest.mark.parametrize("fn,args,graphs,breaks", PROGRAMS,
                         ids=[f"{p[0].__name__}-{i}" for i, p in enumerate(PROGRAMS)])
def test_resume(fn, args, graphs, breaks):
    check(fn, *args, graphs=graphs, breaks=breaks)


def test_kwargs_to_function_with_varkw():
    check(r_varargs, X, 1, 2, k=3, graphs=2, breaks=1)


# ---- state seen by the native instruction and after the call ---------------------------------------------
def _reset_state():
    global G_VALUE
    OUT.seek(0)
    OUT.truncate()
    LOG.clear()
    STATE["n"] = 0
    BOX.n = 0
    G_VALUE = 0


def _state():
    return OUT.getvalue(), list(LOG), dict(STATE), BOX.n, G_VALUE


@pytest.mark.parametrize("fn", [r_global_list, r_attr_side_effect, r_global_side_effect, r_list_side_effect,
                                r_print_between, r_closure_fn])
def test_state_equals_eager(fn):
    eager_log, compiled_log = [0], [0]
    kiln.reset()
    _reset_state()
    expected = [fn(X, eager_log) if fn is r_list_side_effect else fn(X) for _ in range(3)]
    eager_state = _state()
    _reset_state()
    compiled = kiln.compile(fn, backend="eager")
    actual = [compiled(X, compiled_log) if fn is r_list_side_effect else compiled(X) for _ in range(3)]
    assert_same(actual, expected)
    assert _state() == eager_state and compiled_log == eager_log
    # the state read before the break changes on every call, so the frame is captured again each time
    assert {e.brk.location for e in all_entries(compiled) if e.brk is not None}


# ---- caching and recompiles --------------------------------------------------------------------------------
def test_resume_is_cached():
    kiln.reset()
    compiled = kiln.compile(r_two_prints, backend="eager")
    for _ in range(3):
        assert_same(compiled(X), r_two_prints(X))
    captures = kiln.counters["captures"]
    names = [n for n in captures if n.startswith("r_two_prints")]
    assert len(names) == 3 and all(captures[n] == 1 for n in names), dict(captures)
    assert sum(kiln.counters["cache_hits"][n] for n in names) == 6


def test_branch_both_ways_cached():
    kiln.reset()
    compiled = kiln.compile(r_branch, backend="eager")
    for _ in range(2):
        for x in (X.abs(), -X.abs()):
            assert_same(compiled(x), r_branch(x))
    captures = kiln.counters["captures"]
    names = [n for n in captures if n.startswith("r_branch")]
    assert len(names) == 3 and all(captures[n] == 1 for n in names), dict(captures)
    (entry,) = compiled.cache.entries
    assert len(entry.children) == 2  # one resume function per side of the branch


def test_nested_def_callee_cached():
    kiln.reset()
    compiled = kiln.compile(r_nested_def, backend="eager")
    for _ in range(3):
        assert_same(compiled(X), r_nested_def(X))
    captures = kiln.counters["captures"]
    inner = [n for n in captures if "inner" in n]
    assert inner and all(captures[n] == 1 for n in inner), dict(captures)


def test_recompile_on_new_shape():
    kiln.reset()
    compiled = kiln.compile(r_print_between, backend="eager")
    small = torch.randn(2, 3)
    for x in (X, small, X, small):
        assert_same(compiled(x), r_print_between(x))
    assert len(compiled.cache.entries) == 2
    (resume,) = {id(c): c for e in compiled.cache.entries for c in e.children}.values()
    assert len(resume.cache.entries) == 2  # the resume function recaptured for the new shape too
    assert any("r_print_between" in key for key in kiln.counters["recompiles"])


def test_item_value_is_guarded():
    kiln.reset()
    compiled = kiln.compile(r_item_arith, backend="eager")
    for x in (X, X * 2, X):
        assert_same(compiled(x), r_item_arith(x))


# ---- frames that cannot resume run natively, and say so ----------------------------------------------------
def u_try(x):
    y = x + 1
    try:
        print("in try", file=OUT)
    except ValueError:
        y = y * 0
    return y * 2


def u_with(x):
    with torch.no_grad():
        y = x * 2
        print("in no_grad", file=OUT)
    return y + 1


def u_loop(x):
    for i in range(2):
        x = x + i
        print(i, file=OUT)
    return x


def u_cell(x):
    k = 2
    f = lambda t: t * k  # noqa: E731
    print("cell", file=OUT)
    return f(x)


def u_grad_mode(x):
    torch.set_grad_enabled(False)
    y = x * 2
    print("grad off", file=OUT)
    torch.set_grad_enabled(True)
    return y


@pytest.mark.parametrize("fn,why", [(u_try, "try or with"), (u_with, "try or with"), (u_loop, "loop"),
                                    (u_cell, "captured by inner functions"), (u_grad_mode, "grad mode")])
def test_unresumable_break_runs_frame_eagerly(fn, why):
    # the frame runs natively; u_cell's lambda is a user function it calls, so it is still captured as
    # its own frame (a new closure on each of check's two calls: two graphs)
    check(fn, X, graphs=2 if fn is u_cell else 0, breaks=1)
    compiled = kiln.compile(fn, backend="eager")
    compiled(X)  # (check's compiled functions are gone, and their cache with them)
    (entry,) = compiled.cache.entries
    assert not entry.brk.resumed and why in entry.brk.reason and "runs eagerly" in entry.brk.reason


def test_exception_after_break_has_user_line():
    def f(x):
        y = x + 1
        print("before raise", file=OUT)
        if y.shape[0] == 4:
            raise ValueError("bad batch")
        return y
    compiled = kiln.compile(f, backend="eager")
    with pytest.raises(ValueError, match="bad batch") as info:
        compiled(X)
    assert any(str(t.path).endswith("test_capture_resume.py") and "raise ValueError" in str(t.statement)
               for t in info.traceback)


# ---- explain, modules, backends ----------------------------------------------------------------------------
def test_explain_reports_each_break(capsys):
    report = kiln.explain(r_two_prints, X)
    assert report.graph_count == 3 and report.graph_break_count == 2
    for brk, word in zip(report.breaks, ("one", "two")):
        assert "print" in brk.reason and brk.hint and brk.resumed
        assert brk.location.startswith(__file__) and f'print("{word}", file=OUT)' == brk.source_line
    assert capsys.readouterr().out == ""  # the report prints nothing (the program prints to OUT)
    printed = str(report)
    assert "3 graph(s), 2 graph break(s)" in printed and "hint:" in printed


def test_explain_callee_break():
    report = kiln.explain(r_module_helper, X)
    assert report.graph_count == 4 and report.graph_break_count == 2
    reasons = [b.reason for b in report.breaks]
    assert any("captured as its own frame" in r for r in reasons)
    assert any(b.source_line == 'print("in helper", file=OUT)' for b in report.breaks)


class PrintingNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 8)
        self.fc2 = torch.nn.Linear(8, 2)
        self.calls = 0

    def forward(self, x):
        h = self.fc1(x).relu()
        self.calls += 1
        print("hidden", h.shape, file=OUT)
        if h.mean() > 0:
            h = h * 2
        return self.fc2(h)


def test_module_with_breaks_trains_like_eager():
    kiln.reset()
    torch.manual_seed(0)
    net, ref = PrintingNet(), PrintingNet()
    ref.load_state_dict(net.state_dict())
    cm = kiln.compile(net, backend="eager")
    for _ in range(2):
        cm(X).sum().backward()
        ref(X).sum().backward()
    assert net.calls == ref.calls == 2
    for p, q in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    entries = all_entries(cm._compiled_forward)
    # self.calls is guarded by value, so the top frame is captured on each call; the breaks are two
    assert len({e.brk.location for e in entries if e.brk is not None}) == 2
    assert all(e.brk.resumed for e in entries if e.brk is not None)


@pytest.mark.parametrize("fn,args", [(r_branch, (X,)), (r_item_arith, (X,)), (r_module_helper, (X,))])
def test_prims_backend_with_breaks(fn, args):
    check(fn, *args, backend="prims")


def test_fullgraph_still_raises():
    compiled = kiln.compile(r_print_between, backend="eager", fullgraph=True)
    with pytest.raises(kiln.GraphBreakError, match="print"):
        compiled(X)


# ---- breaks in the middle of expressions: values left on the stack are passed to the resume function -----
class Scaler:
    def __init__(self, k):
        self.k = k

    def apply(self, t):
        print("apply", self.k, file=OUT)
        return t * self.k


SCALER = Scaler(3)


def s_or_assign(x):
    flag = (x.sum() > 0) or (x.mean() < -10)
    return x * flag


def s_ternary(x):
    y = x * 2 if x.sum() > 0 else x * -2
    return y + 1


def s_call_args(x):
    return torch.add(x, float(x.sum()), alpha=2)


def s_chained(x):
    if 0 < x.abs().sum() < 1000:
        return x + 1
    return x


def s_dict_build(x):
    return {"a": x + 1, "b": float(x.sum()), "c": x * 2}


def s_method_break(x):
    return SCALER.apply(x + 1) - 1


def s_star_call(x):
    parts = [x.sum(), x.mean()]
    print(*parts, sep=",", file=OUT)
    return parts[0] + parts[1]


def s_kw_star_call(x):
    kw = {"t": x + 1}
    return breaking_helper(**kw) * 2


def s_tuple_partial(x):
    return (x + 1, int(x.argmax()), x - 1)


def s_subscript_item(x):
    i = int(x[0].argmax())
    return x[:, i] * 2


def s_module_arg(x):
    layer = torch.nn.functional.relu
    y = layer(x)
    print("module arg", file=OUT)
    return layer(y - 1)


STACK_PROGRAMS = [
    (s_or_assign, (X,), 2, 1),
    (s_ternary, (X,), 2, 1),
    (s_call_args, (X,), 2, 1),
    (s_chained, (X,), 3, 2),  # 0 < s breaks, then s < 1000 in the resume function
    (s_dict_build, (X,), 2, 1),
    (s_method_break, (X,), 3, 2),
    (s_star_call, (X,), 2, 1),
    (s_kw_star_call, (X,), 4, 2),
    (s_tuple_partial, (X,), 2, 1),
    (s_subscript_item, (X,), 2, 1),
    (s_module_arg, (X,), 2, 1),
]


@pytest.mark.parametrize("fn,args,graphs,breaks", STACK_PROGRAMS,
                         ids=[f"{p[0].__name__}-{i}" for i, p in enumerate(STACK_PROGRAMS)])
def test_resume_with_stack_values(fn, args, graphs, breaks):
    check(fn, *args, graphs=graphs, breaks=breaks)
    check(fn, *(-a if isinstance(a, torch.Tensor) else a for a in args))


class Parent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = torch.nn.Linear(8, 8)
        self.child = PrintingNet()

    def forward(self, x):
        return self.child(self.pre(x).tanh()) * 3


def test_submodule_that_breaks_is_captured_as_its_own_frame():
    kiln.reset()
    torch.manual_seed(0)
    net, ref = Parent(), Parent()
    ref.load_state_dict(net.state_dict())
    cm = kiln.compile(net, backend="eager")
    for _ in range(2):
        torch.testing.assert_close(cm(X), ref(X))
    assert net.child.calls == ref.child.calls == 2
    entries = all_entries(cm._compiled_forward)
    assert any("captured as its own frame" in e.brk.reason for e in entries if e.brk is not None)
    assert any(e.graph is not None and "torch.nn.functional.linear" in e.ops for e in entries)


def test_compiled_function_called_from_compiled_code_is_inlined():
    inner = kiln.compile(lambda t: t * 2, backend="eager")

    def outer(x):
        return inner(x) + 1
    check(outer, X, graphs=1, breaks=0)


HOLDER = Box()


def r_escaping_local_object(x):
    obj = Box()
    HOLDER.ref = obj  # the object escapes before the break and is changed after it
    print("escape", file=OUT)
    obj.n = 5
    return x + obj.n


def make_counter():
    count = 0

    def step(x):
        nonlocal count
        count += 1
        print(count, file=OUT)
        count += 10
        return x * count
    return step, lambda: count


def test_escaping_object_keeps_identity():
    kiln.reset()
    compiled = kiln.compile(r_escaping_local_object, backend="eager")
    for _ in range(2):
        assert_same(compiled(X), r_escaping_local_object(X))
        compiled(X)
        assert HOLDER.ref.n == 5


def test_nonlocal_write_before_break():
    kiln.reset()
    _reset_state()
    step, count = make_counter()
    ref_step, ref_count = make_counter()
    compiled = kiln.compile(step, backend="eager")
    for _ in range(3):
        assert_same(compiled(X), ref_step(X))
        assert count() == ref_count()
    printed = OUT.getvalue().split()
    assert printed == ["1", "1", "12", "12", "23", "23"]  # print saw the cell updated before it ran


def test_return_after_break_needs_no_resume():
    def f(x):
        y = x * 2
        return y.tolist()
    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    for i in range(12):  # new values every call: nothing is specialized on them
        x = torch.randn(3)
        assert compiled(x) == f(x)
    (entry,) = compiled.cache.entries
    assert entry.children == [] and entry.brk.resumed and not kiln.counters["recompiles"]


def r_view_mutated_after_break(x):
    y = x * 2
    z = y[0]
    print("view", file=OUT)
    z.add_(1)
    return y


def test_views_across_a_break():
    def copying_backend(graph, example_inputs):  # returns every output as a fresh tensor
        def call(*inputs):
            return tuple(t.clone() for t in run(graph, inputs, torch_level=True))
        return call
    for backend in ("eager", "prims", copying_backend):
        kiln.reset()
        compiled = kiln.compile(r_view_mutated_after_break, backend=backend)
        for _ in range(2):
            assert_same(compiled(X), r_view_mutated_after_break(X))
    (entry,) = compiled.cache.entries
    assert not entry.brk.resumed and "view" in entry.brk.reason  # the copying backend: frame eagerly
