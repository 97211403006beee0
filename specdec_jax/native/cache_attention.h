// Grouped-query attention of a few queries over a heads-major cache, each query
// computed alone: the attention of a decode step and of a scoring call on CPU.
//
// Why a kernel of our own: a decoder that is one function of each row
// (DecoderConfig.row_independent) must score each query of a G + 1 scoring
// call as a one-token step scores its one. Through XLA that is one attention
// per query, one after another (models/decoder_only.py, blocked_attention):
// K passes of small einsums, a softmax and a masked select over the whole
// cache buffer, whose cost grew with the cache far beyond its bytes (the 1.5B's
// 28 layers: 4.3 ms a step at 320 positions, 9.4 ms at 640, on 2 cores). Here
// each query's sums run in one fixed order whatever the other queries of the
// call, so the row independence is the code's, not a loop's; positions the mask
// hides take no part in any sum (a hidden key beside visible ones in a group of
// four is scored and dropped, never weighted); the positions go in blocks that
// stay in the level-1 cache across the query heads, four keys at a time; and
// the weighted sum of the values stays in registers, 32 dimensions at a time,
// across the positions.
//
// out = softmax(scale * q . keys^T over the visible positions) . values, in
// float32. A query that sees no position gets the plain mean of every
// position's values, as XLA's formulation gives it (all scores equal there).
//
// No XLA here: small_m_matmul.cc wraps it as a handler.

#ifndef SPECDEC_JAX_NATIVE_CACHE_ATTENTION_H_
#define SPECDEC_JAX_NATIVE_CACHE_ATTENTION_H_

#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace specdec {
namespace attention {

// sum_i a[i] * b[i] in a fixed order: kLanes running sums (independent chains of
// vector registers once the compiler vectorises the lane loops), halved pairwise.
inline float Dot(const float* a, const float* b, int64_t n) {
  constexpr int kLanes = 32;
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lanes[l] += a[i + l] * b[i + l];
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  for (int l = 0; l < 16; ++l) lanes[l] += lanes[l + 16];
  for (int l = 0; l < 8; ++l) lanes[l] += lanes[l + 8];
  for (int l = 0; l < 4; ++l) lanes[l] += lanes[l + 4];
  return ((lanes[0] + lanes[2]) + (lanes[1] + lanes[3])) + tail;
}

// The scores of four positions (key rows k, k + n, k + 2n, k + 3n) with one
// query, n a multiple of 8: 8 running sums a position (a vector register each;
// the query's 8 values loaded once for the four keys), added pairwise. A
// position's sum never depends on the other three, so a hidden position of the
// group (read here only) reaches no score that is kept.
inline void Dot4(const float* a, const float* k, int64_t n, float out[4]) {
#if defined(__AVX__)
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 x = _mm256_loadu_ps(a + i);
    s0 = _mm256_add_ps(s0, _mm256_mul_ps(x, _mm256_loadu_ps(k + i)));
    s1 = _mm256_add_ps(s1, _mm256_mul_ps(x, _mm256_loadu_ps(k + n + i)));
    s2 = _mm256_add_ps(s2, _mm256_mul_ps(x, _mm256_loadu_ps(k + 2 * n + i)));
    s3 = _mm256_add_ps(s3, _mm256_mul_ps(x, _mm256_loadu_ps(k + 3 * n + i)));
  }
  // per 128-bit half: (s_p[0] + s_p[1]) + (s_p[2] + s_p[3]) for p = 0..3, then the halves
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(s0, s1), _mm256_hadd_ps(s2, s3));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
#else  // the same sums in the same order (the compiler does not vectorise this one well)
  float s[4][8] = {};
  for (int64_t i = 0; i < n; i += 8)
    for (int p = 0; p < 4; ++p)
      for (int l = 0; l < 8; ++l) s[p][l] += a[i + l] * k[p * n + i + l];
  for (int p = 0; p < 4; ++p)
    out[p] = ((s[p][0] + s[p][1]) + (s[p][2] + s[p][3])) +
             ((s[p][4] + s[p][5]) + (s[p][6] + s[p][7]));
#endif
}

// out[0, n) += sum over the visible j in [begin, end) of weights[j] *
// rows[j * stride + (0, n)], in order of j, for n <= kChunk: the sums stay in
// registers across j. A full chunk takes the loop of constant trip count
// (unrolled into vector registers), the last, shorter chunk of a head the
// general one; both add in the same order.
constexpr int64_t kChunk = 32;
inline void AddWeightedRows(const float* weights, const float* rows, const bool* visible,
                            int64_t begin, int64_t end, int64_t stride, int64_t n, float* out) {
  float acc[kChunk];
  for (int64_t l = 0; l < n; ++l) acc[l] = out[l];
  if (n == kChunk) {
    for (int64_t j = begin; j < end; ++j) {
      if (!visible[j]) continue;
      const float w = weights[j];
      const float* row = rows + j * stride;
      for (int l = 0; l < kChunk; ++l) acc[l] += w * row[l];
    }
  } else {
    for (int64_t j = begin; j < end; ++j) {
      if (!visible[j]) continue;
      const float w = weights[j];
      const float* row = rows + j * stride;
      for (int64_t l = 0; l < n; ++l) acc[l] += w * row[l];
    }
  }
  for (int64_t l = 0; l < n; ++l) out[l] = acc[l];
}

// Positions are visited in blocks of kBlock: a block's key or value rows (32 KiB
// at 128 dimensions) stay in the level-1 cache while every query head, and every
// chunk of dimensions, reads them, where a pass per query head and chunk over
// the whole cache read each row from further away each time (with Dot4, 28
// layers, one query, one thread, Zen 3: 7.0-9.1 ms against 9.3-13.1 at 640
// positions). Which
// positions go four at a time depends on the position and the cache length
// only, never on the other queries of the call.
constexpr int64_t kBlock = 64;

// Scratch floats AttendHead needs: every query head's scores, then their totals.
inline int64_t ScratchFloats(int64_t groups, int64_t positions) {
  return groups * (positions + 1);
}

// The `groups` queries q[groups, dims] that share one key/value head, against
// that head's keys and values [positions, dims] where visible[j]; writes
// out[groups, dims]. `scratch` holds ScratchFloats(groups, positions) floats.
inline void AttendHead(const float* q, const float* keys, const float* values,
                       const bool* visible, int64_t groups, int64_t positions, int64_t dims,
                       float scale, float* scratch, float* out) {
  bool any = false;
  for (int64_t j = 0; j < positions; ++j) any = any || visible[j];
  for (int64_t i = 0; i < groups * dims; ++i) out[i] = 0.0f;
  if (!any) {  // every score equal: uniform weights
    for (int64_t j = 0; j < positions; ++j)
      for (int64_t g = 0; g < groups; ++g)
        for (int64_t d = 0; d < dims; ++d) out[g * dims + d] += values[j * dims + d];
    for (int64_t i = 0; i < groups * dims; ++i) out[i] /= static_cast<float>(positions);
    return;
  }
  float* scores = scratch;                       // [groups, positions]
  float* totals = scratch + groups * positions;  // [groups]
  const bool fours = dims % 8 == 0;
  for (int64_t begin = 0; begin < positions; begin += kBlock) {
    const int64_t end = begin + kBlock < positions ? begin + kBlock : positions;
    for (int64_t g = 0; g < groups; ++g) {
      const float* query = q + g * dims;
      float* row = scores + g * positions;
      int64_t j = begin;
      for (; fours && j + 4 <= end; j += 4) {
        if (!(visible[j] || visible[j + 1] || visible[j + 2] || visible[j + 3])) continue;
        float four[4];
        Dot4(query, keys + j * dims, dims, four);
        for (int p = 0; p < 4; ++p)
          if (visible[j + p]) row[j + p] = four[p] * scale;
      }
      for (; j < end; ++j)
        if (visible[j]) row[j] = Dot(query, keys + j * dims, dims) * scale;
    }
  }
  for (int64_t g = 0; g < groups; ++g) {
    float* weights = scores + g * positions;
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < positions; ++j)
      if (visible[j]) top = weights[j] > top ? weights[j] : top;
    float total = 0.0f;
    for (int64_t j = 0; j < positions; ++j) {
      if (!visible[j]) continue;
      weights[j] = std::exp(weights[j] - top);
      total += weights[j];
    }
    totals[g] = total;
  }
  for (int64_t begin = 0; begin < positions; begin += kBlock) {
    const int64_t end = begin + kBlock < positions ? begin + kBlock : positions;
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t d = 0; d < dims; d += kChunk)
        AddWeightedRows(scores + g * positions, values + d, visible, begin, end, dims,
                        dims - d < kChunk ? dims - d : kChunk, out + g * dims + d);
  }
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t d = 0; d < dims; ++d) out[g * dims + d] /= totals[g];
}

}  // namespace attention
}  // namespace specdec

#endif  // SPECDEC_JAX_NATIVE_CACHE_ATTENTION_H_
