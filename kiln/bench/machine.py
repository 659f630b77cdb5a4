"""How busy this machine is, and what it can do: the load average, the copy bandwidth, the matmul peak.

`kiln bench` records the load and a short copy-bandwidth measurement before and after a run, and calls the
run busy (its times are then not to be trusted) when the 1-minute load is above the CPU count, or when the
copy bandwidth reads well below an idle measurement of it (the roofs that `kiln.profile` caches,
`machine_peaks`). The roofs themselves are cached with the load they were measured under and the spread of
their runs; a set measured on a busy machine is measured again when next asked for.
"""
from __future__ import annotations

import functools
import math
import os
import statistics
import time
from typing import Any, Callable

import torch

from .. import config
from ..config import cpu_name

log = config.channel("bench")
PEAKS_FILE = "machine_peaks.json"
SLOW_BANDWIDTH = 0.7   # a copy bandwidth under this share of the idle one marks the machine busy
COPY_ELEMENTS = 32 << 20   # 128 MB of float32: out of every cache


def load_average() -> float | None:
    """The 1-minute load average (None where the OS has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def cpu_count() -> int:
    return os.cpu_count() or 1


def overloaded(load: float | None, cpus: int | None = None) -> bool:
    """Whether `load` (a 1-minute load average) is above the machine's CPUs: processes wait for a core."""
    return load is not None and load > (cpus or cpu_count())


def timed_runs(fn: Callable[[], Any], repeat: int, min_s: float) -> list[float]:
    """Seconds of at least `repeat` calls of `fn` spread over at least `min_s` seconds, after one untimed."""
    fn()
    times: list[float] = []
    began = time.perf_counter()
    while len(times) < repeat or time.perf_counter() - began < min_s:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def copy_bandwidth(repeat: int = 10, min_s: float = 0.3, threads: int | None = None) -> dict[str, float]:
    """GB/s (bytes read + written) of a 128 MB float32 copy at `threads` (default: torch's current count):
    the best run (what the machine can do) and the median one (what it did, other processes included)."""
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        n = COPY_ELEMENTS
        copy = functools.partial(torch.Tensor.copy_, torch.empty(n), torch.ones(n))
        times = timed_runs(copy, repeat, min_s)
    finally:
        torch.set_num_threads(previous)
    gb = 2 * n * 4 / 1e9
    return {"copy_gbps": round(gb / min(times), 2),
            "copy_gbps_median": round(gb / statistics.median(times), 2)}


def snapshot(threads: int | None = None) -> dict[str, Any]:
    """The load average and the copy bandwidth now (one short measurement, ~0.3 s)."""
    return {"load": load_average(), **copy_bandwidth(threads=threads)}


def slow_bandwidth(measured: dict[str, Any] | None, idle: dict[str, Any] | None) -> bool:
    """Whether the median copy bandwidth measured is well below an idle measurement's median."""
    if not measured or not idle:
        return False
    now = measured.get("copy_gbps_median")
    reference = idle.get("copy_gbps_median") or idle.get("copy_gbps")
    return bool(now and reference and now < SLOW_BANDWIDTH * reference)


def busy_reasons(snapshots: list[dict[str, Any] | None], idle: dict[str, Any] | None,
                 cpus: int | None = None) -> list[str]:
    """Why measurements taken between these snapshots are not to be trusted ([] when none)."""
    cpus = cpus or cpu_count()
    reasons = []
    loads = [s["load"] for s in snapshots if s and s.get("load") is not None]
    if loads and overloaded(max(loads), cpus):
        reasons.append(f"load {max(loads):g} on {cpus} CPUs")
    slow = [s for s in snapshots if slow_bandwidth(s, idle)]
    if slow:
        reference = idle.get("copy_gbps_median") or idle.get("copy_gbps")
        reasons.append(f"copy bandwidth {min(s['copy_gbps_median'] for s in slow):g} GB/s, "
                       f"idle {reference:g}")
    return reasons


# ---- the roofs (kiln.profile) ----------------------------------------------------------------------------

def measure_peaks() -> dict[str, Any]:
    """This machine's copy bandwidth (GB/s: bytes read + written by a 128 MB copy, out of cache: a kernel
    whose buffers fit in cache may run above it) and matmul peak (GFLOP/s of a 1024 x 1024 float32
    torch.mm), at torch's current thread count: the best of 10 or more runs over a second each (a roof is
    what the machine can do), with the median run and the load average before and after (the spread)."""
    load_before = load_average()
    m = 1024
    copy = copy_bandwidth(repeat=10, min_s=1.0)
    mm = timed_runs(functools.partial(torch.mm, torch.randn(m, m), torch.randn(m, m)), 10, 1.0)
    loads = [x for x in (load_before, load_average()) if x is not None]
    return {**copy, "matmul_gflops": round(2 * m ** 3 / min(mm) / 1e9, 1),
            "matmul_gflops_median": round(2 * m ** 3 / statistics.median(mm) / 1e9, 1),
            "load": max(loads) if loads else None, "cpus": cpu_count(),
            "busy": overloaded(max(loads) if loads else None),
            "threads": torch.get_num_threads(), "cpu": cpu_name(),
            "measured": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}


def peaks_path() -> str:
    return os.path.join(config.get("cache_dir"), "profile", PEAKS_FILE)


def _peaks_key(threads: int | None = None) -> str:
    return f"{cpu_name()}|threads={threads or torch.get_num_threads()}|torch={torch.__version__}"


def _read_peaks() -> dict[str, Any]:
    return config.read_json_dict(peaks_path())


def trusted(peaks: Any) -> bool:
    """Whether cached roofs can be reused: measured idle (a set without its load is from before the load
    was stored: measured again)."""
    return isinstance(peaks, dict) and "load" in peaks and not peaks.get("busy") and \
        math.isfinite(peaks.get("copy_gbps") or math.nan)


def cached_peaks(threads: int | None = None) -> dict[str, Any] | None:
    """The cached roofs for this CPU and thread count if they were measured on an idle machine; else None.
    Measures nothing."""
    peaks = _read_peaks().get(_peaks_key(threads))
    return dict(peaks) if trusted(peaks) else None


def machine_peaks(remeasure: bool = False) -> dict[str, Any]:
    """The roofs: measured once per (CPU, thread count, torch version) and cached in `cache_dir`, unless
    they were measured on a busy machine (load above the CPUs): those are measured again on the next call."""
    key = _peaks_key()
    cached = _read_peaks()
    if not remeasure and trusted(cached.get(key)):
        return dict(cached[key], cached=True)
    peaks = measure_peaks()
    if peaks["busy"]:
        log.warning("the machine roofs were measured under load %s on %s CPUs: kept for now, measured "
                    "again next time", peaks["load"], peaks["cpus"])
    cached[key] = peaks
    path = peaks_path()
    try:
        config.write_json(path, cached)
    except OSError as e:  # a read-only cache: measure again next time
        log.debug("could not cache the machine peaks in %s: %s", path, e)
    return dict(peaks, cached=False)


def clear_peaks() -> bool:
    """Forget the cached roofs (`kiln cache clear`); whether there was a file to remove."""
    try:
        os.remove(peaks_path())
    except FileNotFoundError:
        return False
    return True
