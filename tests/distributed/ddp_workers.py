"""What each gloo rank runs in tests/distributed (importable by name: spawn pickles the workers so)."""
from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import kiln
from kiln import config
from kiln.testing import models as zoo

LR = 0.05


def batches(model: torch.nn.Module, example: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """One token batch per step, the same on every rank and in the single-process reference."""
    vocab = (model.wte if hasattr(model, "wte") else model.embed).num_embeddings
    gen = torch.Generator().manual_seed(1234)
    return [torch.randint(0, vocab, example.shape, generator=gen) for _ in range(steps)]


def lm_loss(logits: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy, the mean over the batch's tokens."""
    targets = torch.roll(idx, -1, dims=1)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def eager_reference(name: str, batch: int, steps: int) -> dict[str, Any]:
    """Single-process eager training on the full batch: losses per step and the final parameters."""
    model, (args, _) = zoo.build(name, batch=batch)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for idx in batches(model, args[0], steps):
        opt.zero_grad()
        loss = lm_loss(model(idx), idx)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def _wrap(model: torch.nn.Module, wrapping: str, ddp_kwargs: dict) -> torch.nn.Module:
    if wrapping == "ddp_of_compiled":
        return DDP(kiln.compile(model), **ddp_kwargs)
    if wrapping == "compiled_ddp":
        return kiln.compile(DDP(model, **ddp_kwargs))
    if wrapping == "eager":
        return DDP(model, **ddp_kwargs)
    raise ValueError(wrapping)


class _Events:
    """The order of compiled backwards and DDP bucket all-reduces on this rank (a comm hook logs buckets)."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def comm_hook(self, state, bucket):  # no annotations: DDP checks them against its own types
        self.log.append("allreduce")
        tensor = bucket.buffer()
        tensor.div_(dist.get_world_size())
        return dist.all_reduce(tensor, async_op=True).get_future().then(lambda fut: fut.value()[0])

    @contextlib.contextmanager
    def backwards_logged(self):
        from kiln.backends import aot
        original = aot._State.run_backward
        log = self.log

        def run_backward(state: Any, inputs: list) -> Any:
            result = original(state, inputs)
            log.append("backward")
            return result
        aot._State.run_backward = run_backward
        try:
            yield
        finally:
            aot._State.run_backward = original


def train(rank: int, world: int, name: str, batch: int, steps: int, wrappings: list[str], cache_dir: str,
          ddp_kwargs: dict, log_events: bool = False) -> dict[str, Any]:
    """Each wrapping in turn: DDP training of the zoo's `name` on this rank's half of each batch. Returns
    per wrapping the global mean losses, the final parameters (rank 0's), kiln's counters, the splits and
    (log_events) the order of backwards and all-reduces in each step."""
    results: dict[str, Any] = {}
    with config.patch(cache_dir=cache_dir):
        for wrapping in wrappings:
            kiln.reset()
            model, (args, _) = zoo.build(name, batch=batch)
            model.train()
            data = batches(model, args[0], steps)
            half = batch // world
            wrapped = _wrap(model, wrapping, ddp_kwargs)
            events = _Events()
            if log_events:
                ddp = wrapped._orig_mod if wrapping == "compiled_ddp" else wrapped
                ddp.register_comm_hook(None, events.comm_hook)
            opt = torch.optim.SGD(model.parameters(), lr=LR)
            losses, per_step = [], []
            for idx in data:
                mine = idx[rank * half:(rank + 1) * half]
                opt.zero_grad()
                events.log = []
                with events.backwards_logged() if log_events else contextlib.nullcontext():
                    loss = lm_loss(wrapped(mine), mine)
                    loss.backward()
                opt.step()
                per_step.append(list(events.log))
                total = loss.detach().clone()
                dist.all_reduce(total)
                losses.append(total.item() / world)
            results[wrapping] = {
                "losses": losses,
                "params": {n: p.detach().clone() for n, p in model.named_parameters()},
                "counters": {k: dict(v) for k, v in kiln.counters.items()},
                "splits": [str(s) for s in getattr(wrapped, "splits", [])],
                "piece_counts": [len(s.pieces) for s in getattr(wrapped, "splits", [])],
                "piece_params": [[p.params for p in s.pieces] for s in getattr(wrapped, "splits", [])],
                "events": per_step,
            }
            if wrapping == "compiled_ddp":
                report = kiln.explain(wrapped, data[0][rank * half:(rank + 1) * half])
                results[wrapping]["explain"] = str(report)
                results[wrapping]["explain_pieces"] = [len(s.pieces) for s in report.ddp_splits]
    return results


def collectives_in_compiled_code(rank: int, world: int, cache_dir: str) -> dict[str, Any]:
    """all_reduce and broadcast between tensor ops in a compiled function: values against eager, and the
    breaks kiln reports."""

    def step(x: torch.Tensor) -> torch.Tensor:
        y = x * 2 + 1
        dist.all_reduce(y)          # in place: what follows must see the sum
        z = y.sin() + y
        dist.broadcast(z, src=0)
        return z * 3 - x

    with config.patch(cache_dir=cache_dir):
        kiln.reset()
        x = torch.arange(6, dtype=torch.float32) + 10 * rank
        expected = step(x.clone())
        compiled = kiln.compile(step)
        first = compiled(x.clone())
        second = compiled(x.clone() + 1)      # cached graphs: the collectives still run, in order
        expected_second = step(x.clone() + 1)
        report = kiln.explain(step, x.clone())
    return {"expected": expected, "actual": first, "expected_second": expected_second, "second": second,
            "breaks": dict(kiln.counters["graph_breaks"]), "explain_breaks": report.graph_break_count,
            "explain": str(report)}


def train_fsdp(rank: int, world: int, name: str, batch: int, steps: int, cache_dir: str) -> dict[str, Any]:
    """FSDP2 (fully_shard on each block, then the model) training of the zoo's `name`, eager and through
    kiln.compile, on this rank's half of each batch: losses, full parameters, counters, explain's breaks."""
    from torch.distributed.fsdp import fully_shard

    results: dict[str, Any] = {}
    with config.patch(cache_dir=cache_dir):
        for variant in ("eager", "kiln"):
            kiln.reset()
            model, (args, _) = zoo.build(name, batch=batch)
            model.train()
            data = batches(model, args[0], steps)
            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
            run = kiln.compile(model) if variant == "kiln" else model
            opt = torch.optim.SGD(model.parameters(), lr=LR)
            half = batch // world
            losses = []
            for idx in data:
                mine = idx[rank * half:(rank + 1) * half]
                opt.zero_grad()
                loss = lm_loss(run(mine), mine)
                loss.backward()
                opt.step()
                total = loss.detach().clone()
                dist.all_reduce(total)
                losses.append(total.item() / world)
            results[variant] = {"losses": losses,
                                "params": {n: p.full_tensor().clone() for n, p in model.named_parameters()},
                                "counters": {k: dict(v) for k, v in kiln.counters.items()},
                                "type": type(run).__name__}
            if variant == "kiln":
                report = kiln.explain(run, data[0][rank * half:(rank + 1) * half])
                results[variant]["explain"] = str(report)
    return results
