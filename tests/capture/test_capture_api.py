"""The public API: kiln.compile on functions, methods and modules, decorators, explain, reset, counters,
register_backend, GraphBreakError, the fallback contract and replayed side effects."""
from __future__ import annotations

import functools
import io
import warnings

import pytest
import torch

import kiln
from kiln.graph import run

STATE = {"calls": 0}
SINK = io.StringIO()
TOTAL = 0


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.register_buffer("steps", torch.zeros(()))
        self.scale = 2.0
        self.count = 0

    def forward(self, x):
        self.count += 1
        self.steps.add_(1)
        return self.fc(x) * self.scale

    def helper(self, x):
        return self.fc(x).relu()


def test_decorator_without_and_with_arguments():
    @kiln.compile
    def f(x):
        return x + 1

    @kiln.compile(backend="eager")
    def g(x):
        return x * 2
    x = torch.randn(3)
    torch.testing.assert_close(f(x), x + 1)
    torch.testing.assert_close(g(x), x * 2)


def test_disable_returns_original():
    def f(x):
        return x
    assert kiln.compile(f, disable=True) is f
    m = torch.nn.Linear(2, 2)
    assert kiln.compile(m, disable=True) is m


def test_bound_method():
    kiln.reset()
    net = Net()
    f = kiln.compile(net.helper, backend="eager")
    x = torch.randn(2, 4)
    torch.testing.assert_close(f(x), net.helper(x))
    assert f.cache.entries[0].graph is not None


def test_module_wrapper_behaves_like_the_module():
    kiln.reset()
    net = Net()
    ref = Net()
    ref.load_state_dict(net.state_dict())
    cm = kiln.compile(net, backend="eager")
    assert isinstance(cm, torch.nn.Module)
    assert list(cm.state_dict()) == list(net.state_dict())
    assert [p is q for p, q in zip(cm.parameters(), net.parameters())] == [True, True]
    assert cm.fc is net.fc and cm.scale == 2.0
    x = torch.randn(3, 4)
    for _ in range(3):
        torch.testing.assert_close(cm(x), ref(x))
    assert net.count == ref.count == 3  # attribute side effect replayed
    torch.testing.assert_close(net.steps, ref.steps)  # buffer mutated in place
    cm.scale = 3.0  # setattr reaches the original; the guard on scale recaptures
    ref.scale = 3.0
    torch.testing.assert_close(cm(x), ref(x))
    cm.eval()
    assert not net.training and not cm.training
    cm.train()
    assert net.training


def test_module_hooks_run():
    kiln.reset()
    net = torch.nn.Linear(3, 3)
    seen = []
    net.register_forward_hook(lambda mod, inp, out: seen.append(out.shape))
    cm = kiln.compile(net, backend="eager")
    x = torch.randn(2, 3)
    torch.testing.assert_close(cm(x), net(x))
    assert len(seen) == 2
    assert not hasattr(net, "forward") or "forward" not in net.__dict__


def test_training_gradients_match():
    kiln.reset()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 1))
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 1))
    ref.load_state_dict(net.state_dict())
    cm = kiln.compile(net, backend="eager")
    x = torch.randn(5, 4)
    cm(x).sum().backward()
    ref(x).sum().backward()
    for p, q in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_fullgraph_raises_with_user_line():
    def f(x):
        if x.sum() > 0:  # the break
            return x
        return -x
    cf = kiln.compile(f, backend="eager", fullgraph=True)
    with pytest.raises(kiln.GraphBreakError) as info:
        cf(torch.randn(3))
    assert "test_capture_api.py" in str(info.value) and "if x.sum() > 0" in str(info.value)


def test_raise_on_error_option():
    def f(x):
        print("side effect")
        return x
    cf = kiln.compile(f, backend="eager", options={"raise_on_error": True})
    with pytest.raises(kiln.GraphBreakError, match="print"):
        cf(torch.randn(3))


def test_explain_reports_breaks_and_graphs(capsys):
    def f(x):
        y = x.sum()
        return y.item()
    report = kiln.explain(f, torch.randn(3))
    assert report.graph_break_count == 1 and report.graph_count == 1  # x.sum() runs as a graph
    brk = report.breaks[0]
    assert "item" in brk.reason and brk.source_line == "return y.item()" and brk.hint
    assert "test_capture_api.py" in brk.location
    assert capsys.readouterr().out == ""  # returned, not printed (a REPL would show it twice)
    assert "1 graph break" in str(report) and "1 graph break" in repr(report)

    def g(x):
        return (x + 1).relu()
    report = kiln.explain(g, torch.randn(3))
    assert report.graph_count == 1 and report.graph_break_count == 0
    assert sum(report.ops_per_graph[0].values()) == 2
    assert any("x: Tensor" in guard for guard in report.guards[0])


def test_explain_repr_is_short_and_guards_fold():
    """repr is a few lines of counts; str folds each capture's guards to a count; format(guards=True) and
    guards_text() list them."""
    def f(x, y):
        z = (x * y).sum()
        print("side effect", file=SINK)
        return z + y.mean()
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    report = kiln.explain(f, x, y)
    short = repr(report)
    assert len(short.splitlines()) <= 4, short
    assert "2 graph(s), 1 graph break(s)" in short and "0 frame(s) run natively" in short, short
    assert "0 capture error(s)" in short and "0 recompile(s)" in short, short
    every_guard = [g for guards in report.guards for g in guards]
    assert len(every_guard) >= 4
    text = str(report)
    assert all(g not in text for g in every_guard if "x: Tensor" in g), text
    assert (f"guards of capture 1 ({f.__qualname__}): {len(report.guards[0])} (report.format(guards=True) "
            "lists them)") in text
    full = report.format(guards=True)
    assert all(g in full for g in every_guard) and full.startswith(text.splitlines()[0])
    assert all(g in report.guards_text() for g in every_guard)
    assert "break 1:" not in report.guards_text()


def test_explain_module():
    report = kiln.explain(torch.nn.Linear(3, 2), torch.randn(4, 3))
    assert report.graph_count == 1
    assert any("weight" in guard for guard in report.guards[0])


def test_counters_and_reset():
    kiln.reset()
    f = kiln.compile(lambda x: x + 1, backend="eager")
    f(torch.randn(2))
    f(torch.randn(2))
    assert kiln.counters["captures"]
    assert sum(kiln.counters["cache_hits"].values()) == 1
    kiln.reset()
    assert not kiln.counters["captures"]


def test_register_custom_backend():
    seen = []

    @kiln.register_backend
    def recording_backend(graph, example_inputs):
        seen.append((graph, len(example_inputs)))
        return lambda *inputs: run(graph, inputs)
    kiln.reset()
    f = kiln.compile(lambda x, y: x * y, backend="recording_backend")
    x = torch.randn(3)
    torch.testing.assert_close(f(x, x), x * x)
    assert len(seen) == 1 and seen[0][1] == 1  # the same tensor twice is one input

    def callable_backend(graph, example_inputs):
        return lambda *inputs: run(graph, inputs)
    g = kiln.compile(lambda x: x - 1, backend=callable_backend)
    torch.testing.assert_close(g(x), x - 1)


def test_prims_backend():
    kiln.reset()
    f = kiln.compile(lambda x: torch.exp(x) + x * 2, backend="prims")
    x = torch.randn(4)
    torch.testing.assert_close(f(x), torch.exp(x) + x * 2)


def test_bad_inputs():
    with pytest.raises(TypeError, match="expects a function"):
        kiln.compile(42)

    def gen(x):
        yield x
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = kiln.compile(gen)
    assert list(g(1)) == [1] and any("generator" in str(w.message) for w in caught)

    async def coro(x):
        return x
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert kiln.compile(coro) is coro
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert kiln.compile(len)([1, 2]) == 2


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown kiln backend"):
        kiln.compile(lambda x: x, backend="nope")


def test_exception_propagates_with_user_line():
    def f(x):
        return x @ torch.randn(5, 5)  # shapes do not match
    cf = kiln.compile(f, backend="eager")
    with pytest.raises(RuntimeError) as info:
        cf(torch.randn(3, 4))
    assert any(entry.name == "f" for entry in info.traceback)


def test_global_write_replayed():
    global TOTAL
    kiln.reset()

    def f(x):
        global TOTAL
        TOTAL = TOTAL + 1
        return x + TOTAL
    TOTAL = 0
    cf = kiln.compile(f, backend="eager")
    x = torch.zeros(2)
    out = cf(x)
    assert TOTAL == 1
    torch.testing.assert_close(out, torch.ones(2))


def test_global_dict_mutation_replayed():
    kiln.reset()

    def f(x):
        STATE["calls"] += 1
        STATE["last"] = x * 2
        return x
    STATE.clear()
    STATE["calls"] = 0
    cf = kiln.compile(f, backend="eager")
    x = torch.randn(3)
    cf(x)
    cf(x)
    assert STATE["calls"] == 2
    torch.testing.assert_close(STATE["last"], x * 2)


def test_nonlocal_write_replayed():
    kiln.reset()
    box = 0

    def f(x):
        nonlocal box
        box += 1
        return x * box
    cf = kiln.compile(f, backend="eager")
    x = torch.ones(2)
    torch.testing.assert_close(cf(x), x)
    assert box == 1


def test_attribute_write_on_object():
    kiln.reset()

    class Holder:
        pass
    h = Holder()
    h.value = None

    def f(x, holder):
        holder.value = x.sum()
        return x
    cf = kiln.compile(f, backend="eager")
    x = torch.randn(4)
    cf(x, h)
    torch.testing.assert_close(h.value, x.sum())


def test_input_list_returned_is_same_object():
    kiln.reset()

    def f(xs):
        xs.append(xs[0] * 2)
        return xs
    cf = kiln.compile(f, backend="eager")
    items = [torch.ones(2)]
    out = cf(items)
    assert out is items and len(items) == 2
    torch.testing.assert_close(items[1], torch.full((2,), 2.0))


def test_inplace_input_returned_is_same_object():
    kiln.reset()

    def f(x):
        x.mul_(3)
        return x
    cf = kiln.compile(f, backend="eager")
    x = torch.ones(2)
    assert cf(x) is x
    torch.testing.assert_close(x, torch.full((2,), 3.0))


def test_rng_matches_eager():
    kiln.reset()

    def f(x):
        return x + torch.randn(3)
    cf = kiln.compile(f, backend="eager")
    x = torch.zeros(3)
    torch.manual_seed(1)
    expected = f(x)
    torch.manual_seed(1)
    torch.testing.assert_close(cf(x), expected)


def test_no_grad_inside_graph():
    kiln.reset()

    def f(x):
        with torch.no_grad():
            y = x * 2
        return x * y
    cf = kiln.compile(f, backend="eager")
    x = torch.randn(3, requires_grad=True)
    cf(x).sum().backward()
    x2 = x.detach().clone().requires_grad_()
    f(x2).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    assert torch.is_grad_enabled()


def test_other_python_runs_eagerly(monkeypatch):
    import kiln.api as api
    from kiln.capture import cache
    monkeypatch.setattr(api, "_SUPPORTED_PYTHONS", ((3, 99),))
    monkeypatch.setattr(cache, "_WARNED", set())

    def f(x):
        return x + 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert kiln.compile(f) is f
    assert any("runs eagerly" in str(w.message) for w in caught)


def test_default_backend_auto():
    kiln.reset()
    f = kiln.compile(lambda x: (x * 2).sum(-1))
    x = torch.randn(3, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(f(x), (x * 2).sum(-1))


def test_cyclic_gc_is_paused_while_compiling_and_restored_after():
    import gc
    seen = []

    def backend(graph, example_inputs):
        seen.append(gc.isenabled())
        return lambda *inputs: run(graph, inputs)

    def fn(x):
        return torch.sin(x) + 1

    def broken(x):
        if x.sum() > 0:  # a break: fullgraph raises
            return x
        return -x

    assert gc.isenabled()
    kiln.reset()
    x = torch.randn(3)
    torch.testing.assert_close(kiln.compile(fn, backend=backend)(x), fn(x))
    assert seen == [False] and gc.isenabled()
    with pytest.raises(kiln.GraphBreakError):
        kiln.compile(broken, backend="eager", fullgraph=True)(x)
    assert gc.isenabled()   # restored when the compile raises
    gc.disable()
    try:
        kiln.compile(lambda x: x * 2, backend="eager")(x)
        assert not gc.isenabled()   # a caller's own setting is left alone
    finally:
        gc.enable()


def test_another_python_gets_a_clear_error_not_a_crash(monkeypatch):
    # on Python 3.12 importing the capture raised KeyError('POP_JUMP_BACKWARD_IF_TRUE') (a GPU machine's
    # Python); the API says what it needs and what runs instead
    import kiln
    monkeypatch.setattr(kiln, "CAPTURE_PYTHONS", ((3, 99),))
    with pytest.raises(RuntimeError, match=r"captures CPython 3\.99 bytecode.*kiln\.ops\.trace"):
        kiln.compile


# ---- frame names: the user's module and method, the line a resume function continues at ------------------
def plain_decorator(method):  # no functools.wraps: the wrapper's own name says nothing
    def wrapper(self, *args):
        return method(self, *args)
    return wrapper


def wrapping_decorator(method):  # as transformers' can_return_tuple and deprecate_kwarg
    @functools.wraps(method)
    def wrapped_func(self, *args):
        return method(self, *args)
    return wrapped_func


class DecoratedNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    @wrapping_decorator
    @wrapping_decorator
    def forward(self, x):
        return self.fc(x).relu()


class PlainDecoratedNet(DecoratedNet):
    @plain_decorator
    def forward(self, x):
        return self.fc(x) * 2


def resumed(x):
    y = x + 1
    print("in between", file=SINK)
    return y * 2


def test_frames_named_after_the_module_method_and_resume_line(tmp_path):
    kiln.reset()
    x = torch.randn(2, 4)
    assert kiln.explain(DecoratedNet(), x).capture_names == ["DecoratedNet.forward"]
    assert kiln.explain(PlainDecoratedNet(), x).capture_names == ["PlainDecoratedNet.forward"]
    report = kiln.explain(resumed, x)
    line = resumed.__code__.co_firstlineno + 3  # `return y * 2`, where the frame continues after the print
    assert report.capture_names == ["resumed", f"resumed (resumed at line {line})"], report.capture_names
    assert f"guards of capture 2 (resumed (resumed at line {line})): " in str(report)
    kiln.reset()
    graphs = []

    def recording(graph, example_inputs):
        graphs.append(graph.name)
        return kiln.backends.lookup_backend("eager")(graph, example_inputs)
    kiln.compile(DecoratedNet(), backend=recording)(x)
    kiln.compile(resumed, backend=recording)(x)
    assert graphs == ["DecoratedNet_forward", "resumed", f"resumed_line_{line}"], graphs
    assert kiln.counters["graphs"]["DecoratedNet.forward"] == 1, dict(kiln.counters["graphs"])


@pytest.mark.parametrize("frame", ["<lambda>", "f.<locals>.<lambda>", "class", "3d", "GPT2Model.forward",
                                   "f (resumed at line 12)", "<genexpr>"])
def test_graph_names_are_identifiers_not_keywords(frame):
    """A compiled lambda's graph was named `lambda` (a keyword): its symbolic-size graphs ran with torch and
    failed (arange of a SymInt), and a symbolic int argument gave NotImplemented."""
    import keyword

    from kiln.capture.cache import graph_name
    name = graph_name(frame)
    assert name.isidentifier() and not keyword.iskeyword(name), name
