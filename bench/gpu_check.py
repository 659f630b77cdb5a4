"""The triton backend on a GPU, side by side with eager and torch.compile (Inductor): one command, < 5 minutes.

    python bench/gpu_check.py [--size 4096] [--reps 20] [--models mlp,nanogpt,llama] [--no-inductor]
                              [--json PATH]

1. The device's copy bandwidth (a 256 MB clone, median), the yardstick of every GB/s below.
2. The memory-bound cases of bench/bench_kernels.py at `--size`: eager, torch.compile and kiln (backend
   `triton`) medians, kiln's ratio to torch.compile, kiln's GB/s (bytes that must move) as % of the copy
   bandwidth, and compile times (first call) of kiln and torch.compile.
3. Per kernel of those cases: its own time (launched alone, median), the bytes its buffers hold, GB/s and %
   of the copy bandwidth, and its tile configuration.
4. Three zoo models (inference, no_grad): eager, torch.compile and kiln medians, speedups, max error.

Without a CUDA GPU it runs the same on the CPU under Triton's interpreter (TRITON_INTERPRET=1 is set here,
sizes default to 64, torch.compile is skipped): that checks the script end to end, its times mean nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kiln  # noqa: E402
import kiln.ops  # noqa: E402
from kiln.backends import triton as triton_backend  # noqa: E402
from kiln.backends.triton_tune import _scratch  # noqa: E402
from kiln.codegen.triton import launch_config  # noqa: E402
from kiln.runtime import tritonlib  # noqa: E402
from kiln.testing import models  # noqa: E402

DEVICE = torch.device("cuda") if HAS_CUDA else torch.device("cpu")


def sync() -> None:
    if HAS_CUDA:
        torch.cuda.synchronize()


def median_ms(fn, reps: int) -> float:
    fn()
    sync()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def timed_first_call(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - start, out


def copy_bandwidth(reps: int) -> float:
    n = (256 << 20) // 4 if HAS_CUDA else (16 << 20) // 4
    src = torch.randn(n, device=DEVICE)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), reps)
    return 2 * src.numel() * 4 / (ms * 1e-3) / 1e9


def on_device(value):
    if isinstance(value, torch.Tensor):
        return value.to(DEVICE)
    if isinstance(value, (tuple, list)):
        return type(value)(on_device(v) for v in value)
    if isinstance(value, dict):
        return {k: on_device(v) for k, v in value.items()}
    return value


def compile_traced(fn, args):
    """The triton backend on fn traced by kiln.ops.trace: kiln.compile's backend without its capture, which
    reads CPython 3.11-3.13 bytecode (a GPU machine's Python may be another). Every arg is a tensor."""
    from kiln.backends import lookup_backend
    compiled = lookup_backend("triton")(kiln.ops.trace(fn, *args), list(args))
    return lambda *a: compiled(*a)


def kiln_compile(fn, args):
    """kiln.compile(fn, backend="triton") where capture runs on this Python, else compile_traced."""
    if sys.version_info[:2] in kiln.CAPTURE_PYTHONS:
        return kiln.compile(fn, backend="triton")
    return compile_traced(fn, args)


def kernel_rows(name: str, fn, args, reps: int, bandwidth: float) -> list[dict]:
    """Each triton kernel of the case's graph, launched alone on scratch tensors of its buffers' sizes."""
    graph = kiln.ops.trace(fn, *args)
    compiled = triton_backend.compile_graph(graph, list(args))
    mode = "device" if HAS_CUDA else "interpret"
    rows = []
    for step in compiled.plan.steps:
        seg = compiled.segments.get(getattr(step.node, "name", None))
        if seg is None:
            continue
        module = tritonlib.load_module(seg.source)
        tensors = dict(zip(seg.args, _scratch(compiled.loop, seg.args, DEVICE)))
        for k in seg.kernels:
            cfg = launch_config(k, mode)
            kernel = getattr(module, k.name)
            kargs = [tensors[p[2:]] for p in k.params]

            def launch(kernel=kernel, kargs=kargs, cfg=cfg):
                with tritonlib.kiln_quiet():
                    kernel[tuple(cfg["grid"])](*kargs, XBLOCK=cfg["XBLOCK"], RBLOCK=cfg["RBLOCK"],
                                               num_warps=cfg["num_warps"])
            ms = median_ms(launch, reps)
            nbytes = sum(compiled.loop.buffers[p[2:]].nbytes() for p in k.params)
            gbs = nbytes / (ms * 1e-3) / 1e9
            rows.append({"case": name, "kernel": k.name, "ms": ms, "MB": nbytes / 1e6, "GB/s": gbs,
                         "% copy": 100 * gbs / bandwidth, "tile": f"{cfg['XBLOCK']}x{cfg['RBLOCK']}",
                         "warps": cfg["num_warps"], "kind": "pointwise" if k.pointwise else "rows"})
    return rows


def table(rows: list[dict], columns: list[str]) -> None:
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        cells = []
        for c in columns:
            v = row.get(c, "")
            cells.append(f"{v:.3g}" if isinstance(v, float) else str(v))
        print("| " + " | ".join(cells) + " |")
    print(flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=4096 if HAS_CUDA else 64)
    parser.add_argument("--reps", type=int, default=20 if HAS_CUDA else 3)
    parser.add_argument("--models", default="mlp,nanogpt,llama")
    parser.add_argument("--no-inductor", action="store_true", help="skip torch.compile (always off on CPU)")
    parser.add_argument("--json", help="write every row to this path")
    args = parser.parse_args(argv)
    use_inductor = HAS_CUDA and not args.no_inductor
    from bench_kernels import cases
    device_name = torch.cuda.get_device_name() if HAS_CUDA else "CPU (Triton interpreter: times mean nothing)"
    bandwidth = copy_bandwidth(args.reps)
    capture = "kiln.compile" if sys.version_info[:2] in kiln.CAPTURE_PYTHONS else \
        "kiln.ops.trace (capture does not read this Python's bytecode)"
    print(f"# via {capture}, Python {sys.version.split()[0]}, torch {torch.__version__}", flush=True)
    print(f"# kiln triton on {device_name}; copy bandwidth {bandwidth:.1f} GB/s; size {args.size}\n", flush=True)
    case_rows, kernel_table, model_rows = [], [], []
    for name, (fn, inputs, nbytes) in cases(args.size).items():
        inputs = on_device(inputs)
        row = {"case": name}
        row["eager ms"] = median_ms(lambda: fn(*inputs), args.reps)
        row["kiln compile s"], (kiln_fn, out) = timed_first_call(
            lambda: (lambda f: (f, f(*inputs)))(kiln_compile(fn, inputs)))
        row["kiln ms"] = median_ms(lambda: kiln_fn(*inputs), args.reps)
        if "dropout" not in name:
            torch.testing.assert_close(out, fn(*inputs), atol=1e-4, rtol=1e-4)
        row["kiln GB/s"] = nbytes / (row["kiln ms"] * 1e-3) / 1e9
        row["% copy"] = 100 * row["kiln GB/s"] / bandwidth
        if use_inductor:
            ind = torch.compile(fn)
            row["inductor compile s"], _ = timed_first_call(lambda: ind(*inputs))
            row["inductor ms"] = median_ms(lambda: ind(*inputs), args.reps)
            row["kiln vs inductor"] = row["inductor ms"] / row["kiln ms"]
        case_rows.append(row)
        kernel_table += kernel_rows(name, fn, inputs, args.reps, bandwidth)
    columns = ["case", "eager ms", "inductor ms", "kiln ms", "kiln vs inductor", "kiln GB/s", "% copy",
               "kiln compile s", "inductor compile s"]
    print("## memory-bound cases")
    table(case_rows, [c for c in columns if use_inductor or "inductor" not in c])
    print("## kernels")
    table(kernel_table, ["case", "kernel", "kind", "tile", "warps", "ms", "MB", "GB/s", "% copy"])
    for name in [m for m in args.models.split(",") if m]:
        model, (margs, mkwargs) = models.build(name)
        model = model.to(DEVICE)
        margs, mkwargs = on_device(margs), on_device(mkwargs)
        row = {"model": name}
        with torch.no_grad():
            expected = model(*margs, **mkwargs)
            row["eager ms"] = median_ms(lambda: model(*margs, **mkwargs), args.reps)
            assert not mkwargs, name
            row["kiln compile s"], (compiled, out) = timed_first_call(
                lambda: (lambda f: (f, f(*margs)))(kiln_compile(lambda *a: model(*a), margs)))
            row["kiln ms"] = median_ms(lambda: compiled(*margs, **mkwargs), args.reps)
            row["max error"] = float((out - expected).abs().max())
            row["kiln speedup"] = row["eager ms"] / row["kiln ms"]
            if use_inductor:
                ind = torch.compile(model)
                row["inductor compile s"], _ = timed_first_call(lambda: ind(*margs, **mkwargs))
                row["inductor ms"] = median_ms(lambda: ind(*margs, **mkwargs), args.reps)
                row["inductor speedup"] = row["eager ms"] / row["inductor ms"]
        model_rows.append(row)
    columns = ["model", "eager ms", "inductor ms", "kiln ms", "kiln speedup", "inductor speedup", "max error",
               "kiln compile s", "inductor compile s"]
    print("## models (inference)")
    table(model_rows, [c for c in columns if use_inductor or "inductor" not in c])
    from kiln.counters import counters
    print(f"triton counters: {dict(counters['triton'])}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device_name, "copy GB/s": bandwidth, "cases": case_rows, "kernels": kernel_table,
                       "models": model_rows, "counters": dict(counters["triton"])}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
