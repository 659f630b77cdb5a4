"""The OpInfo stride sweep: do kiln's outputs have eager's strides when the inputs are not contiguous?

    python -m kiln.testing.stridesweep [--ops add,mul] [--all-samples] [--backend cpp] [--json PATH]

For each float32 entry of torch's op_db, its first sample (every sample with `--all-samples`) runs again
with every tensor of the sample laid out otherwise, its values unchanged:
    transposed     the last two dims swapped in memory (column-major matrices)
    channels_last  4-D tensors NHWC (others unchanged)
    sliced         every other element of a twice-as-long last dim (not dense)
    offset         contiguous, 3 elements into its storage
A layout that changes no tensor of the sample is skipped. Each run is traced with kiln.ops.trace and,
when the traced graph holds no fallback node (the op is *decomposed*), compiled with the backend (cpp by
default) and compared with eager: the values (assert_close), the traced graph's output metas' strides and
the compiled outputs' strides. Strides are compared on the dims that place elements (size > 1) of non-empty
outputs: a size-1 dim's stride never moves an element.

An entry *matches* when every layout of every sample gave eager's strides, traced and compiled, and eager's
values. The share of decomposed entries that match is the figure; the entries that do not are listed with
the first layout that differed. tests/test_stridesweep.py runs the first sample of each entry in CI against
the checked-in list STRIDE_EXPECTED (kiln/testing/stridesweep_expected.py), each with a reason; an entry
listed there that matches fails the test, so the list only shrinks.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import warnings
from typing import Any, Callable

import torch

from .opinfo import (RANDOM_OPS, SEED, SampleTimeout, _output_leaves, _tensor_method_name, _wrapped_string,
                     clone_exact, op_database, op_id, replace_tensors, samples, select_ops, tensor_leaves,
                     time_limit, uses_seed_wrapper)


def _transposed(t: torch.Tensor) -> torch.Tensor:
    if t.ndim < 2:
        return t
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def _channels_last(t: torch.Tensor) -> torch.Tensor:
    if t.ndim != 4:
        return t
    return t.contiguous(memory_format=torch.channels_last)


def _sliced(t: torch.Tensor) -> torch.Tensor:
    if t.ndim < 1 or t.numel() == 0:
        return t
    base = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    out = base[..., ::2]
    out.copy_(t)
    return out


def _offset(t: torch.Tensor) -> torch.Tensor:
    if t.ndim < 1 or t.numel() == 0:
        return t
    base = torch.zeros(t.numel() + 3, dtype=t.dtype)
    out = base[3:].view(t.shape)
    out.copy_(t)
    return out


LAYOUTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "transposed": _transposed, "channels_last": _channels_last, "sliced": _sliced, "offset": _offset}


def placed_strides(t: torch.Tensor) -> tuple:
    """The strides that place elements: those of dims of size > 1 (None for dims of size 0 or 1); () for
    an empty tensor."""
    if t.numel() == 0:
        return ()
    return tuple(s if n > 1 else None for n, s in zip(t.shape, t.stride()))


@dataclasses.dataclass
class SweepResult:
    op: str
    decomposed: bool = False
    matched: bool = False
    runs: int = 0
    message: str = ""  # the first difference: "layout: what differed"
    skipped: str = ""  # why the entry was not swept (no float32 samples, eager raises, ...)


def _relaid(leaves: list[torch.Tensor], layout: str) -> list[torch.Tensor] | None:
    """The sample's tensors in `layout` (values unchanged); None when the layout changes none of them."""
    changed = False
    out = []
    for t in leaves:
        if t.layout != torch.strided or t.is_complex():
            out.append(clone_exact(t))
            continue
        r = LAYOUTS[layout](t.detach())
        changed = changed or (r.stride(), r.storage_offset()) != (t.stride(), t.storage_offset())
        out.append(r)
    return out if changed else None


def sweep_sample(op: Any, sample: Any, layout: str, backend: str) -> tuple[str, bool] | None:
    """Run one sample in one layout: (difference or "", decomposed); None when the layout does not apply
    or eager raises on it."""
    import kiln.graph
    import kiln.ops
    from kiln.backends import lookup_backend
    structure = (sample.input, sample.args, sample.kwargs)
    leaves = tensor_leaves(list(structure))
    relaid = _relaid(leaves, layout)
    if relaid is None:
        return None
    method = _tensor_method_name(op)

    def fn(*tensors: Any) -> Any:
        inp, args, kwargs = replace_tensors(list(structure), iter(tensors))
        if method is not None and isinstance(sample.input, torch.Tensor):
            return getattr(inp, method)(*args, **kwargs)
        return op(inp, *args, **kwargs)
    try:
        torch.manual_seed(SEED)
        expected = fn(*[clone_exact(t) for t in relaid])
    except Exception:
        return None
    try:
        graph = kiln.ops.trace(fn, *[clone_exact(t) for t in relaid])
    except Exception as e:
        return f"{layout}: trace raised {type(e).__name__}: {str(e)[:150]}", False
    if graph.fallbacks():
        return "", False
    want = [v for _, v in _output_leaves(expected)]
    metas = [n.meta if isinstance(n, kiln.graph.Node) else n for n in kiln.graph.flatten(graph.output_value)]
    for i, (m, e) in enumerate(zip(metas, want)):
        if isinstance(e, torch.Tensor) and isinstance(m, kiln.graph.TensorMeta):
            traced = placed_strides(torch.empty_strided(tuple(m.shape), tuple(m.strides)))
            if traced != placed_strides(e):
                return f"{layout}: traced out[{i}] strides {tuple(m.strides)}, eager {e.stride()}", True
    try:
        inputs = [clone_exact(t) for t in relaid]
        compiled = lookup_backend(backend)(graph, list(inputs))
        torch.manual_seed(SEED)
        actual = compiled(*inputs)
    except Exception as e:
        return f"{layout}: {backend} raised {type(e).__name__}: {str(e)[:150]}", True
    got = [v for _, v in _output_leaves(actual)]
    random = op.name in RANDOM_OPS or uses_seed_wrapper(op)
    for i, (a, e) in enumerate(zip(got, want)):
        if not isinstance(e, torch.Tensor) or not isinstance(a, torch.Tensor) or e.layout != torch.strided:
            continue
        if placed_strides(a) != placed_strides(e):
            return f"{layout}: {backend} out[{i}] strides {a.stride()}, eager {e.stride()}", True
        if random or getattr(op, "has_nondeterministic_output", False):
            continue
        try:
            torch.testing.assert_close(a, e, equal_nan=True, check_stride=False, atol=1e-4, rtol=1e-4)
        except AssertionError as err:
            return f"{layout}: {backend} out[{i}] values differ: {' '.join(str(err).split())[:150]}", True
    return "", True


def sweep_op(op: Any, *, all_samples: bool = False, backend: str = "cpp",
             layouts: tuple[str, ...] = tuple(LAYOUTS), timeout: float = 60.0) -> SweepResult:
    """Sweep one entry (float32); never raises."""
    result = SweepResult(op_id(op))
    if torch.float32 not in op.supported_dtypes("cpu"):
        result.skipped = "no float32"
        return result
    try:
        with time_limit(timeout):
            chosen = samples(op, torch.float32, None if all_samples else 1)
    except (Exception, SampleTimeout) as e:
        result.skipped = f"sample_inputs raised {type(e).__name__}"
        return result
    decomposed = True
    for sample in chosen:
        for layout in layouts:
            try:
                with time_limit(timeout):
                    outcome = sweep_sample(op, sample, layout, backend)
            except SampleTimeout:
                outcome = (f"{layout}: timed out", True)
            except Exception as e:  # a bug in the harness must not stop the sweep
                outcome = (f"{layout}: harness error {type(e).__name__}: {e}", True)
            if outcome is None:
                continue
            result.runs += 1
            message, traced_whole = outcome
            decomposed = decomposed and traced_whole
            if message and not result.message:
                result.message = message
    if result.runs == 0:
        result.skipped = result.skipped or "no layout applies (or eager raises)"
        return result
    result.decomposed = decomposed
    result.matched = decomposed and not result.message
    return result


# The CI suite's layouts (tests/test_stridesweep.py): one compile per entry, two for 4-d samples.
CI_LAYOUTS = ("transposed", "channels_last")

# Entries the full sweep (every layout) finds differing, beyond the CI list, each with a reason.
FULL_SWEEP_EXPECTED = {
    name: "sliced input: eager's *_scatter ops copy their input with clone_preserve_strides, so the result "
          "keeps a sliced input's gaps (e.g. strides (50, 10, 2)); kiln's results are dense"
    for name in ("diagonal_scatter", "select_scatter", "slice_scatter")
}


def expected_mismatches() -> dict[str, str]:
    """{op id: reason} from kiln/testing/stridesweep_expected.py (entries known to differ in CI's run)."""
    try:
        from . import stridesweep_expected
    except ImportError:
        return {}
    return stridesweep_expected.STRIDE_EXPECTED


def write_expected(results: list[SweepResult], path: str | None = None) -> str:
    """Regenerate the expected list from a CI-layout run, keeping the reasons already written (a new
    entry's reason is its first difference, to be replaced by a cause)."""
    path = path or os.path.join(os.path.dirname(__file__), "stridesweep_expected.py")
    old = expected_mismatches()
    lines = ['"""OpInfo entries whose compiled outputs lack eager\'s strides (or values) in the stride',
             "sweep's CI run (first sample; layouts kiln.testing.stridesweep.CI_LAYOUTS; cpp backend), each",
             "with a reason. tests/test_stridesweep.py fails on an entry that now matches (delete it: the",
             "list only shrinks) and on an unlisted entry that differs. Regenerate with",
             '`python -m kiln.testing.stridesweep --write-expected` (keeps the reasons written here)."""',
             "",
             "STRIDE_EXPECTED = {"]
    for r in sorted(results, key=lambda r: r.op):
        if r.decomposed and not r.matched:
            reason = old.get(r.op) or f"differs: {r.message}"
            lines.append(f"    {json.dumps(r.op)}:")
            lines.append(f"        {_wrapped_string(reason, 8)},")
    lines.append("}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def summary(results: list[SweepResult]) -> str:
    swept = [r for r in results if r.decomposed]
    matched = sum(r.matched for r in swept)
    share = 100.0 * matched / max(len(swept), 1)
    return f"stride sweep: {matched} of {len(swept)} decomposed entries have eager's strides ({share:.1f}%)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kiln.testing.stridesweep",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--ops", default=None, help="comma-separated op names (substring match)")
    parser.add_argument("--all-samples", action="store_true", help="every sample (default: the first)")
    parser.add_argument("--backend", default="cpp")
    parser.add_argument("--json", default=os.path.join(tempfile.gettempdir(), "kiln_stridesweep.json"))
    parser.add_argument("--write-expected", action="store_true",
                        help="run CI's configuration (first sample, CI_LAYOUTS) over every entry and "
                             "regenerate kiln/testing/stridesweep_expected.py")
    args = parser.parse_args(argv)
    layouts = CI_LAYOUTS if args.write_expected else tuple(LAYOUTS)
    warnings.simplefilter("ignore")
    import kiln.ops  # noqa: F401  (registers the decompositions)
    results = []
    for op in (select_ops(args.ops) if args.ops else op_database()):
        r = sweep_op(op, all_samples=args.all_samples and not args.write_expected, backend=args.backend,
                     layouts=layouts)
        results.append(r)
        if r.decomposed and not r.matched:
            print(f"{r.op}: {r.message}", flush=True)
    with open(args.json, "w") as f:
        json.dump([dataclasses.asdict(r) for r in results], f, indent=1)
    print(summary(results))
    if args.write_expected:
        if args.ops or args.backend != "cpp":
            print("--write-expected needs every entry on the cpp backend; not written", file=sys.stderr)
        else:
            print(f"wrote {write_expected(results)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
