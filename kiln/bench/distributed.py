"""`kiln bench --distributed N`: DDP training step time on N gloo ranks of this machine, side by side.

Columns, each a DistributedDataParallel training step (forward, loss, backward with DDP's all-reduce, SGD
step) of the same zoo model on the same data, every rank taking an equal slice of one global batch:

    eager DDP           DDP(model)
    kiln DDP            kiln.compile(DDP(model))   (DDP's forward eager; graphs cut at its buckets)
    DDP(kiln)           DDP(kiln.compile(model))
    torch.compile DDP   the torch.compile baseline wrapping the DDP module (bench/baselines.py)

All in one run on the same ranks: after the warm-up steps (the compiles, timed as `first step`), the
variants take turns step by step, each step between barriers; a step's time is the slowest rank's, and
the table shows each variant's median and its speedup over eager DDP (median eager / median variant).
Each rank runs one torch thread. Ranks are spawned here (loopback, a free port) and killed on timeout.
"""
from __future__ import annotations

import datetime
import os
import socket
import statistics
import tempfile
import time
from typing import Any

import torch

VARIANTS = ("eager DDP", "kiln DDP", "DDP(kiln)", "torch.compile DDP")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the ranks' rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wrap(variant: str, model: torch.nn.Module, cache_dir: str, ddp_kwargs: dict) -> Any:
    from torch.nn.parallel import DistributedDataParallel as DDP

    import kiln
    if variant == "eager DDP":
        return DDP(model, **ddp_kwargs)
    if variant == "kiln DDP":
        return kiln.compile(DDP(model, **ddp_kwargs))
    if variant == "DDP(kiln)":
        return DDP(kiln.compile(model), **ddp_kwargs)
    if variant == "torch.compile DDP":
        from .adapters import Unavailable, load_baselines
        baselines = load_baselines()
        if baselines is None or "torch.compile" not in baselines.BASELINES:
            raise Unavailable("bench/baselines.py (torch.compile) is not in this checkout")
        return baselines.BASELINES["torch.compile"](DDP(model, **ddp_kwargs), cache_dir)
    raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")


def _loss(out: Any) -> torch.Tensor:
    tensor = out if isinstance(out, torch.Tensor) else out[0]
    return (tensor.float() ** 2).mean()


def _rank_main(rank: int, world: int, port: int, name: str, variants: list[str], steps: int, warmup: int,
               cache_dir: str, ddp_kwargs: dict, out_dir: str) -> None:
    import torch.distributed as dist

    from kiln import config
    from kiln.testing import models as zoo

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    spec = zoo.get(name)
    runs: dict[str, dict[str, Any]] = {}
    for variant in variants:
        model, (args, kwargs) = zoo.build(name, batch=spec.batch * world)
        model.train()
        share = spec.batch
        args = tuple(a[rank * share:(rank + 1) * share] if isinstance(a, torch.Tensor) else a for a in args)
        entry: dict[str, Any] = {"times": [], "status": "ok"}
        try:
            wrapped = _wrap(variant, model, os.path.join(cache_dir, variant.replace(" ", "_")), ddp_kwargs)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            entry["step"] = (wrapped, opt, args, kwargs)
        except Exception as e:  # this variant's row says why; the others run
            entry["status"] = f"{type(e).__name__}: {e}"
        runs[variant] = entry

    def step(variant: str) -> float:
        wrapped, opt, args, kwargs = runs[variant]["step"]
        dist.barrier()
        start = time.perf_counter()
        opt.zero_grad()
        _loss(wrapped(*args, **kwargs)).backward()
        opt.step()
        return time.perf_counter() - start

    live = [v for v in variants if runs[v]["status"] == "ok"]
    for variant in list(live):
        try:
            with config.patch(cache_dir=os.path.join(cache_dir, variant.replace(" ", "_"), "kiln")):
                first = [step(variant) for _ in range(warmup)]  # compiles, each variant from a cold cache
        except Exception as e:  # every rank fails alike (same model, same data): the row says why
            runs[variant]["status"] = f"{type(e).__name__}: {str(e)[:200]}"
            live.remove(variant)
            continue
        runs[variant]["first"] = first[0] if first else float("nan")
        runs[variant]["pieces"] = [len(s.pieces) for s in getattr(runs[variant]["step"][0], "splits", [])]
    for _ in range(steps):
        for variant in live:
            runs[variant]["times"].append(step(variant))
    # the slowest rank's time of each step
    for variant in live:
        times = torch.tensor([runs[variant]["first"]] + runs[variant]["times"], dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        runs[variant]["first"], runs[variant]["times"] = times[0].item(), times[1:].tolist()
    if rank == 0:
        summary = {v: {k: runs[v].get(k) for k in ("times", "first", "status", "pieces")} for v in variants}
        torch.save(summary, os.path.join(out_dir, "summary.pt"))
    dist.barrier()
    dist.destroy_process_group()


def run(world: int = 2, model: str = "nanogpt", variants: tuple[str, ...] = VARIANTS, steps: int = 20,
        warmup: int = 3, timeout_s: float = 900.0, ddp_kwargs: dict | None = None) -> dict[str, Any]:
    """Spawn `world` ranks, run every variant, and return {variant: {times, first, status, pieces}}."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="kiln_bench_ddp_") as tmp:
        context = mp.start_processes(
            _rank_main, args=(world, free_port(), model, list(variants), steps, warmup, tmp,
                              ddp_kwargs or {}, tmp), nprocs=world, join=False, start_method="spawn")
        return join_ranks(context, timeout_s, f"kiln bench --distributed {world}", tmp)


def join_ranks(context: Any, timeout_s: float, what: str, tmp: str) -> Any:
    """Wait for spawned ranks (see wait_for_ranks), then load rank 0's summary.pt in `tmp`."""
    wait_for_ranks(context, timeout_s, what)
    return torch.load(os.path.join(tmp, "summary.pt"), weights_only=False)


def wait_for_ranks(context: Any, timeout_s: float, what: str) -> None:
    """Wait for the ranks of torch.multiprocessing's `context`: a failing rank raises (and stops the others);
    any rank still alive after `timeout_s`, or when waiting raised, is killed."""
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=0.5):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: ranks ran past {timeout_s:.0f} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join(5)


def table(results: dict[str, Any], world: int, model: str, steps: int) -> str:
    """The step-time table: median ms, speedup over eager DDP, first (compiling) step, pieces."""
    eager = results.get("eager DDP", {}).get("times") or []
    base = statistics.median(eager) if eager else None
    lines = [f"kiln bench --distributed {world}: {model}, DDP over gloo, {world} ranks x 1 thread, "
             f"{steps} interleaved steps each (slowest rank per step)",
             f"{'variant':20s} {'median step ms':>15s} {'vs eager DDP':>13s} {'first step s':>13s}  note"]
    for variant, entry in results.items():
        if entry["status"] != "ok" or not entry["times"]:
            lines.append(f"{variant:20s} {'-':>15s} {'-':>13s} {'-':>13s}  {entry['status']}")
            continue
        median = statistics.median(entry["times"])
        speedup = f"{base / median:.2f}x" if base else "-"
        note = f"graph pieces {entry['pieces']}" if entry.get("pieces") else ""
        lines.append(f"{variant:20s} {median * 1e3:15.2f} {speedup:>13s} {entry['first']:13.2f}  {note}")
    return "\n".join(lines)


def main(world: int, models: list[str] | None, steps: int = 20, timeout_s: float = 900.0,
         bucket_cap_mb: float | None = None) -> int:
    """`kiln bench --distributed N`: print one table per model (default nanogpt)."""
    ddp_kwargs = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
    for model in models or ["nanogpt"]:
        results = run(world, model, steps=steps, timeout_s=timeout_s, ddp_kwargs=ddp_kwargs)
        print(table(results, world, model, steps))
        print()
    return 0
