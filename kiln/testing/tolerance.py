"""The accuracy rule, as PyTorch's benchmark runner judges its compiler: one function,
used by the OpInfo harness (per op sample) and by the model checks (`kiln.testing.accuracy`, per output).

A float (or complex) tensor `actual` is accurate when
  0. it has NaN where eager has NaN, and its other non-finite values equal eager's, at the same positions;
  1. it is allclose to a reference at `tol` (rtol = atol = tol, NaNs equal), or else
  2. over the positions where actual, eager and the fp64 reference are all finite, it is no further from
     the fp64 reference than eager is: RMSE(actual, fp64) <= multiplier * RMSE(eager, fp64) + tol / 10.
Clause 2 accepts a compiler that reorders float arithmetic (fusion, another reduction order) as long as its
error stays of eager's size.

The reference of clause 1 is a parameter, because the two callers ask different questions:
  allclose_to="eager"  models (and PyTorch's runner): this is the only comparison, so it is against the
                       result the user had before compiling.
  allclose_to="fp64"   OpInfo: the rule is a second chance after `torch.testing.assert_close` against
                       eager has already failed, so it asks whether kiln is within tol of the exact value
                       (a result closer to fp64 than eager's passes; one further from it goes on to clause 2).
Each caller passes its tolerance: OP_TOL for single ops, MODEL_TOL for models.
"""
from __future__ import annotations

import dataclasses
import math

import torch

MODEL_TOL = 1e-3
OP_TOL = 1e-4
RMSE_MULTIPLIER = 2.0
# a model computed in half precision (autocast or converted weights): allclose at a few of the dtype's ulps
# near 1 (bfloat16's is 2**-7, float16's 2**-10); clause 2 (RMSE against fp64) still holds it to eager's
HALF_MODEL_TOL = {torch.bfloat16: 1e-2, torch.float16: 1e-2}


def model_tol(dtype: torch.dtype) -> float:
    """The models' tolerance for a model computed in `dtype` (MODEL_TOL for float32 and float64)."""
    return HALF_MODEL_TOL.get(dtype, MODEL_TOL)


@dataclasses.dataclass(frozen=True)
class RuleResult:
    """What `accuracy_rule` decided, and the figures it decided on."""
    passed: bool
    reason: str = ""               # why not, when not passed (without the tensor's name)
    by_allclose: bool = False      # passed by clause 1: the RMSE figures were not needed
    rmse_actual: float = math.nan  # RMSE(actual, fp64) over the finite positions
    rmse_eager: float = math.nan   # RMSE(eager, fp64) over the same positions
    limit: float = math.nan        # multiplier * rmse_eager + tol / 10


def _as_real(t: torch.Tensor) -> torch.Tensor:
    """t in float64, a complex tensor as its (real, imaginary) pairs."""
    t = t.detach()
    if t.is_complex():
        return torch.view_as_real(t.resolve_conj()).double()
    return t.double()


def _rmse(diff: torch.Tensor) -> float:
    return math.sqrt(torch.mean(diff * diff).item())


def accuracy_rule(actual: torch.Tensor, eager: torch.Tensor, fp64: torch.Tensor, *, tol: float,
                  allclose_to: str = "eager", multiplier: float = RMSE_MULTIPLIER) -> RuleResult:
    """Judge one float or complex tensor by the accuracy rule (module docstring).

    `eager` is eager's result for the same inputs, `fp64` the result of the program run in float64. A complex
    tensor is judged as its (real, imaginary) pairs, except by clause 1 against eager (torch.allclose)."""
    if allclose_to not in ("eager", "fp64"):
        raise ValueError(f"allclose_to must be 'eager' or 'fp64', not {allclose_to!r}")
    if not actual.shape == eager.shape == fp64.shape:
        return RuleResult(False, f"shapes differ: {tuple(actual.shape)}, eager {tuple(eager.shape)}, "
                                 f"fp64 reference {tuple(fp64.shape)}")
    a, e, r = _as_real(actual), _as_real(eager), _as_real(fp64)
    if not torch.equal(torch.isnan(a), torch.isnan(e)):
        return RuleResult(False, "NaN where eager has none, or a number where eager has NaN")
    if allclose_to == "eager":  # in the tensors' own dtype
        close = torch.allclose(actual.detach(), eager.detach(), rtol=tol, atol=tol, equal_nan=True)
    else:  # in float64
        close = torch.allclose(a, r, rtol=tol, atol=tol, equal_nan=True)
    if close:
        return RuleResult(True, by_allclose=True)
    finite = torch.isfinite(a) & torch.isfinite(e) & torch.isfinite(r)
    nonfinite = ~finite
    if not torch.equal(a[nonfinite].nan_to_num(0.0), e[nonfinite].nan_to_num(0.0)):
        return RuleResult(False, "infinities differ from eager's")
    if not finite.any():  # nothing left to measure: every value is eager's infinity or NaN
        return RuleResult(True, rmse_actual=0.0, rmse_eager=0.0, limit=tol / 10)
    rmse_actual = _rmse(a[finite] - r[finite])
    rmse_eager = _rmse(e[finite] - r[finite])
    limit = multiplier * rmse_eager + tol / 10
    passed = rmse_actual <= limit
    reason = "" if passed else (f"RMSE(compiled, fp64) {rmse_actual:.3g} > {multiplier:g} * "
                                f"RMSE(eager, fp64) {rmse_eager:.3g} + {tol / 10:g}")
    return RuleResult(passed, reason, rmse_actual=rmse_actual, rmse_eager=rmse_eager, limit=limit)
