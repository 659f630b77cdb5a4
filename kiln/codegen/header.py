"""The C++ header of generated sources: the helpers kernels call, assembled from the parts a source uses."""
from __future__ import annotations

import re

# The header is assembled per source from the parts it uses: <cmath> alone costs g++ ~0.1 s (without C++17's
# special functions, below), <immintrin.h> ~0.6 s, <memory> ~0.3 s (hence kiln_array), so a graph whose
# kernels only copy or add builds in a fraction of the time.
HEADER_BASE = r"""
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <omp.h>

static inline int64_t kiln_imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t kiln_imax(int64_t a, int64_t b) { return a > b ? a : b; }
// Python's // and % of symbolic sizes (floored, for any signs)
static inline int64_t kiln_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static inline int64_t kiln_floormod(int64_t a, int64_t b) { return a - kiln_floordiv(a, b) * b; }
// an index loaded from a tensor (a gather's, an embedding's token): a negative one counts from the end when
// `wrap`; one outside [0, n) on a live lane reads element 0 instead (never a load outside the buffer) and
// marks `bad`, the kernel's flag for the current outer iteration, which the kernel passes on to the entry's
// result (the wrapper then raises eager's error, found in the index values). An OR into a local of
// the outer iteration is what g++ still vectorizes (a store through a pointer or into a shared variable
// leaves the loop scalar) and hoists when the index is invariant along the inner loop (an embedding's row)
static inline int64_t kiln_index(int64_t i, int64_t n, bool wrap, bool live, int* bad) {
  if (wrap && i < 0) i += n;
  const bool inside = static_cast<uint64_t>(i) < static_cast<uint64_t>(n);
  *bad |= (live && !inside);
  return inside ? i : 0;
}

// bfloat16 and float16: stored as their 16 bits (kiln_bf16 / kiln_fp16 in memory), computed in float
// registers holding the half type's values, rounded after every op (as eager rounds each op's result). The
// conversions are integer arithmetic on the bits, round to nearest even, which g++ vectorizes on any x86
// (SSE2 up to AVX-512): AVX512-BF16's vcvtneps2bf16 flushes subnormals to zero (eager keeps them), and g++ 12
// vectorizes no conversion to or from _Float16, which left every half-precision loop scalar.
static inline float kiln_bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
static inline uint32_t kiln_float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
// c ? a : b as masks: g++ 12 left loops scalar when a select of these ran on a loop-invariant value (the
// rounded statistic of an RMSNorm)
static inline uint32_t kiln_select_bits(bool c, uint32_t a, uint32_t b) {
  const uint32_t m = 0u - uint32_t(c);
  return (a & m) | (b & ~m);
}
static inline float kiln_bf16_to_float(uint16_t h) { return kiln_bits_float(uint32_t(h) << 16); }
// a NaN becomes the quiet NaN 0x7fc0, as c10::BFloat16 makes it. NaN is told by the bits (magnitude above
// infinity's) into a mask computed here, not by f != f through kiln_select_bits: from those g++ 12 built the
// select over 16-bit lanes with mask moves and permutes, ~15% of a bfloat16 tanh chain's time
static inline uint16_t kiln_float_to_bf16(float f) {
  const uint32_t u = kiln_float_bits(f);
  const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = 0u - uint32_t((u & 0x7fffffffu) > 0x7f800000u);
  return uint16_t((r & ~nan) | (0x7fc0u & nan));
}
static inline float kiln_round_bf16(float f) {
  const uint32_t u = kiln_float_bits(f);
  const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  const uint32_t nan = 0u - uint32_t((u & 0x7fffffffu) > 0x7f800000u);
  return kiln_bits_float((r & ~nan) | (0x7fc00000u & nan));
}
static inline float kiln_fp16_to_float(uint16_t h) {
  const uint32_t em = uint32_t(h & 0x7fffu) << 13;  // exponent and mantissa at float's places
  const uint32_t exp = em & 0x0f800000u;
  uint32_t u = em + 0x38000000u;                    // exponent rebiased by 127 - 15
  u = kiln_select_bits(exp == 0x0f800000u, u + 0x38000000u, u);  // infinity and NaN: exponent all ones
  // zero and subnormals (mantissa * 2^-24): 2^-14 * (1 + mantissa / 1024) - 2^-14, exact in float
  const float sub = kiln_bits_float(u + 0x00800000u) - 6.103515625e-05f;
  const uint32_t r = kiln_select_bits(exp == 0, kiln_float_bits(sub), u);
  return kiln_bits_float(r | (uint32_t(h & 0x8000u) << 16));
}
static inline uint16_t kiln_float_to_fp16(float f) {
  const uint32_t all = kiln_float_bits(f);
  const uint32_t sign = all & 0x80000000u;
  const uint32_t u = all ^ sign;
  // normal results: exponent rebiased by 15 - 127, the mantissa rounded to nearest even at bit 13
  const uint32_t normal = (u + 0xc8000fffu + ((u >> 13) & 1u)) >> 13;
  // below 2^-14 (subnormal or zero): adding 0.5 rounds |f| to a multiple of 2^-24, to nearest even
  const uint32_t sub = kiln_float_bits(kiln_bits_float(u) + 0.5f) - 0x3f000000u;
  uint32_t r = kiln_select_bits(u < 0x38800000u, sub, normal);
  r = kiln_select_bits(u >= 0x47800000u, 0x7c00u, r);  // from 65536 on: infinity
  r = kiln_select_bits(u > 0x7f800000u, 0x7e00u, r);   // NaN
  return uint16_t(r | (sign >> 16));
}
// kiln_fp16_to_float(kiln_float_to_fp16(f)) in half the instructions: rounded in place
static inline float kiln_round_fp16(float f) {
  const uint32_t all = kiln_float_bits(f);
  const uint32_t sign = all & 0x80000000u;
  const uint32_t u = all ^ sign;
  const uint32_t normal = (u + 0xfffu + ((u >> 13) & 1u)) & 0xffffe000u;
  const uint32_t sub = kiln_float_bits((kiln_bits_float(u) + 0.5f) - 0.5f);  // a multiple of 2^-24
  uint32_t r = kiln_select_bits(u < 0x38800000u, sub, normal);
  r = kiln_select_bits(normal >= 0x47800000u, 0x7f800000u, r);  // rounded to 65536 or more: infinity
  r = kiln_select_bits(u > 0x7f800000u, 0x7fc00000u, r);        // NaN
  return kiln_bits_float(r | sign);
}
struct kiln_bf16 {
  uint16_t x;
  kiln_bf16() = default;
  kiln_bf16(float f) : x(kiln_float_to_bf16(f)) {}
  operator float() const { return kiln_bf16_to_float(x); }
};
struct kiln_fp16 {
  uint16_t x;
  kiln_fp16() = default;
  kiln_fp16(float f) : x(kiln_float_to_fp16(f)) {}
  operator float() const { return kiln_fp16_to_float(x); }
};

// Non-temporal copy of a computed tile to its (large) output: no read-for-ownership of the destination
// lines and no eviction of the inputs; the caller fences (kiln_stream_fence) before others read it.
// (GCC's builtins rather than <immintrin.h>, which alone costs more to parse than most kernels.)
#ifdef __AVX512F__
typedef long long kiln_v8di __attribute__((vector_size(64)));
static inline void kiln_stream_store(void* dst, const void* src, int64_t bytes) {
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  int64_t head = (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63;
  if (head > bytes) head = bytes;
  std::memcpy(d, s, head);
  int64_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    kiln_v8di v;
    std::memcpy(&v, s + i, 64);
    __builtin_ia32_movntdq512(reinterpret_cast<kiln_v8di*>(d + i), v);
  }
  std::memcpy(d + i, s + i, bytes - i);
}
static inline void kiln_stream_fence() { __builtin_ia32_sfence(); }
#else
static inline void kiln_stream_store(void* dst, const void* src, int64_t bytes) {
  std::memcpy(dst, src, bytes);
}
static inline void kiln_stream_fence() {}
#endif

// maximum/minimum propagate NaN, as torch.maximum / amax
// (on a tie the first operand, as eager: maximum(0., -0.) is 0.)
template <typename T> static inline T kiln_max(T a, T b) {
  return (a != a) ? a : ((b != b) ? b : (b > a ? b : a));
}
template <typename T> static inline T kiln_min(T a, T b) {
  return (a != a) ? a : ((b != b) ? b : (b < a ? b : a));
}
template <typename T> static inline T kiln_shl(T a, T b) {
  return (b < 0 || b >= (T)(sizeof(T) * 8)) ? T(0) : (T)((typename std::make_unsigned<T>::type)a << b);
}
template <typename T> static inline T kiln_shr(T a, T b) {
  return (b < 0 || b >= (T)(sizeof(T) * 8)) ? (a < 0 ? T(-1) : T(0)) : (T)(a >> b);
}
// Integer division and C-style remainder as torch computes them: x / -1 wraps for the minimum value (the
// hardware traps), x / 0 never reaches here (eager raises first, and kiln checks values the same way).
template <typename T> static inline T kiln_idiv(T a, T b) {
  if (b == T(-1)) return (T)(T(0) - (typename std::make_unsigned<T>::type)a);
  return b == T(0) ? T(0) : (T)(a / b);
}
template <typename T> static inline T kiln_ifmod(T a, T b) {
  return (b == T(-1) || b == T(0)) ? T(0) : (T)(a % b);
}
// eager's sign: NaN -> 0
template <typename T> static inline T kiln_sign(T a) { return (T)((T(0) < a) - (a < T(0))); }
// argmax/argmin step: NaN counts as the extreme; ties keep the first index.
template <typename T> static inline void kiln_argmax(T& v, int64_t& i, T nv, int64_t ni) {
  if (v != v) return;
  if (nv != nv || nv > v) { v = nv; i = ni; }
}
template <typename T> static inline void kiln_argmin(T& v, int64_t& i, T nv, int64_t ni) {
  if (v != v) return;
  if (nv != nv || nv < v) { v = nv; i = ni; }
}
// an owned scratch array (per-thread partials, row buffers): freed at the end of its scope
template <typename T> struct kiln_array {
  T* data;
  explicit kiln_array(int64_t n) : data(new T[n]) {}
  ~kiln_array() { delete[] data; }
  kiln_array(const kiln_array&) = delete;
  kiln_array& operator=(const kiln_array&) = delete;
  T* get() const { return data; }
  T& operator[](int64_t i) const { return data[i]; }
};
"""

HEADER_MATH = r"""
// libstdc++'s <cmath> also declares C++17's special functions (std::cyl_bessel_j and the like), which no
// kernel calls and which double the time g++ takes to read <cmath>; this leaves them out (other standard
// libraries ignore it)
#if defined(__has_include)
#if __has_include(<bits/c++config.h>)
#include <bits/c++config.h>
#undef _GLIBCXX_USE_STD_SPEC_FUNCS
#endif
#endif
#include <cmath>

#ifdef KILN_MVEC
// glibc's libmvec has SIMD versions of these: declaring them lets the compiler vectorize loops calling them
extern "C" {
#define KILN_SIMD(name) \
  __attribute__((simd("notinbranch"))) float name##f(float); \
  __attribute__((simd("notinbranch"))) double name(double);
KILN_SIMD(exp) KILN_SIMD(exp2) KILN_SIMD(expm1) KILN_SIMD(log) KILN_SIMD(log2) KILN_SIMD(log10)
KILN_SIMD(log1p) KILN_SIMD(sin) KILN_SIMD(cos) KILN_SIMD(tan) KILN_SIMD(asin) KILN_SIMD(acos) KILN_SIMD(atan)
KILN_SIMD(sinh) KILN_SIMD(cosh) KILN_SIMD(tanh) KILN_SIMD(asinh) KILN_SIMD(acosh) KILN_SIMD(atanh)
KILN_SIMD(erf) KILN_SIMD(erfc)
#undef KILN_SIMD
}
#endif

// exp, bit for bit std::exp, without libmvec's slow path for lanes it reads as special: the SIMD exp hands a
// whole vector to scalar exp when one lane is below ~-87 (float), and a softmax's masked lanes are all -inf
// or -3.4e38. Below -104 (float) / -746 (double) the correctly rounded result is +0: those lanes are given 0
// to exp (through an integer mask, which g++ does not fold away) and their result replaced by 0. NaN stays.
// Inputs nearer 0 than `one_within` are given 0 too (their correctly rounded result is 1, exp(0)'s): the SIMD
// exp's polynomial in them has denormal terms, a microcode assist each (EfficientNet-style SiLU over
// activations near 1e-9 ran 10x slower).
template <typename T, typename Bits> static inline T kiln_exp_zero_below(T v, T below, T one_within) {
  const bool zero = v < below;
  const bool one = (v > -one_within) & (v < one_within);
  Bits u;
  std::memcpy(&u, &v, sizeof(T));
  u &= (zero | one) ? Bits(0) : ~Bits(0);
  T w;
  std::memcpy(&w, &u, sizeof(T));
  const T e = std::exp(w);
  return zero ? T(0) : e;
}
static inline float kiln_exp(float v) { return kiln_exp_zero_below<float, uint32_t>(v, -104.0f, 0x1p-26f); }
static inline double kiln_exp(double v) {
  return kiln_exp_zero_below<double, uint64_t>(v, -746.0, 0x1p-55);
}

// tanh and erf in float: odd rational approximations |x| * P(x^2) / Q(x^2), fitted here (minimax in relative
// error, tanh on |x| <= 9, erf on |x| <= 4) and evaluated with FMAs: within 6 ulp of the correctly rounded
// result over every float, and 1.3x (tanh) and 1.8x (erf) the speed of libmvec's SIMD versions, which left
// the kernels holding them (a tanh chain, GELU) bound by arithmetic rather than memory. The result is +-1
// exactly from the first float whose correctly rounded result is 1 (`one_from`), and below 1 before it; NaN
// stays NaN (the comparisons are false) and -0 stays -0.
template <int Dp, int Dq> static inline float kiln_odd_rational(float v, float clamp, float one_from,
                                                                const float (&p)[Dp], const float (&q)[Dq]) {
  float a = std::fabs(v);
  a = a > clamp ? clamp : a;
  const float s = a * a;
  float n = p[Dp - 1], d = q[Dq - 1];
  for (int i = Dp - 2; i >= 0; i--) n = n * s + p[i];
  for (int i = Dq - 2; i >= 0; i--) d = d * s + q[i];
  float r = a * n / d;
  r = r > 0.99999994f ? 0.99999994f : r;
  return std::copysign(std::fabs(v) >= one_from ? 1.0f : r, v);
}
static inline float kiln_tanh(float v) {
  static constexpr float p[] = {1.0f, 0.133810192f, 0.00349557912f, 2.06088716e-05f, 1.33542608e-08f};
  static constexpr float q[] = {1.0f, 0.467143357f, 0.0258769523f, 0.000328561728f, 7.77641674e-07f};
  return kiln_odd_rational(v, 9.0f, 9.01091385f, p, q);
}
static inline float kiln_erf(float v) {
  static constexpr float p[] = {1.12837911f, 0.193546012f, 0.0531018451f, 0.00388336857f, 0.000284562993f,
                                1.98673115e-06f};
  static constexpr float q[] = {1.0f, 0.504858255f, 0.115350358f, 0.0152073158f, 0.00118557003f,
                                3.74194933e-05f};
  return kiln_odd_rational(v, 4.0f, 3.91920614f, p, q);
}
static inline double kiln_tanh(double v) { return std::tanh(v); }
static inline double kiln_erf(double v) { return std::erf(v); }
// erfinv: Winitzki's closed form (relative error under 2e-3), then Newton's method on erf (erfc in the
// tails) in double
template <typename T> static inline T kiln_erfinv(T y) {
  double a = std::fabs((double)y);
  if (!(a <= 1.0)) return std::numeric_limits<T>::quiet_NaN();
  if (a == 1.0) return (T)std::copysign(std::numeric_limits<double>::infinity(), (double)y);
  double w = -std::log((1.0 - a) * (1.0 + a)), t = 2.0 / (3.141592653589793 * 0.147) - 0.5 * w;
  double x = std::sqrt(std::sqrt(t * t + w / 0.147) - t);
  double b = 1.0 - a;  // (exact for a >= 0.5: the tail's residual is erfc's, without cancellation)
  for (int i = 0; i < 3; i++)
    x -= (a > 0.5 ? b - std::erfc(x) : std::erf(x) - a) / (1.1283791670955126 * std::exp(-x * x));
  return (T)std::copysign(x, (double)y);
}

template <typename T> static inline T kiln_remainder(T a, T b) {
  T r;
  if constexpr (std::is_integral<T>::value) r = kiln_ifmod<T>(a, b);
  else r = std::fmod(a, b);
  if (r != 0 && ((b < 0) != (r < 0))) r += b;
  return r;
}
template <typename T> static inline bool kiln_signbit(T a) { return std::signbit((double)a); }
"""

HEADER_REDUCTIONS = "".join(
    f"#pragma omp declare reduction(k{op} : {t} : omp_out = kiln_{op}<{t}>(omp_out, omp_in)) "
    f"initializer(omp_priv = omp_orig)\n"
    for t in ("float", "double", "int64_t", "int32_t", "int16_t", "int8_t", "uint8_t", "bool")
    for op in ("max", "min"))


_MATH_MARKERS = re.compile(
    r"std::(?!numeric_limits|memcpy|make_unsigned)\w+|kiln_remainder|kiln_signbit|kiln_exp|kiln_tanh|kiln_erf")


def header_for(body: str) -> str:
    """The header a source with these kernels needs (the math part only where used)."""
    parts = [HEADER_BASE]
    if _MATH_MARKERS.search(body):
        parts.append(HEADER_MATH)
    parts.append(HEADER_REDUCTIONS)
    if "kiln_gemm(" in body:
        from .cpp_native import HEADER_GEMM
        parts.append(HEADER_GEMM)
    return "".join(parts)
