"""Run a function on gloo ranks (2 unless `world_size` says otherwise), processes started here, bounded in time.

    results = run_ranks(worker, args, timeout=120)   # worker(rank, world_size, *args) -> picklable result

Each rank is a spawned process on this machine (torch.multiprocessing, MASTER_ADDR=127.0.0.1, a free port
found by binding port 0), one torch thread, in a gloo process group. A rank that raises stops all of them
and the error is raised here; past `timeout` seconds every rank is killed and TimeoutError raised. The
workers live in importable modules (spawn pickles them by name): ddp_workers.py, tp_workers.py, pp_workers.py.
"""
from __future__ import annotations

import datetime
import os
import shutil
import tempfile
from typing import Any, Callable

import pytest
import torch
import torch.multiprocessing as mp

from kiln import config
from kiln.bench.distributed import free_port, wait_for_ranks

# the marks of a module of tests that start ranks: `pytestmark = RANK_TESTS`
RANK_TESTS = [
    pytest.mark.distributed,
    pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                       reason="torch.distributed with gloo is not available"),
    pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
]


def _entry(rank: int, worker: Callable[..., Any], port: int, world_size: int, out_dir: str,
           args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=90))
    try:
        result = worker(rank, world_size, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def assert_training_matches(result: dict, reference: dict, what: str, rtol: float = 1e-4) -> None:
    """A run's losses and parameters (`{"losses": [...], "params": {name: tensor}}`) equal the reference's
    within `rtol` relative (parameters also within 1e-6 absolute)."""
    assert result["losses"] == pytest.approx(reference["losses"], rel=rtol), (what, result["losses"],
                                                                             reference["losses"])
    for name, expected in reference["params"].items():
        torch.testing.assert_close(result["params"][name], expected, rtol=rtol, atol=1e-6,
                                   msg=lambda m: f"{what} {name}: {m}")


def run_ranks(worker: Callable[..., Any], args: tuple = (), world_size: int = 2,
              timeout: float = 120.0) -> list[Any]:
    """worker(rank, world_size, *args) on `world_size` gloo ranks; their results, by rank."""
    with tempfile.TemporaryDirectory(prefix="kiln_ranks_") as out_dir:
        context = mp.start_processes(_entry, args=(worker, free_port(), world_size, out_dir, args),
                                     nprocs=world_size, join=False, start_method="spawn")
        wait_for_ranks(context, timeout, f"{worker.__name__} on {world_size} ranks")
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False)
                for r in range(world_size)]
