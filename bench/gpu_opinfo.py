"""The triton backend's OpInfo sweep on a CUDA GPU: every op_db entry's first sample, kiln vs eager there.

    python bench/gpu_opinfo.py [--ops NAMES] [--dtypes float32] [-j JOBS] [--json PATH]

tests/backend/test_triton_suites.py runs this sweep in CI under Triton's interpreter, on CPU tensors; this
script runs the same samples compiled for the GPU (the kernels ptxas builds, libdevice's transcendentals,
the tile configurations a device launch picks), which no CI machine has. Each entry's first sample is made
on the CPU under the harness's seed and moved to the device, so it is the sample CI checks. Eager on the
same device is the oracle, with the harness's rule (kiln.testing.opinfo.run_sample: values, shapes, dtypes,
strides of views, mutated inputs, the exception type where eager raises).

Prints one line per entry that does not pass and a summary: matched, graphs handed to torch (with the
counter's reason), errors, and WRONG results (a mismatch that the CPU's expected-failure list does not
explain). Exits 1 when any result is wrong. Without CUDA it runs on CPU tensors under the interpreter
(TRITON_INTERPRET=1 is set here): a check of the script itself.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import sys
import time
import types
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

_OPS: list = []


def _init_worker() -> None:
    import torch
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    import kiln.ops  # noqa: F401  (registers the decompositions)
    from kiln.testing import opinfo
    _OPS[:] = opinfo.op_database()


def _moved(value, device):
    import torch
    if isinstance(value, torch.Tensor):
        moved = value.to(device)
        return moved.requires_grad_(value.requires_grad) if value.is_leaf else moved
    if isinstance(value, (list, tuple)):
        return type(value)(_moved(v, device) for v in value)
    if isinstance(value, dict):  # a factory's device= goes to the device too
        return {k: device if k == "device" else _moved(v, device) for k, v in value.items()}
    return value


def run_entry(index: int, dtype_name: str) -> dict:
    """One entry's first sample on the device: {op, status, message, torch_runs, seconds}."""
    import torch
    from kiln.counters import counters
    from kiln.testing import opinfo
    op = _OPS[index]
    name = opinfo.op_id(op)
    dtype = opinfo.DTYPES[dtype_name]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    start = time.perf_counter()
    row = {"op": name, "dtype": dtype_name, "status": "not applicable", "message": "", "torch_runs": []}
    if dtype not in op.supported_dtypes("cpu") or dtype not in op.supported_dtypes(device):
        return row
    try:
        chosen = opinfo.samples(op, dtype, 1)
    except Exception as e:
        row.update(status="error", message=f"sample_inputs raised {opinfo.describe_exception(e)}")
        return row
    if not chosen:
        return row
    sample = chosen[0]
    moved = types.SimpleNamespace(input=_moved(sample.input, device), args=_moved(sample.args, device),
                                  kwargs=_moved(sample.kwargs, device))
    counters.clear()
    try:
        with opinfo.time_limit(120.0):
            outcome = opinfo.run_sample(op, moved, "triton")
        row["status"] = "ok" if outcome.status == "ok" else outcome.status
        row["message"] = outcome.message
    except Exception as e:
        row.update(status="error", message=f"harness: {opinfo.describe_exception(e)}")
    row["torch_runs"] = sorted(k for k, v in counters["triton"].items() if k.startswith("ran with torch") and v)
    row["seconds"] = time.perf_counter() - start
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", help="comma-separated op ids (substring match); default all of op_db")
    parser.add_argument("--dtypes", default="float32")
    parser.add_argument("-j", "--jobs", type=int, default=max(1, min(12, (os.cpu_count() or 2) - 2)))
    parser.add_argument("--json", help="write every row to this path")
    args = parser.parse_args(argv)
    _init_worker()
    import torch
    from kiln.testing import opinfo
    names = [n for n in (args.ops or "").split(",") if n]
    indices = [i for i, op in enumerate(_OPS)
               if not names or any(n == opinfo.op_id(op) or n in opinfo.op_id(op) for n in names)]
    dtypes = [d for d in args.dtypes.split(",") if d]
    expected = opinfo.expected_failures()
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU (Triton's interpreter)"
    print(f"# triton OpInfo first samples on {device}: {len(indices)} entries x {dtypes}, {args.jobs} jobs",
          flush=True)
    started = time.perf_counter()
    rows: list[dict] = []
    context = multiprocessing.get_context("spawn")  # CUDA does not survive a fork
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=context,
                                                initializer=_init_worker) as pool:
        futures = {pool.submit(run_entry, i, d): (i, d) for d in dtypes for i in indices}
        for future in concurrent.futures.as_completed(futures):
            i, d = futures[future]
            try:
                row = future.result()
            except Exception as e:  # a worker that died (a device fault) is an error of that entry
                row = {"op": opinfo.op_id(_OPS[i]), "dtype": d, "status": "error",
                       "message": f"worker: {type(e).__name__}: {e}", "torch_runs": []}
            listed = expected.get(d, {}).get(row["op"])
            row["expected"] = listed["kind"] if listed else None
            row["wrong"] = row["status"] == "mismatch" and not (listed and listed["kind"] == "mismatch")
            rows.append(row)
            if row["status"] not in ("ok", "not applicable") or row["torch_runs"]:
                tag = "WRONG RESULT" if row["wrong"] else row["status"]
                note = f" [expected: {row['expected']}]" if row["expected"] else ""
                print(f"{row['op']:<40} {d:<8} {tag}{note}: {row['message'][:300]} {row['torch_runs']}",
                      flush=True)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    wrong = [r["op"] for r in rows if r["wrong"]]
    handed = sum(1 for r in rows if r["torch_runs"])
    print(f"\n{counts}; graphs handed to torch in {handed} entries; WRONG {len(wrong)}: {wrong}; "
          f"{time.perf_counter() - started:.0f} s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "rows": rows}, f, indent=1)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
