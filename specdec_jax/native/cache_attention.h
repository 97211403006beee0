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
// hides are skipped, not scored and zeroed; and the weighted sum of the values
// stays in registers, 32 dimensions at a time, across the positions.
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

// out[0, n) = sum over the visible j of weights[j] * rows[j * stride + (0, n)],
// in order of j, for n <= kChunk: the sums stay in registers across j. A full
// chunk takes the loop of constant trip count (unrolled into vector registers),
// the last, shorter chunk of a head the general one; both add in the same order.
constexpr int64_t kChunk = 32;
inline void WeightedRows(const float* weights, const float* rows, const bool* visible,
                         int64_t count, int64_t stride, int64_t n, float* out) {
  float acc[kChunk] = {};
  if (n == kChunk) {
    for (int64_t j = 0; j < count; ++j) {
      if (!visible[j]) continue;
      const float w = weights[j];
      const float* row = rows + j * stride;
      for (int l = 0; l < kChunk; ++l) acc[l] += w * row[l];
    }
  } else {
    for (int64_t j = 0; j < count; ++j) {
      if (!visible[j]) continue;
      const float w = weights[j];
      const float* row = rows + j * stride;
      for (int64_t l = 0; l < n; ++l) acc[l] += w * row[l];
    }
  }
  for (int64_t l = 0; l < n; ++l) out[l] = acc[l];
}

// The `groups` queries q[groups, dims] that share one key/value head, against
// that head's keys and values [positions, dims] where visible[j]; writes
// out[groups, dims]. `weights` is scratch of `positions` floats (one query
// head's at a time).
inline void AttendHead(const float* q, const float* keys, const float* values,
                       const bool* visible, int64_t groups, int64_t positions, int64_t dims,
                       float scale, float* weights, float* out) {
  bool any = false;
  for (int64_t j = 0; j < positions; ++j) any = any || visible[j];
  if (!any) {  // every score equal: uniform weights
    for (int64_t i = 0; i < groups * dims; ++i) out[i] = 0.0f;
    for (int64_t j = 0; j < positions; ++j)
      for (int64_t g = 0; g < groups; ++g)
        for (int64_t d = 0; d < dims; ++d) out[g * dims + d] += values[j * dims + d];
    for (int64_t i = 0; i < groups * dims; ++i) out[i] /= static_cast<float>(positions);
    return;
  }
  for (int64_t g = 0; g < groups; ++g) {
    const float* query = q + g * dims;
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < positions; ++j) {
      if (!visible[j]) continue;
      weights[j] = Dot(query, keys + j * dims, dims) * scale;
      top = weights[j] > top ? weights[j] : top;
    }
    float total = 0.0f;
    for (int64_t j = 0; j < positions; ++j) {
      if (!visible[j]) continue;
      weights[j] = std::exp(weights[j] - top);
      total += weights[j];
    }
    float* o = out + g * dims;
    for (int64_t d = 0; d < dims; d += kChunk)
      WeightedRows(weights, values + d, visible, positions, dims,
                   dims - d < kChunk ? dims - d : kChunk, o + d);
    for (int64_t d = 0; d < dims; ++d) o[d] /= total;
  }
}

}  // namespace attention
}  // namespace specdec

#endif  // SPECDEC_JAX_NATIVE_CACHE_ATTENTION_H_
