"""The OpInfo coverage harness: every entry of torch's op database through kiln, against eager.

    python -m kiln.testing.opinfo [--dtypes float32,int64,bool] [--ops abs,nn.functional.gelu]
                                  [--first-sample] [--json PATH] [--backend prims|cpp] [-j N]
                                  [--write-expected]

For each OpInfo entry of `torch.testing._internal.common_methods_invocations.op_db` and each dtype it
supports on the CPU, every sample (or only the first) goes through
    trace (every tensor of the sample is a graph input) -> to_prims -> verify -> the reference interpreter
(or, with `--backend cpp`, the torch-level graph compiled by that backend) and is compared with eager:
values with `torch.testing.assert_close` (default tolerances, equal_nan), output shapes and dtypes exactly,
strides of outputs that are views (eager's output shares an input's storage, or the op is a known view),
and the inputs afterwards (for ops that mutate them). A float value outside assert_close's tolerance still
passes under kiln's accuracy rule (`kiln.testing.tolerance`, at OP_TOL = 1e-4): allclose with an fp64
reference at 1e-4, or RMSE(kiln, fp64) <= 2 * RMSE(eager, fp64) + 1e-5.

Random ops (RANDOM_OPS, and entries whose op is wrapped in OpInfo's `wrapper_set_seed`): the same seed is
set before the eager call and before the kiln run (42 for `wrapper_set_seed` entries: that wrapper seeds
inside the traced function, which the graph does not record) and values are compared; when they differ
(a decomposition may draw its random numbers in another order) the sample is compared on output
structure, shape and dtype only and counted as `random_unchecked` in the table and the JSON. Entries whose
output is uninitialized memory (OpInfo's `has_nondeterministic_output`, e.g. `empty`) are always compared
on structure, shape and dtype only. A `torch.Size` result compares equal to a tuple of the same ints (the
graph IR keeps sizes as tuples).

When eager raises on a sample, kiln must raise the same exception type (the sample then counts as matched).
Samples are generated under a fixed seed, so sample i is the same in every run: the CI suite
(tests/test_opinfo.py) runs the first sample of each entry, or the recorded failing one of a listed entry.

Each entry is classified per dtype:
  decomposed      every sample traced without fallback nodes and matched eager
  fallback        every sample matched eager, some through fallback nodes (the torch op)
  mismatch        some sample gave a wrong result: the worst outcome, reported loudly
  error           kiln raised where eager did not (or a sample timed out)
  not applicable  the entry does not support the dtype on the CPU (or has no samples for it)
A mismatch or error listed in `kiln/testing/opinfo_expected.py` (with a reason) is an expected failure;
a listed entry that passes is reported as an unexpected pass, so the list only shrinks.
`--write-expected` regenerates that list from this run, keeping the reasons already written.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import json
import math
import multiprocessing
import os
import re
import signal
import sys
import tempfile
import threading
import time
import warnings
from typing import Any, Callable, Iterator

import torch

from .tolerance import OP_TOL, accuracy_rule

DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64, "int32": torch.int32,
          "bool": torch.bool, "float16": torch.float16, "bfloat16": torch.bfloat16}
STATUSES = ("decomposed", "fallback", "mismatch", "error", "not applicable")
SEED = 1234

# Ops that draw random numbers (see the module docstring).
RANDOM_OPS = {
    "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "normal", "uniform", "multinomial",
    "rand_like", "randn_like", "randint_like", "randint", "randn", "rand", "nn.functional.dropout",
    "nn.functional.dropout2d", "nn.functional.dropout3d", "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout", "nn.functional.rrelu", "randperm",
}

# Ops whose result is a view of an input: their output strides must equal eager's.
VIEW_OPS = {
    "view", "view_as", "reshape", "reshape_as", "t", "transpose", "permute", "expand", "expand_as",
    "narrow", "select", "squeeze", "unsqueeze", "unfold", "diagonal", "as_strided", "movedim", "moveaxis",
    "swapaxes", "swapdims", "split", "split_with_sizes", "chunk", "unbind", "T", "mT", "H", "mH", "real",
    "imag", "alias", "detach", "flatten", "unflatten", "tensor_split", "hsplit", "vsplit", "dsplit",
    "__getitem__", "slice", "contiguous", "view_as_real", "view_as_complex", "atleast_1d", "atleast_2d",
    "atleast_3d", "broadcast_to", "broadcast_tensors", "ravel", "adjoint", "positive", "resolve_conj",
    "resolve_neg", "conj", "squeeze_copy", "diagonal_copy",
}


# ---- one sample ------------------------------------------------------------------------------------------

class SampleTimeout(BaseException):
    """A sample ran past its time limit (a BaseException, so kiln's `except Exception` cannot swallow it)."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise SampleTimeout after `seconds` (only in the main thread, where signals can be delivered)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise SampleTimeout(f"timed out after {seconds:g} s")
    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _is_container(v: Any) -> bool:
    return type(v) in (tuple, list, dict)


def tensor_leaves(value: Any) -> list[torch.Tensor]:
    """Tensors inside nested plain tuples, lists and dicts, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if _is_container(value):
        items = value.values() if isinstance(value, dict) else value
        return [t for item in items for t in tensor_leaves(item)]
    return []


def replace_tensors(value: Any, tensors: Iterator[torch.Tensor]) -> Any:
    """`value` with each tensor replaced by the next of `tensors` (the inverse of tensor_leaves)."""
    if isinstance(value, torch.Tensor):
        return next(tensors)
    if _is_container(value) and tensor_leaves(value):
        if isinstance(value, dict):
            return {k: replace_tensors(v, tensors) for k, v in value.items()}
        return type(value)(replace_tensors(v, tensors) for v in value)
    return value


def clone_exact(t: torch.Tensor) -> torch.Tensor:
    """A copy with the same sizes, strides and storage offset (clone() would make some inputs dense)."""
    try:
        storage = t.untyped_storage().clone()
        copy = torch.empty(0, dtype=t.dtype, device=t.device)
        copy.set_(storage, t.storage_offset(), t.size(), t.stride())
        copy.requires_grad_(t.requires_grad)
        return copy
    except Exception:
        return t.detach().clone()


def _output_leaves(value: Any, path: str = "out") -> list[tuple[str, Any]]:
    if isinstance(value, torch.Tensor):
        return [(path, value)]
    if isinstance(value, (tuple, list)):
        return [leaf for i, v in enumerate(value) for leaf in _output_leaves(v, f"{path}[{i}]")]
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _output_leaves(v, f"{path}[{k!r}]")]
    return [(path, value)]


def _first_line(text: str, limit: int = 300) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[:limit] + "..."


def describe_exception(e: BaseException) -> str:
    """`Type: first line of the message [note naming the node]`."""
    text = f"{type(e).__name__}: {_first_line(str(e))}"
    notes = [n for n in getattr(e, "__notes__", []) if "kiln ran node" in n]
    if notes:
        text += f" [{notes[0].removeprefix('while kiln ran ')}]"
    return text


@dataclasses.dataclass
class SampleOutcome:
    status: str  # "ok", "mismatch" or "error"
    message: str = ""
    fallbacks: tuple[str, ...] = ()
    by_rule: bool = False  # matched under the accuracy rule, not assert_close
    eager_raised: bool = False
    random_unchecked: bool = False  # a random op whose values differ: compared on shape and dtype only


class Mismatch(Exception):
    pass


def compare_outputs(actual: Any, expected: Any, *, values: bool = True, strides_of: Callable[[Any], bool],
                    reference: Callable[[], Any] | None = None) -> bool:
    """Raise Mismatch when `actual` differs from eager's `expected`; return True if the accuracy rule
    (not assert_close) accepted some value."""
    got, want = _output_leaves(actual), _output_leaves(expected)
    if len(got) != len(want):
        raise Mismatch(f"output structure differs: {len(got)} leaves vs eager's {len(want)} "
                       f"({type(actual).__name__} vs {type(expected).__name__})")
    by_rule = False
    ref_leaves: list[tuple[str, Any]] | None = None
    for index, ((path, a), (_, e)) in enumerate(zip(got, want)):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise Mismatch(f"{path}: {type(a).__name__} where eager gives a tensor")
            if a.shape != e.shape or a.dtype != e.dtype:
                raise Mismatch(f"{path}: {_meta(a)} where eager gives {_meta(e)}")
            if a.layout != e.layout:
                raise Mismatch(f"{path}: layout {a.layout} where eager gives {e.layout}")
            if e.layout != torch.strided:
                a, e = a.to_dense(), e.to_dense()
            if strides_of(e) and a.stride() != e.stride():
                raise Mismatch(f"{path}: view strides {a.stride()} where eager gives {e.stride()}")
            if not values:
                continue
            try:
                torch.testing.assert_close(a, e, equal_nan=True, check_device=True, check_stride=False,
                                           check_layout=False)
            except AssertionError as err:
                if reference is not None and e.is_floating_point():
                    if ref_leaves is None:
                        ref_leaves = _output_leaves(reference())
                    r = ref_leaves[index][1] if index < len(ref_leaves) else None
                    # a second chance after assert_close against eager: allclose to the fp64 value
                    if isinstance(r, torch.Tensor) and accuracy_rule(a, e, r, tol=OP_TOL,
                                                                     allclose_to="fp64").passed:
                        by_rule = True
                        continue
                msg = " ".join(str(err).split())
                raise Mismatch(f"{path} {_meta(e)}: {msg[:400]}") from None
        elif isinstance(e, (bool, int, float, complex)) and not isinstance(a, torch.Tensor):
            if type(a) is not type(e):
                raise Mismatch(f"{path}: {type(a).__name__} {a!r} where eager gives {type(e).__name__} {e!r}")
            if values and not (a == e or (isinstance(e, float) and math.isnan(e) and math.isnan(a))):
                raise Mismatch(f"{path}: {a!r} where eager gives {e!r}")
        else:
            if isinstance(a, torch.Tensor):
                raise Mismatch(f"{path}: a tensor where eager gives {type(e).__name__} {e!r}")
            if values and a != e:
                raise Mismatch(f"{path}: {a!r} where eager gives {e!r}")
    return by_rule


def _meta(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


def _storages(tensors: list[torch.Tensor]) -> set[int]:
    ptrs = set()
    for t in tensors:
        try:
            if t.numel():
                ptrs.add(t.untyped_storage().data_ptr())
        except Exception:
            pass
    return ptrs


def _tensor_method_name(op: Any) -> str | None:
    """The method name when the entry's op is an unbound torch.Tensor method (`torch.Tensor.item`).

    Such a descriptor rejects anything but a real tensor, so the harness calls it as a method of the input
    (`x.item()`), which is how programs call it and what reaches kiln's symbolic tensors.
    """
    fn = op.op
    name = getattr(fn, "__name__", None)
    if name is None or type(fn).__name__ not in ("method_descriptor", "wrapper_descriptor"):
        return None
    return name if getattr(torch.Tensor, name, None) is fn else None


def uses_seed_wrapper(op: Any) -> bool:
    """Whether the entry's op runs inside OpInfo's `wrapper_set_seed` (it seeds 42, then calls the op)."""
    if op.name == "item":  # its lambda names the wrapper but draws no random numbers
        return False
    fn = op.op
    inner = getattr(fn, "func", None)
    if getattr(inner, "__name__", "") == "wrapper_set_seed":
        return True
    code = getattr(fn, "__code__", None)
    return code is not None and "wrapper_set_seed" in code.co_names


def _same_error_type(kiln_error: BaseException, eager_error: BaseException) -> bool:
    """Eager's type or a subclass of it, but not one of kiln's own errors (UnsupportedError, ...): those
    say kiln could not trace the sample, not that the input is bad."""
    if type(kiln_error).__module__.startswith("kiln."):
        return type(kiln_error) is type(eager_error)
    return isinstance(kiln_error, type(eager_error))


def _kiln_call(fn: Callable[..., Any], inputs: list[torch.Tensor], backend: str,
               seed: int = SEED) -> tuple[Any, list, Any]:
    """Trace fn on copies of inputs and run the result on `inputs`; returns (output, fallbacks, graph)."""
    import kiln.graph
    import kiln.ops
    graph = kiln.ops.trace(fn, *[clone_exact(t) for t in inputs])
    fallbacks = [n.target_name() for n in graph.fallbacks()]
    if backend == "prims":
        prim_graph = kiln.graph.to_prims(graph)
        kiln.graph.verify(prim_graph)
        fallbacks = [n.target_name() for n in prim_graph.fallbacks()]
        torch.manual_seed(seed)
        return kiln.graph.run(prim_graph, inputs), fallbacks, prim_graph
    from kiln.backends import lookup_backend
    compiled = lookup_backend(backend)(graph, list(inputs))
    torch.manual_seed(seed)
    return compiled(*inputs), fallbacks, graph


def run_sample(op: Any, sample: Any, backend: str = "prims") -> SampleOutcome:
    """Run one OpInfo sample through kiln and eager and compare (never raises, except SampleTimeout)."""
    structure = (sample.input, sample.args, sample.kwargs)
    leaves = tensor_leaves(list(structure))

    method = _tensor_method_name(op)

    def fn(*tensors: Any) -> Any:
        inp, args, kwargs = replace_tensors(list(structure), iter(tensors))
        if method is not None and isinstance(sample.input, torch.Tensor):
            return getattr(inp, method)(*args, **kwargs)  # as user code calls it: x.item(), x + y
        return op(inp, *args, **kwargs)

    eager_inputs = [clone_exact(t) for t in leaves]
    eager_error: BaseException | None = None
    expected: Any = None
    try:
        torch.manual_seed(SEED)
        expected = fn(*eager_inputs)
    except SampleTimeout:
        raise
    except Exception as e:
        eager_error = e

    kiln_inputs = [clone_exact(t) for t in leaves]
    try:
        actual, fallbacks, _ = _kiln_call(fn, kiln_inputs, backend, 42 if uses_seed_wrapper(op) else SEED)
    except SampleTimeout:
        raise
    except Exception as e:
        if eager_error is not None:
            if _same_error_type(e, eager_error):
                return SampleOutcome("ok", eager_raised=True)
            return SampleOutcome("error", f"kiln raised {describe_exception(e)} where eager raises "
                                          f"{describe_exception(eager_error)}")
        from ..ops.registry import UnsupportedError
        if isinstance(e, UnsupportedError):
            # a clean refusal: under kiln.compile this call is a graph break and runs eagerly (eager's result)
            return SampleOutcome("ok", fallbacks=(f"graph break: {e}",))
        return SampleOutcome("error", describe_exception(e))
    if eager_error is not None:
        return SampleOutcome("mismatch", f"kiln returned a value where eager raises "
                                         f"{describe_exception(eager_error)}", tuple(fallbacks))

    name = op.name
    # older torch's OpInfo lacks the flag: its uninitialized-memory entries are the empty* factories
    uninitialized = getattr(op, "has_nondeterministic_output", name.removeprefix("new_").startswith("empty"))
    random = name in RANDOM_OPS or uses_seed_wrapper(op)
    input_storages = _storages(eager_inputs)
    is_view = name in VIEW_OPS or name.removeprefix("_refs.") in VIEW_OPS

    def strides_of(t: torch.Tensor) -> bool:
        if t.layout != torch.strided:
            return False
        return is_view or (t.numel() > 0 and t.untyped_storage().data_ptr() in input_storages)

    def reference() -> Any:
        # (float16 and bfloat16 too: a reference computed in the sample's half dtype would judge nothing)
        inputs = [t.double() if t.dtype in (torch.float32, torch.float16, torch.bfloat16) else clone_exact(t)
                  for t in leaves]
        torch.manual_seed(SEED)
        return fn(*inputs)

    try:
        unchecked = False
        try:
            by_rule = compare_outputs(actual, expected, values=not uninitialized, strides_of=strides_of,
                                      reference=reference if not random else None)
        except Mismatch:
            if not random:
                raise
            by_rule = compare_outputs(actual, expected, values=False, strides_of=strides_of)
            unchecked = True
        for i, (a, e) in enumerate(zip(kiln_inputs, eager_inputs)):
            if not torch.equal(a, e) and not (a.is_floating_point() and torch.allclose(
                    a, e, equal_nan=True)):
                raise Mismatch(f"input {i} after the call differs from eager's (a mutated input)")
    except Mismatch as m:
        return SampleOutcome("mismatch", str(m), tuple(fallbacks))
    except Exception as e:  # the comparison itself failed (e.g. a reference that cannot run in fp64)
        return SampleOutcome("mismatch", f"cannot compare: {describe_exception(e)}", tuple(fallbacks))
    return SampleOutcome("ok", fallbacks=tuple(fallbacks), by_rule=by_rule, random_unchecked=unchecked)


# ---- one op ----------------------------------------------------------------------------------------------

def op_id(op: Any) -> str:
    """`name` or `name.variant` (OpInfo's variant_test_name), unique in op_db."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def op_database() -> list[Any]:
    from torch.testing._internal.common_methods_invocations import op_db
    return list(op_db)


def samples(op: Any, dtype: torch.dtype, first: int | None = None) -> list[Any]:
    """The op's CPU samples for dtype, generated under a fixed seed (so sample i is reproducible)."""
    torch.manual_seed(0)
    result = []
    for sample in op.sample_inputs("cpu", dtype, requires_grad=False):
        result.append(sample)
        if first is not None and len(result) >= first:
            break
    return result


@dataclasses.dataclass
class OpResult:
    op: str
    dtype: str
    status: str
    samples: int = 0
    matched: int = 0
    eager_errors: int = 0
    by_rule: int = 0
    random_unchecked: int = 0
    fallbacks: list[str] = dataclasses.field(default_factory=list)
    message: str = ""
    failed_sample: int | None = None
    seconds: float = 0.0
    expected: str | None = None  # the checked-in reason, when this entry is a known failure

    @property
    def passed(self) -> bool:
        return self.status in ("decomposed", "fallback")


def run_op(op: Any, dtype_name: str, *, first_sample: bool = False, only_sample: int | None = None,
           backend: str = "prims", sample_timeout: float = 60.0) -> OpResult:
    """Classify one OpInfo entry for one dtype. Never raises (a crash in the op is an `error`)."""
    start = time.perf_counter()
    dtype = DTYPES[dtype_name]
    result = OpResult(op_id(op), dtype_name, "not applicable")
    if dtype not in op.supported_dtypes("cpu"):
        result.message = f"does not support {dtype_name} on the CPU"
        return result
    try:
        with time_limit(sample_timeout):
            if only_sample is not None:
                chosen = list(enumerate(samples(op, dtype, only_sample + 1)))[only_sample:]
            else:
                chosen = list(enumerate(samples(op, dtype, 1 if first_sample else None)))
    except (Exception, SampleTimeout) as e:
        result.status, result.message = "error", f"sample_inputs raised {describe_exception(e)}"
        return result
    if not chosen:
        result.message = f"no {dtype_name} samples on the CPU"
        return result
    fallbacks: set[str] = set()
    failures: dict[str, tuple[int, str]] = {}
    for index, sample in chosen:
        result.samples += 1
        try:
            with time_limit(sample_timeout):
                outcome = run_sample(op, sample, backend)
        except SampleTimeout as e:
            outcome = SampleOutcome("error", f"sample {index} {e}")
        except Exception as e:  # a bug in the harness itself must not stop the run
            outcome = SampleOutcome("error", f"harness error {describe_exception(e)}")
        fallbacks.update(outcome.fallbacks)
        if outcome.status == "ok":
            result.matched += 1
            result.eager_errors += outcome.eager_raised
            result.by_rule += outcome.by_rule
            result.random_unchecked += outcome.random_unchecked
        else:
            failures.setdefault(outcome.status, (index, outcome.message))
    result.fallbacks = sorted(fallbacks)
    for status in ("mismatch", "error"):
        if status in failures:
            result.status = status
            result.failed_sample, result.message = failures[status]
            break
    else:
        result.status = "fallback" if fallbacks else "decomposed"
    result.seconds = time.perf_counter() - start
    return result


# ---- the expected-failure list ---------------------------------------------------------------------------

def expected_failures() -> dict[str, dict[str, dict[str, Any]]]:
    """{dtype: {op id: {"kind", "sample", "reason"}}} from kiln/testing/opinfo_expected.py."""
    try:
        from . import opinfo_expected
    except ImportError:
        return {}
    return opinfo_expected.EXPECTED_FAILURES


_CAUSES = [  # (pattern in the failure message, reason): the first match explains a new entry
    (r"descriptor '(\w+)' .*'Proxy'",
     "kiln's Proxy is not a torch.Tensor: the OpInfo op calls the unbound torch.Tensor.{0} on it "
     "(TypeError)"),
    (r"Sparse|sparse", "sparse tensors: kiln's graph holds strided tensors only"),
    (r"DataDependentError",
     "needs a tensor's value while tracing (data-dependent; a graph break in capture)"),
    (r"UnsupportedError: (.*)", "kiln cannot trace it: {0}"),
    (r"timed out", "a sample ran past the harness's time limit"),
]


def explain_failure(result: OpResult) -> str:
    """A reason for a new expected-failure entry, from the failure message."""
    for pattern, reason in _CAUSES:
        match = re.search(pattern, result.message)
        if match:
            return f"{result.status}: " + reason.format(*match.groups())
    if result.status == "mismatch":
        return f"mismatch (WRONG RESULT): {result.message}"
    return f"{result.status}: {result.message}"


def write_expected(results: list[OpResult], path: str | None = None, partial: bool = False) -> str:
    """Regenerate the expected-failure list from `results`, keeping the reasons already written.

    Entries of dtypes not run are kept; with `partial` (a run of some ops only) so are entries of ops
    not run.
    """
    path = path or os.path.join(os.path.dirname(__file__), "opinfo_expected.py")
    old = expected_failures()
    ran = {(r.dtype, r.op) for r in results}
    run_dtypes = {r.dtype for r in results}
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for dtype, entries in old.items():
        for name, entry in entries.items():
            if dtype not in run_dtypes or (partial and (dtype, name) not in ran):
                table.setdefault(dtype, {})[name] = entry
    for r in results:
        if r.status not in ("mismatch", "error"):
            continue
        previous = old.get(r.dtype, {}).get(r.op)
        reason = previous["reason"] if previous else explain_failure(r)
        table.setdefault(r.dtype, {})[r.op] = {"kind": r.status, "sample": r.failed_sample, "reason": reason}
    lines = ['"""OpInfo entries kiln is known to fail, per dtype, each with a reason (checked in).',
             "",
             "Generated by `python -m kiln.testing.opinfo --write-expected` (reasons already here are kept;",
             "edit them freely). `kind` is mismatch or error; `sample` is the first failing sample,",
             "which the CI suite (tests/test_opinfo.py) runs. An entry that passes fails the CI suite:",
             "delete it, so the list only shrinks. The list is for the prims backend (the reference",
             'interpreter)."""',
             "",
             "EXPECTED_FAILURES = {"]
    for dtype in sorted(table):
        lines.append(f"    {json.dumps(dtype)}: {{")
        for name in sorted(table[dtype]):
            entry = table[dtype][name]
            lines.append(f"        {json.dumps(name)}: {{\"kind\": {json.dumps(entry['kind'])}, "
                         f"\"sample\": {entry['sample']!r},")
            lines.append(f"            \"reason\": {_wrapped_string(entry['reason'], 16)}}},")
        lines.append("    },")
    lines.append("}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def _wrapped_string(text: str, indent: int, width: int = 108) -> str:
    """A Python string literal of text, split into adjacent literals that fit in `width` columns."""
    room = max(width - indent - 12, 20)
    pieces: list[str] = []
    current = ""
    for word in text.split(" "):
        candidate = f"{current} {word}" if current else word
        while len(json.dumps(candidate)) > room:
            if current:  # break before the word
                pieces.append(current + " ")
                current, candidate = "", word
                continue
            cut = max(room - 12, 8)  # a word longer than a line: cut it
            pieces.append(candidate[:cut])
            candidate = candidate[cut:]
        current = candidate
    pieces.append(current)
    if len(pieces) == 1:
        return json.dumps(pieces[0])
    joiner = "\n" + " " * indent
    return "(" + joiner.join(json.dumps(p) for p in pieces) + ")"


def mark_expected(results: list[OpResult]) -> None:
    table = expected_failures()
    for r in results:
        entry = table.get(r.dtype, {}).get(r.op)
        if entry is not None:
            r.expected = entry["reason"]


# ---- reporting -------------------------------------------------------------------------------------------

def totals(results: list[OpResult], dtype: str) -> dict[str, int]:
    rows = [r for r in results if r.dtype == dtype]
    count = {s: sum(r.status == s for r in rows) for s in STATUSES}
    expected = sum(1 for r in rows if r.status in ("mismatch", "error") and r.expected)
    return {
        "decomposed": count["decomposed"], "fallback": count["fallback"], "expected_fail": expected,
        "wrong": sum(1 for r in rows if r.status == "mismatch" and not r.expected),
        "error": sum(1 for r in rows if r.status == "error" and not r.expected),
        "mismatch": count["mismatch"], "all_errors": count["error"],
        "not_applicable": count["not applicable"], "ops": len(rows) - count["not applicable"],
        "unexpected_pass": sum(1 for r in rows if r.passed and r.expected),
    }


def summary_line(results: list[OpResult], dtype: str, prims: int) -> str:
    t = totals(results, dtype)
    return (f"opinfo {dtype}: {t['decomposed']} decomposed, {t['fallback']} fallback, "
            f"{t['expected_fail']} expected-fail, {t['wrong']} wrong, {t['error']} error of {t['ops']} ops, "
            f"{prims} prims")


def fallback_ranking(results: list[OpResult]) -> list[tuple[str, int]]:
    """Fallback torch ops, by how many otherwise-passing entries use them (most first)."""
    counts: dict[str, int] = {}
    for r in results:
        if r.status == "fallback":
            for name in r.fallbacks:
                counts[name] = counts.get(name, 0) + 1
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def print_table(results: list[OpResult], dtype: str, out: Any = sys.stdout) -> None:
    rows = sorted((r for r in results if r.dtype == dtype), key=lambda r: r.op)
    print(f"\n== {dtype} ==", file=out)
    print(f"{'op':<44} {'status':<15} {'samples':>9}  detail", file=out)
    for r in rows:
        detail = ""
        if r.status == "fallback":
            detail = "fallback: " + ", ".join(r.fallbacks)
        elif r.status in ("mismatch", "error"):
            detail = f"sample {r.failed_sample}: {r.message}" if r.failed_sample is not None else r.message
            label = "EXPECTED " if r.expected else ("WRONG RESULT " if r.status == "mismatch" else "")
            detail = label + detail
        elif r.status == "not applicable":
            detail = r.message
        if r.passed and r.expected:
            detail = "UNEXPECTED PASS (remove it from opinfo_expected.py) " + detail
        if r.by_rule:
            detail += f" [{r.by_rule} by the accuracy rule]"
        if r.random_unchecked:
            detail += f" [{r.random_unchecked} random: shape and dtype only]"
        print(f"{r.op:<44} {r.status:<15} {r.matched:>4}/{r.samples:<4}  {detail[:300]}", file=out)
    t = totals(results, dtype)
    print(f"totals {dtype}: " + ", ".join(f"{v} {k}" for k, v in t.items()), file=out)
    ranking = fallback_ranking(rows)
    if ranking:
        print(f"fallback ops by entries they keep from decomposing ({dtype}): "
              + ", ".join(f"{name} {count}" for name, count in ranking[:40]), file=out)
    wrong = [r for r in rows if r.status == "mismatch" and not r.expected]
    if wrong:
        print(f"!! {len(wrong)} {dtype} entries give WRONG RESULTS: {', '.join(r.op for r in wrong)}",
              file=out)


# ---- running many ops ------------------------------------------------------------------------------------

_POOL_OPS: list[Any] = []


def _pool_task(index: int, dtype: str, options: dict[str, Any]) -> dict[str, Any]:
    torch.set_num_threads(1)
    return dataclasses.asdict(run_op(_POOL_OPS[index], dtype, **options))


def run_all(ops: list[Any], dtypes: list[str], jobs: int = 1, progress: Any = sys.stderr,
            **options: Any) -> list[OpResult]:
    """run_op for every (op, dtype); with jobs > 1 in forked worker processes (a crash is an error)."""
    tasks = [(i, d) for d in dtypes for i in range(len(ops))]
    results: dict[tuple[int, str], OpResult] = {}
    started = time.perf_counter()

    def report(key: tuple[int, str], r: OpResult) -> None:
        results[key] = r
        if progress is not None:
            flag = "  <-- WRONG RESULT" if r.status == "mismatch" else ""
            print(f"[{len(results):>4}/{len(tasks)} {time.perf_counter() - started:6.0f}s] {r.dtype:<8} "
                  f"{r.op:<40} {r.status}{flag} ({r.seconds:.1f}s)", file=progress, flush=True)

    if jobs <= 1:
        for i, d in tasks:
            report((i, d), run_op(ops[i], d, **options))
    else:
        _POOL_OPS[:] = ops
        pending = list(tasks)
        while pending:
            crashed = _run_pool(pending, jobs, options, report)
            pending = [t for t in pending if t not in results]
            if crashed and len(pending) == len(crashed) and jobs == 1:
                for i, d in pending:  # a lone task that kills its worker
                    report((i, d), OpResult(op_id(ops[i]), d, "error", message="the worker process crashed"))
                pending = []
            elif crashed:
                jobs = 1  # find the task that crashes by running the rest one at a time
    return [results[t] for t in tasks]


def _run_pool(tasks: list[tuple[int, str]], jobs: int, options: dict[str, Any],
              report: Callable[[tuple[int, str], OpResult], None]) -> list[tuple[int, str]]:
    context = multiprocessing.get_context("fork")
    crashed: list[tuple[int, str]] = []
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
        futures = {pool.submit(_pool_task, i, d, options): (i, d) for i, d in tasks}
        for future in concurrent.futures.as_completed(futures):
            key = futures[future]
            try:
                report(key, OpResult(**future.result()))
            except concurrent.futures.process.BrokenProcessPool:
                crashed.append(key)
            except Exception as e:
                report(key, OpResult(op_id(_POOL_OPS[key[0]]), key[1], "error",
                                     message=f"worker failed: {describe_exception(e)}"))
    return crashed


def select_ops(names: str | None) -> list[Any]:
    ops = op_database()
    if not names:
        return ops
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    return [op for op in ops if any(w == op_id(op) or w in op_id(op) for w in wanted)]


def main(argv: list[str] | None = None) -> int:
    """The command line; returns 1 when some entry gives a wrong result or fails unexpectedly."""
    parser = argparse.ArgumentParser(prog="python -m kiln.testing.opinfo", description=__doc__.split("\n")[0])
    parser.add_argument("--dtypes", default="float32,int64,bool", help="comma-separated dtypes")
    parser.add_argument("--ops", default=None, help="comma-separated op names (substring match)")
    parser.add_argument("--first-sample", action="store_true", help="only the first sample of each op")
    parser.add_argument("--json", default=os.path.join(tempfile.gettempdir(), "kiln_opinfo.json"),
                        help="write every result to this JSON file (default: %(default)s)")
    parser.add_argument("--backend", default="prims", help="prims (reference interpreter) or a backend name")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per sample")
    parser.add_argument("--write-expected", action="store_true",
                        help="regenerate kiln/testing/opinfo_expected.py from this run (keeps reasons; "
                             "with --ops only those entries)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args(argv)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for d in dtypes:
        if d not in DTYPES:
            parser.error(f"unknown dtype {d!r}; known: {', '.join(DTYPES)}")

    warnings.simplefilter("ignore")  # torch's UserWarnings about samples would drown the table
    import kiln.ops  # noqa: F401  (registers the decompositions)
    import kiln.prims
    ops = select_ops(args.ops)
    options = {"first_sample": args.first_sample, "backend": args.backend, "sample_timeout": args.timeout}
    results = run_all(ops, dtypes, jobs=args.jobs, progress=None if args.quiet else sys.stderr, **options)
    mark_expected(results)
    prims = kiln.prims.count()
    for d in dtypes:
        print_table(results, d)
    if args.write_expected:
        if args.first_sample or args.backend != "prims":
            print("--write-expected needs every sample on the prims backend; not written", file=sys.stderr)
        else:
            print(f"wrote {write_expected(results, partial=bool(args.ops))}", file=sys.stderr)
    if args.json:
        print(f"results in {args.json}", file=sys.stderr)
        with open(args.json, "w") as f:
            json.dump({"backend": args.backend, "prims": prims, "first_sample": args.first_sample,
                       "totals": {d: totals(results, d) for d in dtypes},
                       "results": [dataclasses.asdict(r) for r in results]}, f, indent=1)
    print()
    for d in dtypes:
        print(summary_line(results, d, prims))
    bad = any(r.status in ("mismatch", "error") and not r.expected for r in results)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
