"""What each gloo rank runs in tests/distributed/test_tp.py (importable by name: spawn pickles workers so).

Models parallelized with torch.distributed.tensor.parallel (ColwiseParallel/RowwiseParallel on a 1-D mesh)
and trained with SGD, eagerly and through kiln.compile, from the same initial weights and data on every rank.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

import kiln
from kiln import config
from kiln.testing.tp_models import build

LR = 0.05


def full_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in model.named_parameters()}


def sgd_steps(run: Any, opt: torch.optim.Optimizer, data: list) -> list[float]:
    """One SGD step of `(run(x) ** 2).mean()` per batch of `data`: the losses."""
    losses = []
    for x in data:
        opt.zero_grad()
        loss = (run(x) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def train_tp(rank: int, world: int, configs: list[tuple[str, bool]], steps: int, cache_dir: str,
             with_unsupported: bool = False) -> dict[Any, Any]:
    """train_one for each (model name, bias) in `configs`, in one set of ranks (and, with
    `with_unsupported`, unsupported_layout's result under the key "unsupported")."""
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (world,))
    results: dict[Any, Any] = {(name, bias): train_one(mesh, name, steps, cache_dir, bias)
                               for name, bias in configs}
    if with_unsupported:
        results["unsupported"] = unsupported_layout(rank, world, cache_dir)
    return results


def train_one(mesh: Any, name: str, steps: int, cache_dir: str, bias: bool = False,
              variants: tuple = ("eager", "kiln", "kiln_eager")) -> dict[str, Any]:
    """Each variant: parallelize_module over the mesh, then `steps` SGD steps on the same batches (the
    same on every rank, as tensor parallelism wants). Losses, full parameters, counters, explain."""
    from torch.distributed.tensor.parallel import parallelize_module

    results: dict[str, Any] = {}
    with config.patch(cache_dir=cache_dir):
        for variant in variants:
            kiln.reset()
            model, plan, example = build(name, bias)
            parallelize_module(model, mesh, plan)
            # kiln_eager: kiln's eager backend, the captured graph op by op (the collectives' eager autograd)
            backend = {"kiln": "auto", "kiln_eager": "eager"}.get(variant)
            run = model if backend is None else kiln.compile(model, backend=backend)
            opt = torch.optim.SGD(model.parameters(), lr=LR)
            gen = torch.Generator().manual_seed(1234)
            data = [torch.randn(example.shape, generator=gen) for _ in range(steps)]
            losses = sgd_steps(run, opt, data)
            results[variant] = {"losses": losses, "params": full_parameters(model),
                                "counters": {k: dict(v) for k, v in kiln.counters.items()},
                                "type": type(run).__name__}
            if variant != "eager":
                report = kiln.explain(run, data[0])
                results[variant]["explain"] = str(report)
                results[variant]["graphs"] = report.graph_count
                results[variant]["breaks"] = report.graph_break_count
                raw = kiln.explain(model, data[0])  # the parallelized model itself: explained as compiled
                results[variant]["raw_model_counts"] = (raw.graph_count, raw.graph_break_count)
    return results


def unsupported_layout(rank: int, world: int, cache_dir: str) -> dict[str, Any]:
    """A ColwiseParallel with a replicated output (an all-gather kiln does not write over shards): kiln
    compiles the model as a plain module, the hooked Linears break the graph, the values are eager's."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,))
    with config.patch(cache_dir=cache_dir):
        kiln.reset()
        model, _, example = build("mlp")
        plan = {f"blocks.{i}.{n}": ColwiseParallel(output_layouts=Replicate())
                for i in range(2) for n in ("gate", "up")}
        parallelize_module(model, mesh, plan)
        x = example.clone()
        expected = model(x)
        compiled = kiln.compile(model)
        actual = compiled(x)
        report = kiln.explain(compiled, x)
    return {"expected": expected.detach(), "actual": actual.detach(), "type": type(compiled).__name__,
            "breaks": report.graph_break_count, "explain": str(report)}


def train_tp_dp(rank: int, world: int, steps: int, cache_dir: str) -> dict[str, Any]:
    """2-D parallelism as torch's tutorials write it: a (dp, tp) mesh of the ranks, parallelize_module over
    the tp dimension, then FSDP2's fully_shard over the dp dimension; each dp group takes its own batches.
    `steps` SGD steps eagerly and through kiln.compile: losses, full parameters, explain."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    results: dict[str, Any] = {}
    with config.patch(cache_dir=cache_dir):
        for variant in ("eager", "kiln"):
            kiln.reset()
            model, plan, example = build("mlp")
            parallelize_module(model, mesh["tp"], plan)
            fully_shard(model, mesh=mesh["dp"])
            run = kiln.compile(model) if variant == "kiln" else model
            opt = torch.optim.SGD(model.parameters(), lr=LR)
            gen = torch.Generator().manual_seed(1234 + mesh["dp"].get_local_rank())
            data = [torch.randn(example.shape, generator=gen) for _ in range(steps)]
            losses = sgd_steps(run, opt, data)
            results[variant] = {"losses": losses, "params": full_parameters(model), "type": type(run).__name__,
                                "counters": {k: dict(v) for k, v in kiln.counters.items()}}
            if variant == "kiln":
                results[variant]["explain"] = str(kiln.explain(run, data[0]))
    return results
