"""What each gloo rank runs in tests/distributed/test_pp.py (importable by name: spawn pickles workers so).

A decoder split into one stage per rank (kiln.testing.pp_models), run by torch.distributed.pipelining's
PipelineStage under a GPipe or 1F1B schedule with SGD, eagerly and with each stage module kiln.compile'd,
from the same initial weights and data on every rank.
"""
from __future__ import annotations

from typing import Any

import torch

import kiln
from kiln import config
from kiln.bench.distributed_pp import schedule_step
from kiln.testing.pp_models import build_stage, loss_fn

LR = 0.05
MICROBATCHES = 4


def schedule_steps(schedule: Any, opt: torch.optim.Optimizer, rank: int, world: int, inputs: torch.Tensor,
                   target: torch.Tensor, steps: int) -> list[float]:
    """`steps` SGD steps through a pipeline schedule: the last stage's losses (the mean over microbatches)."""
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        microbatch_losses = schedule_step(schedule, rank, world, inputs, target)
        if microbatch_losses:
            losses.append(torch.stack(microbatch_losses).mean().item())
        opt.step()
    return losses


def train_pp(rank: int, world: int, configs: list[tuple[str, str]], steps: int, cache_dir: str,
             variants: tuple = ("eager", "kiln", "kiln_eager")) -> dict[Any, Any]:
    """Each (model, schedule) of `configs` and variant: `steps` SGD steps. Per rank: the last stage's losses
    (the mean over microbatches), the stage's parameters, kiln's counters and explain of the stage."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    schedules = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
    results: dict[Any, Any] = {}
    with config.patch(cache_dir=cache_dir):
        for name, schedule in configs:
            for variant in variants:
                kiln.reset()
                stage_module, tokens, target = build_stage(name, rank, world)
                # kiln_eager: kiln's eager backend, the captured graph op by op
                backend = {"kiln": "auto", "kiln_eager": "eager"}.get(variant)
                run = stage_module if backend is None else kiln.compile(stage_module, backend=backend)
                stage = PipelineStage(run, rank, world, torch.device("cpu"))
                step = schedules[schedule](stage, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
                opt = torch.optim.SGD(stage_module.parameters(), lr=LR)
                losses = schedule_steps(step, opt, rank, world, tokens, target, steps)
                entry = {"losses": losses, "type": type(run).__name__,
                         "params": {n: p.detach().clone() for n, p in stage_module.named_parameters()},
                         "counters": {k: dict(v) for k, v in kiln.counters.items()}}
                if variant != "eager":
                    # the stage alone, on one microbatch of what it takes (tokens, or a block's activations)
                    example = tokens[:tokens.shape[0] // MICROBATCHES]
                    with torch.no_grad():
                        for earlier in range(rank):
                            example = build_stage(name, earlier, world)[0](example)
                    report = kiln.explain(run, example)
                    entry.update(explain=str(report), graphs=report.graph_count,
                                 breaks=report.graph_break_count)
                results[(name, schedule, variant)] = entry
    return results


def train_traced(rank: int, world: int, steps: int, cache_dir: str) -> dict[str, Any]:
    """pipeline(): torch.distributed.pipelining traces the whole model (torch.export) and splits it at a
    block; each rank builds its stage and compiles the stage's module (`stage.submod`), as with
    torch.compile. The GPipe schedule, `steps` SGD steps, eagerly and through kiln."""
    from torch.distributed.pipelining import ScheduleGPipe, SplitPoint, pipeline

    from kiln.testing.models import NanoGPT
    from kiln.testing.pp_models import SIZES

    vocab, dim, heads, layers, batch, tokens = SIZES["test"]
    data = torch.randint(0, vocab, (batch, tokens + 1), generator=torch.Generator().manual_seed(1))
    inputs, target = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    results: dict[str, Any] = {}
    with config.patch(cache_dir=cache_dir):
        for variant in ("eager", "kiln"):
            kiln.reset()
            torch.manual_seed(0)
            model = NanoGPT(vocab=vocab, dim=dim, heads=heads, layers=layers, max_len=tokens)
            model.lm_head = torch.nn.Linear(dim, vocab, bias=False)  # untied: two ranks
            pipe = pipeline(model, mb_args=(inputs[:batch // MICROBATCHES],),
                            split_spec={f"blocks.{layers // 2}": SplitPoint.BEGINNING})
            stage = pipe.build_stage(rank, torch.device("cpu"))
            module = stage.submod
            if variant == "kiln":
                stage.submod = kiln.compile(module)
            step = ScheduleGPipe(stage, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
            opt = torch.optim.SGD(module.parameters(), lr=LR)
            losses = schedule_steps(step, opt, rank, world, inputs, target, steps)
            results[variant] = {"losses": losses, "type": type(stage.submod).__name__,
                                "params": {n: p.detach().clone() for n, p in module.named_parameters()},
                                "counters": {k: dict(v) for k, v in kiln.counters.items()}}
    return results
