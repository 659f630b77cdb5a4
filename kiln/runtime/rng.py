"""Bernoulli draws from torch's CPU generator, as eager draws them, in native code.

Eager's `bernoulli_(p)` on a CPU without MKL's path (torch takes it on Intel CPUs only) draws element by
element in memory order: two 32-bit outputs of the generator's MT19937 engine make a 64-bit word, its
low 53 bits a double u in [0, 1), and the element is `u < p`. It runs serially through TensorIterator
(~13-16 ns an element here), which made `dropout` 0.7x of torch.compile's own (different) random stream.
`bernoulli` below reads the generator's state (`get_state`), runs the same engine in C++ on those bytes
(~1.5-2 ns an element with AVX-512, ~4.6 with AVX2), and writes the advanced state back (`set_state`): the
same draws and the same state after the call as eager, so later random calls agree too.

That this is eager's algorithm on this machine is checked once per process (`_native_matches`): a few
draws across the engine's 624-word blocks, with a copy of a generator, must equal torch's values and its
state after them; where they do not (MKL's path, another torch), every call runs torch's kernel.
The GIL is held through the native call (PyDLL): no other thread can draw between reading and writing
the state.
"""
from __future__ import annotations

import ctypes
import functools
import struct
from typing import Any

import torch

from ..counters import counters
from .build import build

# below this many elements torch's own kernel costs less than reading and writing the generator's state
# (~4.5 us a call, then ~1.5 ns an element against torch's ~6-8: measured single-thread, 1024 elements
# 5.1 against 8.7 us, 256 elements 4.8 against 3.6)
NATIVE_MIN = 512
_STATE_WORDS = 624
_POD = "<QiiQ"  # CPUGeneratorImpl's state: seed, left, seeded, next, then 624 words stored as uint64
_WORDS_AT = struct.calcsize(_POD)

SOURCE = r"""
#include <cmath>
#include <cstdint>
#include <cstring>

static void kiln_mt_twist(uint32_t* s) {
  const int n = 624, m = 397;
  int i = 0;
  for (; i < n - m; ++i) {
    uint32_t y = (s[i] & 0x80000000u) | (s[i + 1] & 0x7fffffffu);
    s[i] = s[i + m] ^ (y >> 1) ^ ((s[i + 1] & 1u) ? 0x9908b0dfu : 0u);
  }
  for (; i < n - 1; ++i) {
    uint32_t y = (s[i] & 0x80000000u) | (s[i + 1] & 0x7fffffffu);
    s[i] = s[i + m - n] ^ (y >> 1) ^ ((s[i + 1] & 1u) ? 0x9908b0dfu : 0u);
  }
  uint32_t y = (s[n - 1] & 0x80000000u) | (s[0] & 0x7fffffffu);
  s[n - 1] = s[m - 1] ^ (y >> 1) ^ ((s[0] & 1u) ? 0x9908b0dfu : 0u);
}

static inline uint32_t kiln_mt_temper(uint32_t y);

// the engine's next output: `left` counts down to a refill of the 624 words, `next` indexes them
static inline uint32_t kiln_mt_next(uint32_t* s, int64_t& left, int64_t& next) {
  if (--left == 0) {
    kiln_mt_twist(s);
    left = 624;
    next = 0;
  }
  return kiln_mt_temper(s[next++]);
}

static inline uint32_t kiln_mt_temper(uint32_t y) {
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

// element = (u < p) for u the low 53 bits m of (first output << 32 | second output), over 2^53. Both m and
// p * 2^53 are exact doubles, so u < p is m < ceil(p * 2^53) in integers: a 64-bit compare, which vectorizes
// where an int64 -> double conversion does not (x86 without AVX-512DQ)
// (`one` is 1 in the output's type: a half type's element is its bits, 1.0's bits)
template <typename T>
static inline T kiln_bernoulli_of(uint64_t hi, uint64_t lo, int64_t threshold, T one) {
  const int64_t m = static_cast<int64_t>(((hi << 32) | lo) & ((1ull << 53) - 1));
  return m < threshold ? one : T(0);
}

template <typename T>
static void kiln_draw(uint32_t* __restrict__ s, int64_t* pos, T* __restrict__ out, int64_t n, double p, T one) {
  int64_t left = pos[0], next = pos[1];
  const int64_t threshold = static_cast<int64_t>(std::ceil(p * 9007199254740992.0));  // p * 2^53
  int64_t i = 0;
  while (i < n) {
    // outputs the current block still holds: left - 1 (the next output refills when left reaches 0)
    int64_t k = (left - 1) / 2;
    if (k > n - i) k = n - i;
    if (k > 0) {
      const uint32_t* w = s + next;
      T* o = out + i;
      #pragma omp simd
      for (int64_t j = 0; j < k; ++j) {
        o[j] = kiln_bernoulli_of<T>(kiln_mt_temper(w[2 * j]), kiln_mt_temper(w[2 * j + 1]), threshold, one);
      }
      left -= 2 * k;
      next += 2 * k;
      i += k;
      continue;
    }
    // an element whose outputs cross into the next block
    uint64_t hi = kiln_mt_next(s, left, next);
    uint64_t lo = kiln_mt_next(s, left, next);
    out[i++] = kiln_bernoulli_of<T>(hi, lo, threshold, one);
  }
  pos[0] = left;
  pos[1] = next;
}

// `state` is the generator's get_state() bytes, little-endian: seed (u64), left (i32), seeded (i32),
// next (u64), the 624 engine words each stored as a u64, then fields the draws leave alone. They are read,
// advanced by the n draws and written back in place, for set_state.
template <typename T>
static int kiln_draw_state(uint8_t* state, T* out, int64_t n, double p, T one) {
  int32_t left32;
  uint64_t next64;
  std::memcpy(&left32, state + 8, 4);
  std::memcpy(&next64, state + 16, 8);
  uint32_t s[624];
  for (int i = 0; i < 624; ++i) {
    uint64_t w;
    std::memcpy(&w, state + 24 + 8 * i, 8);
    s[i] = static_cast<uint32_t>(w);
  }
  int64_t pos[2] = {left32, static_cast<int64_t>(next64)};
  kiln_draw<T>(s, pos, out, n, p, one);
  left32 = static_cast<int32_t>(pos[0]);
  next64 = static_cast<uint64_t>(pos[1]);
  std::memcpy(state + 8, &left32, 4);
  std::memcpy(state + 16, &next64, 8);
  for (int i = 0; i < 624; ++i) {
    const uint64_t w = s[i];
    std::memcpy(state + 24 + 8 * i, &w, 8);
  }
  return 0;
}

extern "C" int kiln_bernoulli_f32(uint8_t* state, float* out, int64_t n, double p) {
  return kiln_draw_state<float>(state, out, n, p, 1.0f);
}
extern "C" int kiln_bernoulli_f64(uint8_t* state, double* out, int64_t n, double p) {
  return kiln_draw_state<double>(state, out, n, p, 1.0);
}
extern "C" int kiln_bernoulli_bf16(uint8_t* state, uint16_t* out, int64_t n, double p) {
  return kiln_draw_state<uint16_t>(state, out, n, p, 0x3f80);
}
extern "C" int kiln_bernoulli_fp16(uint8_t* state, uint16_t* out, int64_t n, double p) {
  return kiln_draw_state<uint16_t>(state, out, n, p, 0x3c00);
}
"""


# the dtypes drawn natively, and their entry points
_NATIVE = {torch.float32: "kiln_bernoulli_f32", torch.float64: "kiln_bernoulli_f64",
           torch.bfloat16: "kiln_bernoulli_bf16", torch.float16: "kiln_bernoulli_fp16"}


@functools.lru_cache(maxsize=None)
def _entries() -> dict[torch.dtype, Any]:
    lib = ctypes.PyDLL(build(SOURCE)._name)  # PyDLL: the GIL stays held (see the module doc)
    entries = {}
    for dtype, name in _NATIVE.items():
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_double]
        fn.restype = ctypes.c_int
        entries[dtype] = fn
    return entries


def _draw_native(shape: tuple, dtype: torch.dtype, p: float, generator: torch.Generator) -> torch.Tensor:
    out = torch.empty(shape, dtype=dtype)  # (first: between get_state and set_state nothing releases the GIL)
    state = generator.get_state()  # a copy: the native call advances it in place, set_state installs it
    if state.numel() < _WORDS_AT + 8 * _STATE_WORDS:
        raise RuntimeError(f"unexpected generator state of {state.numel()} bytes")
    _entries()[dtype](state.data_ptr(), out.data_ptr(), out.numel(), float(p))
    generator.set_state(state)
    return out


@functools.lru_cache(maxsize=None)
def _native_matches() -> bool:
    """Whether the native draws equal torch's here: values and the generator's state after them."""
    try:
        for seed, n, p in ((0, 1000, 0.9), (123, 3001, 0.5), (7, 313, 0.1)):
            ours, theirs = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
            torch.empty(17).bernoulli_(0.3, generator=theirs)  # start inside a block, not at its start
            ours.set_state(theirs.get_state())
            for dtype in _NATIVE:
                mine = _draw_native((n,), dtype, p, ours)
                eager = torch.empty(n, dtype=dtype).bernoulli_(p, generator=theirs)
                if not torch.equal(mine, eager) or not torch.equal(ours.get_state(), theirs.get_state()):
                    return False
        return True
    except Exception:  # no compiler, another state layout: torch's kernel, always right
        return False


def bernoulli(a: torch.Tensor, p: Any = None, generator: Any = None) -> torch.Tensor:
    """prims.bernoulli's reference (`torch.bernoulli(a, p).contiguous()`), natively where it is the same."""
    native = p is not None and 0.0 <= p <= 1.0 and a.device.type == "cpu" and \
        a.dtype in _NATIVE and a.is_contiguous() and a.numel() >= NATIVE_MIN and \
        (generator is None or (isinstance(generator, torch.Generator) and generator.device.type == "cpu"))
    if native:
        if _native_matches():
            return _draw_native(tuple(a.shape), a.dtype, float(p), generator or torch.default_generator)
        counters["cpp"]["bernoulli drawn by torch: the native draws differ from eager's here"] += 1
    out = torch.bernoulli(a, generator=generator) if p is None else torch.bernoulli(a, p, generator=generator)
    return out.contiguous()
