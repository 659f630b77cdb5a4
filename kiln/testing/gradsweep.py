"""The op_db gradient sweep: each OpInfo entry's backward through a kiln backend, against eager autograd.

    python -m kiln.testing.gradsweep [--dtypes float64,float32] [--ops add,nn.functional.gelu] [--backend cpp]
                                     [--all-samples] [--json PATH]

For each entry that supports autograd on the CPU and each dtype, the first sample (or every sample) is
traced with its floating-point tensors requiring gradients and compiled by the backend (which
differentiates it ahead of time: `kiln.backends.aot`); outputs and the gradients of every such input (for a
fixed random output gradient) are compared with eager autograd's, by assert_close or else kiln's accuracy
rule against a float64 run. Statuses per entry: `compiled` (the backward ran as kiln's kernels), `torch`
(the backend handed the graph to torch: counted, with its reason), `mismatch`, `error`, `random` (a random
op whose draws differ from eager's: values not compared), `not applicable` (eager raises, or no output
needs a gradient). The CI subset is tests/test_gradsweep.py.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import sys
import warnings
from typing import Any

import torch

from ..counters import counters
from . import opinfo
from .tolerance import accuracy_rule

DTYPES = {"float64": torch.float64, "float32": torch.float32}


@dataclasses.dataclass
class GradResult:
    op: str
    dtype: str
    status: str
    message: str = ""


def _float_tensors(values: list) -> list[torch.Tensor]:
    return [t for t in values if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _outputs(value: Any) -> list[torch.Tensor]:
    from ..graph import flatten
    return [t for t in flatten(value) if isinstance(t, torch.Tensor) and t.requires_grad]


def _close(actual: list, expected: list, reference: list | None) -> str | None:
    """Why the lists of tensors differ (None: they agree by assert_close or by the accuracy rule)."""
    if len(actual) != len(expected):
        return f"{len(actual)} tensors where eager has {len(expected)}"
    for k, (a, e) in enumerate(zip(actual, expected)):
        try:
            torch.testing.assert_close(a, e, equal_nan=True)
            continue
        except AssertionError as error:
            text = " ".join(str(error).splitlines()[:4])
        if reference is not None and a.shape == e.shape and a.is_floating_point() and \
                accuracy_rule(a, e, reference[k], tol=1e-4).passed:
            continue
        return f"tensor {k}: {text}"
    return None


def run_sample(op: Any, sample: Any, backend: str = "cpp") -> GradResult | None:
    """One sample's forward and backward through the backend vs eager (None: not applicable)."""
    from ..backends import lookup_backend
    from ..ops import trace
    name = opinfo.op_id(op)
    structure = (sample.input, sample.args, sample.kwargs)
    leaves = opinfo.tensor_leaves(list(structure))
    method = opinfo._tensor_method_name(op)

    def fn(*tensors: Any) -> Any:
        inp, args, kwargs = opinfo.replace_tensors(list(structure), iter(tensors))
        if method is not None and isinstance(sample.input, torch.Tensor):
            return getattr(inp, method)(*args, **kwargs)
        return op(inp, *args, **kwargs)

    def inputs(dtype: torch.dtype | None = None) -> list[torch.Tensor]:
        out = []
        for t in leaves:
            c = opinfo.clone_exact(t.detach())
            if dtype is not None and c.is_floating_point():
                c = c.to(dtype)
            if c.is_floating_point():
                c.requires_grad_(True)
            out.append(c)
        return out

    def grads_of(outs: Any, ins: list, seed_grads: list | None) -> tuple[list, list]:
        results = _outputs(outs)
        if seed_grads is None:
            gen = torch.Generator().manual_seed(0)
            seed_grads = [torch.randn(r.shape, generator=gen, dtype=r.dtype) for r in results]
        wrt = _float_tensors(ins)
        got = torch.autograd.grad(results, wrt, seed_grads, allow_unused=True)
        return [torch.zeros_like(w) if g is None else g for w, g in zip(wrt, got)], seed_grads

    try:
        torch.manual_seed(opinfo.SEED)
        eager_in = inputs()
        expected = fn(*eager_in)
        if not _outputs(expected):
            return None
        eager_grads, seed = grads_of(expected, eager_in, None)
    except Exception:
        return None
    dtype = leaves[0].dtype if leaves else torch.float64
    try:
        torch.manual_seed(opinfo.SEED)
        ref_in = inputs(torch.float64)
        ref_out = fn(*ref_in)
        ref_grads, _ = grads_of(ref_out, ref_in, [s.double() for s in seed])
    except Exception:
        ref_grads = None
    before = dict(counters[backend])
    try:
        graph = trace(fn, *inputs())
        compiled = lookup_backend(backend)(graph, inputs())
        kiln_in = inputs()
        torch.manual_seed(opinfo.SEED)
        actual = compiled(*kiln_in)
        kiln_grads, _ = grads_of(actual, kiln_in, seed)
    except Exception as e:
        return GradResult(name, str(dtype).removeprefix("torch."), "error", f"{type(e).__name__}: {e}")
    handed = counters[backend]["graphs run with torch"] > before.get("graphs run with torch", 0)
    problem = _close(kiln_grads, eager_grads, ref_grads)
    if problem is None:
        problem = _close(_outputs(actual), _outputs(expected), None)
    random = name in opinfo.RANDOM_OPS or opinfo.uses_seed_wrapper(op)
    status = ("random" if random else "mismatch") if problem else ("torch" if handed else "compiled")
    message = problem or ""
    if handed and not problem:
        reasons = [k for k, v in counters[backend].items() if k.startswith("ran with torch:") and v > before.get(k, 0)]
        message = reasons[-1] if reasons else ""
    return GradResult(name, str(dtype).removeprefix("torch."), status, message)


def run_op(op: Any, dtype: str, backend: str = "cpp", all_samples: bool = False) -> GradResult:
    name = opinfo.op_id(op)
    if not op.supports_autograd or DTYPES[dtype] not in op.supported_backward_dtypes("cpu"):
        return GradResult(name, dtype, "not applicable", "no autograd for this dtype")
    last = GradResult(name, dtype, "not applicable", "no sample needs a gradient")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(opinfo.SEED)
        for sample in op.sample_inputs("cpu", DTYPES[dtype], requires_grad=True):
            result = run_sample(op, sample, backend)
            if result is None:
                continue
            result.dtype = dtype
            if result.status in ("mismatch", "error") or not all_samples:
                return result
            last = result
    return last


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kiln.testing.gradsweep", description=__doc__.split("\n")[0])
    parser.add_argument("--dtypes", default="float64,float32")
    parser.add_argument("--ops", default="")
    parser.add_argument("--backend", default="cpp")
    parser.add_argument("--all-samples", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    import kiln.ops  # noqa: F401
    wanted = set(filter(None, args.ops.split(",")))
    ops = [op for op in opinfo.op_database() if not wanted or opinfo.op_id(op) in wanted]
    results = []
    for dtype in args.dtypes.split(","):
        tally: collections.Counter = collections.Counter()
        for op in ops:
            r = run_op(op, dtype, args.backend, args.all_samples)
            results.append(r)
            tally[r.status] += 1
            if r.status in ("mismatch", "error"):
                print(f"{r.status.upper()} {r.op} {dtype}: {r.message[:300]}", flush=True)
        print(f"gradsweep {dtype} ({args.backend}): " + ", ".join(f"{v} {k}" for k, v in sorted(tally.items())),
              flush=True)
    reasons = collections.Counter(r.message for r in results if r.status == "torch")
    for reason, n in reasons.most_common(15):
        print(f"  {n:4d} handed to torch: {reason[:150]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dataclasses.asdict(r) for r in results], f, indent=1)
    return 1 if any(r.status in ("mismatch", "error") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
