"""Baseline compilers for `kiln bench`: torch.compile (TorchInductor), the compiler kiln is measured against.

This file lives outside `kiln/` on purpose: kiln never imports torch's compiler stack (a test scans `kiln/`
for it), and torch.compile appears only here, as the baseline. `kiln/bench/adapters.py` loads this file by
its path, so it works from a source checkout (`pip install -e .`); where it is missing, the torch.compile
column reports "unavailable".

A baseline is `compile(model, cache_dir) -> callable`; `cache_dir` is an empty directory for a cold compile
and the same directory again for a warm one (cache hit).
"""
from __future__ import annotations

import os
from typing import Any, Callable

import torch


def torch_compile(model: torch.nn.Module, cache_dir: str | None) -> Callable[..., Any]:
    """torch.compile with the default backend (inductor), its caches under `cache_dir`.

    One setting differs from the default: `fallback_random`, so that its random ops draw eager's numbers (as
    kiln's do). By default Inductor generates its own random streams, and a model training with dropout
    (the Hugging Face models at transformers' defaults) then fails the accuracy check against eager on
    every output, which drops its row from the comparison. It changes nothing without random ops."""
    if cache_dir:
        # Inductor reads its cache location from the environment when it first needs it (FX graph cache,
        # AOTAutograd cache, compiled C++ kernels): point it at the run's own directory before compiling.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_dir, "inductor")
        os.environ["TRITON_CACHE_DIR"] = os.path.join(cache_dir, "triton")
    return torch.compile(model, options={"fallback_random": True})


BASELINES: dict[str, Callable[[torch.nn.Module, str | None], Callable[..., Any]]] = {
    "torch.compile": torch_compile,
}


def dynamo_counts(model: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, int]:
    """TorchDynamo's graphs and graph breaks for one call of `model` (torch._dynamo.explain: capture only, no
    code generation), for `kiln explain --check`'s side-by-side column."""
    import torch._dynamo
    torch._dynamo.reset()
    try:
        report = torch._dynamo.explain(model)(*args, **kwargs)
    finally:
        torch._dynamo.reset()
    return {"graphs": report.graph_count, "breaks": report.graph_break_count}
