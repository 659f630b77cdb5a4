"""`kiln bench --distributed N [--strategy fsdp]`: DDP (or FSDP2) training step time on N gloo ranks of this
machine, side by side.

Columns, each a DistributedDataParallel training step (forward, loss, backward with DDP's all-reduce, SGD
step) of the same zoo model on the same data, every rank taking an equal slice of one global batch:

    eager DDP           DDP(model)
    kiln DDP            kiln.compile(DDP(model))   (DDP's forward eager; graphs cut at its buckets)
    DDP(kiln)           DDP(kiln.compile(model))
    torch.compile DDP   the torch.compile baseline wrapping the DDP module (bench/baselines.py)

With `--strategy fsdp`, FSDP2 (`fully_shard` on each of the model's blocks, then on the model; models with
`blocks`: nanogpt, llama):

    eager FSDP2             the sharded model
    kiln FSDP2              kiln.compile(model): each sharded block's forward and the model's compiled,
                            FSDP's hooks (all-gather, reshard, reduce-scatter) eager around them
    torch.compile FSDP2     the torch.compile baseline of the sharded model

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
from typing import Any, Callable

import torch

VARIANTS = ("eager DDP", "kiln DDP", "DDP(kiln)", "torch.compile DDP")
FSDP_VARIANTS = ("eager FSDP2", "kiln FSDP2", "torch.compile FSDP2")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the ranks' rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_compile_baseline(module: torch.nn.Module, cache_dir: str) -> Any:
    """`module` compiled by bench/baselines.py's torch.compile entry (Unavailable outside a checkout)."""
    from .adapters import Unavailable, load_baselines
    baselines = load_baselines()
    if baselines is None or "torch.compile" not in baselines.BASELINES:
        raise Unavailable("bench/baselines.py (torch.compile) is not in this checkout")
    return baselines.BASELINES["torch.compile"](module, cache_dir)


def _wrap(variant: str, model: torch.nn.Module, cache_dir: str, ddp_kwargs: dict) -> Any:
    from torch.nn.parallel import DistributedDataParallel as DDP

    import kiln
    if "FSDP2" in variant:
        from torch.distributed.fsdp import fully_shard
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        if variant == "eager FSDP2":
            return model
        if variant == "kiln FSDP2":
            return kiln.compile(model)
    if variant == "eager DDP":
        return DDP(model, **ddp_kwargs)
    if variant == "kiln DDP":
        return kiln.compile(DDP(model, **ddp_kwargs))
    if variant == "DDP(kiln)":
        return DDP(kiln.compile(model), **ddp_kwargs)
    if variant.startswith("torch.compile"):
        return torch_compile_baseline(model if "FSDP2" in variant else DDP(model, **ddp_kwargs), cache_dir)
    raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS + FSDP_VARIANTS)}")


def _loss(out: Any) -> torch.Tensor:
    tensor = out if isinstance(out, torch.Tensor) else out[0]
    return (tensor.float() ** 2).mean()


def _rank_main(rank: int, world: int, port: int, name: str, variants: list[str], steps: int, warmup: int,
               cache_dir: str, ddp_kwargs: dict, out_dir: str) -> None:
    import torch.distributed as dist

    from kiln.testing import models as zoo

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    spec = zoo.get(name)

    def prepare(variant: str) -> tuple:
        model, (args, kwargs) = zoo.build(name, batch=spec.batch * world)
        model.train()
        share = spec.batch
        args = tuple(a[rank * share:(rank + 1) * share] if isinstance(a, torch.Tensor) else a for a in args)
        wrapped = _wrap(variant, model, os.path.join(cache_dir, variant.replace(" ", "_")), ddp_kwargs)
        return wrapped, torch.optim.SGD(model.parameters(), lr=0.01), args, kwargs

    def step(state: tuple) -> None:
        wrapped, opt, args, kwargs = state
        opt.zero_grad()
        _loss(wrapped(*args, **kwargs)).backward()
        opt.step()

    def pieces(variant: str, state: tuple) -> dict[str, Any]:
        if "FSDP2" in variant:
            return explain_counts(variant, state[0], *state[2])
        return {"pieces": [len(s.pieces) for s in getattr(state[0], "splits", [])]}

    time_variants(rank, variants, prepare, step, steps, warmup, cache_dir, out_dir, after_warmup=pieces)
    dist.destroy_process_group()


def time_variants(rank: int, variants: list[str], prepare: Callable[[str], Any], step: Callable[[Any], None],
                  steps: int, warmup: int, cache_dir: str, out_dir: str,
                  after_warmup: Callable[[str, Any], dict] | None = None) -> None:
    """The timing every `kiln bench --distributed` strategy shares, run on each rank of a process group:
    `prepare(variant)` builds a variant's state (an exception makes its row say why; the others run),
    `step(state)` runs one training step. Each variant's warm-up steps (the compiles, from a cold cache of
    its own; the first is `first`) run in turn, then `after_warmup(variant, state)` adds columns; then the
    variants take turns step by step, each step between barriers. A step's time is the slowest rank's.
    Rank 0 writes {variant: {times, first, status, ...}} to out_dir/summary.pt."""
    import torch.distributed as dist

    from kiln import config

    runs: dict[str, dict[str, Any]] = {}
    for variant in variants:
        runs[variant] = {"times": [], "status": "ok"}
        try:
            runs[variant]["state"] = prepare(variant)
        except Exception as e:  # this variant's row says why; the others run
            runs[variant]["status"] = f"{type(e).__name__}: {str(e)[:200]}"

    def timed(variant: str) -> float:
        dist.barrier()
        start = time.perf_counter()
        step(runs[variant]["state"])
        return time.perf_counter() - start

    live = [v for v in variants if runs[v]["status"] == "ok"]
    for variant in list(live):
        try:
            with config.patch(cache_dir=os.path.join(cache_dir, variant.replace(" ", "_"), "kiln")):
                first = [timed(variant) for _ in range(warmup)]  # compiles, each variant from a cold cache
                if after_warmup is not None:
                    runs[variant].update(after_warmup(variant, runs[variant]["state"]))
        except Exception as e:  # every rank fails alike (same model, same data): the row says why
            runs[variant]["status"] = f"{type(e).__name__}: {str(e)[:200]}"
            live.remove(variant)
            continue
        runs[variant]["first"] = first[0] if first else float("nan")
    for _ in range(steps):
        for variant in live:
            runs[variant]["times"].append(timed(variant))
    for variant in live:  # the slowest rank's time of each step
        times = torch.tensor([runs[variant]["first"]] + runs[variant]["times"], dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        runs[variant]["first"], runs[variant]["times"] = times[0].item(), times[1:].tolist()
    if rank == 0:
        summary = {v: {k: value for k, value in runs[v].items() if k != "state"} for v in variants}
        torch.save(summary, os.path.join(out_dir, "summary.pt"))
    dist.barrier()


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


def table(results: dict[str, Any], world: int, model: str, steps: int, strategy: str = "ddp") -> str:
    """The step-time table: median ms, speedup over eager DDP (FSDP2), first (compiling) step, the note
    (DDP: the graph pieces; FSDP2: kiln.explain's graphs and breaks)."""
    name = {"ddp": "DDP", "fsdp": "FSDP2"}[strategy]
    title = (f"kiln bench --distributed {world}{' --strategy fsdp' if strategy == 'fsdp' else ''}: {model}, "
             f"{name} over gloo, {world} ranks x 1 thread, {steps} interleaved steps each (slowest rank per step)")
    return step_table(results, title, f"eager {name}", lambda entry: (
        f"graph pieces {entry['pieces']}" if entry.get("pieces") else graphs_note(entry)))


def explain_counts(variant: str, compiled: Any, *example: Any) -> dict[str, Any]:
    """kiln.explain's (graphs, breaks) of a kiln variant's compiled model, as the table's note."""
    if not variant.startswith("kiln"):
        return {}
    import kiln
    report = kiln.explain(compiled, *example)
    return {"graphs": (report.graph_count, report.graph_break_count)}


def graphs_note(entry: dict) -> str:
    return f"{entry['graphs'][0]} graphs, {entry['graphs'][1]} breaks" if entry.get("graphs") else ""




def step_table(results: dict[str, Any], title: str, baseline: str,
               note: Callable[[dict], str] = lambda entry: "") -> str:
    """Each variant's median step ms, its speedup over `baseline`'s median, the quartiles of its steps,
    its first (compiling) step and `note(entry)`; a variant that failed, why."""
    eager = results.get(baseline, {}).get("times") or []
    base = statistics.median(eager) if eager else None
    width = max([20] + [len(v) for v in results])
    lines = [title, f"{'variant':{width}s} {'median step ms':>15s} {'vs ' + baseline:>15s} {'quartiles ms':>16s} "
             f"{'first step s':>13s}  note"]
    for variant, entry in results.items():
        if entry["status"] != "ok" or not entry["times"]:
            lines.append(f"{variant:{width}s} {'-':>15s} {'-':>15s} {'-':>16s} {'-':>13s}  {entry['status']}")
            continue
        times = sorted(entry["times"])
        median = statistics.median(times)
        quartiles = f"{times[len(times) // 4] * 1e3:.2f}-{times[(3 * len(times)) // 4] * 1e3:.2f}"
        speedup = f"{base / median:.2f}x" if base else "-"
        lines.append(f"{variant:{width}s} {median * 1e3:15.2f} {speedup:>15s} {quartiles:>16s} "
                     f"{entry['first']:13.2f}  {note(entry)}")
    return "\n".join(lines)


def main(world: int, models: list[str] | None, steps: int = 20, timeout_s: float = 900.0,
         bucket_cap_mb: float | None = None, strategy: str = "ddp") -> int:
    """`kiln bench --distributed N [--strategy fsdp]`: print one table per model (default nanogpt)."""
    ddp_kwargs = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
    variants = FSDP_VARIANTS if strategy == "fsdp" else VARIANTS
    for model in models or ["nanogpt"]:
        results = run(world, model, variants, steps=steps, timeout_s=timeout_s, ddp_kwargs=ddp_kwargs)
        print(table(results, world, model, steps, strategy))
        print()
    return 0
