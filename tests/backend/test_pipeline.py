"""The backend pipeline: the cpp backend as a declared pass list, the runner (timing, verify, dumps, fuel),
the compile context (options reach the backend; unsupported modes warn), the Target."""
import warnings

import pytest
import torch

import kiln
import kiln.ops
from kiln import config
from kiln.backends import GraphCompiler, compiler_for, cpp, lookup_backend
from kiln.codegen.cpp import CPP_TARGET
from kiln.graph.pipeline import FUEL, CompileContext, CompileState, Pass, PassVerifyError, run_pipeline
from kiln.lower.verify import LoopVerifyError
from kiln.schedule.verify import ScheduleVerifyError


pytestmark = pytest.mark.usefixtures("kiln_cache")


def softmax_mlp(x, w):
    return torch.softmax(torch.relu(x @ w) * 2 + 1, -1).sum(0)


def inputs():
    torch.manual_seed(0)
    return torch.randn(8, 16), torch.randn(16, 32)


def test_cpp_backend_is_its_declared_pass_list():
    x, w = inputs()
    c = cpp.compile_graph(kiln.ops.trace(softmax_mlp, x, w), [x, w])
    assert [r.name for r in c.records] == [p.name for p in cpp.PASSES]
    assert [p.name for p in cpp.PASSES] == ["to_prims", "dce", "cse", "lower", "fold_bias", "fuse", "order",
                                             "plan", "codegen", "build"]
    assert all(r.ms >= 0 for r in c.records)
    torch.testing.assert_close(c(x, w), softmax_mlp(x, w))


def test_verifier_runs_between_passes_and_names_the_pass():
    x, w = inputs()
    graph = kiln.ops.trace(softmax_mlp, x, w)

    def drop_a_kernel(state, ctx):
        state.schedule = state.schedule[1:]
    broken = list(cpp.PASSES)
    at = [p.name for p in broken].index("fuse") + 1
    broken.insert(at, Pass("drop_a_kernel", drop_a_kernel, verifier=cpp.PASSES[at - 1].verifier))
    with config.patch(verify=True), pytest.raises(PassVerifyError, match="after pass drop_a_kernel") as info:
        cpp.compile_graph(graph, [x, w], passes=broken)
    assert isinstance(info.value.__cause__, ScheduleVerifyError)
    # without verify the broken schedule is not checked between passes (the plan may still fail later)
    with config.patch(verify=False):
        try:
            cpp.compile_graph(graph, [x, w], passes=broken)
        except PassVerifyError:  # pragma: no cover - the runner must not verify
            pytest.fail("verified with verify off")
        except Exception:
            pass


def test_loop_verifier_catches_a_read_before_write():
    x, w = inputs()

    def reverse_nodes(state, ctx):
        state.loop.nodes.reverse()
    passes = list(cpp.PASSES)
    at = [p.name for p in passes].index("lower") + 1
    passes.insert(at, Pass("reverse_nodes", reverse_nodes, verifier=passes[at - 1].verifier))
    ctx = CompileContext(options={"verify": True})
    with pytest.raises(PassVerifyError, match="reverse_nodes") as info:
        cpp.compile_graph(kiln.ops.trace(softmax_mlp, x, w), [x, w], ctx, passes=passes)
    assert isinstance(info.value.__cause__, LoopVerifyError)
    assert "before it is written" in str(info.value.__cause__)


def test_runner_times_and_dumps_each_pass():
    seen = []
    passes = [Pass("one", lambda s, c: seen.append(1), lambda s: "x = 1"),
              Pass("two", lambda s, c: seen.append(2))]
    state = run_pipeline("demo", passes, CompileState(None, []), CompileContext(), dump=True)
    assert seen == [1, 2]
    assert [r.name for r in state.records] == ["one", "two"]
    assert state.records[0].dump.startswith("# demo: after pass one (") and state.records[0].dump.endswith(
        "x = 1")
    assert state.records[1].dump is None


def test_fuel_bisects_fusion_decisions():
    x, w = inputs()
    graph = kiln.ops.trace(softmax_mlp, x, w)
    full = cpp.compile_graph(graph, [x, w]).kernel_count
    FUEL.reset()
    with config.patch(fuel=0):
        starved = cpp.compile_graph(kiln.ops.trace(softmax_mlp, x, w), [x, w])
    assert starved.kernel_count > full  # no fusion at all
    torch.testing.assert_close(starved(x, w), softmax_mlp(x, w))
    FUEL.reset()
    with config.patch(fuel=1):
        one = cpp.compile_graph(kiln.ops.trace(softmax_mlp, x, w), [x, w])
    assert FUEL.used == 1 and FUEL.last[0] == 1 and FUEL.last[1] in ("cse", "fuse", "plan", "order")
    assert one.kernel_count <= starved.kernel_count
    FUEL.reset()


def test_fuel_bisects_in_place_writes_over_intermediates(monkeypatch):
    """Each in-place write over an intermediate is a decision: `kiln bisect` can refuse it alone."""
    torch.manual_seed(0)
    x = torch.randn(64, 48)

    def fn(x):
        a = torch.sigmoid(x) * 2
        s = a.sum(0)
        return torch.tanh(torch.exp(a) / s)  # the last reader of `a`, at its index: may overwrite it

    decisions = []
    real_take = FUEL.take

    def take(pass_name, decision):
        decisions.append((pass_name, decision() if callable(decision) else decision))
        return real_take(pass_name, decision)
    monkeypatch.setattr(FUEL, "take", take)

    def compile_with(fuel):
        FUEL.reset()
        decisions.clear()
        with config.patch(fuel=fuel):
            return cpp.compile_graph(kiln.ops.trace(fn, x), [x])
    full = compile_with(1 << 20)
    pairs = [(n, src) for step in full.plan.steps for n, src in step.inplace.items()]
    writes = [d for p, d in decisions if p == "plan"]
    assert pairs and writes == [f"write {n} in place of {src}" for n, src in pairs], (pairs, decisions)
    assert all(p == "plan" for p, _ in decisions[-len(writes):])  # (the plan decides last)
    refused = compile_with(len(decisions) - len(writes))  # every decision but the in-place writes
    assert not any(step.inplace for step in refused.plan.steps)
    assert refused.kernel_count == full.kernel_count
    torch.testing.assert_close(refused(x), fn(x))
    torch.testing.assert_close(full(x), fn(x))
    FUEL.reset()


def test_raise_on_error_option_reaches_the_cpp_backend(monkeypatch):
    def broken_codegen(state, ctx):
        raise RuntimeError("internal codegen failure")
    passes = [p if p.name != "codegen" else Pass("codegen", broken_codegen) for p in cpp.PASSES]
    monkeypatch.setitem(vars(cpp), "PASSES", passes)  # (removed after; see conftest's _lazy_attributes_left_lazy)
    x, w = inputs()

    def f(x, w):
        return torch.relu(x @ w) + 1
    with config.patch(raise_on_error=False):
        strict = kiln.compile(f, backend="cpp", options={"raise_on_error": True})
        with pytest.raises(RuntimeError, match="internal codegen failure"):
            strict(x, w)
        lenient = kiln.compile(f, backend="cpp")
        with pytest.warns(UserWarning, match="could not compile graph"):
            torch.testing.assert_close(lenient(x, w), f(x, w))


def test_per_compile_options_override_flags():
    x, w = inputs()
    graph = kiln.ops.trace(softmax_mlp, x, w)
    ctx = CompileContext.from_compile(options={"cpp_in_place": False, "memory_order": False})
    assert ctx.flag("cpp_in_place") is False and ctx.flag("recompile_limit") == config.get("recompile_limit")
    c = cpp.compile_graph(graph, [x, w], ctx)
    assert not any(step.inplace for step in c.plan.steps)


def test_unknown_options_and_modes_raise_unsupported_ones_warn():
    def f(x):
        return x + 1
    with pytest.raises(ValueError, match="unknown option"):
        kiln.compile(f, options={"no_such_option": 1})
    with pytest.raises(ValueError, match="unknown mode"):
        kiln.compile(f, mode="fastest")
    with pytest.raises(ValueError, match="dynamic must be"):
        kiln.compile(f, dynamic="yes")
    from kiln.graph import pipeline
    pipeline._WARNED.clear()
    with pytest.warns(UserWarning, match="mode='max-autotune'.*autotunes only the triton"):
        kiln.compile(f, mode="max-autotune")
    with pytest.warns(UserWarning, match="mode='reduce-overhead'.*runs.*'eager' backend compiles with the default"):
        kiln.compile(f, mode="reduce-overhead", backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kiln.compile(f, dynamic=True)  # supported: symbolic sizes (tests/capture/test_dynamic_shapes.py)
        kiln.compile(f, mode="max-autotune")  # once only
        kiln.compile(f, mode="max-autotune", backend="triton")  # what the mode tunes: no warning
        kiln.compile(f, mode="default", dynamic=False)
        kiln.compile(f, mode="reduce-overhead")  # the cpp backend's runs (kiln/codegen/cpp_native.py)
        g = kiln.compile(torch.nn.Linear(2, 2), mode="default", dynamic=False)
    assert isinstance(g, kiln.CompiledModule)


def test_backends_get_the_context_and_two_argument_backends_still_work():
    seen = []

    def two(graph, example_inputs):
        seen.append("two")
        return lookup_backend("eager")(graph, example_inputs)

    def three(graph, example_inputs, context):
        seen.append(context.mode)
        return lookup_backend("eager")(graph, example_inputs, context)

    def f(x):
        return x * 3
    x = torch.randn(4)
    torch.testing.assert_close(kiln.compile(f, backend=two)(x), f(x))
    torch.testing.assert_close(kiln.compile(f, backend=three, mode="default")(x), f(x))
    assert seen == ["two", "default"]
    # equal compiles share one compiler object (so their resume functions and callees are shared)
    a = compiler_for("eager", CompileContext.from_compile(options={"memory_order": False}))
    b = compiler_for("eager", CompileContext.from_compile(options={"memory_order": False}))
    assert isinstance(a, GraphCompiler) and a is b
    assert compiler_for("eager", CompileContext()) is not a


def test_cpp_target_policy():
    assert CPP_TARGET.computes(torch.float32) and not CPP_TARGET.computes(torch.complex64)
    assert "mm" in CPP_TARGET.extern_prims
