"""Capture time: kiln against Dynamo, both with the eager backend (graph capture alone, no code generation).

Per zoo model (default: the 21 Hugging Face models, suite `hf`), in one process, one run:

  eager ms        the fastest eager call of the warm model (of 8 or more)
  kiln            `kiln.compile(model, backend="eager")` after `kiln.reset()`: the first call's wall time
                  minus the eager call; graphs and graph breaks from kiln.counters over that call
  dynamo          `torch.compile(model, backend="eager")` (Dynamo with the eager backend) after
                  `torch._dynamo.reset()`: the same measure; graphs (`unique_graphs`) and graph breaks from
                  `torch._dynamo.utils.counters` over that call
  same            whether the first compiled call's outputs equal eager's (allclose at 1e-4; KV caches too)

Each compiler gets a freshly built (seeded) copy of the model; kiln goes first, then Dynamo. One-time costs
(imports; Dynamo's and kiln's first capture) are paid by a warm-up on a tiny function before the first model.
All calls run under torch.no_grad(), on one torch thread by default (`--threads`). Prints a markdown table; `--json PATH` keeps the rows.

    python bench/bench_capture.py [--models hf_gpt2,hf_bert | --suite hf] [--json PATH] [--threads N]
                                  [--compilers kiln,dynamo] [--against PATH]

torch._dynamo appears only here (bench/) and in tests: kiln never imports it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback
import warnings
from typing import Any, Callable

import torch
import torch._dynamo
import torch._dynamo.utils

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))   # this checkout's kiln

import kiln  # noqa: E402
from kiln.bench.census import _eager_seconds  # noqa: E402
from kiln.testing import accuracy  # noqa: E402
from kiln.testing import models as zoo  # noqa: E402


def same_outputs(actual: Any, expected: Any) -> bool:
    try:
        a, e = accuracy.flatten(actual), accuracy.flatten(expected)
    except TypeError:
        return False
    if [path for path, _ in a] != [path for path, _ in e]:
        return False
    for (_, x), (_, y) in zip(a, e):
        if isinstance(y, torch.Tensor):
            if not isinstance(x, torch.Tensor) or x.shape != y.shape or not torch.allclose(x, y, 1e-4, 1e-4):
                return False
        elif x != y:
            return False
    return True


def first_call(compile_fn: Callable[[torch.nn.Module], Any], name: str) -> tuple[Any, float, float]:
    """The first call's output, wall seconds and this process's CPU seconds (steadier than wall on a busy
    machine: one torch thread, so it is the capture's own work)."""
    model, (args, kwargs) = zoo.build(name)
    compiled = compile_fn(model)
    start, cpu = time.perf_counter(), time.process_time()
    out = compiled(*args, **kwargs)
    return out, time.perf_counter() - start, time.process_time() - cpu


def kiln_compile(model: torch.nn.Module) -> Any:
    kiln.reset()
    return kiln.compile(model, backend="eager")


def dynamo_compile(model: torch.nn.Module) -> Any:
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    return torch.compile(model, backend="eager")


def kiln_counts() -> dict[str, int]:
    return {"graphs": sum(kiln.counters.get("graphs", {}).values()),
            "breaks": sum(kiln.counters.get("graph_breaks", {}).values()),
            "errors": sum(kiln.counters.get("capture_errors", {}).values())}


def dynamo_counts() -> dict[str, int]:
    counters = torch._dynamo.utils.counters
    return {"graphs": int(counters["stats"]["unique_graphs"]),
            "breaks": sum(counters["graph_break"].values())}


def warm_up() -> None:
    def tiny(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x * 2 + 1).softmax(-1).sum()
    x = torch.randn(4, 4)
    kiln.reset()
    kiln.compile(tiny, backend="eager")(x)
    torch._dynamo.reset()
    torch.compile(tiny, backend="eager")(x)
    torch._dynamo.reset()


def measure(name: str, compilers: tuple[str, ...] = ("kiln", "dynamo")) -> dict[str, Any]:
    row: dict[str, Any] = {"model": name}
    try:
        model, (args, kwargs) = zoo.build(name)
        expected = model(*args, **kwargs)
        row["eager_s"] = _eager_seconds(model, args, kwargs)
        del model
    except Exception as e:
        return dict(row, error=f"eager: {type(e).__name__}: {e}")
    for label, compile_fn, counts in (("kiln", kiln_compile, kiln_counts),
                                      ("dynamo", dynamo_compile, dynamo_counts)):
        if label not in compilers:
            continue
        try:
            out, wall, cpu = first_call(compile_fn, name)
            row[label] = dict(counts(), first_call_s=wall, first_call_cpu_s=cpu,
                              capture_s=max(0.0, wall - row["eager_s"]),
                              same=same_outputs(out, expected))
        except Exception as e:
            row[label] = {"error": f"{type(e).__name__}: {e}"[:300],
                          "traceback": traceback.format_exc().strip().splitlines()[-3:]}
    torch._dynamo.reset()
    kiln.reset()
    return row


def _cell(result: dict[str, Any]) -> tuple[str, str, str]:
    if "error" in result:
        return "error", "-", "-"
    return f"{result['graphs']}/{result['breaks']}", f"{result['capture_s']:.2f}", "yes" if result["same"] else "no"


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | eager ms | kiln graphs/breaks | kiln capture s | kiln same | dynamo graphs/breaks | "
             "dynamo capture s | dynamo same | dynamo / kiln |",
             "|---|---:|---:|---:|:-:|---:|---:|:-:|---:|"]
    ratios = []
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | error: {row['error'][:80]} | | | | | | | |")
            continue
        k, d = row.get("kiln", {"error": "not run"}), row.get("dynamo", {"error": "not run"})
        kg, kc, ks = _cell(k)
        dg, dc, ds = _cell(d)
        ratio = "-"
        if "error" not in k and "error" not in d and k["capture_s"] > 0:
            ratios.append(d["capture_s"] / k["capture_s"])
            ratio = f"{ratios[-1]:.1f}x"
        lines.append(f"| {row['model']} | {row['eager_s'] * 1e3:.2f} | {kg} | {kc} | {ks} | {dg} | {dc} | {ds} "
                     f"| {ratio} |")
    if ratios:
        geomean = math.exp(statistics.fmean(math.log(r) for r in ratios))
        lines.append("")
        lines.append(f"geomean dynamo / kiln capture time: {geomean:.1f}x over {len(ratios)} models "
                     f"(median {statistics.median(ratios):.1f}x)")
    errors = [(row["model"], label, row[label]["error"]) for row in rows for label in ("kiln", "dynamo")
              if isinstance(row.get(label), dict) and "error" in row[label] and row[label]["error"] != "not run"]
    for model, label, error in errors:
        lines.append(f"- {model} / {label}: {error}")
    return "\n".join(lines)


def against(rows: list[dict[str, Any]], path: str) -> str:
    """kiln's first-call CPU seconds (capture and one call) here over the same model's in `path` (a run on
    another Python or torch)."""
    with open(path) as f:
        other = json.load(f)
    theirs = {row["model"]: row.get("kiln", {}) for row in other["rows"]}
    key = "first_call_cpu_s"
    lines = [f"| model | kiln first call, CPU s here | there ({other.get('python', '?')}) | here / there |",
             "|---|---:|---:|---:|"]
    ratios = []
    for row in rows:
        mine, them = row.get("kiln", {}), theirs.get(row["model"], {})
        if key in mine and them.get(key):
            ratios.append(mine[key] / them[key])
            lines.append(f"| {row['model']} | {mine[key]:.3f} | {them[key]:.3f} | {ratios[-1]:.2f} |")
    if ratios:
        lines.append(f"\ngeomean here / there: {math.exp(statistics.fmean(math.log(r) for r in ratios)):.2f} over "
                     f"{len(ratios)} models")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=None, help="comma-separated zoo names (default: --suite)")
    parser.add_argument("--suite", default="hf", help="zoo suite when --models is not given (default: hf)")
    parser.add_argument("--json", default=None, help="write the rows as JSON to this path")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: steadier eager times on a busy machine; 0: torch's own)")
    parser.add_argument("--compilers", default="kiln,dynamo", help="which to time (default: kiln,dynamo)")
    parser.add_argument("--against", default=None, metavar="PATH",
                        help="also compare kiln's capture times with a --json file of another run (another "
                             "Python or torch): per model and their geomean")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    names = [n.strip() for n in args.models.split(",") if n.strip()] if args.models else zoo.names(args.suite)
    for name in names:
        zoo.get(name)
    warnings.simplefilter("ignore")
    rows = []
    with torch.no_grad():
        warm_up()
        for i, name in enumerate(names):
            print(f"[{i + 1}/{len(names)}] {name}", file=sys.stderr, flush=True)
            rows.append(measure(name, tuple(args.compilers.split(","))))
    print(table(rows))
    if args.against:
        print(against(rows, args.against))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "python": sys.version.split()[0],
                       "kiln": os.path.dirname(kiln.__file__), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
