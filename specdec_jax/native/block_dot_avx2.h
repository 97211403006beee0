// The block kernel on 256-bit registers: AVX2 + FMA + F16C (Haswell and
// later, AMD Zen), with vpdpbusd where the CPU has AVX-VNNI (Alder Lake and
// later; also AVX-512 VNNI's 256-bit form). Included by block_dot.h where the
// compiler targets AVX2. A zmm of the AVX-512 path is two ymm here (lanes 0-7,
// 8-15): the same lanes, the same exact integer sums per lane, and the
// reference's float operations in its order (block_dot.h, namespace ref);
// block_dot_check.cc holds both variants to it bit for bit.
//
// Without VNNI, a product of 4 codes and 4 activations per 32-bit lane is
// vpmaddubsw (unsigned codes times signed activations, adjacent pairs summed
// to int16, saturating) then vpmaddwd by ones (pairs to int32). Saturation is
// never reached: pairs of codes <= 63 and activations >= -128 stay within
// 2 * 63 * 128 = 16128, and where several products are added in int16 before
// widening, each place bounds the sum. q8_0's codes (q + 128, up to 255) are
// split into nibbles (16 hi + lo): each half's pairs are exact.

#ifndef SPECDEC_JAX_NATIVE_BLOCK_DOT_AVX2_H_
#define SPECDEC_JAX_NATIVE_BLOCK_DOT_AVX2_H_

#include <immintrin.h>

#define SPECDEC_BLOCKS_AVX2 1
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
#define SPECDEC_BLOCKS_AVXVNNI 1
#endif

namespace specdec {
namespace blocks {
namespace avx2 {

inline __m256i Ones16() { return _mm256_set1_epi16(1); }

// acc + per lane the sum of 4 products of unsigned bytes u and signed bytes s.
inline __m256i Dpbusd(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#else  // not a VNNI build: Avx256<true> is not instantiated; the same sums, exactly
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i lo = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_and_si256(u, low4), s), Ones16());
  const __m256i hi = _mm256_madd_epi16(
      _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(u, 4), low4), s), _mm256_set1_epi16(16));
  return _mm256_add_epi32(acc, _mm256_add_epi32(lo, hi));
#endif
}

// acc + lane sums of 4 products, codes u <= 127 (vpmaddubsw pairs cannot saturate).
template <bool kVnni>
inline __m256i Dot4(__m256i acc, __m256i u, __m256i s) {
  if constexpr (kVnni) {
    return Dpbusd(acc, u, s);
  } else {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), Ones16()));
  }
}

// The same for codes up to 255 (q8_0): AVX2 splits them into nibbles.
template <bool kVnni>
inline __m256i Dot4Bytes(__m256i acc, __m256i u, __m256i s) {
  if constexpr (kVnni) {
    return Dpbusd(acc, u, s);
  } else {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i lo = _mm256_maddubs_epi16(_mm256_and_si256(u, low4), s);
    const __m256i hi = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(u, 4), low4), s);
    return _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(lo, Ones16()),
                                                  _mm256_madd_epi16(hi, _mm256_set1_epi16(16))));
  }
}

// The 16 lanes' sum in the reference's order (Sum16): lanes i and i + 8 are
// the same lane of lo and hi.
inline float Sum16(__m256 lo, __m256 hi) {
  const __m256 t = _mm256_add_ps(hi, lo);
  const __m128 u = _mm_add_ps(_mm256_extractf128_ps(t, 1), _mm256_castps256_ps128(t));
  const __m128 w = _mm_add_ps(u, _mm_movehl_ps(u, u));  // lanes 0, 1: u0 + u2, u1 + u3
  return _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)));
}

inline float MaxOf(__m256 v) {  // exact in any order (finite values)
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}
inline int32_t SumOf(__m256i v) {  // wrapping int32, as the reference's
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}
inline __m256 Abs(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

// 32 rounded values (4 x 8 int32) -> 32 int8 codes in order, saturated.
inline __m256i PackCodes(__m256i r0, __m256i r1, __m256i r2, __m256i r3) {
  // per 128 bits: r0[0..3] r1[0..3] r2[0..3] r3[0..3] | r0[4..7] r1[4..7] ...
  const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(r0, r1), _mm256_packs_epi32(r2, r3));
  return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// A chunk of 8 * N values: the rounded values (x * 127 / max |x|, nearest,
// ties even; as QuantizeValues) and da.
template <int N>
inline float Round(const float* x, __m256i r[N]) {
  __m256 v[N];
  __m256 peak = _mm256_setzero_ps();
  for (int i = 0; i < N; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    peak = _mm256_max_ps(peak, Abs(v[i]));
  }
  const float top = MaxOf(peak);
  const __m256 inv = _mm256_set1_ps(top > 0.0f ? 127.0f / top : 0.0f);
  for (int i = 0; i < N; ++i) r[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
  return top / 127.0f;
}

inline __m256 HalvesToFloats(const uint8_t* p) {  // 8 float16
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256i BytesToInts(const uint8_t* p) {  // 8 unsigned bytes
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline __m256i Load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m256i Load(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m256 F16Broadcast(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _mm256_set1_ps(_cvtsh_ss(h));
}

// ---------------------------------------------------------------------------
// The 32-weight file formats: a unit of two blocks, 64 codes in two ymm
// (lanes 0-7: the first block, 8-15: the second), scale and offset per lane.
struct Chunk {
  __m256i q[2];
  __m256 s[2], o[2];
};

// 16 bytes of nibbles -> 32 codes: the low nibbles, then the high nibbles.
inline __m256i Nibbles(const uint8_t* p) {
  const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_and_si256(_mm256_srlv_epi64(both, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
}
// 32 bits -> 32 bytes, byte j 16 where bit j is set.
inline __m256i FifthBits(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(int(bits)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                       2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(16));
}

template <int F>
inline Chunk UnitChunk(const uint8_t* b) {
  Chunk ch;
  for (int blk = 0; blk < 2; ++blk) {
    if constexpr (F == kQ8_0) {
      const uint8_t* p = b + 34 * blk;
      ch.q[blk] = _mm256_xor_si256(Load(p + 2), _mm256_set1_epi8(char(0x80)));
      ch.s[blk] = F16Broadcast(p);
      ch.o[blk] = _mm256_mul_ps(ch.s[blk], _mm256_set1_ps(-128.0f));
    } else if constexpr (F == kQ4_1) {
      const uint8_t* p = b + 20 * blk;
      ch.q[blk] = Nibbles(p + 4);
      ch.s[blk] = F16Broadcast(p);
      ch.o[blk] = F16Broadcast(p + 2);
    } else {
      const uint8_t* p = b + 22 * blk;
      ch.q[blk] = _mm256_or_si256(Nibbles(p + 6), FifthBits(p + 2));
      ch.s[blk] = F16Broadcast(p);
      ch.o[blk] = _mm256_mul_ps(ch.s[blk], _mm256_set1_ps(-16.0f));
    }
  }
  return ch;
}

// A chunk of 64 (ref::Quantizers::QuantizeChunk).
inline float QuantizeChunk(const float* x, int8_t q[kChunk], float sums[16]) {
  const __m256i ones = _mm256_set1_epi8(1);
  __m256i r[8];
  const float d = Round<8>(x, r);
  for (int h = 0; h < 2; ++h) {
    const __m256i codes = PackCodes(r[4 * h], r[4 * h + 1], r[4 * h + 2], r[4 * h + 3]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * h), codes);
    // the saturated codes' lane sums (4 codes of at most 128: exact)
    const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones, codes), Ones16());
    _mm256_storeu_ps(sums + 8 * h, _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d)));
  }
  return d;
}

template <int F, int MB, bool kVnni>
void RowPass(const uint8_t* w_row, const Activations& a, int64_t k_dim, int64_t m0, float* y,
             int64_t n_dim, int64_t n) {
  __m256 acc[MB][2];
  SPECDEC_UNROLL for (int m = 0; m < MB; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  constexpr int64_t kBytes = FileSpec<F>::kBytes;
  for (int64_t c = 0; c < a.chunks; ++c) {
    if (m0 == 0) PrefetchAhead<F>(w_row, c);
    const Chunk ch = UnitChunk<F>(w_row + c * kBytes);
    SPECDEC_UNROLL for (int m = 0; m < MB; ++m) {
      const int64_t mc = (m0 + m) * a.chunks + c;
      const int8_t* act = a.q.data() + (m0 + m) * k_dim + c * kChunk;
      const __m256 da = _mm256_set1_ps(a.d[mc]);
      for (int h = 0; h < 2; ++h) {
        const __m256i zero = _mm256_setzero_si256();
        const __m256i isum = F == kQ8_0 ? Dot4Bytes<kVnni>(zero, ch.q[h], Load(act + 32 * h))
                                        : Dot4<kVnni>(zero, ch.q[h], Load(act + 32 * h));
        acc[m][h] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(isum), ch.s[h]), da, acc[m][h]);
        acc[m][h] = _mm256_fmadd_ps(ch.o[h], _mm256_loadu_ps(a.sums.data() + mc * 16 + 8 * h), acc[m][h]);
      }
    }
  }
  SPECDEC_UNROLL for (int m = 0; m < MB; ++m) y[(m0 + m) * n_dim + n] = Sum16(acc[m][0], acc[m][1]);
}

// This path's 32-weight formats (block_dot.h: what a path provides).
template <bool kVnni>
struct Blocks {
  static constexpr int kMaxMPerBlockPass = 4;  // 2 accumulators a row
  static constexpr auto QuantizeChunk = &avx2::QuantizeChunk;
  template <int F, int MB> static constexpr auto RowPass = &avx2::RowPass<F, MB, kVnni>;
};

// ---------------------------------------------------------------------------
// The k-quants in their file's layout (the AVX-512 path's KRowPass, halved):
// a chunk pair's lane sums packed to int16 (vpackssdw: per 128 bits, 4 lanes
// of chunk 2h then the same 4 of chunk 2h + 1, so ymm lo holds the zmm's
// 128-bit lanes 0-1 and hi its 2-3) times their groups' scales (vpmaddwd).
// The scale of each element comes from a 16-byte window of int16 scales by
// vpshufb (the AVX-512 path's vpermw): a pair's groups are 4h..4h+3 (q4_k)
// or 8h..8h+7 (q6_k), so one window covers them.
struct KShuffles { int8_t idx[2][2][32]; int base[2]; };  // [pair][ymm][byte]
constexpr KShuffles MakeKShuffles(int step, int per, int window) {
  KShuffles s{};
  for (int h = 0; h < 2; ++h) {
    s.base[h] = window * h;
    for (int e = 0; e < 32; ++e) {
      const int k = e / 8, j = e % 8;
      const int chunk = 2 * h + j / 4, lane = 4 * k + j % 4;
      const int at = step * chunk + lane / per - s.base[h];
      s.idx[h][e / 16][2 * (e % 16)] = int8_t(2 * at);
      s.idx[h][e / 16][2 * (e % 16) + 1] = int8_t(2 * at + 1);
    }
  }
  return s;
}
alignas(32) constexpr KShuffles kQ4KShuffles = MakeKShuffles(2, 8, 0);  // one window: 8 scales
alignas(32) constexpr KShuffles kQ6KShuffles = MakeKShuffles(4, 4, 8);  // groups of 16

template <int F> struct KUnit;

template <> struct KUnit<kQ4_K> {
  static constexpr int kBytes = 144;
  const uint8_t* qs;
  float d, dmin;
  alignas(32) int16_t sc16[16];  // the 8 scales, then 0
  __m256i mins;                  // 16 x int16: each group of 32's minimum, twice (groups of 16)
  void Load(const uint8_t* p) {
    d = _cvtsh_ss(uint16_t(p[0] | p[1] << 8));
    dmin = _cvtsh_ss(uint16_t(p[2] | p[3] << 8));
    uint32_t scales[2], minimums[2];
    Q4KScalesMins(p + 4, scales, minimums);
    _mm256_store_si256(reinterpret_cast<__m256i*>(sc16), _mm256_castsi128_si256(_mm_cvtepu8_epi16(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales)))));
    const __m128i m8 = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(minimums)));
    mins = _mm256_set_m128i(_mm_unpackhi_epi16(m8, m8), _mm_unpacklo_epi16(m8, m8));
    qs = p + 16;
  }
  void Codes(int c, __m256i q[2]) const {  // low nibbles: group 2c; high nibbles: 2c + 1
    const __m256i v = avx2::Load(qs + 32 * c), f = _mm256_set1_epi8(0x0F);
    q[0] = _mm256_and_si256(v, f);
    q[1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), f);
  }
  void PairScales(int h, __m256i s[2]) const {
    const __m256i window = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc16 + kQ4KShuffles.base[h])));
    for (int i = 0; i < 2; ++i)
      s[i] = _mm256_shuffle_epi8(window, _mm256_load_si256(reinterpret_cast<const __m256i*>(kQ4KShuffles.idx[h][i])));
  }
};

template <> struct KUnit<kQ6_K> {
  static constexpr int kBytes = 210;
  const uint8_t* b;
  float d, dmin;
  alignas(32) int16_t sc16[16];  // the 16 scales
  __m256i mins;                  // 32 x scale: w = d * sc * q - d * (32 sc)
  void Load(const uint8_t* p) {
    b = p;
    d = dmin = _cvtsh_ss(uint16_t(p[208] | p[209] << 8));
    const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(sc16), sc);
    mins = _mm256_slli_epi16(sc, 5);
  }
  void Codes(int c, __m256i q[2]) const {
    const int h = c / 2, shift = 4 * (c % 2);
    const __m256i f = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3);
    const __m256i qh = avx2::Load(b + 128 + 32 * h);
    for (int i = 0; i < 2; ++i) {
      const __m256i low = _mm256_and_si256(_mm256_srli_epi16(avx2::Load(b + 64 * h + 32 * i), shift), f);
      const __m256i high = _mm256_and_si256(_mm256_srli_epi16(qh, shift + 2 * i), three);
      q[i] = _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
    }
  }
  void PairScales(int h, __m256i s[2]) const {
    const __m256i window = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc16 + kQ6KShuffles.base[h])));
    for (int i = 0; i < 2; ++i)
      s[i] = _mm256_shuffle_epi8(window, _mm256_load_si256(reinterpret_cast<const __m256i*>(kQ6KShuffles.idx[h][i])));
  }
};

// A super-block of 256 (ref::Quantizers::QuantizeSuper).
inline float QuantizeSuper(const float* x, int8_t q[kSuper], int16_t sums[16]) {
  __m256i r[32];
  const float d = Round<32>(x, r);
  for (int i = 0; i < 8; ++i) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * i),
                        PackCodes(r[4 * i], r[4 * i + 1], r[4 * i + 2], r[4 * i + 3]));
    sums[2 * i] = int16_t(uint16_t(uint32_t(SumOf(_mm256_add_epi32(r[4 * i], r[4 * i + 1])))));
    sums[2 * i + 1] = int16_t(uint16_t(uint32_t(SumOf(_mm256_add_epi32(r[4 * i + 2], r[4 * i + 3])))));
  }
  return d;
}

template <int F, int MB, bool kVnni>
void KRowPass(const uint8_t* w_row, const SuperActivations& a, int64_t k_dim, int64_t m0,
              float* y, int64_t n_dim, int64_t n) {
  __m256 acc[MB][2];
  SPECDEC_UNROLL for (int m = 0; m < MB; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  KUnit<F> unit;
  for (int64_t u = 0; u < a.supers; ++u) {
    if (m0 == 0) PrefetchAhead<F>(w_row, u);
    unit.Load(w_row + u * KUnit<F>::kBytes);
    __m256i isum[MB][2];
    SPECDEC_UNROLL for (int m = 0; m < MB; ++m) isum[m][0] = isum[m][1] = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      __m256i q0[2], q1[2], sc[2];
      unit.Codes(2 * h, q0);
      unit.Codes(2 * h + 1, q1);
      unit.PairScales(h, sc);
      SPECDEC_UNROLL for (int m = 0; m < MB; ++m) {
        const int8_t* act = a.q.data() + (m0 + m) * k_dim + u * kSuper + 128 * h;
        const __m256i zero = _mm256_setzero_si256();
        for (int i = 0; i < 2; ++i) {
          const __m256i t0 = Dot4<kVnni>(zero, q0[i], Load(act + 32 * i));
          const __m256i t1 = Dot4<kVnni>(zero, q1[i], Load(act + 64 + 32 * i));
          isum[m][i] = _mm256_add_epi32(isum[m][i], _mm256_madd_epi16(_mm256_packs_epi32(t0, t1), sc[i]));
        }
      }
    }
    const __m256 d = _mm256_set1_ps(unit.d), dmin = _mm256_set1_ps(unit.dmin);
    SPECDEC_UNROLL for (int m = 0; m < MB; ++m) {
      const int64_t mu = (m0 + m) * a.supers + u;
      const __m256i s = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.sums.data() + mu * 16));
      const __m256 low = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(unit.mins, s)), dmin);
      const __m256 da = _mm256_set1_ps(a.d[mu]);
      const __m256 v0 = _mm256_fmsub_ps(_mm256_cvtepi32_ps(isum[m][0]), d, low);
      const __m256 v1 = _mm256_fmsub_ps(_mm256_cvtepi32_ps(isum[m][1]), d, _mm256_setzero_ps());
      acc[m][0] = _mm256_fmadd_ps(v0, da, acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(v1, da, acc[m][1]);
    }
  }
  SPECDEC_UNROLL for (int m = 0; m < MB; ++m) y[(m0 + m) * n_dim + n] = Sum16(acc[m][0], acc[m][1]);
}

// This path's k-quants.
template <bool kVnni>
struct KQuants {
  static constexpr int kMaxMPerKPass = 4;  // 4 registers a row: integer and float, lo and hi
  static constexpr auto QuantizeSuper = &avx2::QuantizeSuper;
  template <int F, int MB> static constexpr auto KRowPass = &avx2::KRowPass<F, MB, kVnni>;
};

// ---------------------------------------------------------------------------
// The layouts interleaved by 16 output rows: a lane per output row, so a
// ymm holds half a group (lanes 0-7: the first 32 bytes of each 64-byte line,
// 8-15: the last 32), and a pass over a group is two passes over its halves
// (the second reads the group from cache). Per lane, the reference's integer
// sum and float order (block_dot.h, ref::X16Q4Row, X16Q6Row, X16Q5Row).

// A block of 32 (ref::Quantizers::QuantizeBlock32).
inline float QuantizeBlock32(const float* x, int8_t q[32], int32_t& low, int32_t& high) {
  __m256i r[4];
  const float da = Round<4>(x, r);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), PackCodes(r[0], r[1], r[2], r[3]));
  low = SumOf(_mm256_add_epi32(r[0], r[1]));
  high = SumOf(_mm256_add_epi32(r[2], r[3]));
  return da;
}

// int32 lanes a and b (each within int16) -> int16 pairs (a, b) per lane.
inline __m256i Int16Pairs(__m256i a, __m256i b) { return _mm256_blend_epi16(a, _mm256_slli_epi32(b, 16), 0xAA); }

// A super-block of q4_k_x16, one half (d: its float16 d). Without VNNI a
// sub-block's scale multiplies its int16 pair sums in the vpmaddwd that
// widens them (sc in both halves of a lane: |pair sum| <= 30720, sc <= 63).
// A row's minimums term: per pair of sub-blocks one vpmaddwd of the lanes'
// (mn_2i, mn_2i+1) with the row's (asum_2i, asum_2i+1).
template <int MB, bool kVnni>
SPECDEC_INLINE void X16Q4Unit(const uint8_t* p, int64_t u, const PassView& pass, int half, __m256 d,
                              __m256 (&acc)[MB]) {
  const int first = 8 * half;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256i total[MB];
  _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) total[m] = _mm256_setzero_si256();
  for (int j = 0; j < 8; ++j) {
    const __m256i sc = BytesToInts(p + 64 + 16 * j + first);
    const __m256i sc_pairs = Int16Pairs(sc, sc);
    const int32_t* wj = pass.words + (u * 64 + 8 * j) * MB;  // this sub-block's 8 words per row
    __m256i isum[MB];
    _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) isum[m] = _mm256_setzero_si256();
    _Pragma("GCC unroll 4") for (int t = 0; t < 4; ++t) {
      const uint8_t* line = p + kX16Codes + (4 * j + t) * 64;
      if (half == 0) _mm_prefetch(reinterpret_cast<const char*>(line) + X16Spec<kQ4_KX16>::kAhead, _MM_HINT_T0);
      const __m256i codes = Load(line + 4 * first);
      const __m256i lo = _mm256_and_si256(codes, low4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(codes, 4), low4);
      _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) {
        const __m256i a_lo = _mm256_set1_epi32(wj[(2 * t) * MB + m]);
        const __m256i a_hi = _mm256_set1_epi32(wj[(2 * t + 1) * MB + m]);
        if constexpr (kVnni) {
          isum[m] = Dpbusd(Dpbusd(isum[m], lo, a_lo), hi, a_hi);
        } else {
          // int16 pairs of the sub-block's 8 products: |sum| <= 8 * 2 * 15 * 128 = 30720
          isum[m] = _mm256_add_epi16(isum[m], _mm256_add_epi16(_mm256_maddubs_epi16(lo, a_lo),
                                                                _mm256_maddubs_epi16(hi, a_hi)));
        }
      }
    }
    _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) {
      const __m256i scaled = kVnni ? _mm256_mullo_epi32(isum[m], sc) : _mm256_madd_epi16(isum[m], sc_pairs);
      total[m] = _mm256_add_epi32(total[m], scaled);
    }
  }
  const __m256 dmin = HalvesToFloats(p + 32 + 2 * first);
  __m256i mn_pairs[4];
  _Pragma("GCC unroll 4") for (int i = 0; i < 4; ++i)
    mn_pairs[i] = Int16Pairs(BytesToInts(p + 192 + 32 * i + first), BytesToInts(p + 208 + 32 * i + first));
  const int32_t* pairs = pass.pair_sums + u * 4 * MB;
  _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) {
    const __m256 da = _mm256_set1_ps(pass.da[u * MB + m]);
    acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total[m]), _mm256_mul_ps(d, da), acc[m]);
    const __m256i mins = _mm256_add_epi32(
        _mm256_add_epi32(_mm256_madd_epi16(mn_pairs[0], _mm256_set1_epi32(pairs[m])),
                         _mm256_madd_epi16(mn_pairs[1], _mm256_set1_epi32(pairs[MB + m]))),
        _mm256_add_epi32(_mm256_madd_epi16(mn_pairs[2], _mm256_set1_epi32(pairs[2 * MB + m])),
                         _mm256_madd_epi16(mn_pairs[3], _mm256_set1_epi32(pairs[3 * MB + m]))));
    acc[m] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_mul_ps(dmin, da), acc[m]);
  }
}

// A q6_k_x16 block of 16's 8 scales (lanes first..first + 7) as int32.
inline __m256i Q6Scales(const uint8_t* p, int j, int first) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 32 + 16 * j + first)));
}

// A super-block of q6_k_x16, one half: a row's sum stays an integer through
// the super-block (ref::X16Q6Row), one float step at its end. Without VNNI,
// a block of 16's scale multiplies its int16 pair sums in the vpmaddwd that
// widens them (the scale in both halves of a lane), and the -32 of every code
// is paid once a block of 32: its two halves' code sums (half_sums) times
// -32 sc of their blocks, one vpmaddwd. The integers are the reference's (|a pair sum| <= 32256 and
// |sc| <= 128; |half sum| <= 2048 and |-32 sc| <= 4096; the super-block's sum
// within ref::X16Q6Row's bound): two vpmulld and an addition fewer a row and
// block of 32, one vpmaddwd more. On a Zen 3 core (x16_pass_rows.cc, 1,536 x
// 8,960 and the 151,936-row head) 9 rows 1-8% faster and 16 rows 5-8%, 1 row
// the same.
template <int MB, bool kVnni>
SPECDEC_INLINE void X16Q6Unit(const uint8_t* p, int64_t u, const PassView& pass, int half, __m256 d,
                              __m256 (&acc)[MB]) {
  const int first = 8 * half;
  __m256i total[MB];
  _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) total[m] = _mm256_setzero_si256();
  for (int jp = 0; jp < 8; ++jp) {
    const int64_t b = u * 8 + jp;
    const __m256i scales[2] = {Q6Scales(p, 2 * jp, first), Q6Scales(p, 2 * jp + 1, first)};
    // (-32 sc of block 2jp, of 2jp + 1) per lane (|-32 sc| <= 4096: int16)
    const __m256i minus32_scales =
        _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(Int16Pairs(scales[0], scales[1]), 5));
    _Pragma("GCC unroll 2") for (int sub = 0; sub < 2; ++sub) {
      const int j = 2 * jp + sub;
      const __m256i sc = scales[sub];
      const uint8_t* low = p + kX16Q6Low + 128 * j;
      const uint8_t* high = p + kX16Q6High + 64 * j;
      if (half == 0) {
        _mm_prefetch(reinterpret_cast<const char*>(low) + X16Spec<kQ6_KX16>::kAhead, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(low) + 64 + X16Spec<kQ6_KX16>::kAhead, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(high) + X16Spec<kQ6_KX16>::kAhead, _MM_HINT_T0);
      }
      const __m256i lines[2] = {Load(low + 4 * first), Load(low + 64 + 4 * first)};
      __m256i codes[4];
      X16SplitCodes<2>(lines, Load(high + 4 * first), codes);
      const int32_t* wj = pass.words + (u * 64 + 4 * j) * MB;  // this sub-block's 4 words per row
      if constexpr (kVnni) {
        const int32_t* offset = pass.q6_offset + (u * 16 + j) * MB;
        _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) {
          __m256i isum = _mm256_set1_epi32(offset[m]);  // the -32 of every code, paid up front
          _Pragma("GCC unroll 4") for (int k = 0; k < 4; ++k)
            isum = Dpbusd(isum, codes[k], _mm256_set1_epi32(wj[k * MB + m]));
          total[m] = _mm256_add_epi32(total[m], _mm256_mullo_epi32(isum, sc));
        }
      } else {
        const __m256i sc_pairs = Int16Pairs(sc, sc);
        _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) {
          // int16 pairs of two products each: |sum| <= 2 * 2 * 63 * 128 = 32256
          const __m256i s01 = _mm256_add_epi16(
              _mm256_maddubs_epi16(codes[0], _mm256_set1_epi32(wj[0 * MB + m])),
              _mm256_maddubs_epi16(codes[1], _mm256_set1_epi32(wj[1 * MB + m])));
          const __m256i s23 = _mm256_add_epi16(
              _mm256_maddubs_epi16(codes[2], _mm256_set1_epi32(wj[2 * MB + m])),
              _mm256_maddubs_epi16(codes[3], _mm256_set1_epi32(wj[3 * MB + m])));
          __m256i scaled = _mm256_add_epi32(_mm256_madd_epi16(s01, sc_pairs), _mm256_madd_epi16(s23, sc_pairs));
          if (sub == 0)
            scaled = _mm256_add_epi32(
                scaled, _mm256_madd_epi16(_mm256_set1_epi32(pass.half_sums[b * MB + m]), minus32_scales));
          total[m] = _mm256_add_epi32(total[m], scaled);
        }
      }
    }
  }
  _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m)
    acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total[m]), _mm256_mul_ps(d, _mm256_set1_ps(pass.da[u * MB + m])), acc[m]);
}

// A block of q5_0_x16, one half.
template <int MB, bool kVnni>
SPECDEC_INLINE void X16Q5Unit(const uint8_t* p, int64_t b, const PassView& pass, int half, __m256 d,
                              __m256 (&acc)[MB]) {
  const int first = 8 * half;
  const __m256i lines[4] = {Load(p + 32 + 4 * first), Load(p + 96 + 4 * first),
                            Load(p + 160 + 4 * first), Load(p + 224 + 4 * first)};
  __m256i codes[8];
  X16SplitCodes<1>(lines, Load(p + 288 + 4 * first), codes);
  const int32_t* wb = pass.words + 8 * b * MB;
  _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) {
    const __m256i offset = _mm256_set1_epi32(WrapMul(-16, pass.asum[b * MB + m]));  // the -16 of every code
    __m256i isum;
    if constexpr (kVnni) {
      isum = offset;
      _Pragma("GCC unroll 8") for (int k = 0; k < 8; ++k)
        isum = Dpbusd(isum, codes[k], _mm256_set1_epi32(wb[k * MB + m]));
    } else {
      // int16 pairs of four products each: |sum| <= 4 * 2 * 31 * 128 = 31744
      __m256i s[2];
      _Pragma("GCC unroll 2") for (int i = 0; i < 2; ++i) {
        s[i] = _mm256_add_epi16(
            _mm256_add_epi16(_mm256_maddubs_epi16(codes[4 * i], _mm256_set1_epi32(wb[(4 * i) * MB + m])),
                             _mm256_maddubs_epi16(codes[4 * i + 1], _mm256_set1_epi32(wb[(4 * i + 1) * MB + m]))),
            _mm256_add_epi16(_mm256_maddubs_epi16(codes[4 * i + 2], _mm256_set1_epi32(wb[(4 * i + 2) * MB + m])),
                             _mm256_maddubs_epi16(codes[4 * i + 3], _mm256_set1_epi32(wb[(4 * i + 3) * MB + m]))));
      }
      isum = _mm256_add_epi32(offset, _mm256_add_epi32(_mm256_madd_epi16(s[0], Ones16()),
                                                       _mm256_madd_epi16(s[1], Ones16())));
    }
    acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum),
                             _mm256_mul_ps(d, _mm256_set1_ps(pass.da[b * MB + m])), acc[m]);
  }
}

// The rows of x a pass reads both halves of a group in, this path (the
// AVX-VNNI one keeps a pass per half: not timed on a CPU that runs it).
constexpr int WholeRows(bool vnni) { return vnni ? 0 : 2; }

// Per unit: its prefetch (X16Spec, by the first half only: the second reads
// the group from cache), its 16 rows' float16 d, its format's sums. A pass of
// at most WholeRows rows reads both halves, unit by unit (part 0 of 1), so
// the second half's products run while the next unit's lines are on their
// way from memory; a larger pass reads the half `part` (part 0 or 1 of 2).
template <int F, int MB, bool kVnni>
void X16Pass(const uint8_t* group, int64_t units, const PassView& pass, float* y, int64_t n_dim,
             int64_t lane0, int part) {
  constexpr bool kWhole = MB <= WholeRows(kVnni);
  constexpr int kHalves = kWhole ? 2 : 1;
  __m256 acc[kHalves][MB];
  _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) {
    for (int h = 0; h < kHalves; ++h) acc[h][m] = _mm256_setzero_ps();
  }
  for (int64_t u = 0; u < units; ++u) {
    const uint8_t* p = group + u * X16Spec<F>::kBytes;
    if (kWhole || part == 0) PrefetchX16Ahead<F>(p);
    for (int h = 0; h < kHalves; ++h) {
      const int half = kWhole ? h : part;
      const __m256 d = HalvesToFloats(p + 16 * half);
      if constexpr (F == kQ4_KX16) X16Q4Unit<MB, kVnni>(p, u, pass, half, d, acc[h]);
      else if constexpr (F == kQ6_KX16) X16Q6Unit<MB, kVnni>(p, u, pass, half, d, acc[h]);
      else X16Q5Unit<MB, kVnni>(p, u, pass, half, d, acc[h]);
    }
  }
  for (int h = 0; h < kHalves; ++h) {
    const int first = 8 * (kWhole ? h : part);  // this half's first lane
    _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m)
      _mm256_storeu_ps(y + (pass.m0 + m) * n_dim + lane0 + first, acc[h][m]);
  }
}

// This path's interleaved layouts: a pass per half of a group, or over both
// halves for 1 or 2 rows (X16Pass; on one Zen 3 core M = 1 read 4-20%
// faster so, M = 2 6-16%, and 3 or 4 rows spilled and read slower).
// Rows of x per pass: an integer and a float accumulator per row beside the
// codes, so from 3 rows on some spill; yet each pass loads and unpacks the
// group's codes once more, and that costs more than the spills. Measured
// with benchmarks/scripts/x16_pass_rows.cc on a Zen 3 core (the 1.5B's
// shapes, weights read from memory), up to 12 rows a pass against 8 on the
// AVX2 path: M = 9 7-16% faster in each format, M = 12 6-12% (one pass
// instead of two), M = 17 3-10% (two passes instead of three), M = 1..8 the
// same passes. 16 rows a pass gained 7-9% more at M = 13..16 only, and
// doubled the library's compile time (g++ 12: 17 s with 8, 25 s with 12,
// 34 s with 16). The AVX-VNNI path keeps 8 rows and a pass per half (not
// timed on a CPU that runs it).
template <bool kVnni>
struct Interleaved {
  static constexpr int kMaxMPerX16Pass = kVnni ? 8 : 12, kX16Parts = 2, kX16WholeRows = WholeRows(kVnni);
  static constexpr auto QuantizeBlock32 = &avx2::QuantizeBlock32;
  template <int F, int MB> static constexpr auto X16Pass = &avx2::X16Pass<F, MB, kVnni>;
};

}  // namespace avx2

template <bool kVnni>
struct Avx256 : avx2::Blocks<kVnni>, avx2::KQuants<kVnni>, avx2::Interleaved<kVnni> {
  static constexpr const char* kName = kVnni ? "avxvnni" : "avx2";
};

}  // namespace blocks
}  // namespace specdec

#endif  // SPECDEC_JAX_NATIVE_BLOCK_DOT_AVX2_H_
