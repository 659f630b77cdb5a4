"""Which 1x1 convolutions run as one matrix product instead of torch's convolution: timed once per shape.

A 1x1 convolution (stride 1, no padding, one group) is a matrix product: the pixels' rows (N*H*W, C) times the
weight's transpose. `kiln.ops.conv_gemm` writes the small ones that way (at most `conv_gemm_max_macs`). Above
that torch's convolution is usually as fast, except where it works image by image over few pixels: on one
thread with a batch under 16, torch runs a 1x1 convolution not with oneDNN but with its own per-image product
(`slow_conv2d`), and over 2x2 or 3x3 images that is slow. On this class of machine (one thread, float32) a
[8, 96, 2, 2] -> 384-channel convolution took 190 us where the product took 25 us, [8, 512, 2, 2] -> 2048
6.4 ms against 0.69 ms; 3x3 images ran 3-6x slower, 4x4 and 8x8 ones even, and batch 32 over 160 channels
(oneDNN's) 1.5-2x *faster* than the product. Which path torch takes, and how fast each is, depends on the
threads, the batch and the library build, so kiln times both here, once per shape.

What is timed, on random tensors of the convolution's sizes and dtype, with the threads the caller runs:
- torch's convolution in NCHW and in NHWC (the layout pass, `kiln.lower.conv_layout`, may give it either),
  the faster of the two;
- the matrix product kiln runs instead, `F.linear(rows (N*H*W, C), weight (O, C))` (gathering the rows and
  copying the result into eager's layout are kernels that fuse with their neighbours, or views where the
  images are NHWC, so they are not counted).
The product is taken when it is at least `MARGIN` (1.5) times faster, so a close call (and timing noise)
keeps torch's convolution, as before this choice existed.

Each answer is kept in-process and on disk, `<cache_dir>/conv_choice.json`, keyed by the CPU, the thread count,
the torch version, the dtype and the sizes: a later compile, in this process or another, reads it instead of
timing again. The flag `conv_pointwise` overrides the choice ('gemm', 'conv'); convolutions above
`conv_pointwise_measure_max_macs` are not timed (torch's).
"""
from __future__ import annotations

import os
import time
from typing import Any

import torch

from .. import config
from ..counters import counters

log = config.channel("kernels")
FILE = "conv_choice.json"
# the product must be this much faster than the faster convolution layout: the product's neighbours cost
# something too (the rows' gather, the copy into eager's layout). At 1.15 MobileNet at batch 8 took its
# 4x4 stage's 1x1s (1.18-1.24x faster alone) as products and ran ~10% slower a call; the 2x2 stages that
# matter (PoolFormer, EfficientNet) are 1.7x faster with NHWC, 5-9x with torch's NCHW kernel
MARGIN = 1.5
REPEATS = 5     # timings of each candidate; the minimum counts
MIN_SECONDS = 2e-3  # each timing runs the candidate this long at least

_answers: dict[str, bool] = {}


def pointwise(w_shape: tuple, stride: Any, padding: Any, dilation: Any, groups: int) -> bool:
    """A 1x1 convolution: kernel of ones, stride 1, no padding, one group (a matrix product of channels)."""
    return groups == 1 and all(k == 1 for k in w_shape[2:]) and all(s == 1 for s in stride) and \
        not any(padding)


def _key(batch: int, channels: int, spatial: tuple, out_channels: int, dtype: torch.dtype) -> str:
    sizes = "x".join(str(s) for s in (batch, channels, *spatial))
    return (f"{config.cpu_name()}|threads={torch.get_num_threads()}|torch={torch.__version__}|{dtype}|"
            f"{sizes}->{out_channels}")


def _seconds(fn: Any) -> float:
    """The fastest of REPEATS timings of `fn`, each over enough calls to last MIN_SECONDS."""
    fn()
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    calls = max(1, int(MIN_SECONDS / once))
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def measure(batch: int, channels: int, spatial: tuple, out_channels: int, dtype: torch.dtype) -> tuple:
    """(convolution seconds: the faster layout, product seconds) of one 1x1 convolution's sizes."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn((batch, channels, *spatial), generator=generator, dtype=dtype)
    w = torch.randn((out_channels, channels) + (1,) * len(spatial), generator=generator, dtype=dtype)
    conv = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d,
            3: torch.nn.functional.conv3d}[len(spatial)]
    # (plain float kernels: not the caller's autocast, nor a graph being recorded)
    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        times = [_seconds(lambda: conv(x, w))]
        if len(spatial) == 2:
            xl, wl = x.contiguous(memory_format=torch.channels_last), w.contiguous(memory_format=torch.channels_last)
            times.append(_seconds(lambda: conv(xl, wl)))
        rows = x.movedim(1, -1).reshape(-1, channels).contiguous()
        weight = w.reshape(out_channels, channels)
        product = _seconds(lambda: torch.nn.functional.linear(rows, weight))
    return min(times), product


def _path() -> str:
    return os.path.join(config.get("cache_dir"), FILE)


def _write(key: str, entry: dict) -> None:
    """Add one answer to the file (a reader sees a whole file)."""
    path = _path()
    try:
        config.write_json(path, dict(config.read_json_dict(path), **{key: entry}))
    except OSError as e:  # (an unwritable cache: the answer still holds for this process)
        log.info("conv_choice: could not save to %s: %s", path, e)


def gemm_faster(batch: int, channels: int, spatial: tuple, out_channels: int, dtype: torch.dtype,
                choice: str = "measure", max_macs: int = 1 << 27) -> bool:
    """Whether this 1x1 convolution runs as a matrix product (see the module docstring): `choice` (the flag
    conv_pointwise: 'gemm', 'conv'), else the cached or freshly timed answer (none above `max_macs`)."""
    if choice != "measure":
        return choice == "gemm"
    macs = batch * channels * out_channels
    for s in spatial:
        macs *= s
    if macs > max_macs:
        return False
    key = _key(batch, channels, tuple(spatial), out_channels, dtype)
    if key in _answers:
        return _answers[key]
    entry = config.read_json_dict(_path()).get(key)
    if not (isinstance(entry, dict) and isinstance(entry.get("gemm"), bool)):
        conv_s, product_s = measure(batch, channels, tuple(spatial), out_channels, dtype)
        entry = {"gemm": product_s * MARGIN < conv_s, "conv_us": round(conv_s * 1e6, 1),
                 "product_us": round(product_s * 1e6, 1)}
        counters["conv_choice"]["1x1 convolutions timed"] += 1
        log.info("conv_choice: %s: convolution %.1f us, product %.1f us: %s", key, entry["conv_us"],
                 entry["product_us"], "product" if entry["gemm"] else "convolution")
        _write(key, entry)
    _answers[key] = entry["gemm"]
    if entry["gemm"]:
        counters["conv_choice"]["1x1 convolutions as a product (faster here)"] += 1
    return entry["gemm"]
