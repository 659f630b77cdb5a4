"""Model outputs judged by the accuracy rule (the rule itself is `kiln.testing.tolerance`).

A compiled result is right when every float tensor it returns passes the rule against eager's result and
an fp64 reference (allclose to eager at `tol`, or RMSE(compiled, fp64) <= 2 * RMSE(eager, fp64) + tol / 10),
and its integer and bool tensors and non-tensor leaves equal eager's. tol is 1e-3 for models, 1e-4 for
single ops.

    verdict = check(compiled_out, eager_out, fp64_out, tol=MODEL_TOL)
    if not verdict.passed: print(verdict.reason)
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from .tolerance import MODEL_TOL, RMSE_MULTIPLIER, accuracy_rule


@dataclasses.dataclass
class Verdict:
    """The outcome of `check`: passed, why not, and the worst figures over all output tensors."""
    passed: bool
    reason: str = ""
    max_abs_error: float = 0.0        # max |compiled - eager| over all float outputs
    rmse_compiled: float = 0.0        # RMSE(compiled, fp64) of the worst tensor by the rule
    rmse_eager: float = 0.0           # RMSE(eager, fp64) of that tensor
    tensors: int = 0                  # how many tensor leaves were compared

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def flatten(value: Any, path: str = "out") -> list[tuple[str, Any]]:
    """The leaves of a model output (tensors, numbers, None) with their paths, in a stable order.

    Handles tensors, tuples, lists, dicts (and so Hugging Face ModelOutput), dataclasses and Hugging Face
    KV caches (the keys and values of each layer)."""
    if isinstance(value, torch.Tensor) or value is None or isinstance(value, (bool, int, float, str)):
        return [(path, value)]
    if isinstance(value, dict):
        leaves = []
        for key, item in value.items():
            leaves += flatten(item, f"{path}[{key!r}]")
        return leaves
    if isinstance(value, (tuple, list)):
        leaves = []
        for i, item in enumerate(value):
            leaves += flatten(item, f"{path}[{i}]")
        return leaves
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        leaves = []
        for field in dataclasses.fields(value):
            leaves += flatten(getattr(value, field.name), f"{path}.{field.name}")
        return leaves
    if _is_kv_cache(value):   # a Hugging Face Cache (decoders return one by default): its keys and values
        if hasattr(value, "self_attention_cache"):   # EncoderDecoderCache
            return (flatten(value.self_attention_cache, f"{path}.self_attention_cache")
                    + flatten(value.cross_attention_cache, f"{path}.cross_attention_cache"))
        leaves = []
        for i, layer in enumerate(value.layers):
            leaves += [(f"{path}.layers[{i}].keys", getattr(layer, "keys", None)),
                       (f"{path}.layers[{i}].values", getattr(layer, "values", None))]
        return leaves
    raise TypeError(f"cannot compare outputs of type {type(value).__qualname__} at {path}")


def _is_kv_cache(value: Any) -> bool:
    """Whether `value` is a transformers `Cache` (by class name, so that transformers is not imported)."""
    if not any(cls.__name__ == "Cache" and cls.__module__.startswith("transformers")
               for cls in type(value).__mro__):
        return False
    return hasattr(value, "self_attention_cache") or isinstance(getattr(value, "layers", None), list)


def to_fp64(value: Any) -> Any:
    """`value` with every floating-point tensor cast to float64 (structure kept: tuples, lists, dicts)."""
    if isinstance(value, torch.Tensor):
        return value.double() if value.is_floating_point() else value
    if isinstance(value, dict):
        return {key: to_fp64(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return tuple(to_fp64(item) for item in value)
    if isinstance(value, list):
        return [to_fp64(item) for item in value]
    return value


def check(compiled: Any, eager: Any, fp64: Any, tol: float = MODEL_TOL,
          multiplier: float = RMSE_MULTIPLIER) -> Verdict:
    """Judge `compiled` against `eager` and the `fp64` reference by the accuracy rule (module docstring)."""
    got, expected, reference = flatten(compiled), flatten(eager), flatten(fp64)
    if not len(got) == len(expected) == len(reference):
        return Verdict(False, f"output structure differs: compiled has {len(got)} leaves, eager "
                              f"{len(expected)}, fp64 reference {len(reference)}")
    verdict = Verdict(True)
    worst_excess = -math.inf
    for (path, c), (_, e), (_, r) in zip(got, expected, reference):
        if not isinstance(e, torch.Tensor):
            if c != e:
                return _fail(verdict, f"{path}: compiled gives {c!r}, eager {e!r}")
            continue
        if not isinstance(c, torch.Tensor):
            return _fail(verdict, f"{path}: compiled gives {type(c).__qualname__}, eager a tensor")
        verdict.tensors += 1
        if c.shape != e.shape or c.dtype != e.dtype:
            return _fail(verdict, f"{path}: compiled gives {c.dtype} {tuple(c.shape)}, "
                                  f"eager {e.dtype} {tuple(e.shape)}")
        if not (e.is_floating_point() or e.is_complex()):
            if not torch.equal(c, e):
                return _fail(verdict, f"{path}: {e.dtype} {tuple(e.shape)} values differ from eager")
            continue
        c, e, r = c.detach(), e.detach(), r.detach()
        if c.numel():
            error = (c.double() - e.double()).abs().nan_to_num(nan=math.inf).max().item()
            verdict.max_abs_error = max(verdict.max_abs_error, error)
        result = accuracy_rule(c, e, r, tol=tol, allclose_to="eager", multiplier=multiplier)
        if result.by_allclose:
            continue
        excess = result.rmse_actual - result.limit   # NaN when the rule failed before clause 2
        if math.isnan(excess) or excess > worst_excess:
            worst_excess = math.inf if math.isnan(excess) else excess
            verdict.rmse_compiled, verdict.rmse_eager = result.rmse_actual, result.rmse_eager
        if not result.passed:
            return _fail(verdict, f"{path} {tuple(e.shape)}: not allclose to eager at tol {tol:g} (max abs "
                                  f"error {verdict.max_abs_error:.3g}) and {result.reason}")
    return verdict


def _fail(verdict: Verdict, reason: str) -> Verdict:
    verdict.passed = False
    verdict.reason = reason
    return verdict
