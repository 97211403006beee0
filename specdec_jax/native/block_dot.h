// Products with weights kept in their GGUF file's blocks (native/stored_blocks.py),
// activations quantised per row to int8: y[m, n] = x[m] . w[n] for M few rows.
// No XLA here: small_m_matmul.cc calls Product<Best> from its FFI handler, and
// block_dot_check.cc compares every compiled path with the reference.
//
// Every format reads as codes q (unsigned bytes) with a scale s and an offset o
// per group of weights: w = s * q + o (q4_k: s = d * sc, o = -dmin * m; q6_k:
// o = -32 s; q8_0: q + 128 with o = -128 s; ...). Each row of x is cut into
// chunks (64, 256 or 32 values, by format), each quantised to int8
// a = round(x * 127 / max |x|) with da = max |x| / 127, once per call. Products
// of codes and activations are exact integer sums of 4 (a "lane"), and a row's
// float work is a fixed sequence of multiplies, fused multiply-adds and (file
// layouts) one reduction tree over 16 lanes, per output row. The result for a
// row depends on that row of x and on w alone: a row gets the same bits
// whether it is multiplied alone or with 16 others, which is what makes
// speculative decoding exact with respect to this function.
//
// Paths (the design: one scalar reference of the integer sums, every SIMD path
// equal to it bit for bit, so exactness never depends on the CPU):
//   Reference  scalar C++ (this file): the oracle, compiled everywhere.
//   Avx512     AVX-512 VNNI + BW: a 512-bit register per 16 lanes (block_dot_avx512.h).
//   Avx256<1>  AVX-VNNI (or AVX-512 VNNI's 256-bit form): vpdpbusd on ymm.
//   Avx256<0>  AVX2 + FMA + F16C: vpmaddubsw / vpmaddwd (block_dot_avx2.h).
//   Neon       AArch64 NEON with dotprod: sdot (block_dot_neon.h).
// Best is the first of them the compiler targets; SPECDEC_BLOCKS_REFERENCE
// forces the reference. The integer sums are exact in every path (each
// bound is written where it is used), so only the float sequence matters: it
// is written once, in the reference, and each path performs the same
// operations in the same order per lane. Three things keep that true:
// - the build must not contract a * b + c into one fma where the reference
//   rounds twice: every build (cpu_kernels.py, the harness) passes
//   -ffp-contract=off, and the reference calls std::fma where SIMD fuses;
// - float16 scales are converted exactly (vcvtph2ps, HalfToFloat);
// - rounding to int8 is x86's cvtps2dq (nearest, ties to even; NaN or out of
//   range: INT32_MIN) then saturation, for finite activations (tiny chunks,
//   max |x| < 127 / FLT_MAX, make 127 / max infinite and their codes -128 in
//   every path). Activations with NaN are outside the identity: vmaxps and
//   std::max drop a NaN at different places.
// Everything is also the same bits in one floating-point environment only:
// XLA's threads flush denormals (FTZ / DAZ), the harness does not.

#ifndef SPECDEC_JAX_NATIVE_BLOCK_DOT_H_
#define SPECDEC_JAX_NATIVE_BLOCK_DOT_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#ifndef SPECDEC_UNROLL
#define SPECDEC_UNROLL _Pragma("GCC unroll 8")
#endif
// A pass's body in pieces (per unit of a format): inlined into the pass, so
// its accumulators stay in registers as if written there.
#define SPECDEC_INLINE inline __attribute__((always_inline))

namespace specdec {
namespace blocks {

enum Format : int32_t {
  kQ8_0 = 0, kQ4_1 = 1, kQ5_0 = 2, kQ4_K = 3, kQ6_K = 4, kQ4_KX16 = 5, kQ6_KX16 = 6, kQ5_0X16 = 7
};
constexpr int kNumFormats = 8;
inline const char* FormatName(int32_t f) {
  static const char* const kNames[kNumFormats] = {"q8_0", "q4_1", "q5_0", "q4_k",
                                                  "q6_k", "q4_k_x16", "q6_k_x16", "q5_0_x16"};
  return f >= 0 && f < kNumFormats ? kNames[f] : "?";
}

constexpr int kChunk = 64;   // file layouts q8_0, q4_1, q5_0: activations per scale, one unit
constexpr int kSuper = 256;  // k-quants: super-block, activations per scale

// The file layouts, per unit: the 32-weight formats two blocks at a time (a
// chunk), the k-quants a super-block. Their activations are quantised per unit.
template <int F> struct FileSpec;
template <> struct FileSpec<kQ8_0> { static constexpr int kWeights = kChunk, kBytes = 68; };
template <> struct FileSpec<kQ4_1> { static constexpr int kWeights = kChunk, kBytes = 40; };
template <> struct FileSpec<kQ5_0> { static constexpr int kWeights = kChunk, kBytes = 44; };
template <> struct FileSpec<kQ4_K> { static constexpr int kWeights = kSuper, kBytes = 144; };
template <> struct FileSpec<kQ6_K> { static constexpr int kWeights = kSuper, kBytes = 210; };

// Interleaved by 16 output rows (byte layouts: block_dot_avx512.h, where each
// format's pass says why it is laid out so).
constexpr int kX16Lanes = 16;
constexpr int64_t kX16Bytes = 32 + 32 + 128 + 128 + 2048;  // q4_k_x16, per super-block
constexpr int kX16Codes = 320;                              // its code lines
constexpr int64_t kX16Q6Bytes = 32 + 256 + 2048 + 1024;     // q6_k_x16, per super-block
constexpr int kX16Q6Low = 288, kX16Q6High = 288 + 2048;
constexpr int64_t kX16Q5Bytes = 32 + 256 + 64;              // q5_0_x16, per block of 32

// Per unit of an interleaved layout (16 rows of a super-block; q5_0: of a
// block of 32): its weights and bytes, and what the x86 passes ask for ahead
// of the unit they read: the unit kAhead bytes on, its first kHead bytes (the
// scales; q5_0: all of it) when a unit starts, each line of codes as it is
// read. q4_k: in a prototype of the AVX-512 loop, 2 super-blocks ahead beat 1 and 5.
template <int64_t Weights, int64_t Bytes, int64_t Ahead, int64_t Head>
struct X16Sizes {
  static constexpr int64_t kWeights = Weights, kBytes = Bytes, kAhead = Ahead, kHead = Head;
};
template <int F> struct X16Spec;
template <> struct X16Spec<kQ4_KX16> : X16Sizes<kSuper, kX16Bytes, 2 * kX16Bytes, kX16Codes> {};
template <> struct X16Spec<kQ6_KX16> : X16Sizes<kSuper, kX16Q6Bytes, 2 * kX16Q6Bytes, kX16Q6Low> {};
template <> struct X16Spec<kQ5_0X16> : X16Sizes<32, kX16Q5Bytes, 4 * kX16Q5Bytes, kX16Q5Bytes> {};

// The x86 paths' software prefetch (__builtin_prefetch(p, 0, 3): prefetcht0,
// what _mm_prefetch(p, _MM_HINT_T0) is; the NEON path asks for nothing). In a
// file's layout the weights stream from memory once per call, and a pass of
// several rows spends long enough on each unit that the hardware prefetcher
// falls behind on long rows (down's 8960 weights: 9 rows cost 1.3-2x as much
// with the matrix out of cache as in it). The first pass over a row (m0 == 0)
// asks for unit u's bytes kAheadBytes on (into the next row at a row's end:
// rows are contiguous): a chunk by its first and last byte (it spans at most
// two lines), a super-block 64 bytes at a time.
constexpr int64_t kAheadBytes = 2048;
template <int F>
inline void PrefetchAhead(const uint8_t* w_row, int64_t u) {
  constexpr int64_t kBytes = FileSpec<F>::kBytes;
  const char* ahead = reinterpret_cast<const char*>(w_row + (u + kAheadBytes / kBytes) * kBytes);
  if constexpr (FileSpec<F>::kWeights == kChunk) {
    __builtin_prefetch(ahead, 0, 3);
    __builtin_prefetch(ahead + kBytes - 1, 0, 3);
  } else {
    for (int l = 0; l < kBytes; l += 64) __builtin_prefetch(ahead + l, 0, 3);
  }
}
// An interleaved unit at p: its first kHead bytes kAhead on (X16Spec).
template <int F>
inline void PrefetchX16Ahead(const uint8_t* p) {
  const char* ahead = reinterpret_cast<const char*>(p + X16Spec<F>::kAhead);
  for (int l = 0; l < X16Spec<F>::kHead; l += 64) __builtin_prefetch(ahead + l, 0, 3);
}

// ---------------------------------------------------------------------------
// Activations, quantised once per call (the same values in every path; the
// layout of PassActivations follows the path's rows per pass).

// Per row and chunk of 64 (file layouts q8_0, q4_1, q5_0): int8 codes, scale,
// and per lane the sum of its 4 codes times the scale.
struct Activations {
  std::vector<int8_t> q;    // [M, K]
  std::vector<float> d;     // [M, K / 64]
  std::vector<float> sums;  // [M, K / 64, 16]
  int64_t chunks = 0;
};

// Per row and super-block of 256 (q4_k, q6_k: llama.cpp's Q8_K).
struct SuperActivations {
  std::vector<int8_t> q;      // [M, K]
  std::vector<float> d;       // [M, K / 256]
  std::vector<int16_t> sums;  // [M, K / 256, 16]: sums of the 16 groups of 16
  int64_t supers = 0;
};

// Per row and unit of `unit` values (interleaved layouts: a super-block of
// 256 for the k-quants, rounded as QuantizeSuper rounds, llama.cpp's Q8_K; a
// block of 32 for q5_0), grouped in passes of rows: codes as int32 words of 4
// (word k of row r of a pass at k * rows + r), so a broadcast of one row's 4
// codes is one load. One scale per 256 lets a k-quant pass keep a row's sum an
// exact integer through the whole super-block: its float steps come once per
// 256 weights, where a scale per 32 needed them once per 32 (at 6-16 rows the
// float steps were a third of an AVX-512 q4_k pass's instructions).
struct PassActivations {
  int64_t unit = 32;
  std::vector<int32_t> words;  // per pass: [K / 4][rows]
  std::vector<float> d;        // per pass: [K / unit][rows]: da
  // per pass: [K / 16][rows]: -32 times the integer sum of each 16 codes (q6_k's
  // sub-blocks of 16, whose weights are q - 32)
  std::vector<int32_t> q6_offset;
  std::vector<int32_t> asum;  // per pass: [K / 32][rows]: the integer sum of each 32 codes
  // per pass: [K / 32][rows]: the sums of each 32 codes' two halves of 16 as
  // int16 (low half first; |sum| <= 16 * 128), for one vpmaddwd with a pair of scales
  std::vector<int32_t> half_sums;
  // per pass: [K / 64][rows]: asum of blocks 2i and 2i + 1 as an int16 pair
  // (|asum| <= 32 * 128), for one vpmaddwd / vpdpwssd with q4_k's minimums
  std::vector<int32_t> pair_sums;
  std::vector<int64_t> first, rows;  // per pass: its first row of x and row count
};

// Rows of x per pass where passes are of equal size, at most max_rows each
// (9 rows, at most 12: one pass; 16: two of 8).
inline int64_t EqualPassRows(int64_t m_dim, int64_t max_rows) {
  const int64_t passes = (m_dim + max_rows - 1) / max_rows;
  return (m_dim + passes - 1) / passes;
}

inline void PlanPasses(int64_t m_dim, int64_t max_rows, PassActivations& a) {
  const int64_t per_pass = EqualPassRows(m_dim, max_rows);
  a.first.clear();
  a.rows.clear();
  for (int64_t m0 = 0; m0 < m_dim; m0 += per_pass) {
    a.first.push_back(m0);
    a.rows.push_back(std::min(per_pass, m_dim - m0));
  }
}

// Two int16 values in one int32 word, `low` in its low half (one operand of
// vpmaddwd / vpdpwssd broadcast per row).
inline int32_t Int16Pair(int32_t low, int32_t high) {
  return int32_t(uint32_t(uint16_t(low)) | uint32_t(uint16_t(high)) << 16);
}

inline void ResizePass(int64_t m_dim, int64_t k_dim, PassActivations& a) {
  a.words.resize(m_dim * k_dim / 4);
  a.d.resize(m_dim * k_dim / a.unit);
  a.q6_offset.resize(m_dim * k_dim / 16);
  a.asum.resize(m_dim * k_dim / 32);
  a.half_sums.resize(m_dim * k_dim / 32);
  a.pair_sums.resize(m_dim * k_dim / 64);
}

// Pass p of PassActivations as the interleaved passes read it: rows
// [m0, m0 + rows) of x, and where its arrays start (row r's word k at
// words[k * rows + r], its scale of block b at da[b * rows + r], ...).
struct PassView {
  int64_t m0, rows;
  const int32_t* words;
  const float* da;
  const int32_t *asum, *q6_offset, *half_sums, *pair_sums;
  PassView(const PassActivations& a, int64_t k_dim, size_t p)
      : m0(a.first[p]), rows(a.rows[p]), words(a.words.data() + m0 * k_dim / 4),
        da(a.d.data() + m0 * k_dim / a.unit), asum(a.asum.data() + m0 * k_dim / 32),
        q6_offset(a.q6_offset.data() + m0 * k_dim / 16), half_sums(a.half_sums.data() + m0 * k_dim / 32),
        pair_sums(a.pair_sums.data() + m0 * k_dim / 64) {}
};

// Row r of a pass, or row m of x whatever the pass layout (the reference and
// the harness read through it).
struct PassRow {
  PassView v;
  int64_t r;
  PassRow(const PassView& view, int64_t row) : v(view), r(row) {}
  PassRow(const PassActivations& a, int64_t k_dim, int64_t m) : v(a, k_dim, PassOf(a, m)), r(m - v.m0) {}
  static size_t PassOf(const PassActivations& a, int64_t m) {
    size_t p = 0;
    while (p + 1 < a.first.size() && a.first[p + 1] <= m) ++p;
    return p;
  }
  int8_t code(int64_t k) const {
    int32_t w = v.words[(k / 4) * v.rows + r];
    int8_t b[4];
    std::memcpy(b, &w, 4);
    return b[k % 4];
  }
  float d(int64_t u) const { return v.da[u * v.rows + r]; }  // of unit u
  int32_t asum(int64_t b) const { return v.asum[b * v.rows + r]; }
  int32_t q6_offset(int64_t j) const { return v.q6_offset[j * v.rows + r]; }
  int32_t half_sums(int64_t b) const { return v.half_sums[b * v.rows + r]; }
  int32_t pair_sums(int64_t i) const { return v.pair_sums[i * v.rows + r]; }
};

// Calls f(std::integral_constant<int, n>) for 1 <= n <= Max (larger n: Max):
// the row count of a pass as a template argument (its accumulators stay in
// registers).
template <typename Fn, int... N>
void ForRowCountIn(int64_t n, Fn&& f, std::integer_sequence<int, N...>) {
  ((n == N + 1 ? (f(std::integral_constant<int, N + 1>{}), 0) : 0), ...);
}
template <int Max, typename Fn>
void ForRowCount(int64_t n, Fn&& f) {
  ForRowCountIn(std::min<int64_t>(n, Max), f, std::make_integer_sequence<int, Max>{});
}

// ---------------------------------------------------------------------------
// Scalar pieces every path agrees with.

// float16 -> float32, exactly (as vcvtph2ps: subnormals kept, NaN made quiet).
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13) | (mantissa ? 0x400000u : 0u);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else {
    const float f = float(mantissa) * 5.9604644775390625e-08f;  // mantissa * 2^-24, exact
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline float HalfAt(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return HalfToFloat(h);
}

// x86's cvtps2dq in the default rounding mode: nearest, ties to even; NaN and
// values out of int32's range give INT32_MIN ("integer indefinite").
inline int32_t RoundToInt32(float v) {
  if (!(v >= -2147483648.0f && v < 2147483648.0f)) return INT32_MIN;
  return int32_t(std::nearbyint(v));
}
inline int8_t SaturateToInt8(int32_t v) { return int8_t(std::min(127, std::max(-128, v))); }
inline int16_t SaturateToInt16(int32_t v) { return int16_t(std::min(32767, std::max(-32768, v))); }
// int32 sums that wrap as the SIMD adds do (they only can on INT32_MIN codes).
inline int32_t WrapAdd(int32_t a, int32_t b) { return int32_t(uint32_t(a) + uint32_t(b)); }
inline int32_t WrapMul(int32_t a, int32_t b) { return int32_t(uint32_t(a) * uint32_t(b)); }

// The sum of 16 lanes in the order of GCC's _mm512_reduce_add_ps, which every
// path follows: lanes i and i + 8, then i and i + 4, then i and i + 2, then 0 and 1.
inline float Sum16(const float a[16]) {
  float t[8], u[4];
  for (int i = 0; i < 8; ++i) t[i] = a[i + 8] + a[i];
  for (int i = 0; i < 4; ++i) u[i] = t[i + 4] + t[i];
  const float v0 = u[0] + u[2], v1 = u[1] + u[3];
  return v0 + v1;
}

// q4_k's 12 bytes k[0..11] of 8 six-bit scales and 8 six-bit minimums, as
// bytes (the x86 paths; the reference decodes them one at a time): scale j < 4
// is k[j] & 63 and j >= 4 is (k[j + 4] & 15) | (k[j - 4] >> 6) << 4; minimum
// j < 4 is k[j + 4] & 63 and j >= 4 is (k[j + 4] >> 4) | (k[j] >> 6) << 4
// (llama.cpp's get_scale_min_k4). Four bytes at a time, as 32-bit words.
inline void Q4KScalesMins(const uint8_t* k, uint32_t scales[2], uint32_t minimums[2]) {
  uint32_t w[3];
  std::memcpy(w, k, 12);
  const uint32_t low6 = 0x3F3F3F3Fu, low4 = 0x0F0F0F0Fu, low2 = 0x03030303u;
  scales[0] = w[0] & low6;
  scales[1] = (w[2] & low4) | (((w[0] >> 6) & low2) << 4);
  minimums[0] = w[1] & low6;
  minimums[1] = ((w[2] >> 4) & low4) | (((w[1] >> 6) & low2) << 4);
}

// One chunk of n values: the rounded values before saturation (their sums are
// the SIMD paths' sums of cvtps2dq's results) and the chunk's scale.
inline float QuantizeValues(const float* x, int n, int32_t* r) {
  float top = 0.0f;
  for (int i = 0; i < n; ++i) top = std::max(top, std::fabs(x[i]));
  const float inv = top > 0.0f ? 127.0f / top : 0.0f;
  for (int i = 0; i < n; ++i) r[i] = RoundToInt32(x[i] * inv);
  return top / 127.0f;
}

// ---------------------------------------------------------------------------
// The reference: scalar, one row at a time, written from the file formats and
// the layouts' descriptions, not from the SIMD code.
namespace ref {

// The activations' rounding, a unit at a time (the loops around it and the
// layouts: Quantize<P>): the codes, the sums each layout needs, and the scale.
struct Quantizers {
  // A chunk of 64: per lane the saturated codes' sum times the scale.
  static float QuantizeChunk(const float* x, int8_t q[kChunk], float sums[16]) {
    int32_t r[kChunk];
    const float d = QuantizeValues(x, kChunk, r);
    for (int i = 0; i < kChunk; ++i) q[i] = SaturateToInt8(r[i]);
    for (int lane = 0; lane < 16; ++lane) {  // the saturated codes' sums
      const int32_t s = q[4 * lane] + q[4 * lane + 1] + q[4 * lane + 2] + q[4 * lane + 3];
      sums[lane] = float(s) * d;
    }
    return d;
  }
  // A super-block of 256: per group of 16 the rounded values' sum.
  static float QuantizeSuper(const float* x, int8_t q[kSuper], int16_t sums[16]) {
    int32_t r[kSuper];
    const float d = QuantizeValues(x, kSuper, r);
    for (int i = 0; i < kSuper; ++i) q[i] = SaturateToInt8(r[i]);
    for (int g = 0; g < 16; ++g) {  // the rounded values' sums, truncated to int16
      int32_t s = 0;
      for (int i = 0; i < 16; ++i) s = WrapAdd(s, r[16 * g + i]);
      sums[g] = int16_t(uint16_t(uint32_t(s)));
    }
    return d;
  }
  // A block of 32: the rounded values' sums of its halves.
  static float QuantizeBlock32(const float* x, int8_t q[32], int32_t& low, int32_t& high) {
    int32_t r[32];
    const float d = QuantizeValues(x, 32, r);
    for (int i = 0; i < 32; ++i) q[i] = SaturateToInt8(r[i]);
    low = high = 0;
    for (int j = 0; j < 16; ++j) low = WrapAdd(low, r[j]);
    for (int j = 16; j < 32; ++j) high = WrapAdd(high, r[j]);
    return d;
  }
};

// A unit of the 32-weight formats (two blocks): 64 codes in weight order, and
// per lane of 4 weights the scale s and offset o (w = s * q + o).
template <int F>
inline void UnitCodes(const uint8_t* b, uint8_t q[64], float s[16], float o[16]) {
  for (int blk = 0; blk < 2; ++blk) {
    float scale, offset;
    if constexpr (F == kQ8_0) {  // d, then 32 int8 codes; q + 128 as unsigned
      const uint8_t* p = b + 34 * blk;
      scale = HalfAt(p);
      offset = scale * -128.0f;
      for (int j = 0; j < 32; ++j) q[32 * blk + j] = uint8_t(p[2 + j] ^ 0x80);
    } else if constexpr (F == kQ4_1) {  // d, m, then weight j (< 16) in byte j's low nibble, j + 16 in its high
      const uint8_t* p = b + 20 * blk;
      scale = HalfAt(p);
      offset = HalfAt(p + 2);
      for (int j = 0; j < 16; ++j) {
        q[32 * blk + j] = p[4 + j] & 15;
        q[32 * blk + 16 + j] = p[4 + j] >> 4;
      }
    } else {  // q5_0: d, qh (bit j: weight j's fifth bit), then nibbles as q4_1
      const uint8_t* p = b + 22 * blk;
      scale = HalfAt(p);
      offset = scale * -16.0f;
      uint32_t qh;
      std::memcpy(&qh, p + 2, 4);
      for (int j = 0; j < 16; ++j) {
        q[32 * blk + j] = uint8_t((p[6 + j] & 15) | ((qh >> j) & 1) << 4);
        q[32 * blk + 16 + j] = uint8_t((p[6 + j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
      }
    }
    for (int lane = 8 * blk; lane < 8 * blk + 8; ++lane) {
      s[lane] = scale;
      o[lane] = offset;
    }
  }
}

// One output of a 32-weight format: per chunk and lane
//   acc = fma(float(isum) * s, da, acc); acc = fma(o, da * lane's code sum, acc)
// then the 16 lanes' sum.
template <int F>
float UnitRow(const uint8_t* w_row, const Activations& a, int64_t k_dim, int64_t m) {
  float acc[16] = {};
  uint8_t q[64];
  float s[16], o[16];
  for (int64_t c = 0; c < a.chunks; ++c) {
    UnitCodes<F>(w_row + c * FileSpec<F>::kBytes, q, s, o);
    const int8_t* act = a.q.data() + m * k_dim + c * kChunk;
    const float da = a.d[m * a.chunks + c];
    const float* sums = a.sums.data() + (m * a.chunks + c) * 16;
    for (int lane = 0; lane < 16; ++lane) {
      int32_t isum = 0;
      for (int i = 4 * lane; i < 4 * lane + 4; ++i) isum += int32_t(q[i]) * act[i];
      acc[lane] = std::fma(float(isum) * s[lane], da, acc[lane]);
      acc[lane] = std::fma(o[lane], sums[lane], acc[lane]);
    }
  }
  return Sum16(acc);
}

// A k-quant super-block: 256 codes in weight order, d and dmin, and the
// integer scale and minimum of each group of 16 weights (w = d sc q - dmin mn).
template <int F>
inline void SuperCodes(const uint8_t* b, uint8_t q[256], float& d, float& dmin, int16_t sc[16],
                       int16_t mn[16]) {
  if constexpr (F == kQ4_K) {
    // d, dmin, 12 bytes of 6-bit scales and minimums (llama.cpp's
    // get_scale_min_k4), then per 64 weights 32 bytes: low nibbles the first 32.
    d = HalfAt(b);
    dmin = HalfAt(b + 2);
    const uint8_t* k = b + 4;
    for (int j = 0; j < 8; ++j) {
      const int s = j < 4 ? k[j] & 63 : (k[j + 4] & 15) | ((k[j - 4] >> 6) << 4);
      const int m = j < 4 ? k[j + 4] & 63 : (k[j + 4] >> 4) | ((k[j] >> 6) << 4);
      sc[2 * j] = sc[2 * j + 1] = int16_t(s);
      mn[2 * j] = mn[2 * j + 1] = int16_t(m);
    }
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        q[64 * c + l] = b[16 + 32 * c + l] & 15;
        q[64 * c + 32 + l] = b[16 + 32 * c + l] >> 4;
      }
    }
  } else {
    // ql[128], qh[64], int8 scales[16], d (llama.cpp's dequantize_row_q6_K);
    // w = d sc (q - 32): the minimum of a group is 32 sc.
    d = dmin = HalfAt(b + 208);
    for (int g = 0; g < 16; ++g) {
      sc[g] = int8_t(b[192 + g]);
      mn[g] = int16_t(32 * sc[g]);
    }
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = b + 64 * h;
      const uint8_t* qh = b + 128 + 32 * h;
      for (int l = 0; l < 32; ++l) {
        q[128 * h + l] = uint8_t((ql[l] & 15) | ((qh[l] >> 0) & 3) << 4);
        q[128 * h + l + 32] = uint8_t((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4);
        q[128 * h + l + 64] = uint8_t((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4);
        q[128 * h + l + 96] = uint8_t((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4);
      }
    }
  }
}

// One output of a k-quant in its file's layout. Per super-block, the lane
// sums t (4 weights each) of its four chunks of 64 are paired as vpackssdw
// pairs them: chunk pair h, element e = 8k + j (k the 128-bit lane) holds
// chunk 2h + j / 4's lane 4k + j % 4, saturated to int16 (never reached:
// |t| <= 4 * 63 * 128). Integer lane i sums elements 2i and 2i + 1 of both
// pairs, each times its group's scale (vpdpwssd). Then per lane
//   v = fma(float(isum), d, -low); acc = fma(v, da, acc)
// with low (lanes 0-7) = float(mn[2i] s[2i] + mn[2i+1] s[2i+1]) * dmin over the
// activations' group sums s (0 in lanes 8-15), and the 16 lanes' sum.
template <int F>
float KRow(const uint8_t* w_row, const SuperActivations& a, int64_t k_dim, int64_t m) {
  float acc[16] = {};
  uint8_t q[256];
  int16_t sc[16], mn[16];
  float d, dmin;
  for (int64_t u = 0; u < a.supers; ++u) {
    SuperCodes<F>(w_row + u * FileSpec<F>::kBytes, q, d, dmin, sc, mn);
    const int8_t* act = a.q.data() + m * k_dim + u * kSuper;
    int32_t isum[16] = {};
    for (int h = 0; h < 2; ++h) {
      int32_t t[2][16];
      for (int c = 0; c < 2; ++c) {
        for (int lane = 0; lane < 16; ++lane) {
          int32_t s = 0;
          for (int i = 0; i < 4; ++i) {
            const int w = 128 * h + 64 * c + 4 * lane + i;
            s += int32_t(q[w]) * act[w];
          }
          t[c][lane] = s;
        }
      }
      for (int i = 0; i < 16; ++i) {
        for (int e = 2 * i; e < 2 * i + 2; ++e) {
          const int k = e / 8, j = e % 8, c = j / 4, lane = 4 * k + j % 4;
          const int group = (128 * h + 64 * c + 4 * lane) / 16;
          isum[i] += int32_t(SaturateToInt16(t[c][lane])) * sc[group];
        }
      }
    }
    const int16_t* s = a.sums.data() + (m * a.supers + u) * 16;
    const float da = a.d[m * a.supers + u];
    for (int i = 0; i < 16; ++i) {
      const float low = i < 8 ? float(int32_t(mn[2 * i]) * s[2 * i] +
                                      int32_t(mn[2 * i + 1]) * s[2 * i + 1]) * dmin
                              : 0.0f;
      const float v = std::fma(float(isum[i]), d, -low);
      acc[i] = std::fma(v, da, acc[i]);
    }
  }
  return Sum16(acc);
}

// One output (lane `lane` of a group of 16 rows) of q4_k_x16: per
// super-block u, with activations of one scale da, the exact integers
//   total = sum over sub-blocks j of sc_j * isum_j,  mins = sum over j of mn_j * asum_j,
// (|total| <= 8 * 63 * 32 * 15 * 128, |mins| <= 8 * 63 * 32 * 128: int32), then
//   acc = fma(float(total), d * da, acc); acc = fma(-float(mins), dmin * da, acc).
inline float X16Q4Row(const uint8_t* group, int64_t supers, const PassRow& x, int lane) {
  float acc = 0.0f;
  for (int64_t u = 0; u < supers; ++u) {
    const uint8_t* p = group + u * kX16Bytes;
    const float d = HalfAt(p + 2 * lane), dmin = HalfAt(p + 32 + 2 * lane);
    int32_t total = 0, mins = 0;
    for (int j = 0; j < 8; ++j) {
      int32_t isum = 0;
      for (int t = 0; t < 4; ++t) {
        for (int b = 0; b < 4; ++b) {  // low nibble: weight 32j + 8t + b; high: + 4
          const uint8_t byte = p[kX16Codes + (4 * j + t) * 64 + 4 * lane + b];
          const int64_t k = 256 * u + 32 * j + 8 * t + b;
          isum += int32_t(byte & 15) * x.code(k) + int32_t(byte >> 4) * x.code(k + 4);
        }
      }
      total += int32_t(p[64 + 16 * j + lane]) * isum;
      mins += int32_t(p[192 + 16 * j + lane]) * x.asum(8 * u + j);
    }
    acc = std::fma(float(total), d * x.d(u), acc);
    acc = std::fma(-float(mins), dmin * x.d(u), acc);
  }
  return acc;
}

// The code of weight 4k + b of one lane (byte i = 4 lane + b of a 64-byte
// line) in the x16 layouts whose codes are split in two: its low nibble in
// line k / 2 of `lines` (the high nibble for odd k), its top `bits` bits at
// bit bits * k of `high`'s byte (q6_k: 2 bits, q5_0: 1).
inline int32_t X16Code(const uint8_t* lines, const uint8_t* high, int bits, int k, int i) {
  const int32_t low = (lines[64 * (k / 2) + i] >> (4 * (k % 2))) & 15;
  return low | ((high[i] >> (bits * k)) & ((1 << bits) - 1)) << 4;
}

// q6_k_x16: per super-block u (activations of one scale da), the exact
// integer sum over its sub-blocks j of 16 of sc_j * (sum of q a - 32 * sum of
// a) (|sum| <= 16 * 128 * 16 * 127 * (63 + 32): int32), then
//   acc = fma(float(sum), d * da, acc).
inline float X16Q6Row(const uint8_t* group, int64_t supers, const PassRow& x, int lane) {
  float acc = 0.0f;
  for (int64_t u = 0; u < supers; ++u) {
    const uint8_t* p = group + u * kX16Q6Bytes;
    const float d = HalfAt(p + 2 * lane);
    int32_t total = 0;
    for (int j = 0; j < 16; ++j) {
      const int32_t sc = int8_t(p[32 + 16 * j + lane]);
      int32_t isum = x.q6_offset(16 * u + j);
      for (int k = 0; k < 4; ++k) {
        for (int b = 0; b < 4; ++b) {  // weight 16j + 4k + b
          const int32_t code = X16Code(p + kX16Q6Low + 128 * j, p + kX16Q6High + 64 * j, 2,
                                       k, 4 * lane + b);
          isum = WrapAdd(isum, code * x.code(256 * u + 16 * j + 4 * k + b));
        }
      }
      total = WrapAdd(total, WrapMul(isum, sc));
    }
    acc = std::fma(float(total), d * x.d(u), acc);
  }
  return acc;
}

// q5_0_x16: per block of 32, acc = fma(float(sum of q a - 16 asum), d * da, acc).
inline float X16Q5Row(const uint8_t* group, int64_t blocks, const PassRow& x, int lane) {
  float acc = 0.0f;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const uint8_t* p = group + blk * kX16Q5Bytes;
    const float d = HalfAt(p + 2 * lane);
    int32_t isum = WrapMul(-16, x.asum(blk));
    for (int k = 0; k < 8; ++k) {
      for (int b = 0; b < 4; ++b) {  // weight 4k + b: line k / 2, nibble k % 2; fifth bit k
        const int32_t code = X16Code(p + 32, p + 288, 1, k, 4 * lane + b);
        isum = WrapAdd(isum, code * x.code(32 * blk + 4 * k + b));
      }
    }
    acc = std::fma(float(isum), d * x.d(blk), acc);
  }
  return acc;
}

}  // namespace ref

// The reference as a path (the interface every path has: Product<P> below):
// one row of x at a time, its activations in a pass of their own.
struct Reference : ref::Quantizers {
  static constexpr const char* kName = "scalar";
  static constexpr int kMaxMPerBlockPass = 1, kMaxMPerKPass = 1, kMaxMPerX16Pass = 1, kX16Parts = 1,
                       kX16WholeRows = 1;
  template <int F, int MB>
  static void RowPass(const uint8_t* w_row, const Activations& a, int64_t k_dim, int64_t m0, float* y,
                      int64_t n_dim, int64_t n) {
    y[m0 * n_dim + n] = ref::UnitRow<F>(w_row, a, k_dim, m0);
  }
  template <int F, int MB>
  static void KRowPass(const uint8_t* w_row, const SuperActivations& a, int64_t k_dim, int64_t m0,
                       float* y, int64_t n_dim, int64_t n) {
    y[m0 * n_dim + n] = ref::KRow<F>(w_row, a, k_dim, m0);
  }
  template <int F, int MB>
  static void X16Pass(const uint8_t* group, int64_t units, const PassView& pass, float* y, int64_t n_dim,
                      int64_t lane0, int) {
    const PassRow x(pass, 0);
    for (int lane = 0; lane < kX16Lanes; ++lane) {
      float v;
      if constexpr (F == kQ4_KX16) v = ref::X16Q4Row(group, units, x, lane);
      else if constexpr (F == kQ6_KX16) v = ref::X16Q6Row(group, units, x, lane);
      else v = ref::X16Q5Row(group, units, x, lane);
      y[pass.m0 * n_dim + lane0 + lane] = v;
    }
  }
};

// The codes of the x16 layouts that split a code in two, at any x86 vector
// width (q6_k_x16: 2 lines, 2 high bits, 4 codes; q5_0_x16: 4 lines, 1 bit, 8
// codes): code k's low nibble is the low (k even) or high (k odd) nibble of
// line k / 2's bytes, its top kBits bits sit at bit kBits * k of h's. V is
// __m256i or __m512i, GCC vector types whose & and | are the bitwise
// operations; the shifts are 16-bit ones (vpsllw / vpsrlw), and the byte
// masks keep only bits that never crossed a byte.
template <int kBits, int kLines, class V>
SPECDEC_INLINE void X16SplitCodes(const V (&lines)[kLines], V h, V (&codes)[2 * kLines]) {
  typedef uint16_t Words __attribute__((vector_size(sizeof(V))));
  const V low4 = V{} + 0x0F0F0F0F0F0F0F0FLL;
  const V top = V{} + 0x0101010101010101LL * (((1 << kBits) - 1) << 4);
  _Pragma("GCC unroll 8") for (int k = 0; k < 2 * kLines; ++k) {
    const V low = k % 2 ? V(Words(lines[k / 2]) >> 4) : lines[k / 2];
    const int shift = 4 - kBits * k;  // moves code k's top bits to bit 4
    const V high = shift >= 0 ? V(Words(h) << shift) : V(Words(h) >> -shift);
    codes[k] = (low & low4) | (high & top);
  }
}

}  // namespace blocks
}  // namespace specdec

// The SIMD paths, each where the compiler targets its instructions.
#if !defined(SPECDEC_BLOCKS_REFERENCE)
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include "block_dot_avx512.h"
#endif
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "block_dot_avx2.h"
#endif
#if defined(__aarch64__) && defined(__ARM_NEON) && defined(__ARM_FEATURE_DOTPROD)
#include "block_dot_neon.h"
#endif
#endif

namespace specdec {
namespace blocks {

// The path this build runs: the widest the compiler targets.
#if defined(SPECDEC_BLOCKS_AVX512)
using Best = Avx512;
#elif defined(SPECDEC_BLOCKS_AVXVNNI)
using Best = Avx256<true>;
#elif defined(SPECDEC_BLOCKS_AVX2)
using Best = Avx256<false>;
#elif defined(SPECDEC_BLOCKS_NEON)
using Best = Neon;
#else
using Best = Reference;
#endif
constexpr bool kBestIsSimd = !std::is_same<Best, Reference>::value;

// ---------------------------------------------------------------------------
// What every path shares: the loops around its rounding of activations and
// its passes. A path P (Reference above; Avx512, Avx256<kVnni> and Neon in
// their headers) provides
//   kName;
//   the rounding of one unit of a row of x, each returning the unit's scale:
//     QuantizeChunk(x, q[64], sums[16]), QuantizeSuper(x, q[256], sums[16]),
//     QuantizeBlock32(x, q[32], low, high) (as ref::Quantizers);
//   the passes, MB rows of x (a template argument: its accumulators stay in
//   registers) times one row of w in its file's layout, or one part of a
//   group of 16 rows interleaved:
//     RowPass<F, MB>(w_row, a, k_dim, m0, y, n_dim, n)      q8_0, q4_1, q5_0
//     KRowPass<F, MB>(w_row, a, k_dim, m0, y, n_dim, n)     q4_k, q6_k
//     X16Pass<F, MB>(group, units, pass, y, n_dim, lane0, part)   the x16 layouts
//   and the most rows of each pass (kMaxMPerBlockPass, kMaxMPerKPass,
//   kMaxMPerX16Pass) and how many parts a group of 16 rows is read in
//   (kX16Parts: as many as its registers need for 16 lanes), except passes
//   of at most kX16WholeRows rows, which read the whole group in one part.

// Per row of x and unit of kPer values: round(x, codes, sums) -> scale.
template <int kPer, auto Round, class A>
void QuantizeUnits(const float* x, int64_t m_dim, int64_t k_dim, int64_t& units, A& a) {
  units = k_dim / kPer;
  a.q.resize(m_dim * k_dim);
  a.d.resize(m_dim * units);
  a.sums.resize(m_dim * units * 16);
  for (int64_t m = 0; m < m_dim; ++m) {
    for (int64_t u = 0; u < units; ++u) {
      const int64_t mu = m * units + u;
      a.d[mu] = Round(x + m * k_dim + u * kPer, a.q.data() + m * k_dim + u * kPer, a.sums.data() + mu * 16);
    }
  }
}
template <class P>
void Quantize(const float* x, int64_t m_dim, int64_t k_dim, Activations& a) {
  QuantizeUnits<kChunk, P::QuantizeChunk>(x, m_dim, k_dim, a.chunks, a);
}
template <class P>
void Quantize(const float* x, int64_t m_dim, int64_t k_dim, SuperActivations& a) {
  QuantizeUnits<kSuper, P::QuantizeSuper>(x, m_dim, k_dim, a.supers, a);
}
// The interleaved layouts' activations, in the path's passes of rows, a
// scale per `unit` values (X16Spec<F>::kWeights: 256 or 32).
template <class P>
void Quantize(const float* x, int64_t m_dim, int64_t k_dim, int64_t unit, PassActivations& a) {
  PlanPasses(m_dim, P::kMaxMPerX16Pass, a);
  a.unit = unit;
  ResizePass(m_dim, k_dim, a);
  for (size_t p = 0; p < a.first.size(); ++p) {
    const int64_t m0 = a.first[p], rows = a.rows[p];
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t u = 0; u < k_dim / unit; ++u) {
        alignas(64) int8_t codes[kSuper];
        int32_t sums[16];  // of each 16 codes
        const float* xu = x + (m0 + i) * k_dim + unit * u;
        if (unit == kSuper) {
          int16_t s16[16];
          a.d[m0 * k_dim / unit + u * rows + i] = P::QuantizeSuper(xu, codes, s16);
          for (int g = 0; g < 16; ++g) sums[g] = s16[g];
        } else {
          a.d[m0 * k_dim / unit + u * rows + i] = P::QuantizeBlock32(xu, codes, sums[0], sums[1]);
        }
        for (int64_t g = 0; g < unit / 16; ++g)
          a.q6_offset[m0 * k_dim / 16 + (unit / 16 * u + g) * rows + i] = WrapMul(-32, sums[g]);
        for (int64_t c = 0; c < unit / 32; ++c) {
          const int64_t at = m0 * k_dim / 32 + (unit / 32 * u + c) * rows + i;
          const int32_t low = sums[2 * c], high = sums[2 * c + 1];
          a.asum[at] = WrapAdd(low, high);
          a.half_sums[at] = Int16Pair(low, high);
        }
        for (int64_t c = 0; c < unit / 64; ++c)
          a.pair_sums[m0 * k_dim / 64 + (unit / 64 * u + c) * rows + i] =
              Int16Pair(WrapAdd(sums[4 * c], sums[4 * c + 1]), WrapAdd(sums[4 * c + 2], sums[4 * c + 3]));
        for (int64_t w = 0; w < unit / 4; ++w)
          std::memcpy(&a.words[m0 * k_dim / 4 + (unit / 4 * u + w) * rows + i], codes + 4 * w, 4);
      }
    }
  }
}

// Rows [begin, end) of w in a file layout, each times x in passes of rows:
// steps of the path's most rows (the 32-weight formats), or passes of equal
// size (the k-quants: each pass unpacks the row's codes once more).
template <class P, int F, class A>
void FileRows(const uint8_t* w, int64_t row_bytes, const A& a, int64_t m_dim, int64_t k_dim, float* y,
              int64_t n_dim, int64_t begin, int64_t end) {
  constexpr bool kK = FileSpec<F>::kWeights == kSuper;
  constexpr int kMax = kK ? P::kMaxMPerKPass : P::kMaxMPerBlockPass;
  const int64_t step = kK ? EqualPassRows(m_dim, kMax) : kMax;
  for (int64_t n = begin; n < end; ++n) {
    const uint8_t* w_row = w + n * row_bytes;
    for (int64_t m0 = 0; m0 < m_dim; m0 += step) {
      ForRowCount<kMax>(std::min(step, m_dim - m0), [&](auto rows) {
        constexpr int kRows = decltype(rows)::value;
        if constexpr (kK) P::template KRowPass<F, kRows>(w_row, a, k_dim, m0, y, n_dim, n);
        else P::template RowPass<F, kRows>(w_row, a, k_dim, m0, y, n_dim, n);
      });
    }
  }
}

// Groups [begin, end) of 16 rows of w interleaved, each times x per pass of
// rows and per part of the group.
template <class P, int F>
void X16Groups(const uint8_t* w, int64_t units, const PassActivations& a, int64_t k_dim, float* y,
               int64_t n_dim, int64_t begin, int64_t end) {
  for (int64_t g = begin; g < end; ++g) {
    const uint8_t* group = w + g * units * X16Spec<F>::kBytes;
    for (size_t p = 0; p < a.first.size(); ++p) {
      const PassView pass(a, k_dim, p);
      const int parts = pass.rows <= P::kX16WholeRows ? 1 : P::kX16Parts;
      for (int part = 0; part < parts; ++part) {
        ForRowCount<P::kMaxMPerX16Pass>(pass.rows, [&](auto rows) {
          P::template X16Pass<F, decltype(rows)::value>(group, units, pass, y, n_dim, g * kX16Lanes, part);
        });
      }
    }
  }
}

// A product on path P. `parallel(items, tile, fn)` runs fn(begin, end) over
// chunks of [0, items) made of whole tiles (small_m_matmul.cc: the calling
// thread and its helpers; the harness: in turn). Returns nullptr, or why the
// arguments are not a product of this format.
template <class P, int F, class Parallel>
const char* RunFile(const float* x, const uint8_t* w, float* y, int64_t m_dim, int64_t k_dim,
                    int64_t n_dim, int64_t row_bytes, Parallel&& parallel) {
  using Spec = FileSpec<F>;
  if (k_dim % Spec::kWeights != 0 || row_bytes != k_dim / Spec::kWeights * Spec::kBytes)
    return "block_matmul: rows of w do not hold K weights of this format";
  std::conditional_t<Spec::kWeights == kSuper, SuperActivations, Activations> a;
  Quantize<P>(x, m_dim, k_dim, a);
  parallel(n_dim, 4, [&](int64_t begin, int64_t end) {
    FileRows<P, F>(w, row_bytes, a, m_dim, k_dim, y, n_dim, begin, end);
  });
  return nullptr;
}

template <class P, int F, class Parallel>
const char* RunX16(const float* x, const uint8_t* w, float* y, int64_t m_dim, int64_t k_dim,
                   int64_t n_dim, int64_t row_bytes, Parallel&& parallel) {
  // a "unit": a super-block of 256 weights (the k-quants) or a block of 32 (q5_0)
  using Spec = X16Spec<F>;
  const int64_t units = k_dim / Spec::kWeights;
  if (k_dim % Spec::kWeights != 0 || k_dim % 32 != 0 || n_dim % kX16Lanes != 0 ||
      row_bytes * kX16Lanes != units * Spec::kBytes)
    return "block_matmul: w is not a format interleaved by 16 rows of K weights "
           "(stored_blocks.interleave)";
  PassActivations a;
  Quantize<P>(x, m_dim, k_dim, Spec::kWeights, a);
  parallel(n_dim / kX16Lanes, 1, [&](int64_t begin, int64_t end) {
    X16Groups<P, F>(w, units, a, k_dim, y, n_dim, begin, end);
  });
  return nullptr;
}

template <class P, class Parallel>
const char* Product(int32_t format, const float* x, const uint8_t* w, float* y, int64_t m_dim,
                    int64_t k_dim, int64_t n_dim, int64_t row_bytes, Parallel&& parallel) {
  switch (format) {
    case kQ8_0: return RunFile<P, kQ8_0>(x, w, y, m_dim, k_dim, n_dim, row_bytes, parallel);
    case kQ4_1: return RunFile<P, kQ4_1>(x, w, y, m_dim, k_dim, n_dim, row_bytes, parallel);
    case kQ5_0: return RunFile<P, kQ5_0>(x, w, y, m_dim, k_dim, n_dim, row_bytes, parallel);
    case kQ4_K: return RunFile<P, kQ4_K>(x, w, y, m_dim, k_dim, n_dim, row_bytes, parallel);
    case kQ6_K: return RunFile<P, kQ6_K>(x, w, y, m_dim, k_dim, n_dim, row_bytes, parallel);
    case kQ4_KX16: return RunX16<P, kQ4_KX16>(x, w, y, m_dim, k_dim, n_dim, row_bytes, parallel);
    case kQ6_KX16: return RunX16<P, kQ6_KX16>(x, w, y, m_dim, k_dim, n_dim, row_bytes, parallel);
    case kQ5_0X16: return RunX16<P, kQ5_0X16>(x, w, y, m_dim, k_dim, n_dim, row_bytes, parallel);
    default: return "block_matmul: unknown block format";
  }
}

}  // namespace blocks
}  // namespace specdec

#endif  // SPECDEC_JAX_NATIVE_BLOCK_DOT_H_
