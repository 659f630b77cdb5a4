"""glibc's malloc thresholds, fixed where its own adjustment would take them, once kiln runs compiled graphs.

glibc maps every allocation above its mmap threshold afresh (and unmaps it when freed), and returns the free
top of its heap to the system above its trim threshold: memory it gets again faults in page by page, zeroed.
Both thresholds start low (128 KiB, 256 KiB) and rise as the program frees mapped chunks, up to 32 MiB and
64 MiB, so that a loop allocating the same sizes each step settles on heap memory it reuses. A compiled
graph's wrapper keeps its own buffers across calls (`kiln.codegen.wrapper`'s pool), so it frees few mapped
chunks, and what torch allocates inside a graph (an extern's result: a convolution's, a product's) can stay
fresh mapped memory on every call. On this class of machine (a VM, where a page fault costs 1-2 us), the
zoo's DenseNet at batch 8 on one thread took 736 page faults a call, 10.0 ms, and none, 8.5 ms, with the
thresholds fixed; PoolFormer 38 and 13 faults, 1.83 and 1.70 ms; MobileNet none either way. (Eager suffers
the same: DenseNet's eager calls took ~3000 faults each, 15 ms, and 10 ms in a process with the thresholds
fixed.) Pooling fewer of kiln's buffers instead settled some models and unsettled others.

So the first compiled graph sets both thresholds to glibc's own maxima (mmap 32 MiB, trim 64 MiB) with
`mallopt`: the process keeps up to 64 MiB of freed heap for reuse, as a long-running eager program's glibc
ends up doing anyway. Setting either threshold turns glibc's adjustment off, so both are set or neither.
Not on other C libraries (no `mallopt`), not where the user set glibc's malloc tunables in the environment
(theirs stand), and not with the flag `malloc_thresholds` off. Counted (`counters["runtime"]`) and logged.
"""
from __future__ import annotations

import ctypes
import sys

from .. import config
from ..counters import counters

log = config.channel("kernels")
M_TRIM_THRESHOLD = -1   # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_BYTES = 32 << 20   # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TRIM_BYTES = 64 << 20   # twice it, as glibc's adjustment sets the trim threshold
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
SET = "glibc malloc thresholds fixed at mmap 32 MiB, trim 64 MiB (kiln.runtime.malloc)"

_settled: bool | None = None  # whether this process's thresholds were set (None: not decided yet)


def _user_tuned() -> bool:
    environment = config.process_environment()
    return any(name in environment for name in USER_SETTINGS) or \
        "glibc.malloc." in environment.get("GLIBC_TUNABLES", "")


def settle() -> bool:
    """Fix glibc's mmap and trim thresholds (see the module docstring), once per process; whether they are."""
    global _settled
    if _settled is not None:
        return _settled
    _settled = False
    if not config.get("malloc_thresholds") or not sys.platform.startswith("linux") or _user_tuned():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # (not glibc)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if mallopt(M_MMAP_THRESHOLD, MMAP_BYTES) != 1:
        return False
    if mallopt(M_TRIM_THRESHOLD, TRIM_BYTES) != 1:
        log.warning("kiln: glibc accepted the mmap threshold but not the trim threshold")
    _settled = True
    counters["runtime"][SET] += 1
    log.info("%s: compiled graphs' externs reuse heap memory instead of faulting in fresh pages; "
             "KILN_MALLOC_THRESHOLDS=0 leaves glibc's defaults", SET)
    return True
