"""`mode="max-autotune"` for the triton backend: time each kernel's candidate launch configurations once, keep
the fastest on disk next to the kernel module, and launch with it from then on.

Candidates are a few tile shapes around the size heuristic (`kiln.codegen.triton.launch_config`) and 4 or 8
warps. Each kernel is timed alone, on scratch tensors the size of its segment's buffers (floats random,
integers and bools zero, so gathers stay in bounds), median of a few launches after a warm-up. The choice is
keyed by the module's source (`<kernel cache>/triton/kiln_<key>.tune.json`): a later process, or a later
compile of the same graph, reads it instead of timing again.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

import torch

from .. import config
from ..codegen.triton import SegmentSource, launch_config, segment_source
from ..counters import counters
from ..lower.ir import LoopGraph
from ..schedule.memory import Segment

log = config.channel("kernels")
REPEATS = 5


def candidates(kernel: Any, mode: str) -> list[dict]:
    """The heuristic's config first, then tiles of 1/4 to 4x its size, 4 and 8 warps (distinct only)."""
    base = launch_config(kernel, mode)
    tile = base["XBLOCK"] * base["RBLOCK"]
    found = [base]
    for scale in (4, 2, 1, 0.5, 0.25):
        size = max(16, int(tile * scale))
        for warps in (4, 8):
            cfg = launch_config(kernel, mode, size)
            cfg["num_warps"] = warps
            if cfg not in found:
                found.append(cfg)
    return found


def _scratch(loop: LoopGraph, names: list[str], device: torch.device) -> list[torch.Tensor]:
    tensors = []
    for name in names:
        buf = loop.buffers[name]
        size = max(buf.layout.storage_size(), 1)
        if buf.dtype.is_floating_point:
            tensors.append(torch.randn(size, device=device).to(buf.dtype))
        else:
            tensors.append(torch.zeros(size, dtype=buf.dtype, device=device))
    return tensors


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(launch: Any, device: torch.device) -> float:
    launch()  # compile and warm up
    _sync(device)
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        launch()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def tuned_source(seg: Segment, source: SegmentSource, module: Any, loop: LoopGraph, device: torch.device,
                 mode: str) -> str | None:
    """The segment's module source with each kernel's fastest config (timed now, or read from disk);
    None when the heuristic's configs won everywhere."""
    from ..runtime import tritonlib
    path = module.__file__[:-3] + ".tune.json"
    try:
        with open(path, encoding="utf-8") as f:
            chosen = json.load(f)
        counters["triton"]["autotune choices read from disk"] += 1
    except (OSError, ValueError):
        chosen = {}
        tensors = dict(zip(seg.args, _scratch(loop, seg.args, device)))
        for kernel in source.kernels:
            fn = getattr(module, kernel.name)
            args = [tensors[p[2:]] for p in kernel.params]
            timings = []
            for cfg in candidates(kernel, mode):
                def launch(cfg: dict = cfg) -> None:
                    fn[tuple(cfg["grid"])](*args, XBLOCK=cfg["XBLOCK"], RBLOCK=cfg["RBLOCK"],
                                           num_warps=cfg["num_warps"])
                try:
                    with tritonlib.kiln_quiet():
                        timings.append((_time(launch, device), cfg))
                except Exception as e:  # a config the device cannot run (too many registers, ...)
                    log.debug("autotune %s: %s failed: %s", kernel.name, cfg, e)
            if timings:
                best = min(timings, key=lambda t: t[0])[1]
                chosen[kernel.name] = best
                log.debug("autotune %s: %s (%d configs)", kernel.name, best, len(timings))
        counters["triton"]["kernels autotuned"] += len(chosen)
        directory = os.path.dirname(path)
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(chosen, f)
        os.replace(temporary, os.path.join(directory, os.path.basename(path)))
    if all(chosen.get(k.name) in (None, launch_config(k, mode)) for k in source.kernels):
        return None
    return segment_source(source.name, seg.groups, seg.args, loop.buffers, seg.aliases, mode, 0,
                          configs=chosen).source
