// The block kernel on AArch64 NEON with the dot-product extension (Apple
// Silicon, Graviton 2+, Cortex-A76+): sdot multiplies 4 signed bytes by 4 per
// 32-bit lane, which is the reference's lane. A zmm of the AVX-512 path is
// four q registers here; the same exact integer sums per lane, and the
// reference's float operations in its order (vfmaq_f32 where it calls
// std::fma). Activations are quantised by the reference's own code (its
// rounding is x86's cvtps2dq, written out in C++), so they are its bits by
// construction. Held to the reference bit for bit by block_dot_check.cc
// (cross-compiled and run under qemu-aarch64 by tests/test_block_dot.py);
// written for identity first: its speed was not measured on an ARM CPU.
//
// Codes are unsigned but at most 63 in every format but q8_0, so they are
// the same bytes as signed int8; q8_0's q + 128 is summed as its signed byte w
// plus 128 times the activations' sum: the same integer, exactly.

#ifndef SPECDEC_JAX_NATIVE_BLOCK_DOT_NEON_H_
#define SPECDEC_JAX_NATIVE_BLOCK_DOT_NEON_H_

#include <arm_neon.h>

#define SPECDEC_BLOCKS_NEON 1

namespace specdec {
namespace blocks {
namespace neon {

// The 16 lanes' sum in the reference's order (Sum16): a[0..3] lanes 0-3, ...
inline float Sum16(const float32x4_t a[4]) {
  const float32x4_t t_lo = vaddq_f32(a[2], a[0]), t_hi = vaddq_f32(a[3], a[1]);  // i + 8, i
  const float32x4_t u = vaddq_f32(t_hi, t_lo);                                    // i + 4, i
  const float v0 = vgetq_lane_f32(u, 0) + vgetq_lane_f32(u, 2);
  const float v1 = vgetq_lane_f32(u, 1) + vgetq_lane_f32(u, 3);
  return v0 + v1;
}

inline int8x16_t Signed(uint8x16_t v) { return vreinterpretq_s8_u8(v); }
inline int8x16_t Word(int32_t w) { return vreinterpretq_s8_s32(vdupq_n_s32(w)); }
inline float32x4_t Halves4(const uint8_t* p) {  // 4 float16, exactly
  return vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(p)));
}
inline int32x4_t Ints4(const uint8_t* p) {  // 4 unsigned bytes
  uint32_t w;
  std::memcpy(&w, p, 4);
  const uint16x4_t h = vget_low_u16(vmovl_u8(vcreate_u8(w)));
  return vreinterpretq_s32_u32(vmovl_u16(h));
}

// ---------------------------------------------------------------------------
// The 32-weight file formats, per unit of two blocks: 64 codes in four q
// registers (lanes 4r .. 4r + 3), and per lane scale and offset.
template <int F>
struct NeonUnit {
  int8x16_t q[4];  // signed bytes (q8_0: w, whose code is w + 128)
  float32x4_t s[4], o[4];
  void Load(const uint8_t* b) {
    for (int blk = 0; blk < 2; ++blk) {
      float scale, offset;
      if constexpr (F == kQ8_0) {
        const uint8_t* p = b + 34 * blk;
        scale = HalfAt(p);
        offset = scale * -128.0f;
        q[2 * blk] = vreinterpretq_s8_u8(vld1q_u8(p + 2));
        q[2 * blk + 1] = vreinterpretq_s8_u8(vld1q_u8(p + 18));
      } else if constexpr (F == kQ4_1) {
        const uint8_t* p = b + 20 * blk;
        scale = HalfAt(p);
        offset = HalfAt(p + 2);
        const uint8x16_t v = vld1q_u8(p + 4);
        q[2 * blk] = Signed(vandq_u8(v, vdupq_n_u8(15)));
        q[2 * blk + 1] = Signed(vshrq_n_u8(v, 4));
      } else {  // q5_0
        const uint8_t* p = b + 22 * blk;
        scale = HalfAt(p);
        offset = scale * -16.0f;
        const uint8x16_t v = vld1q_u8(p + 6);
        static const uint8_t kBit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
        const uint8x16_t bit = vld1q_u8(kBit), sixteen = vdupq_n_u8(16);
        for (int i = 0; i < 2; ++i) {  // weights 16i .. 16i + 15: bits 16i .. 16i + 15 of qh
          const uint8x16_t bytes = vcombine_u8(vdup_n_u8(p[2 + 2 * i]), vdup_n_u8(p[3 + 2 * i]));
          const uint8x16_t fifth = vandq_u8(vtstq_u8(bytes, bit), sixteen);
          const uint8x16_t low = i == 0 ? vandq_u8(v, vdupq_n_u8(15)) : vshrq_n_u8(v, 4);
          q[2 * blk + i] = Signed(vorrq_u8(low, fifth));
        }
      }
      for (int r = 2 * blk; r < 2 * blk + 2; ++r) {
        s[r] = vdupq_n_f32(scale);
        o[r] = vdupq_n_f32(offset);
      }
    }
  }
};

template <int F, int MB>
void RowPass(const uint8_t* w_row, const Activations& a, int64_t k_dim, int64_t m0, float* y,
             int64_t n_dim, int64_t n) {
  float32x4_t acc[MB][4];
  for (int m = 0; m < MB; ++m)
    for (int r = 0; r < 4; ++r) acc[m][r] = vdupq_n_f32(0.0f);
  NeonUnit<F> unit;
  const int32x4_t zero = vdupq_n_s32(0);
  for (int64_t c = 0; c < a.chunks; ++c) {
    unit.Load(w_row + c * FileSpec<F>::kBytes);
    for (int m = 0; m < MB; ++m) {
      const int64_t mc = (m0 + m) * a.chunks + c;
      const int8_t* act = a.q.data() + (m0 + m) * k_dim + c * kChunk;
      const float32x4_t da = vdupq_n_f32(a.d[mc]);
      for (int r = 0; r < 4; ++r) {
        const int8x16_t x = vld1q_s8(act + 16 * r);
        int32x4_t isum = vdotq_s32(zero, unit.q[r], x);
        if constexpr (F == kQ8_0)  // + 128 * the lane's activation sum
          isum = vaddq_s32(isum, vshlq_n_s32(vdotq_s32(zero, vdupq_n_s8(1), x), 7));
        acc[m][r] = vfmaq_f32(acc[m][r], vmulq_f32(vcvtq_f32_s32(isum), unit.s[r]), da);
        acc[m][r] = vfmaq_f32(acc[m][r], unit.o[r], vld1q_f32(a.sums.data() + mc * 16 + 4 * r));
      }
    }
  }
  for (int m = 0; m < MB; ++m) y[(m0 + m) * n_dim + n] = Sum16(acc[m]);
}

// This path's 32-weight formats (block_dot.h: what a path provides).
struct Blocks {
  static constexpr int kMaxMPerBlockPass = 4;
  template <int F, int MB> static constexpr auto RowPass = &neon::RowPass<F, MB>;
};

// ---------------------------------------------------------------------------
// The k-quants in their file's layout: per chunk pair h and 128-bit lane k,
// the int16 pairs [chunk 2h's lanes 4k..4k+3, chunk 2h + 1's] (vpackssdw's,
// saturated by sqxtn) times their groups' scales, summed in adjacent pairs
// (the reference's KRow, vpdpwssd on x86).
template <int F, int MB>
void KRowPass(const uint8_t* w_row, const SuperActivations& a, int64_t k_dim, int64_t m0,
              float* y, int64_t n_dim, int64_t n) {
  float32x4_t acc[MB][4];
  for (int m = 0; m < MB; ++m)
    for (int r = 0; r < 4; ++r) acc[m][r] = vdupq_n_f32(0.0f);
  const int32x4_t zero = vdupq_n_s32(0);
  uint8_t codes[256];
  int16_t sc[16], mn[16], picks[2][32];
  float d, dmin;
  for (int64_t u = 0; u < a.supers; ++u) {
    ref::SuperCodes<F>(w_row + u * FileSpec<F>::kBytes, codes, d, dmin, sc, mn);
    for (int h = 0; h < 2; ++h) {
      for (int e = 0; e < 32; ++e) {
        const int k = e / 8, j = e % 8;
        picks[h][e] = sc[(128 * h + 64 * (j / 4) + 4 * (4 * k + j % 4)) / 16];
      }
    }
    const int16x8_t mins[2] = {vld1q_s16(mn), vld1q_s16(mn + 8)};
    for (int m = 0; m < MB; ++m) {
      const int64_t mu = (m0 + m) * a.supers + u;
      const int8_t* act = a.q.data() + (m0 + m) * k_dim + u * kSuper;
      int32x4_t isum[4] = {zero, zero, zero, zero};
      for (int h = 0; h < 2; ++h) {
        for (int k = 0; k < 4; ++k) {
          int32x4_t t[2];
          for (int c = 0; c < 2; ++c) {
            const int at = 128 * h + 64 * c + 16 * k;
            t[c] = vdotq_s32(zero, Signed(vld1q_u8(codes + at)), vld1q_s8(act + at));
          }
          const int16x8_t packed = vcombine_s16(vqmovn_s32(t[0]), vqmovn_s32(t[1]));
          const int16x8_t scale = vld1q_s16(picks[h] + 8 * k);
          const int32x4_t lo = vmull_s16(vget_low_s16(packed), vget_low_s16(scale));
          const int32x4_t hi = vmull_high_s16(packed, scale);
          isum[k] = vaddq_s32(isum[k], vpaddq_s32(lo, hi));
        }
      }
      const int16_t* s = a.sums.data() + mu * 16;
      int32x4_t low_int[2];
      for (int i = 0; i < 2; ++i) {
        const int16x8_t sv = vld1q_s16(s + 8 * i);
        low_int[i] = vpaddq_s32(vmull_s16(vget_low_s16(mins[i]), vget_low_s16(sv)),
                                vmull_high_s16(mins[i], sv));
      }
      const float32x4_t dv = vdupq_n_f32(d), da = vdupq_n_f32(a.d[mu]);
      for (int r = 0; r < 4; ++r) {
        const float32x4_t low = r < 2 ? vmulq_f32(vcvtq_f32_s32(low_int[r]), vdupq_n_f32(dmin))
                                      : vdupq_n_f32(0.0f);
        const float32x4_t v = vfmaq_f32(vnegq_f32(low), vcvtq_f32_s32(isum[r]), dv);
        acc[m][r] = vfmaq_f32(acc[m][r], v, da);
      }
    }
  }
  for (int m = 0; m < MB; ++m) y[(m0 + m) * n_dim + n] = Sum16(acc[m]);
}

// This path's k-quants.
struct KQuants {
  static constexpr int kMaxMPerKPass = 4;
  template <int F, int MB> static constexpr auto KRowPass = &neon::KRowPass<F, MB>;
};

// ---------------------------------------------------------------------------
// The layouts interleaved by 16 output rows: a lane per output row, a q
// register per quarter of a group (lanes 4q..4q+3: bytes 16q..16q+15 of each
// 64-byte line), a pass per quarter.

// A super-block of q4_k_x16, one quarter (first: its first lane; d: its float16 d).
template <int MB>
SPECDEC_INLINE void X16Q4Unit(const uint8_t* p, int64_t u, const PassView& pass, int first, float32x4_t d,
                              float32x4_t (&acc)[MB]) {
  int32x4_t total[MB], mins[MB];
  for (int m = 0; m < MB; ++m) total[m] = mins[m] = vdupq_n_s32(0);
  for (int j = 0; j < 8; ++j) {
    const int32x4_t sc = Ints4(p + 64 + 16 * j + first), mn = Ints4(p + 192 + 16 * j + first);
    const int32_t* wj = pass.words + (u * 64 + 8 * j) * MB;
    int32x4_t isum[MB];
    for (int m = 0; m < MB; ++m) isum[m] = vdupq_n_s32(0);
    for (int t = 0; t < 4; ++t) {
      const uint8x16_t codes = vld1q_u8(p + kX16Codes + (4 * j + t) * 64 + 4 * first);
      const int8x16_t lo = Signed(vandq_u8(codes, vdupq_n_u8(15))), hi = Signed(vshrq_n_u8(codes, 4));
      for (int m = 0; m < MB; ++m) {
        isum[m] = vdotq_s32(isum[m], lo, Word(wj[(2 * t) * MB + m]));
        isum[m] = vdotq_s32(isum[m], hi, Word(wj[(2 * t + 1) * MB + m]));
      }
    }
    for (int m = 0; m < MB; ++m) {
      total[m] = vmlaq_s32(total[m], isum[m], sc);
      mins[m] = vmlaq_s32(mins[m], mn, vdupq_n_s32(pass.asum[(u * 8 + j) * MB + m]));
    }
  }
  const float32x4_t dmin = Halves4(p + 32 + 2 * first);
  for (int m = 0; m < MB; ++m) {
    const float32x4_t da = vdupq_n_f32(pass.da[u * MB + m]);
    acc[m] = vfmaq_f32(acc[m], vcvtq_f32_s32(total[m]), vmulq_f32(d, da));
    acc[m] = vfmsq_f32(acc[m], vcvtq_f32_s32(mins[m]), vmulq_f32(dmin, da));
  }
}

// A super-block of q6_k_x16, one quarter.
template <int MB>
SPECDEC_INLINE void X16Q6Unit(const uint8_t* p, int64_t u, const PassView& pass, int first, float32x4_t d,
                              float32x4_t (&acc)[MB]) {
  const uint8x16_t low4 = vdupq_n_u8(15), high2 = vdupq_n_u8(0x30);
  int32x4_t total[MB];
  for (int m = 0; m < MB; ++m) total[m] = vdupq_n_s32(0);
  for (int j = 0; j < 16; ++j) {
    uint32_t sc_bytes;
    std::memcpy(&sc_bytes, p + 32 + 16 * j + first, 4);
    const int32x4_t sc = vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_u32(vdup_n_u32(sc_bytes)))));
    const uint8_t* low = p + kX16Q6Low + 128 * j;
    const uint8x16_t l0 = vld1q_u8(low + 4 * first), l1 = vld1q_u8(low + 64 + 4 * first);
    const uint8x16_t h = vld1q_u8(p + kX16Q6High + 64 * j + 4 * first);
    const int8x16_t codes[4] = {
        Signed(vorrq_u8(vandq_u8(l0, low4), vandq_u8(vshlq_n_u8(h, 4), high2))),
        Signed(vorrq_u8(vshrq_n_u8(l0, 4), vandq_u8(vshlq_n_u8(h, 2), high2))),
        Signed(vorrq_u8(vandq_u8(l1, low4), vandq_u8(h, high2))),
        Signed(vorrq_u8(vshrq_n_u8(l1, 4), vandq_u8(vshrq_n_u8(h, 2), high2)))};
    const int32_t* wj = pass.words + (u * 64 + 4 * j) * MB;
    const int32_t* offset = pass.q6_offset + (u * 16 + j) * MB;
    for (int m = 0; m < MB; ++m) {
      int32x4_t isum = vdupq_n_s32(offset[m]);
      for (int k = 0; k < 4; ++k) isum = vdotq_s32(isum, codes[k], Word(wj[k * MB + m]));
      total[m] = vmlaq_s32(total[m], isum, sc);
    }
  }
  for (int m = 0; m < MB; ++m)
    acc[m] = vfmaq_f32(acc[m], vcvtq_f32_s32(total[m]), vmulq_f32(d, vdupq_n_f32(pass.da[u * MB + m])));
}

// A block of q5_0_x16, one quarter.
template <int MB>
SPECDEC_INLINE void X16Q5Unit(const uint8_t* p, int64_t b, const PassView& pass, int first, float32x4_t d,
                              float32x4_t (&acc)[MB]) {
  const uint8x16_t low4 = vdupq_n_u8(15), fifth = vdupq_n_u8(0x10);
  const uint8x16_t h = vld1q_u8(p + 288 + 4 * first);
  const uint8x16_t high[8] = {  // bit k of each byte moved to bit 4
      vandq_u8(vshlq_n_u8(h, 4), fifth), vandq_u8(vshlq_n_u8(h, 3), fifth),
      vandq_u8(vshlq_n_u8(h, 2), fifth), vandq_u8(vshlq_n_u8(h, 1), fifth),
      vandq_u8(h, fifth), vandq_u8(vshrq_n_u8(h, 1), fifth),
      vandq_u8(vshrq_n_u8(h, 2), fifth), vandq_u8(vshrq_n_u8(h, 3), fifth)};
  int8x16_t codes[8];
  for (int t = 0; t < 4; ++t) {
    const uint8x16_t line = vld1q_u8(p + 32 + 64 * t + 4 * first);
    codes[2 * t] = Signed(vorrq_u8(vandq_u8(line, low4), high[2 * t]));
    codes[2 * t + 1] = Signed(vorrq_u8(vshrq_n_u8(line, 4), high[2 * t + 1]));
  }
  const int32_t* wb = pass.words + 8 * b * MB;
  for (int m = 0; m < MB; ++m) {
    int32x4_t isum = vdupq_n_s32(WrapMul(-16, pass.asum[b * MB + m]));
    for (int k = 0; k < 8; ++k) isum = vdotq_s32(isum, codes[k], Word(wb[k * MB + m]));
    acc[m] = vfmaq_f32(acc[m], vcvtq_f32_s32(isum), vmulq_f32(d, vdupq_n_f32(pass.da[b * MB + m])));
  }
}

template <int F, int MB>
void X16Pass(const uint8_t* group, int64_t units, const PassView& pass, float* y, int64_t n_dim,
             int64_t lane0, int quarter) {
  float32x4_t acc[MB];
  for (int m = 0; m < MB; ++m) acc[m] = vdupq_n_f32(0.0f);
  const int first = 4 * quarter;
  for (int64_t u = 0; u < units; ++u) {
    const uint8_t* p = group + u * X16Spec<F>::kBytes;
    const float32x4_t d = Halves4(p + 2 * first);
    if constexpr (F == kQ4_KX16) X16Q4Unit<MB>(p, u, pass, first, d, acc);
    else if constexpr (F == kQ6_KX16) X16Q6Unit<MB>(p, u, pass, first, d, acc);
    else X16Q5Unit<MB>(p, u, pass, first, d, acc);
  }
  for (int m = 0; m < MB; ++m) vst1q_f32(y + (pass.m0 + m) * n_dim + lane0 + first, acc[m]);
}

// This path's interleaved layouts.
struct Interleaved {
  static constexpr int kMaxMPerX16Pass = 8, kX16Parts = 4, kX16WholeRows = 0;
  template <int F, int MB> static constexpr auto X16Pass = &neon::X16Pass<F, MB>;
};

}  // namespace neon

// Activations quantised by the reference's own code (the header comment).
struct Neon : ref::Quantizers, neon::Blocks, neon::KQuants, neon::Interleaved {
  static constexpr const char* kName = "neon-dotprod";
};

}  // namespace blocks
}  // namespace specdec

#endif  // SPECDEC_JAX_NATIVE_BLOCK_DOT_NEON_H_
