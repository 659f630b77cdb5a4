"""at::vec::Vectorized<float> versus compiler vectorization (`#pragma omp simd` + libmvec).

kiln issue 4, item 3.

Builds two standalone shared objects with kiln's exact compiler flags (kiln.runtime.build.flags()), one per
variant, each with the same three kernels (OpenMP over rows of 4096 floats):
  pointwise  y = a*b + 1
  gelu_tanh  y = 0.5*a*(1 + tanh(sqrt(2/pi)*(a + 0.044715*a^3)))
  softmax    y = exp(a - rowmax) / rowsum
calls them through ctypes on 4096x4096 float32 tensors, checks both against torch (assert_close) and prints
the median ms over interleaved repetitions, the ratio at::vec / compiler and the GB/s.

    python bench/bench_vec.py [--n 4096] [--reps 30]
"""
import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch.utils.cpp_extension import include_paths

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from kiln.runtime.build import flags, libraries  # noqa: E402

HEADER = r"""
#include <cmath>
#include <cstdint>
#include <omp.h>
#ifdef KILN_MVEC
extern "C" {
#define KILN_SIMD(name) \
  __attribute__((simd("notinbranch"))) float name##f(float); \
  __attribute__((simd("notinbranch"))) double name(double);
KILN_SIMD(exp) KILN_SIMD(tanh)
#undef KILN_SIMD
}
#endif
"""

# (a) what kiln emits: plain loops, `#pragma omp simd`, libm calls vectorized through libmvec.
COMPILER = HEADER + r"""
extern "C" void pointwise(const float* a, const float* b, float* y, int64_t rows, int64_t cols) {
  #pragma omp parallel for
  for (int64_t r = 0; r < rows; ++r) {
    const float* ar = a + r * cols; const float* br = b + r * cols; float* yr = y + r * cols;
    #pragma omp simd
    for (int64_t i = 0; i < cols; ++i) yr[i] = ar[i] * br[i] + 1.0f;
  }
}
extern "C" void gelu_tanh(const float* a, float* y, int64_t rows, int64_t cols) {
  #pragma omp parallel for
  for (int64_t r = 0; r < rows; ++r) {
    const float* ar = a + r * cols; float* yr = y + r * cols;
    #pragma omp simd
    for (int64_t i = 0; i < cols; ++i) {
      float x = ar[i];
      yr[i] = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    }
  }
}
extern "C" void softmax(const float* a, float* y, int64_t rows, int64_t cols) {
  #pragma omp parallel for
  for (int64_t r = 0; r < rows; ++r) {
    const float* ar = a + r * cols; float* yr = y + r * cols;
    float m = -INFINITY;
    #pragma omp simd reduction(max:m)
    for (int64_t i = 0; i < cols; ++i) m = ar[i] > m ? ar[i] : m;
    float s = 0.0f;
    #pragma omp simd reduction(+:s)
    for (int64_t i = 0; i < cols; ++i) { float e = expf(ar[i] - m); yr[i] = e; s += e; }
    float inv = 1.0f / s;
    #pragma omp simd
    for (int64_t i = 0; i < cols; ++i) yr[i] = yr[i] * inv;
  }
}
"""

# (b) at::vec::Vectorized<float> loads/ops/stores with a scalar tail.
ATVEC = r"""
#include <ATen/cpu/vec/vec.h>
#include <ATen/cpu/vec/functional.h>
""" + HEADER + r"""
using Vec = at::vec::Vectorized<float>;
extern "C" int vec_size() { return Vec::size(); }
extern "C" void pointwise(const float* a, const float* b, float* y, int64_t rows, int64_t cols) {
  #pragma omp parallel for
  for (int64_t r = 0; r < rows; ++r) {
    const float* ar = a + r * cols; const float* br = b + r * cols; float* yr = y + r * cols;
    const Vec one(1.0f);
    int64_t i = 0;
    for (; i + Vec::size() <= cols; i += Vec::size())
      at::vec::fmadd(Vec::loadu(ar + i), Vec::loadu(br + i), one).store(yr + i);
    for (; i < cols; ++i) yr[i] = ar[i] * br[i] + 1.0f;
  }
}
extern "C" void gelu_tanh(const float* a, float* y, int64_t rows, int64_t cols) {
  #pragma omp parallel for
  for (int64_t r = 0; r < rows; ++r) {
    const float* ar = a + r * cols; float* yr = y + r * cols;
    const Vec half(0.5f), one(1.0f), k0(0.7978845608028654f), k1(0.044715f);
    int64_t i = 0;
    for (; i + Vec::size() <= cols; i += Vec::size()) {
      Vec x = Vec::loadu(ar + i);
      Vec inner = k0 * (x + k1 * x * x * x);
      (half * x * (one + inner.tanh())).store(yr + i);
    }
    for (; i < cols; ++i) {
      float x = ar[i];
      yr[i] = 0.5f * x * (1.0f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    }
  }
}
extern "C" void softmax(const float* a, float* y, int64_t rows, int64_t cols) {
  #pragma omp parallel for
  for (int64_t r = 0; r < rows; ++r) {
    const float* ar = a + r * cols; float* yr = y + r * cols;
    int64_t i = 0;
    Vec vm(-INFINITY);
    for (; i + Vec::size() <= cols; i += Vec::size()) vm = at::vec::maximum(vm, Vec::loadu(ar + i));
    float m = at::vec::vec_reduce_all<float>([](Vec& p, Vec& q) { return at::vec::maximum(p, q); }, vm);
    for (; i < cols; ++i) m = ar[i] > m ? ar[i] : m;
    Vec vmax(m), vs(0.0f);
    i = 0;
    for (; i + Vec::size() <= cols; i += Vec::size()) {
      Vec e = (Vec::loadu(ar + i) - vmax).exp();
      e.store(yr + i);
      vs = vs + e;
    }
    float s = at::vec::vec_reduce_all<float>([](Vec& p, Vec& q) { return p + q; }, vs);
    for (; i < cols; ++i) { float e = std::exp(ar[i] - m); yr[i] = e; s += e; }
    Vec vinv(1.0f / s);
    i = 0;
    for (; i + Vec::size() <= cols; i += Vec::size()) (Vec::loadu(yr + i) * vinv).store(yr + i);
    for (; i < cols; ++i) yr[i] = yr[i] * (1.0f / s);
  }
}
"""


def capability_defines():
    """at::vec picks its ISA from CPU_CAPABILITY_*; match what torch dispatches to on this machine."""
    cap = torch.backends.cpu.get_cpu_capability()
    if cap.startswith("AVX512"):
        return ["-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"], "AVX512"
    if cap.startswith("AVX2"):
        return ["-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"], "AVX2"
    return ["-DCPU_CAPABILITY=DEFAULT"], "DEFAULT"


def build(name, source, extra, tmp, link=()):
    src = os.path.join(tmp, name + ".cpp")
    so = os.path.join(tmp, name + ".so")
    with open(src, "w") as f:
        f.write(source)
    cmd = ["g++", *flags(), *extra, src, "-o", so, *link, *libraries()]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    return so, res, dt, cmd


def timeit(fn):
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    n, reps = args.n, args.reps
    torch.manual_seed(0)
    defines, cap = capability_defines()
    torch_dir = os.path.dirname(torch.__file__)
    torch_lib = os.path.join(torch_dir, "lib")
    inc = [f"-I{p}" for p in include_paths()]
    # Vectorized<float>::exp/tanh call Sleef_*f16_u10, exported by libtorch_cpu (sleef.h is in the headers).
    link = [f"-L{torch_lib}", f"-Wl,-rpath,{torch_lib}", "-ltorch_cpu", "-lc10"]
    print(f"torch {torch.__version__}  cpu capability {cap}  threads {torch.get_num_threads()}  "
          f"omp threads {os.environ.get('OMP_NUM_THREADS', 'default')}")
    print("kiln flags:", " ".join(flags() + libraries()))
    with tempfile.TemporaryDirectory() as tmp:
        so_c, res_c, dt_c, _ = build("compiler", COMPILER, [], tmp)
        if res_c.returncode:
            print("compiler-vectorized variant failed to build:\n" + res_c.stderr[-3000:])
            return 1
        so_v, res_v, dt_v, cmd_v = build("atvec", ATVEC, [*defines, *inc], tmp, link)
        print(f"build: compiler {dt_c:.1f} s, at::vec {dt_v:.1f} s (at::vec extra flags: "
              f"{' '.join(defines)} -I<torch include> -ltorch_cpu -lc10)")
        if res_v.returncode:
            print("at::vec variant FAILED to compile; command:\n  " + " ".join(cmd_v))
            print("g++ stderr (tail):\n" + res_v.stderr[-4000:])
            return 1
        libs = {"compiler": ctypes.CDLL(so_c), "at::vec": ctypes.CDLL(so_v)}
        print(f"at::vec Vectorized<float>::size() = {libs['at::vec'].vec_size()}")

    a = torch.randn(n, n)
    b = torch.randn(n, n)
    p = ctypes.c_void_p
    i64 = ctypes.c_int64
    for lib in libs.values():
        lib.pointwise.argtypes = [p, p, p, i64, i64]
        lib.gelu_tanh.argtypes = [p, p, i64, i64]
        lib.softmax.argtypes = [p, p, i64, i64]
    nbytes = a.numel() * a.element_size()
    kernels = {
        # name: (call(lib, y), reference, bytes moved (read + write, minimum))
        "pointwise a*b+1": (lambda lib, y: lib.pointwise(a.data_ptr(), b.data_ptr(), y.data_ptr(), n, n),
                            lambda: a * b + 1, 3 * nbytes),
        "gelu_tanh": (lambda lib, y: lib.gelu_tanh(a.data_ptr(), y.data_ptr(), n, n),
                      lambda: torch.nn.functional.gelu(a, approximate="tanh"), 2 * nbytes),
        "softmax (rows)": (lambda lib, y: lib.softmax(a.data_ptr(), y.data_ptr(), n, n),
                           lambda: torch.softmax(a, -1), 2 * nbytes),
    }
    rows = []
    for kname, (call, ref, moved) in kernels.items():
        expected = ref()
        outs = {v: torch.empty(n, n) for v in libs}
        for v, lib in libs.items():
            call(lib, outs[v])
            torch.testing.assert_close(outs[v], expected)
        times = {v: [] for v in libs}
        times["torch eager"] = []
        for _ in range(3):  # warm up
            for v, lib in libs.items():
                call(lib, outs[v])
        for r in range(reps):  # interleaved, order alternating per repetition
            order = list(libs) if r % 2 == 0 else list(libs)[::-1]
            for v in order:
                times[v].append(timeit(lambda: call(libs[v], outs[v])))
            times["torch eager"].append(timeit(ref))
        med = {v: statistics.median(t) for v, t in times.items()}
        rows.append((kname, med, moved))
    print(f"\n{n}x{n} float32, median of {reps} interleaved reps (both variants checked with assert_close;"
          " eager includes allocating its output)")
    print(f"{'kernel':<18}{'compiler ms':>12}{'at::vec ms':>12}{'ratio vec/cc':>14}"
          f"{'cc GB/s':>10}{'vec GB/s':>10}{'eager ms':>10}")
    for kname, med, moved in rows:
        c, v = med["compiler"], med["at::vec"]
        print(f"{kname:<18}{c:>12.2f}{v:>12.2f}{v / c:>14.2f}{moved / c / 1e6:>10.1f}"
              f"{moved / v / 1e6:>10.1f}{med['torch eager']:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
