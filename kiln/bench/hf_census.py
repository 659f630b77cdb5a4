"""What `kiln explain --models hf-all` adds to the census rows of `hf:<type>` entries (and of any model with
`--check`): whether kiln's compiled result is right, how long the first compiled call took, and TorchDynamo's
own graph and break counts for the same model.

  verdict     "correct" (the accuracy rule against eager and an fp64 reference passes), "wrong" (it fails:
              a miscompile), or "crash" (the compiled call raised where eager did not)
  compile_s   the first call of `kiln.compile(model)` (default backend), capture and code generation included
  dynamo      {"graphs", "breaks"}: TorchDynamo's own counts, computed by bench/baselines.py `dynamo_counts`
              (outside kiln/, which never uses torch's compiler stack); absent where that file is not in the
              checkout

The fp64 reference is a float64 copy of the model; where the model cannot run in float64 (a kernel without a
double version), eager's float32 result is the reference too, which makes the rule plain closeness to eager
(`reference` says which).
"""
from __future__ import annotations

import contextlib
import copy
import io
import time
from typing import Any

import torch

from ..testing import hf_all
from ..testing.accuracy import check
from . import adapters


def _double(value: Any) -> Any:
    return value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def build(name: str, batch: int | None) -> tuple[torch.nn.Module, tuple[tuple, dict]]:
    """An `hf:<type>` entry (hf_all.Unbuildable when it cannot be built here)."""
    return hf_all.build(name[len(hf_all.PREFIX):], batch)


def judge(model: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Compile `model` with kiln's default backend; time its first call and judge its result."""
    import kiln
    out: dict[str, Any] = {}
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        expected = model(*args, **kwargs)
        try:
            reference = copy.deepcopy(model).double()(*map(_double, args),
                                                     **{k: _double(v) for k, v in kwargs.items()})
            out["reference"] = "fp64"
        except Exception as e:
            reference = expected
            out["reference"] = f"fp32 eager (fp64 copy raised {type(e).__name__})"
        kiln.reset()
        compiled = kiln.compile(model)
        start = time.perf_counter()
        try:
            got = compiled(*args, **kwargs)
        except Exception as e:
            out.update(verdict="crash", compile_s=time.perf_counter() - start,
                       error=f"{type(e).__name__}: {e}".strip()[:2000])
            return out
        out["compile_s"] = time.perf_counter() - start
    verdict = check(got, expected, reference)
    out["verdict"] = "correct" if verdict.passed else "wrong"
    if not verdict.passed:
        out["wrong"] = verdict.reason
    return out


def dynamo(model: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, int] | None:
    """TorchDynamo's graphs and breaks for the model (bench/baselines.py), or None where unavailable."""
    baselines = adapters.load_baselines()
    counts = getattr(baselines, "dynamo_counts", None) if baselines is not None else None
    if counts is None:
        return None
    try:
        with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
            return counts(model, args, kwargs)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}".strip()[:300]}


def summary(rows: list[dict[str, Any]], slow_s: float = 30.0) -> list[str]:
    """The census's totals: verdicts, whole graphs against TorchDynamo's, slow compiles, unbuildable types."""
    built = [row for row in rows if row["status"] == "ok"]
    verdicts = {v: [r["model"] for r in built if r.get("verdict") == v] for v in ("correct", "wrong", "crash")}
    whole = [r for r in built if r["graphs"] == 1 and r["breaks"] == 0 and r["native"] == 0]
    with_dynamo = [r for r in built if isinstance(r.get("dynamo"), dict) and "graphs" in r["dynamo"]]
    dynamo_whole = [r for r in with_dynamo if r["dynamo"]["graphs"] == 1 and r["dynamo"]["breaks"] == 0]
    slow = [r for r in built if (r.get("compile_s") or 0) > slow_s]
    errors = [r for r in built if r.get("capture_errors")]
    unbuildable = [r for r in rows if r["status"] == "unbuildable"]
    lines = [f"{len(rows)} types: {len(built)} built and run, {len(unbuildable)} not buildable here, "
             f"{len(rows) - len(built) - len(unbuildable)} failed in the census itself (timeout or error)",
             f"verdicts: {len(verdicts['correct'])} correct, {len(verdicts['wrong'])} wrong, "
             f"{len(verdicts['crash'])} crash",
             f"one graph, no break: kiln {len(whole)} of {len(built)}; TorchDynamo {len(dynamo_whole)} of "
             f"{len(with_dynamo)}",
             f"capture errors: {len(errors)}; first compiled call over {slow_s:.0f} s: {len(slow)}"]
    kinds: dict[str, int] = {}
    for row in unbuildable:
        kinds[unbuildable_kind(row.get("error") or "")] = kinds.get(unbuildable_kind(row.get("error") or ""), 0) + 1
    if kinds:
        lines.append("  not buildable: " + ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items(),
                                                                                         key=lambda kv: -kv[1])))
    for label, names in (("wrong", verdicts["wrong"]), ("crash", verdicts["crash"]),
                         ("capture errors", [r["model"] for r in errors]),
                         (f"over {slow_s:.0f} s", [f"{r['model']} ({r['compile_s']:.0f} s)" for r in slow])):
        if names:
            lines.append(f"  {label}: {', '.join(names)}")
    return lines


def unbuildable_kind(reason: str) -> str:
    """A short category for why a type could not be built here (the census's totals)."""
    for needle, kind in (("no AutoModel class", "sub-configs or head-only types"),
                         ("requires the", "need a library not installed"),
                         ("parameters (over", "too large even when shrunk"),
                         ("inputs:", "need inputs the census does not make"),
                         ("config:", "config rejected"), ("model:", "model construction failed")):
        if needle in reason.split(" | ")[0]:
            return kind
    return "other"
