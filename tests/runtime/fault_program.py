"""The program each fault test runs in a fresh process (tests/runtime/test_faults.py).

    python fault_program.py '<json plan>'

It compiles `fn` (a pointwise chain and a reduction) with kiln's cpp backend and checks it against eager
in up to three phases, printing one line `KILN-REPORT {json}`:

- `fault`: the fault as the test set it up (environment, files), plus an in-process injection when the plan
  names one (`enospc_from`: os.write raises ENOSPC from the n-th write into the cache directory on);
  two calls of the compiled function; the warnings they raised;
- `raise` (plan["raise"]): the fault again (plan["refault"]: copy a file over the cache entry first),
  compiled with options={"raise_on_error": True}: what it raised, or its result;
- `recover` (plan["recover"]: flags to set, and the injection removed): a fresh compile with
  raise_on_error must compile and be right, warning nothing.

The environment decides the rest (KILN_CACHE_DIR, KILN_CXX, PATH); plan["variant"] == "other" compiles
a function of the same name and signature that computes something else (for a foreign cache entry).
"""
import errno
import json
import os
import shutil
import signal
import sys
import warnings

# Ctrl-C raises KeyboardInterrupt here as in a program started from a terminal, whatever the test process
# left to its children: a blocked SIGINT (the calling thread's mask) or an ignored one is inherited across
# exec, and a test run where an earlier test left either waited 30 s for an interrupt that never came
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
signal.signal(signal.SIGINT, signal.default_int_handler)

import torch

import kiln
from kiln import config
from kiln.runtime import cache, forget_loaded

PLAN = json.loads(sys.argv[1])

if PLAN.get("variant") == "other":
    def fn(x, y):
        return torch.relu(x * y - 1).sum(dim=1)
else:
    def fn(x, y):
        return torch.relu(x * y + 1).sum(dim=1)

x, y = torch.randn(5, 7), torch.randn(5, 7)
EXPECTED = fn(x, y)
REAL_WRITE = os.write


def inject_enospc(first_failing: int) -> None:
    """os.write into the cache directory raises ENOSPC from the `first_failing`-th such write on."""
    count = [0]

    def write(fd, data):
        target = os.readlink(f"/proc/self/fd/{fd}")
        if target.startswith(os.path.dirname(cache.configured_directory())):
            count[0] += 1
            if count[0] >= first_failing:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return REAL_WRITE(fd, data)
    os.write = write


def inject() -> None:
    if PLAN.get("enospc_from"):
        inject_enospc(PLAN["enospc_from"])


def run_phase(options: dict | None) -> dict:
    """Compile and call twice; what came out, what it warned, whether the kernels were compiled."""
    kiln.reset()
    forget_loaded()
    out = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            compiled = kiln.compile(fn, backend="cpp", options=options)
            first = compiled(x, y)
            second = compiled(x, y)  # the next call
            out["correct"] = bool(torch.allclose(first, EXPECTED) and torch.allclose(second, EXPECTED))
        except Exception as e:
            out["raised"] = type(e).__name__
            out["message"] = str(e)
    out["warnings"] = [str(w.message) for w in caught]
    out["compiled"] = kiln.counters["cpp"]["graphs compiled"]
    out["eager"] = kiln.counters["cpp"]["graphs run with torch"]
    out["cache"] = dict(kiln.counters["cache"])
    return out


report = {}
inject()
report["fault"] = run_phase(None)
if PLAN.get("raise"):
    if PLAN.get("refault"):
        entry, bad = PLAN["refault"]
        os.unlink(entry)
        shutil.copyfile(bad, entry)
    report["raise"] = run_phase({"raise_on_error": True})
if PLAN.get("recover") is not None:
    os.write = REAL_WRITE
    for name, value in PLAN["recover"].items():
        config.set(name, value)
    report["recover"] = run_phase({"raise_on_error": True})
report["private_directory"] = cache._PRIVATE[0] if cache._PRIVATE else None
print("KILN-REPORT " + json.dumps(report), flush=True)
