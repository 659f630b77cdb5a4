"""The zoo under torch.autocast: each model compiled (cpp backend) and run under
`torch.autocast("cpu", dtype)` beside eager autocast, judged by the accuracy rule against an fp64 reference,
then called again with autocast off (a recapture, judged the same way); the library ops (linear, matmul,
convolution, attention) that ran with torch instead of kiln's externs are listed.

    python -m kiln.testing.autocast_census [--models mlp,hf_gpt2] [--dtypes bfloat16,float16]
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
from typing import Any

import torch

from .. import api
from ..counters import counters
from . import models as zoo
from .accuracy import check

LIBRARY_OPS = ("linear", "matmul", "mm", "sdpa", "scaled_dot_product", "conv", "addmm")


def _double(v: Any) -> Any:
    return v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v


def run_one(name: str, dtype: torch.dtype) -> dict:
    """One model at one autocast dtype: {'on', 'off' (verdict reasons or ''), 'library_fallbacks', ...}."""
    api.reset()
    counters.clear()
    model, (args, kwargs) = zoo.build(name)
    reference = copy.deepcopy(model).double()
    compiled = api.compile(model, backend="cpp")
    start = time.perf_counter()
    with torch.no_grad():
        ref = reference(*[_double(a) for a in args], **{k: _double(v) for k, v in kwargs.items()})
        with torch.autocast("cpu", dtype=dtype):
            eager_on, kiln_on = model(*args, **kwargs), compiled(*args, **kwargs)
        eager_off, kiln_off = model(*args, **kwargs), compiled(*args, **kwargs)
    on, off = check(kiln_on, eager_on, ref), check(kiln_off, eager_off, ref)
    fallbacks = dict(counters["fallback"])
    return {"model": name, "dtype": str(dtype).removeprefix("torch."), "on": "" if on.passed else on.reason,
            "off": "" if off.passed else off.reason, "max_abs_error": on.max_abs_error,
            "captures": sum(counters["captures"].values()), "fallbacks": fallbacks,
            "library_fallbacks": {k: n for k, n in fallbacks.items() if any(w in k for w in LIBRARY_OPS)},
            "seconds": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="", help="comma-separated zoo names (default: the whole zoo)")
    parser.add_argument("--dtypes", default="bfloat16,float16")
    opts = parser.parse_args(argv)
    names = opts.models.split(",") if opts.models else zoo.names()
    dtypes = [getattr(torch, d) for d in opts.dtypes.split(",")]
    failed = 0
    print(f"{'model':22s} {'dtype':9s} {'autocast on':12s} {'then off':9s} {'max|err|':>9s}  library ops with torch")
    for name in names:
        for dtype in dtypes:
            try:
                r = run_one(name, dtype)
            except Exception as e:  # a model that cannot be built or compiled is a row, not the end
                failed += 1
                print(f"{name:22s} {str(dtype)[6:]:9s} error: {type(e).__name__}: {str(e)[:120]}")
                continue
            bad = bool(r["on"] or r["off"] or r["library_fallbacks"])
            failed += bad
            print(f"{name:22s} {r['dtype']:9s} {'ok' if not r['on'] else 'WRONG':12s} "
                  f"{'ok' if not r['off'] else 'WRONG':9s} {r['max_abs_error']:9.2e}  "
                  f"{r['library_fallbacks'] or '-'}", flush=True)
    print(f"{failed} failing of {len(names) * len(dtypes)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
