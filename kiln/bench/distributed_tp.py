"""`kiln bench --distributed N --strategy tp`: tensor-parallel training step time on N gloo ranks.

Columns, each a training step (forward, loss, backward, SGD step) of the same model parallelized by
`parallelize_module` with a ColwiseParallel/RowwiseParallel plan (kiln.testing.tp_models, bench sizes) on a
1-D mesh of all ranks, every rank running the same batch:

    eager TP            the parallelized model as it is (DTensor, its hooks)
    kiln TP             kiln.compile(model): compiled per rank over the shards, collectives in the graph
    kiln TP (hooks)     kiln's plain module path on the same model (what kiln.compile did before: each
                        parallelized Linear's hooks a graph break)
    torch.compile TP    the torch.compile baseline of the model (bench/baselines.py)

Timing as `kiln bench --distributed` (kiln/bench/distributed.py): after the warm-up steps (the compiles,
timed as `first step`) the variants take turns step by step, each step between barriers; a step's time is
the slowest rank's; the table shows each variant's median, its speedup over eager TP (median eager / median
variant) and kiln's graphs and breaks (kiln.explain). One torch thread per rank; ranks spawned here
(loopback, a free port) and killed on timeout.
"""
from __future__ import annotations

import datetime
import os
import tempfile
from typing import Any

import torch

from .distributed import explain_counts, free_port, graphs_note, join_ranks, step_table, time_variants, \
    torch_compile_baseline

VARIANTS = ("eager TP", "kiln TP", "kiln TP (hooks)", "torch.compile TP")
MODELS = ("mlp", "llama")


def _wrap(variant: str, model: torch.nn.Module, cache_dir: str) -> Any:
    import kiln
    if variant == "eager TP":
        return model
    if variant == "kiln TP":
        return kiln.compile(model)
    if variant == "kiln TP (hooks)":
        return kiln.api.CompiledModule(model)  # kiln's plain module path, not the shards' one
    if variant == "torch.compile TP":
        return torch_compile_baseline(model, cache_dir)
    raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")


def _rank_main(rank: int, world: int, port: int, name: str, variants: list[str], steps: int, warmup: int,
               cache_dir: str, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from kiln.testing.tp_models import build

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    mesh = init_device_mesh("cpu", (world,))

    def prepare(variant: str) -> tuple:
        model, plan, example = build(name, size="bench")
        parallelize_module(model, mesh, plan)
        wrapped = _wrap(variant, model, os.path.join(cache_dir, variant.replace(" ", "_")))
        return wrapped, torch.optim.SGD(model.parameters(), lr=0.01), example

    def step(state: tuple) -> None:
        wrapped, opt, example = state
        opt.zero_grad()
        (wrapped(example) ** 2).mean().backward()
        opt.step()

    time_variants(rank, variants, prepare, step, steps, warmup, cache_dir, out_dir,
                  after_warmup=lambda variant, state: explain_counts(variant, state[0], state[2]))
    dist.destroy_process_group()


def run(world: int = 2, model: str = "mlp", variants: tuple[str, ...] = VARIANTS, steps: int = 20,
        warmup: int = 3, timeout_s: float = 900.0) -> dict[str, Any]:
    """Spawn `world` ranks, run every variant, and return {variant: {times, first, status, graphs}}."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="kiln_bench_tp_") as tmp:
        context = mp.start_processes(
            _rank_main, args=(world, free_port(), model, list(variants), steps, warmup, tmp, tmp),
            nprocs=world, join=False, start_method="spawn")
        return join_ranks(context, timeout_s, f"kiln bench --distributed {world} --strategy tp", tmp)


def table(results: dict[str, Any], world: int, model: str, steps: int) -> str:
    """The step-time table: median ms, speedup over eager TP, first (compiling) step, kiln's graphs."""
    title = (f"kiln bench --distributed {world} --strategy tp: {model}, ColwiseParallel/RowwiseParallel over "
             f"gloo, {world} ranks x 1 thread, {steps} interleaved steps each (slowest rank per step)")
    return step_table(results, title, "eager TP", graphs_note)


def main(world: int, models: list[str] | None, steps: int = 20, timeout_s: float = 900.0) -> int:
    """`kiln bench --distributed N --strategy tp`: one table per model (default: mlp and llama)."""
    for model in models or list(MODELS):
        if model not in MODELS:
            print(f"kiln bench --strategy tp: unknown model {model!r} (choose from {', '.join(MODELS)})")
            return 2
        print(table(run(world, model, steps=steps, timeout_s=timeout_s), world, model, steps))
        print()
    return 0
