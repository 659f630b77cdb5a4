"""torch.ops.aten overloads called directly, compiled by kiln, against eager.

    python -m kiln.testing.aten_overloads [--all-samples] [--dtype float32] [--backend prims] [--ops add,mm]

For each OpInfo entry whose `aten_name` names an aten operator, each sample (or only the first) is called
as the overload torch's dispatcher picks for it (`torch.ops.aten.add.Tensor(input, *args, **kwargs)`),
in a function compiled with `kiln.compile`; results (values, dtypes, shapes) and inputs afterwards are
compared with eager. Samples eager refuses in the overload's conventions are skipped. Each case is
    traced     no fallback node, no graph break: kiln decomposed the overload (or the graph is empty: it
               returns its input)
    fallback   matched eager; the graph calls a torch op kiln does not decompose
    eager      matched eager, but a graph break (or the whole frame) ran in torch
    mismatch   a wrong result (or an error eager does not raise): the outcome that must never happen
Random ops and uninitialized results (`empty_like`) are compared on structure, shapes and dtypes
only. Only kiln's public API is used, so the same file measures an older checkout:
`PYTHONPATH=<checkout> python path/to/aten_overloads.py`.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import warnings
from typing import Any, Iterator

import torch

import kiln

OUTCOMES = ("traced", "fallback", "eager", "mismatch")
# overloads whose values are random or uninitialized memory: compared on structure, shapes and dtypes
_UNCHECKED_WORDS = ("rand", "bernoulli", "normal", "dropout", "multinomial", "poisson", "uniform",
                    "exponential", "geometric", "cauchy", "rrelu", "empty")
_DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64, "bool": torch.bool}


@dataclasses.dataclass
class Case:
    name: str  # the OpInfo entry (and variant)
    op: Any  # the OpOverload
    args: tuple
    kwargs: dict

    @property
    def unchecked(self) -> bool:
        return any(word in str(self.op) for word in _UNCHECKED_WORDS)


def _leaves(value: Any) -> list:
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in _leaves(v)]
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    return [value]


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


def cases(dtype: torch.dtype = torch.float32, first_only: bool = True,
          only: set | None = None) -> Iterator[Case]:
    """(OpInfo entry, overload, sample) for every entry naming an aten operator whose sample eager accepts
    in the overload's conventions."""
    from torch.testing._internal.common_methods_invocations import op_db
    for entry in op_db:
        name = entry.name + (f".{entry.variant_test_name}" if entry.variant_test_name else "")
        packet = getattr(torch.ops.aten, entry.aten_name or "", None) if entry.aten_name else None
        if packet is None or (only and entry.name not in only) or dtype not in entry.supported_dtypes("cpu"):
            continue
        torch.manual_seed(1234)
        try:
            samples = list(entry.sample_inputs("cpu", dtype, requires_grad=False))
        except Exception:
            continue
        for sample in samples[:1] if first_only else samples:
            args, kwargs = (sample.input, *sample.args), dict(sample.kwargs)
            try:
                overload = getattr(packet, torch._C._jit_resolve_packet(packet._qualified_op_name, *args,
                                                                        **kwargs))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    overload(*_clone(args), **_clone(kwargs))
            except Exception:
                continue
            yield Case(name, overload, args, kwargs)


def _program(op: Any) -> Any:
    def program(args: tuple, kwargs: dict) -> Any:
        return op(*args, **kwargs)
    return program


def _agree(expected: Any, got: Any, values: bool) -> str | None:
    """None, or what differs."""
    if type(expected) is not type(got) and not (isinstance(expected, tuple) and isinstance(got, tuple)):
        return f"result type {type(got).__name__}, eager {type(expected).__name__}"
    left, right = _leaves(expected), _leaves(got)
    if len(left) != len(right):
        return f"{len(right)} results, eager {len(left)}"
    for a, b in zip(left, right):
        if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
            return f"{type(b).__name__} where eager gives {type(a).__name__}"
        if not isinstance(a, torch.Tensor):
            if values and a != b and not (a != a and b != b):
                return f"{b!r} where eager gives {a!r}"
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"{b.dtype} {tuple(b.shape)} where eager gives {a.dtype} {tuple(a.shape)}"
        if values:
            try:
                torch.testing.assert_close(b, a, equal_nan=True, atol=1e-4, rtol=1e-4)
            except AssertionError as e:
                return str(e).splitlines()[0]
    return None


def run_case(case: Case, backend: str = "prims") -> tuple[str, str]:
    """(outcome, detail) for one case."""
    kiln.reset()
    kiln.counters.clear()
    args, kwargs = _clone(case.args), _clone(case.kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        try:
            expected: Any = case.op(*args, **kwargs)
        except Exception as e:  # (a sample that passed once may fail on a clone: skip it)
            return "eager", f"eager raised {type(e).__name__}"
        expected_state = (args, kwargs)
        args, kwargs = _clone(case.args), _clone(case.kwargs)
        compiled = kiln.compile(_program(case.op), backend=backend)
        torch.manual_seed(0)
        try:
            got = compiled(args, kwargs)
        except Exception as e:
            return "mismatch", f"kiln raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    values = not case.unchecked
    problem = _agree(expected, got, values) or _agree(expected_state, (args, kwargs), values)
    if problem is not None:
        return "mismatch", problem
    counters = kiln.counters
    if sum(counters["graph_breaks"].values()) or sum(counters["frames_run_natively"].values()):
        return "eager", "; ".join(sorted(counters["graph_breaks"]))[:200]
    if sum(counters["fallback"].values()):
        return "fallback", ", ".join(sorted(counters["fallback"]))
    return "traced", ""


def sweep(dtype: torch.dtype = torch.float32, first_only: bool = True, backend: str = "prims",
          only: set | None = None) -> dict[str, list[tuple[Case, str]]]:
    """Every case's outcome: {outcome: [(case, detail)]}."""
    results: dict[str, list[tuple[Case, str]]] = collections.defaultdict(list)
    for case in cases(dtype, first_only, only):
        outcome, detail = run_case(case, backend)
        results[outcome].append((case, detail))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all-samples", action="store_true")
    parser.add_argument("--dtype", default="float32", choices=sorted(_DTYPES))
    parser.add_argument("--backend", default="prims")
    parser.add_argument("--ops", default="", help="OpInfo names, comma-separated")
    parser.add_argument("-v", "--verbose", action="store_true", help="list every case that is not traced")
    opts = parser.parse_args()
    only = set(opts.ops.split(",")) if opts.ops else None
    results = sweep(_DTYPES[opts.dtype], not opts.all_samples, opts.backend, only)
    total = sum(len(v) for v in results.values())
    overloads = {str(c.op) for v in results.values() for c, _ in v}
    print(f"{total} cases ({len(overloads)} overloads), {opts.dtype}, backend {opts.backend}")
    for outcome in OUTCOMES:
        print(f"  {outcome:9s} {len(results[outcome])}")
    for outcome in OUTCOMES[1:]:
        if outcome == "mismatch" or opts.verbose:
            for case, detail in results[outcome]:
                print(f"{outcome}: {case.name} {case.op}: {detail}")


if __name__ == "__main__":
    main()
