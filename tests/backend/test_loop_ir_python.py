"""Every loop IR prints as runnable Python, and the printed modules compute the graph's values.

The programs are the fusion tests' own. Each test of test_cpp_backend.py, test_memory_order.py,
test_concat.py and test_fuzz_cpp.py runs here with its compile entry points replaced by a recorder: the
recorder puts the graph through the cpp backend's passes up to (not including) code generation, prints the
loop graph before fusion (`kiln.lower.printer.loop_python`) and the fused, ordered schedule
(`kiln.schedule.printer.schedule_python`), `exec`s each module on its own, runs it on the reference handler
and compares its outputs and mutated inputs with the graph interpreter (`kiln.graph.run(graph, inputs,
torch_level=True)`): default tolerances for each float dtype, exact for integers and bools. The test itself
then continues with a stand-in for the compiled graph whose call runs the printed schedule, so its own
assertions (kernel counts, the plan, values against eager, second calls with other inputs) hold for the
printed module too; test_fuzz_cpp.py's programs (captured by kiln.compile, with graph breaks, mutations and
aliasing inputs) reach the recorder through the cpp backend's `compile_graph`. No C++ compiler is needed.
"""
import functools
import importlib.util
import inspect
import itertools
import pathlib
import traceback

import pytest
import sympy
import torch

import kiln
import kiln.backends.cpp as kiln_cpp
import kiln.ops
from kiln import config
from kiln.backends.cpp import PASSES, CompiledGraph
from kiln.codegen.cpp import CPP_TARGET
from kiln.graph import map_structure, run
from kiln.graph.pipeline import CompileContext, CompileState, run_pipeline
from kiln.lower import reference
from kiln.lower.index import FloorDiv, ModularIndexing, index_var
from kiln.lower.ir import ComputedBuffer, ExternNode
from kiln.lower.ops import BINARY_OPS, UNARY_OPS, PrintHandler
from kiln.lower.printer import constants_of, loop_python
from kiln.lower.reference import Reference
from kiln.prims.registry import PRIMS
from kiln.schedule.fusion import FusedGroup
from kiln.schedule.printer import schedule_python

HERE = pathlib.Path(__file__).parent
SOURCES = ["test_cpp_backend.py", "test_memory_order.py", "test_fuzz_cpp.py", "test_concat.py", "test_indirect_index.py"]
# tests whose own assertions are about the C++ wrapper itself, not values: their programs are still
# recorded and checked, a failure of the test's own assertions is not one of the printed modules
WRAPPER_ONLY = {
    "test_outputs_recycled_only_when_dropped":
        "asserts that a dropped output's memory is reused (the wrapper's pool; the stand-in allocates anew)",
    "test_pooling_taps_read_one_padded_buffer":
        "asserts the generated C++ text (which loads are bounds-tested); the stand-in runs no C++",
    "test_products_run_as_eager_linear_calls_without_views":
        "asserts the generated wrapper's text (the stand-in is the printed IR, not the wrapper)",
    "test_broadcast_int64_to_float_is_computed_apart_without_a_vector_conversion":
        "asserts the lowering under a given target (the stand-in lowers for this machine's own)",
}
# the passes the backend runs before it writes code (printers read the loop IR and schedule they leave)
SCHEDULE_PASSES = PASSES[:[p.name for p in PASSES].index("codegen")]


def _load(filename):
    """A private copy of a test module (its globals can be replaced without touching pytest's own)."""
    name = f"_printed_ir_{pathlib.Path(filename).stem}"
    spec = importlib.util.spec_from_file_location(name, HERE / filename)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _parameter_sets(fn):
    """Keyword arguments for each case of a test's @pytest.mark.parametrize marks (one {} when none)."""
    axes = []
    for mark in getattr(fn, "pytestmark", []):
        if mark.name != "parametrize":
            continue
        names, values = mark.args[0], mark.args[1]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        cases = []
        for value in values:
            value = value.values if hasattr(value, "values") and hasattr(value, "marks") else value
            value = value if len(names) > 1 else (value,)
            cases.append(dict(zip(names, value)))
        axes.append(cases)
    for combination in itertools.product(*axes):
        kwargs = {}
        for part in combination:
            kwargs.update(part)
        yield kwargs


_MODULES = {}


def _collect():
    cases = []
    for filename in SOURCES:
        module = _MODULES[filename] = _load(filename)
        for name, fn in vars(module).items():
            if not (name.startswith("test_") and inspect.isfunction(fn)):
                continue
            marks = [m for m in getattr(fn, "pytestmark", []) if m.name in ("slow", "skip")]
            for kwargs in _parameter_sets(fn):
                label = ",".join(f"{v}" for v in kwargs.values())
                case_id = f"{pathlib.Path(filename).stem}::{name}" + (f"[{label}]" if label else "")
                cases.append(pytest.param(filename, name, kwargs, id=case_id, marks=marks))
    return cases


def _clone(value):
    """A copy with the same shape, strides and storage offset (the loop IR is lowered for the layout)."""
    if not isinstance(value, torch.Tensor):
        return value
    length = value.untyped_storage().nbytes() // value.element_size()
    base = value.detach().as_strided((length,), (1,), 0).clone()
    return base.as_strided(value.shape, value.stride(), value.storage_offset())


def _assert_same(got, want, where):
    """Equal structure; tensors close at the dtype's default tolerances (exact for integers and bools)."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{where}: a {type(got).__name__} where a tensor was expected"
        assert got.shape == want.shape and got.dtype == want.dtype, \
            f"{where}: {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}"
        torch.testing.assert_close(got, want, equal_nan=True, msg=lambda m: f"{where}: {m}")
    elif isinstance(want, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(want), f"{where}: {got!r} vs {want!r}"
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_same(g, w, f"{where}[{i}]")
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), f"{where}: {got!r} vs {want!r}"
        for key in want:
            _assert_same(got[key], want[key], f"{where}[{key!r}]")
    else:
        assert got == want, f"{where}: {got!r}, expected {want!r}"


def _module(source, label):
    namespace = {}
    exec(compile(source, label, "exec"), namespace)
    return namespace["run"]


def _layout_matches(loop, inputs):
    return len(inputs) == len(loop.inputs) and all(
        isinstance(t, torch.Tensor) and tuple(t.shape) == tuple(b.shape) and t.dtype == b.dtype and
        tuple(t.stride()) == tuple(b.layout.strides) for t, b in zip(inputs, loop.inputs))


class Recorder:
    """Stands in for compile_graph: checks the printed modules of each graph it is given."""

    SEED = 1234  # the printed modules and the interpreter draw the same random numbers

    def __init__(self):
        self.checked = 0
        self.failures = []
        self._seen = set()

    def compile_graph(self, graph, example_inputs, context=None, **_):
        state = CompileState(graph, list(example_inputs), CPP_TARGET)
        state = run_pipeline(f"printed {graph.name}", SCHEDULE_PASSES, state, context or CompileContext())
        loop = state.loop
        schedule_source = schedule_python(loop, state.schedule, "after pass order")
        self.check(graph, example_inputs, state, schedule_source)
        call = _module(schedule_source, f"<fused loop IR of {graph.name}>")

        def run_printed(*inputs):
            if not _layout_matches(loop, inputs):
                return run(graph, inputs, torch_level=True)  # as the wrapper falls back
            return call(*inputs, constants=constants_of(loop))
        return CompiledGraph(graph, loop, state.schedule, state.plan, "", schedule_source, run_printed,
                             state.records)

    def check(self, graph, inputs, state, schedule_source):
        rng = torch.get_rng_state()
        loop = state.loop
        try:
            sources = {"loop IR before fusion": loop_python(loop, "after pass fold_bias"),
                       "fused loop IR": schedule_source}
            expected_inputs = map_structure(_clone, list(inputs))
            torch.manual_seed(self.SEED)
            want = run(graph, expected_inputs, torch_level=True)
            for what, source in sources.items():
                fn = _module(source, f"<{what} of {graph.name}>")
                given = map_structure(_clone, list(inputs))
                torch.manual_seed(self.SEED)
                got = fn(*given, constants=constants_of(loop))
                _assert_same(got, want, f"{what} of {graph.name}: output")
                _assert_same(given, expected_inputs, f"{what} of {graph.name}: inputs after the call")
            self.checked += 1
        except Exception:
            self.failures.append(f"graph {graph.name}:\n{traceback.format_exc()}\n"
                                 f"--- loop IR ---\n{loop.describe()}\n--- fused ---\n{schedule_source}")
        finally:
            torch.set_rng_state(rng)

    def program(self, fn, *inputs):
        """Check a program the test schedules without compiling it (once per function and inputs)."""
        key = (id(fn),) + tuple(id(t) for t in inputs)
        if key not in self._seen:
            self._seen.add(key)
            self.compile_graph(kiln.ops.trace(fn, *inputs), list(inputs))


def _ordered_compile(recorder, fn, *inputs, memory_order=True):
    with config.patch(memory_order=memory_order):
        return recorder.compile_graph(kiln.ops.trace(fn, *inputs), list(inputs))


def _patched(module, recorder):
    """(object, attribute, replacement) routing the module's compiles through the recorder."""
    # the registered backend and test_memory_order's cpp.compile_graph, test_cpp_backend's compile_graph
    patches = [(kiln_cpp, "compile_graph", recorder.compile_graph)]
    if getattr(module, "compile_graph", None) is kiln_cpp.compile_graph:
        patches.append((module, "compile_graph", recorder.compile_graph))
    for name in ("schedules", "planned_peak"):  # test_memory_order's helpers that schedule without compiling
        original = getattr(module, name, None)
        if original is not None:
            def wrapped(fn, *inputs, _original=original, **kwargs):
                recorder.program(fn, *inputs)
                return _original(fn, *inputs, **kwargs)
            patches.append((module, name, wrapped))
    return patches


@pytest.mark.parametrize("filename, name, kwargs", _collect())
def test_printed_loop_ir_matches_the_interpreter(filename, name, kwargs):
    module = _MODULES.get(filename) or _MODULES.setdefault(filename, _load(filename))
    fn = getattr(module, name)
    recorder = Recorder()
    fixtures = {"ordered_compile": functools.partial(_ordered_compile, recorder)}
    arguments = dict(kwargs)
    for parameter in inspect.signature(fn).parameters:
        if parameter not in arguments:
            if parameter not in fixtures:
                pytest.skip(f"{name} needs fixture {parameter!r} (it compiles outside this process)")
            arguments[parameter] = fixtures[parameter]
    patches = _patched(module, recorder)
    saved = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in patches]
    body_error = None
    # kiln.compile caches captures per code object, and the copy's code objects equal the original's: forget
    # them before (so this test's programs reach the recorder) and after (so later tests compile for real)
    kiln.reset()
    try:
        for obj, attr, value in patches:
            setattr(obj, attr, value)
        fn(**arguments)
    except Exception:
        body_error = traceback.format_exc()
    finally:
        for obj, attr, value in reversed(saved):
            setattr(obj, attr, value)
        kiln.reset()
    assert not recorder.failures, "\n\n".join(recorder.failures)
    if recorder.checked == 0:
        failed = f" (it failed: {body_error[-500:]})" if body_error else ""
        pytest.skip(f"{name} compiles no graph{failed}")
    if body_error is not None and name not in WRAPPER_ONLY:
        pytest.fail(f"{name} failed with the printed schedule standing in for the compiled graph "
                    f"({recorder.checked} graphs checked before):\n{body_error}")


def test_printed_modules_spell_every_body():
    """The printed text is Python the interpreter parses and runs without the IR objects: no sympy names,
    no unbound loop variables; every kernel's body (FusedGroup.describe(body=True)) is in the module."""
    x, w = torch.randn(6, 10), torch.randn(10, 12)

    def fn(x, w):
        y = torch.softmax(x @ w, -1).reshape(4, 18)
        return y.sum(0) + torch.cat([y, y * 2], 0)[1:5].amax(0), torch.cumsum(x.t(), 0)
    recorder = Recorder()
    compiled = recorder.compile_graph(kiln.ops.trace(fn, x, w), [x, w])
    assert not recorder.failures, "\n\n".join(recorder.failures)
    source = compiled.wrapper_source
    for word in ("FloorDiv", "ModularIndexing", "lambda i", "Symbol"):
        assert word not in source, source
    for group in compiled.kernels:
        assert group.describe(body=True) in source
    loop_source = loop_python(compiled.loop)
    for node in compiled.loop.nodes:
        if isinstance(node, ComputedBuffer):
            assert node.describe() in loop_source
            assert node.describe() in compiled.loop.describe()
    assert any(isinstance(s, ExternNode) for s in compiled.schedule)
    assert any(isinstance(s, FusedGroup) and s.inner for s in compiled.schedule)
    torch.testing.assert_close(compiled(x, w), fn(x, w))


def test_a_wrong_body_is_caught():
    """The comparison has teeth: a printed module whose kernel computes something else fails."""
    x = torch.randn(5, 7)
    recorder = Recorder()
    compiled = recorder.compile_graph(kiln.ops.trace(lambda x: (x * 2).sum(-1), x), [x])
    assert recorder.checked == 1 and not recorder.failures
    broken = compiled.wrapper_source.replace("ops.reduce('sum'", "ops.reduce('max'")
    assert broken != compiled.wrapper_source
    got = _module(broken, "<broken>")(x, constants={})
    with pytest.raises(AssertionError):
        _assert_same(got, (x * 2).sum(-1), "broken module")


def test_reference_runs_bodies_directly():
    """The reference handler runs a body itself too, its index expressions (FloorDiv, ModularIndexing
    included) left as sympy and evaluated on the loop variables' tensors, and agrees with the printed
    module."""
    x = torch.randn(6, 10)

    def fn(x):
        return x.exp().reshape(4, 15).t().sum(-1), torch.cumsum(x, 1)
    graph = kiln.ops.trace(fn, x)
    state = run_pipeline("direct", SCHEDULE_PASSES, CompileState(graph, [x], CPP_TARGET), CompileContext())
    loop = state.loop
    assert "modular_indexing(" in loop.describe()  # the transposed reshape reads with a remainder
    ops = Reference()
    ops.input("x", x, (6, 10), (10, 1), torch.float32)
    for node in loop.nodes:
        ops.compute(node)
    printed = _module(loop_python(loop), "<direct>")(x)
    direct = tuple(ops.tensor(ref.name) for ref in loop.output)
    _assert_same(direct, fn(x), "direct run")
    _assert_same(direct, printed, "direct run against the printed module")


@pytest.mark.parametrize("name", sorted(UNARY_OPS | BINARY_OPS))
def test_reference_op_is_the_prim(name):
    """Each scalar op of the loop IR computes what the prim of the same name computes (its meaning; the
    logical ops, which no prim has, torch's), in each of float32, int32 and bool the prim accepts, NaN,
    infinities and signed zeros included."""
    prim = PRIMS.get(name)
    meaning = prim.ref if prim is not None else getattr(torch, name)
    arity = 1 if name in UNARY_OPS else 2
    floats = torch.tensor([-2.5, -1.0, -0.0, 0.0, 0.5, 1.0, 3.0, float("nan"), float("inf"), -float("inf")])
    samples = {torch.float32: (floats, floats.flip(0)),
               torch.int32: (torch.tensor([-7, -3, -1, 0, 1, 2, 5, 9], dtype=torch.int32),
                             torch.tensor([3, 1, 2, 1, 3, 1, 2, 4], dtype=torch.int32)),
               torch.bool: (torch.tensor([True, False, True, False]),
                            torch.tensor([True, True, False, False]))}
    accepted = 0
    for dtype, operands in samples.items():
        args = operands[:arity]
        if prim is not None:
            try:
                prim.meta(*args)
            except (TypeError, RuntimeError):
                continue
        _assert_same(Reference().op(name, *args), meaning(*args), f"ops.{name} on {dtype}")
        accepted += 1
    assert accepted, f"prims.{name} accepts none of the sample dtypes"


def test_an_index_without_a_python_spelling_fails_when_run_not_when_printed():
    """A fraction or another function in an index prints as a call that raises (a dump never breaks the
    compile); FloorDiv and ModularIndexing print as the reference's helpers and evaluate as they mean."""
    i = index_var("i", 0)
    namespace = {"floordiv": reference.floordiv, "modular_indexing": reference.modular_indexing,
                 "unprintable": reference.unprintable, "i0": torch.arange(20)}
    text = PrintHandler.index_text(3 * FloorDiv(i + 2, 7) + ModularIndexing(i, 4))
    assert torch.equal(eval(text, namespace), 3 * ((torch.arange(20) + 2) // 7) + torch.arange(20) % 4)
    for expr in (sympy.Rational(1, 2) * i, sympy.Min(i, 3)):
        text = PrintHandler.index_text(expr)
        assert text.startswith("unprintable(")
        with pytest.raises(NotImplementedError, match="index expression"):
            eval(text, namespace)
