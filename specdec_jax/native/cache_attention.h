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
// hides are skipped, not scored and zeroed; and a key or value row, loaded once,
// serves the G query heads that share it.
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

// sum_i a[i] * b[i] in a fixed order: kLanes running sums (one or two vector
// registers once the compiler vectorises the lane loop), added pairwise.
inline float Dot(const float* a, const float* b, int64_t n) {
  constexpr int kLanes = 16;
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lanes[l] += a[i + l] * b[i + l];
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  return lanes[0] + tail;
}

// The `groups` queries q[groups, dims] that share one key/value head, against
// that head's keys and values [positions, dims] where visible[j]; writes
// out[groups, dims]. `scores` is scratch of groups x positions floats.
inline void AttendHead(const float* q, const float* keys, const float* values,
                       const bool* visible, int64_t groups, int64_t positions, int64_t dims,
                       float scale, float* scores, float* out) {
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
  float top[64], total[64];  // per query head; AttendCache checks groups <= 64
  for (int64_t g = 0; g < groups; ++g) {
    top[g] = -std::numeric_limits<float>::infinity();
    total[g] = 0.0f;
  }
  for (int64_t j = 0; j < positions; ++j) {
    if (!visible[j]) continue;
    for (int64_t g = 0; g < groups; ++g) {
      const float s = Dot(q + g * dims, keys + j * dims, dims) * scale;
      scores[g * positions + j] = s;
      top[g] = s > top[g] ? s : top[g];
    }
  }
  for (int64_t j = 0; j < positions; ++j) {
    if (!visible[j]) continue;
    for (int64_t g = 0; g < groups; ++g) {
      const float weight = std::exp(scores[g * positions + j] - top[g]);
      scores[g * positions + j] = weight;
      total[g] += weight;
    }
  }
  for (int64_t j = 0; j < positions; ++j) {
    if (!visible[j]) continue;
    const float* v = values + j * dims;
    for (int64_t g = 0; g < groups; ++g) {
      const float weight = scores[g * positions + j];
      float* o = out + g * dims;
      for (int64_t d = 0; d < dims; ++d) o[d] += weight * v[d];
    }
  }
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t d = 0; d < dims; ++d) out[g * dims + d] /= total[g];
}

constexpr int64_t kMaxGroups = 64;

}  // namespace attention
}  // namespace specdec

#endif  // SPECDEC_JAX_NATIVE_CACHE_ATTENTION_H_
