"""`kiln bench --distributed N --strategy pp`: pipeline-parallel training step time on N gloo ranks.

Columns, each a training step (the schedule's forward and backward over the microbatches, the loss on the
last stage, an SGD step on every stage) of the same decoder split into one stage per rank
(kiln.testing.pp_models, bench sizes), run by torch.distributed.pipelining's PipelineStage:

    eager PP            the stage modules as they are
    kiln PP             each rank's stage module kiln.compile'd
    torch.compile PP    each rank's stage module compiled by the torch.compile baseline (bench/baselines.py)

under the GPipe and the 1F1B schedule (a table each). Timing as `kiln bench --distributed`
(kiln.bench.distributed.time_variants): warm-up steps (the compiles: `first step`), then the variants take
turns step by step between barriers; a step's time is the slowest rank's. One torch thread per rank; ranks
spawned here (loopback, a free port) and killed on timeout.
"""
from __future__ import annotations

import datetime
import os
import tempfile
from typing import Any

import torch

from .distributed import explain_counts, free_port, graphs_note, join_ranks, step_table, time_variants, \
    torch_compile_baseline

VARIANTS = ("eager PP", "kiln PP", "torch.compile PP")
SCHEDULES = ("gpipe", "1f1b")
MICROBATCHES = 4


def _wrap(variant: str, stage: torch.nn.Module, cache_dir: str) -> Any:
    import kiln
    if variant == "eager PP":
        return stage
    if variant == "kiln PP":
        return kiln.compile(stage)
    if variant == "torch.compile PP":
        return torch_compile_baseline(stage, cache_dir)
    raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")


def schedule_step(runner: Any, rank: int, world: int, inputs: Any, target: Any) -> list[torch.Tensor]:
    """One step of a pipeline schedule on this rank: the first stage feeds `inputs`, the last takes `target`
    and returns its microbatches' losses (other ranks: an empty list)."""
    losses: list[torch.Tensor] = []
    if rank == 0:
        runner.step(inputs)
    elif rank == world - 1:
        runner.step(target=target, losses=losses)
    else:
        runner.step()
    return losses


def _rank_main(rank: int, world: int, port: int, name: str, schedule: str, variants: list[str], steps: int,
               warmup: int, cache_dir: str, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from kiln.testing.pp_models import build_stage, loss_fn

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]

    def prepare(variant: str) -> tuple:
        module, tokens, target = build_stage(name, rank, world, size="bench")
        wrapped = _wrap(variant, module, os.path.join(cache_dir, variant.replace(" ", "_")))
        stage = PipelineStage(wrapped, rank, world, torch.device("cpu"))
        return (kind(stage, n_microbatches=MICROBATCHES, loss_fn=loss_fn),
                torch.optim.SGD(module.parameters(), lr=0.01), tokens, target, wrapped)

    def step(state: tuple) -> None:
        runner, opt, tokens, target, _ = state
        opt.zero_grad()
        schedule_step(runner, rank, world, tokens, target)
        opt.step()

    def graphs(variant: str, state: tuple) -> dict[str, Any]:
        # the stage alone, on one microbatch of what it takes: tokens, or the earlier stages' activations
        example = state[2][:state[2].shape[0] // MICROBATCHES]
        with torch.no_grad():
            for earlier in range(rank):
                example = build_stage(name, earlier, world, size="bench")[0](example)
        return explain_counts(variant, state[4], example)

    time_variants(rank, variants, prepare, step, steps, warmup, cache_dir, out_dir, after_warmup=graphs)
    dist.destroy_process_group()


def run(world: int = 2, model: str = "nanogpt", schedule: str = "gpipe", variants: tuple[str, ...] = VARIANTS,
        steps: int = 20, warmup: int = 3, timeout_s: float = 900.0) -> dict[str, Any]:
    """Spawn `world` ranks, run every variant, and return {variant: {times, first, status, graphs}}."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="kiln_bench_pp_") as tmp:
        context = mp.start_processes(
            _rank_main, args=(world, free_port(), model, schedule, list(variants), steps, warmup, tmp, tmp),
            nprocs=world, join=False, start_method="spawn")
        return join_ranks(context, timeout_s, f"kiln bench --distributed {world} --strategy pp", tmp)


def table(results: dict[str, Any], world: int, model: str, schedule: str, steps: int) -> str:
    """The step-time table: median ms, speedup over eager PP, first (compiling) step, kiln's graphs
    (of rank 0's stage)."""
    title = (f"kiln bench --distributed {world} --strategy pp: {model}, {schedule}, {world} stages, "
             f"{MICROBATCHES} microbatches, gloo, 1 thread per rank, {steps} interleaved steps each "
             f"(slowest rank per step)")
    return step_table(results, title, "eager PP", graphs_note)


def main(world: int, models: list[str] | None, steps: int = 20, timeout_s: float = 900.0,
         variants: tuple[str, ...] = VARIANTS) -> int:
    """`kiln bench --distributed N --strategy pp`: one table per model and schedule (default: nanogpt and
    llama, GPipe and 1F1B)."""
    from kiln.testing.pp_models import MODELS
    for model in models or list(MODELS):
        if model not in MODELS:
            print(f"kiln bench --strategy pp: unknown model {model!r} (choose from {', '.join(MODELS)})")
            return 2
        for schedule in SCHEDULES:
            results = run(world, model, schedule, variants, steps=steps, timeout_s=timeout_s)
            print(table(results, world, model, schedule, steps))
            print()
    return 0
