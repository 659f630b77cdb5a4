"""What generated Triton modules import, and how they are built, cached, loaded and compile-checked.

- The `kiln_*` helpers are `@triton.jit` functions the kernels call: NaN-propagating maximum/minimum (as
  torch.maximum and amax), the combine functions of reductions, argmax/argmin over (value, index) pairs
  (NaN is the extreme, ties keep the first index), torch's integer division and remainders.
- `libdevice` is Triton's libdevice on a GPU. Triton's interpreter (`TRITON_INTERPRET=1`) cannot call
  libdevice, so there it is a namespace of the same functions computed by torch on the interpreter's
  arrays: the same values eager computes.
- `load_module(source)` writes a generated module once into the kernel cache directory (`triton/`, keyed
  by the source's sha256) and imports it (Triton reads a kernel's source from its file). Triton caches the
  compiled binaries itself, across processes.
- `compile_check(module, kernel)` compiles a kernel for a CUDA architecture without a GPU (Triton's
  frontend, LLVM and ptxas run on the CPU): what the interpreter accepts but the compiler would not fails
  here.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import types
from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

from .. import config
from . import cache

__all__ = ["triton", "tl", "libdevice", "kiln_add", "kiln_mul", "kiln_maximum", "kiln_minimum", "kiln_imax",
           "kiln_imin", "kiln_fmax", "kiln_fmin", "kiln_argmax", "kiln_argmin", "kiln_idiv", "kiln_ifmod",
           "kiln_iremainder", "kiln_fremainder", "kiln_shift_left", "kiln_shift_right", "kiln_div64",
           "kiln_round_bf16", "kiln_round_fp16", "kiln_quiet"]


def interpreting() -> bool:
    """Triton runs kernels on its interpreter (CPU tensors, numpy) instead of compiling them."""
    knobs = getattr(triton, "knobs", None)
    return bool(knobs is not None and knobs.runtime.interpret)


# ---- helpers the kernels call --------------------------------------------------------------------------

@triton.jit
def kiln_add(a, b):
    return a + b


@triton.jit
def kiln_mul(a, b):
    return a * b


@triton.jit
def kiln_maximum(a, b):
    # NaN wins; on a tie the first operand (maximum(0., -0.) is 0.)
    return tl.where((a != a) | (a >= b), a, tl.where(b != b, b, b))


@triton.jit
def kiln_minimum(a, b):
    return tl.where((a != a) | (a <= b), a, b)


@triton.jit
def kiln_imax(a, b):
    return tl.maximum(a, b)


@triton.jit
def kiln_imin(a, b):
    return tl.minimum(a, b)


@triton.jit
def kiln_fmax(a, b):
    return tl.where(a != a, b, tl.where(b != b, a, tl.where(a >= b, a, b)))


@triton.jit
def kiln_fmin(a, b):
    return tl.where(a != a, b, tl.where(b != b, a, tl.where(a <= b, a, b)))


@triton.jit
def kiln_argmax(va, ia, vb, ib):
    a_nan = va != va
    b_nan = vb != vb
    take_a = (a_nan & ((vb == vb) | (ia < ib))) | \
        ((va == va) & (vb == vb) & ((va > vb) | ((va == vb) & (ia < ib))))
    return tl.where(take_a, va, vb), tl.where(take_a, ia, ib)


@triton.jit
def kiln_argmin(va, ia, vb, ib):
    a_nan = va != va
    take_a = (a_nan & ((vb == vb) | (ia < ib))) | \
        ((va == va) & (vb == vb) & ((va < vb) | ((va == vb) & (ia < ib))))
    return tl.where(take_a, va, vb), tl.where(take_a, ia, ib)


@triton.jit
def kiln_idiv(a, b):
    # C division as torch computes it; x / -1 wraps for the minimum value (the hardware traps), x / 0 never
    # reaches here (eager raises first)
    safe = tl.where((b == 0) | (b == -1), 1, b)
    return tl.where(b == -1, 0 - a, tl.where(b == 0, 0, a // safe))


@triton.jit
def kiln_ifmod(a, b):
    safe = tl.where((b == 0) | (b == -1), 1, b)
    return tl.where((b == 0) | (b == -1), 0, a % safe)


@triton.jit
def kiln_iremainder(a, b):
    safe = tl.where((b == 0) | (b == -1), 1, b)
    r = tl.where((b == 0) | (b == -1), 0, a % safe)
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def kiln_fremainder(a, b, fm):
    return tl.where((fm != 0) & ((fm < 0) != (b < 0)), fm + b, fm)


@triton.jit
def kiln_shift_left(a, b, bits: tl.constexpr):
    bad = (b < 0) | (b >= bits)
    return tl.where(bad, 0, a << tl.where(bad, 0, b))


@triton.jit
def kiln_shift_right(a, b, bits: tl.constexpr):
    bad = (b < 0) | (b >= bits)
    return tl.where(bad, tl.where(a < 0, -1, 0), a >> tl.where(bad, 0, b))


@triton.jit
def kiln_div64(a, b):
    return a / b


@triton.jit
def kiln_round_fp16(x):
    return x.to(tl.float16).to(tl.float32)


if interpreting():
    @triton.jit
    def kiln_round_bf16(x):
        # the interpreter truncates float32 -> bfloat16: round to nearest even by hand (NaN stays NaN)
        bits = x.to(tl.int32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True))
else:
    @triton.jit
    def kiln_round_bf16(x):
        return x.to(tl.bfloat16).to(tl.float32)  # cvt.rn: round to nearest even


def kiln_quiet() -> Any:
    """Under the interpreter numpy computes masked-out lanes too: silence its floating-point warnings."""
    return np.errstate(all="ignore")


# ---- libdevice ------------------------------------------------------------------------------------------

_TORCH_MATH = {
    "exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1, "log": torch.log, "log2": torch.log2,
    "log10": torch.log10, "log1p": torch.log1p, "sqrt": torch.sqrt, "sin": torch.sin, "cos": torch.cos,
    "tan": torch.tan, "asin": torch.asin, "acos": torch.acos, "atan": torch.atan, "sinh": torch.sinh,
    "cosh": torch.cosh, "tanh": torch.tanh, "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh,
    "erf": torch.erf, "erfc": torch.erfc, "erfinv": torch.erfinv, "lgamma": torch.lgamma, "ceil": torch.ceil, "floor": torch.floor,
    "trunc": torch.trunc, "nearbyint": torch.round, "atan2": torch.atan2, "hypot": torch.hypot,
    "copysign": torch.copysign, "nextafter": torch.nextafter, "fmod": torch.fmod, "pow": torch.pow,
}


def _interpreted(fn: Any) -> Any:
    def apply(*args: Any) -> Any:
        from triton.runtime.interpreter import TensorHandle
        first = next(a for a in args if isinstance(a, tl.core.tensor))
        scalar = first.type.scalar
        arrays = []
        for a in args:
            data = a.handle.data if isinstance(a, tl.core.tensor) else np.asarray(a, dtype=first.handle.data.dtype)
            arrays.append(torch.from_numpy(np.ascontiguousarray(data)))
        out = np.ascontiguousarray(fn(*arrays).numpy())
        return tl.core.tensor(TensorHandle(out, scalar), tl.block_type(scalar, list(out.shape))
                              if out.ndim else scalar)
    return apply


def _interpreter_libdevice() -> types.SimpleNamespace:
    return types.SimpleNamespace(**{name: _interpreted(fn) for name, fn in _TORCH_MATH.items()})


def _device_libdevice() -> Any:
    if torch.version.hip is not None:
        from triton.language.extra.hip import libdevice as lib
    else:
        from triton.language.extra.cuda import libdevice as lib
    return lib


libdevice = _interpreter_libdevice() if interpreting() else _device_libdevice()

HEADER = """import triton
import triton.language as tl
from kiln.runtime.tritonlib import *  # the kiln_* helpers and libdevice
"""


# ---- building and loading ---------------------------------------------------------------------------------

_LOADED: dict[str, types.ModuleType] = {}


def module_key(source: str) -> str:
    mode = "interpret" if interpreting() else "device"
    return hashlib.sha256(f"{triton.__version__}\n{mode}\n{source}".encode()).hexdigest()[:32]


def load_module(source: str) -> types.ModuleType:
    """Import a generated module (HEADER + source), writing it to the cache directory the first time."""
    text = HEADER + "\n\n" + source + "\n"
    key = module_key(text)
    module = _LOADED.get(key)
    if module is not None:
        return module
    directory = os.path.join(cache.directory(), "triton")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, f"kiln_{key}.py")
    try:
        with open(path, encoding="utf-8") as f:
            fresh = f.read() != text
    except OSError:
        fresh = True
    if fresh:
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".py")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(temporary, path)
    name = f"kiln_triton_{key}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # Triton looks its kernels' modules up by name
    spec.loader.exec_module(module)
    _LOADED[key] = module
    return module


def compile_check(path: str, kernel: str, signature: dict[str, str], constants: dict, arch: int = 90) -> Any:
    """Compile kernel `kernel` of the generated module at `path` for CUDA compute capability `arch` without a
    GPU (Triton's frontend, LLVM and ptxas run on the CPU) and return the compiled kernel; raises what the
    compiler raises. `signature`: pointer parameter -> Triton type ("*fp32"). Needs a process that is not
    interpreting (`compile_check_in_subprocess` starts one)."""
    from triton.backends.compiler import GPUTarget
    if interpreting():
        raise RuntimeError("compile_check needs a process without TRITON_INTERPRET")
    name = "kiln_check_" + os.path.basename(path)[:-3]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    full = dict(signature)
    full.update({n: "constexpr" for n in constants})
    src = triton.compiler.ASTSource(fn=getattr(module, kernel), signature=full, constexprs=dict(constants))
    return triton.compile(src, target=GPUTarget("cuda", arch, 32))


def compile_check_in_subprocess(jobs: list[dict], arch: int = 90, timeout: float = 600) -> list[str]:
    """Run `compile_check` on each job ({"path", "kernel", "signature", "constants"}) in one fresh process
    without the interpreter; the errors, one line per failed kernel (empty: all compiled)."""
    import json
    import subprocess
    env = config.child_environment(drop=("TRITON_INTERPRET",))
    code = ("import json, sys\nfrom kiln.runtime import tritonlib\nerrors = []\n"
            "for job in json.load(sys.stdin):\n"
            "    try:\n"
            f"        c = tritonlib.compile_check(job['path'], job['kernel'], job['signature'], job['constants'], {arch})\n"
            "        assert c.asm.get('cubin'), 'no cubin'\n"
            "    except Exception as e:\n"
            "        errors.append(f\"{job['kernel']} ({job['path']}): {type(e).__name__}: {e}\")\n"
            "print(json.dumps(errors))\n")
    done = subprocess.run([sys.executable, "-c", code], input=json.dumps(jobs), capture_output=True, text=True,
                          env=env, timeout=timeout)
    if done.returncode != 0:
        return [f"compile-check process failed ({done.returncode}): {done.stderr[-2000:]}"]
    return json.loads(done.stdout.strip().splitlines()[-1])
