"""The precisions of `kiln bench --precision`: under which dtype eager, torch.compile and kiln all run.

  fp32          the model as built (the default bench)
  bf16, fp16    every call under `torch.autocast("cpu", dtype)`; in training the forward and the loss under
                autocast, backward and SGD step outside it (as torch's AMP recipe)
  amp           fp16 autocast, and in training a `torch.amp.GradScaler`: the loss scaled before backward,
                the gradients unscaled (inf/NaN checked) before the step, a step skipped on inf, the scale
                updated (inference: as fp16)
  bf16-weights  the model and the floating-point inputs converted (`model.to(torch.bfloat16)`), no autocast
  fp16-weights  likewise in float16

Every compiler runs under the same precision; the fp64 reference is the same model (the converted one for
`-weights`) in float64 without autocast, and the accuracy rule's tolerance is the dtype's (`tolerance`).
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, ContextManager

import torch

from ..testing import tolerance


@dataclasses.dataclass(frozen=True)
class Precision:
    name: str
    autocast: torch.dtype | None = None   # the dtype of torch.autocast("cpu", ...) around each call
    weights: torch.dtype | None = None    # the dtype the model and its float inputs are converted to
    scaler: bool = False                  # training: a GradScaler around backward and the SGD step

    @property
    def dtype(self) -> torch.dtype:
        return self.autocast or self.weights or torch.float32

    @property
    def tol(self) -> float:
        return tolerance.model_tol(self.dtype)

    def context(self) -> ContextManager[Any]:
        """The region each call runs in: autocast at this precision's dtype, or nothing."""
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast("cpu", dtype=self.autocast)

    def convert(self, model: torch.nn.Module, example: tuple[tuple, dict]) -> tuple[torch.nn.Module, tuple]:
        """The model and example at this precision's weights dtype (unchanged without one)."""
        if self.weights is None:
            return model, example
        args, kwargs = example
        return model.to(self.weights), (_to(args, self.weights), _to(kwargs, self.weights))

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        return torch.amp.GradScaler("cpu") if self.scaler else None


def _to(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, dict):
        return {key: _to(item, dtype) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_to(item, dtype) for item in value)
    return value


PRECISIONS = {p.name: p for p in (
    Precision("fp32"),
    Precision("bf16", autocast=torch.bfloat16),
    Precision("fp16", autocast=torch.float16),
    Precision("amp", autocast=torch.float16, scaler=True),
    Precision("bf16-weights", weights=torch.bfloat16),
    Precision("fp16-weights", weights=torch.float16),
)}
DEFAULT = "fp32"


def get(name: str | None) -> Precision:
    if name is None:
        return PRECISIONS[DEFAULT]
    if name not in PRECISIONS:
        raise ValueError(f"unknown precision {name!r}; known: {', '.join(PRECISIONS)}")
    return PRECISIONS[name]
