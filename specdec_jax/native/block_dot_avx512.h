// The block kernel on AVX-512 VNNI + BW (servers, AMD Zen 4+): a zmm of 16
// lanes per output row (file layouts) or per 16 output rows (interleaved
// layouts). Included by block_dot.h where the compiler targets it; every
// float operation is the reference's (block_dot.h, namespace ref), lane for
// lane, and block_dot_check.cc holds this path to it bit for bit on a CPU
// that runs it.

#ifndef SPECDEC_JAX_NATIVE_BLOCK_DOT_AVX512_H_
#define SPECDEC_JAX_NATIVE_BLOCK_DOT_AVX512_H_

#include <immintrin.h>

#define SPECDEC_BLOCKS_AVX512 1

namespace specdec {
namespace blocks {
namespace avx512 {

// The 16 lanes' sum in the reference's order (Sum16: GCC's _mm512_reduce_add_ps,
// written out so that another compiler's reduction order cannot change it).
inline float Sum16(__m512 v) {
  const __m256 t = _mm256_add_ps(_mm512_castps512_ps256(v),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  const __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  const __m128 w = _mm_add_ps(u, _mm_movehl_ps(u, u));  // lanes 0, 1: u0 + u2, u1 + u3
  return _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)));
}

// float16 without F16C (AVX-512F converts 16 at once; a single one is
// converted exactly by the reference's HalfToFloat), so that the flags
// -mavx512f -mavx512bw -mavx512vnni -mavx512vl alone build this path.
inline float F16(const uint8_t* p) { return HalfAt(p); }

struct Chunk {
  __m512i q;  // 64 unsigned codes
  __m512 s;   // per lane (4 weights): scale
  __m512 o;   // per lane: offset
};

inline __m512i Join(__m256i lo, __m256i hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}
// Two blocks' 16 bytes of nibbles (at p and q) -> 64 codes: p's low nibbles,
// p's high nibbles, then q's. Each 16 bytes go to two 128-bit lanes at once
// (a broadcast load), and one variable shift moves the high lanes' nibbles
// down: four instructions where unpacking each half apart took eleven. The
// same codes: a product's bits do not change.
inline __m512i NibblePairs(const uint8_t* p, const uint8_t* q) {
  const __m512i both = _mm512_mask_broadcast_i32x4(
      _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
      __mmask16(0xFF00), _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
  const __m512i shifts = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
  return _mm512_and_si512(_mm512_srlv_epi64(both, shifts), _mm512_set1_epi8(0x0F));
}
// Two float16 scales (at p and q) -> lanes 0-7 p's, 8-15 q's.
inline __m512 HalvesF16(const uint8_t* p, const uint8_t* q) {
  uint16_t a, b;
  std::memcpy(&a, p, 2);
  std::memcpy(&b, q, 2);
  const __m512 two = _mm512_cvtph_ps(_mm256_zextsi128_si256(_mm_cvtsi32_si128(int(a) | (int(b) << 16))));
  return _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0), two);
}

// A unit of the 32-weight formats: two blocks, one chunk (the k-quants have
// their own path below).
template <int F> struct Unit;

template <> struct Unit<kQ8_0> {
  static constexpr int kWeights = 64, kBytes = 68, kChunks = 1;
  const uint8_t* b;
  void Load(const uint8_t* p) { b = p; }
  Chunk Get(int) const {
    const __m256i flip = _mm256_set1_epi8(char(0x80));
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 36));
    const __m512 s = HalvesF16(b, b + 34);
    return {Join(_mm256_xor_si256(lo, flip), _mm256_xor_si256(hi, flip)), s,
            _mm512_mul_ps(s, _mm512_set1_ps(-128.0f))};
  }
};

template <> struct Unit<kQ4_1> {
  static constexpr int kWeights = 64, kBytes = 40, kChunks = 1;
  const uint8_t* b;
  void Load(const uint8_t* p) { b = p; }
  Chunk Get(int) const {
    return {NibblePairs(b + 4, b + 24), HalvesF16(b, b + 20), HalvesF16(b + 2, b + 22)};
  }
};

template <> struct Unit<kQ5_0> {
  static constexpr int kWeights = 64, kBytes = 44, kChunks = 1;
  const uint8_t* b;
  void Load(const uint8_t* p) { b = p; }
  Chunk Get(int) const {
    uint32_t h0, h1;
    std::memcpy(&h0, b + 2, 4);
    std::memcpy(&h1, b + 24, 4);
    const __m512i low = NibblePairs(b + 6, b + 28);
    const __mmask64 fifth = __mmask64(h0) | (__mmask64(h1) << 32);
    const __m512 s = HalvesF16(b, b + 22);
    return {_mm512_mask_add_epi8(low, fifth, low, _mm512_set1_epi8(16)), s,
            _mm512_mul_ps(s, _mm512_set1_ps(-16.0f))};
  }
};

// The 32-weight formats: a zmm of 16 lanes per output row.
// A chunk of 64 (ref::Quantizers::QuantizeChunk).
inline float QuantizeChunk(const float* x, int8_t q[kChunk], float lane_sums[16]) {
  const __m512i ones = _mm512_set1_epi8(1);
  __m512 v[4];
  __m512 peak = _mm512_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm512_loadu_ps(x + 16 * i);
    peak = _mm512_max_ps(peak, _mm512_abs_ps(v[i]));
  }
  const float top = _mm512_reduce_max_ps(peak);
  const float d = top / 127.0f;
  const __m512 inv = _mm512_set1_ps(top > 0.0f ? 127.0f / top : 0.0f);
  for (int i = 0; i < 4; ++i) {
    const __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(v[i], inv));  // nearest, ties even
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * i), _mm512_cvtsepi32_epi8(r));
  }
  const __m512i codes = _mm512_loadu_si512(q);
  const __m512 sums = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, codes));
  _mm512_storeu_ps(lane_sums, _mm512_mul_ps(sums, _mm512_set1_ps(d)));
  return d;
}

template <int F, int MB>
void RowPass(const uint8_t* w_row, const Activations& a, int64_t k_dim, int64_t m0,
             float* y, int64_t n_dim, int64_t n) {
  __m512 acc[MB];
  SPECDEC_UNROLL for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
  Unit<F> unit;
  const int64_t units = k_dim / Unit<F>::kWeights;
  for (int64_t u = 0; u < units; ++u) {
    if (m0 == 0) PrefetchAhead<F>(w_row, u);  // the first pass asks ahead (block_dot.h)
    unit.Load(w_row + u * Unit<F>::kBytes);
    for (int j = 0; j < Unit<F>::kChunks; ++j) {
      const Chunk ch = unit.Get(j);
      const int64_t c = u * Unit<F>::kChunks + j;
      SPECDEC_UNROLL for (int m = 0; m < MB; ++m) {
        const int64_t mc = (m0 + m) * a.chunks + c;
        const __m512i codes = _mm512_loadu_si512(a.q.data() + (m0 + m) * k_dim + c * kChunk);
        const __m512 sums = _mm512_cvtepi32_ps(
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), ch.q, codes));
        acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(sums, ch.s), _mm512_set1_ps(a.d[mc]), acc[m]);
        acc[m] = _mm512_fmadd_ps(ch.o, _mm512_loadu_ps(a.sums.data() + mc * 16), acc[m]);
      }
    }
  }
  SPECDEC_UNROLL for (int m = 0; m < MB; ++m) y[(m0 + m) * n_dim + n] = Sum16(acc[m]);
}

// This path's 32-weight formats (block_dot.h: what a path provides).
struct Blocks {
  static constexpr int kMaxMPerBlockPass = 8;
  static constexpr auto QuantizeChunk = &avx512::QuantizeChunk;
  template <int F, int MB> static constexpr auto RowPass = &avx512::RowPass<F, MB>;
};

// The k-quant formats (q4_k, q6_k) have integer sub-block scales, so a super-
// block's products stay integer to its end, and one float multiply-add per
// super-block and row ends it. Their activations are quantised per 256
// (llama.cpp's Q8_K), the super-block. Within a super-block, chunks go in
// pairs: each chunk's 64 products become 16 lane sums of 4 (vpdpbusd; a lane
// sum fits int16: 4 * 63 * 127), the two chunks' lane sums are packed into
// int16 (vpackssdw) and multiplied by their sub-blocks' scales and added in
// one vpdpwssd: three multiplies per two chunks and row, where codes times
// activations in int16 pairs (vpmaddubsw) then times scales (vpdpwssd) took
// four. Every step is exact integer arithmetic up to the super-block's float
// multiply-add, and each row is computed alone, in one order.
//   x . w ~= sum over super-blocks of da * (d * sum_j sc_j * isum_j - dmin * sum_j mn_j * asum_j)

// One super-block of a k-quant row: per chunk of 64, the codes; per pair of
// chunks, the int16 scale of each element of their packed lane sums; per group
// of 16, the int16 minimum.
template <int F> struct KUnit;

// Where PairScales reads each element of chunk pair h: the group of the lane
// that vpackssdw put there (per 128 bits: 4 lanes of chunk 2h, then the same 4
// of chunk 2h + 1), where lane i of chunk c is in group step * c + i / per.
struct PairPicks { int16_t of[2][32]; };
constexpr PairPicks MakePairPicks(int step, int per) {
  PairPicks p{};
  for (int h = 0; h < 2; ++h) {
    for (int e = 0; e < 32; ++e) {
      const int k = e / 8, j = e % 8;
      const int chunk = 2 * h + j / 4, lane = 4 * k + j % 4;
      p.of[h][e] = int16_t(step * chunk + lane / per);
    }
  }
  return p;
}
alignas(64) constexpr PairPicks kQ4KPicks = MakePairPicks(2, 8);  // low nibbles: group 2c
alignas(64) constexpr PairPicks kQ6KPicks = MakePairPicks(4, 4);  // groups of 16

template <> struct KUnit<kQ4_K> {
  static constexpr int kBytes = 144;
  const uint8_t* qs;
  float d, dmin;
  __m512i sc16;  // the 8 scales as int16 (the rest unused)
  __m256i mins;  // 16 x int16: each group of 32's minimum, twice (groups of 16)
  void Load(const uint8_t* p) {
    d = F16(p);
    dmin = F16(p + 2);
    uint32_t scales[2], minimums[2];
    Q4KScalesMins(p + 4, scales, minimums);
    sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64(
        reinterpret_cast<const __m128i*>(scales))));
    const __m128i m8 = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(minimums)));
    mins = _mm256_set_m128i(_mm_unpackhi_epi16(m8, m8), _mm_unpacklo_epi16(m8, m8));
    qs = p + 16;
  }
  __m512i Codes(int c) const {  // low nibbles: group 2c; high nibbles: group 2c + 1
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
    const __m256i f = _mm256_set1_epi8(0x0F);
    return Join(_mm256_and_si256(v, f), _mm256_and_si256(_mm256_srli_epi16(v, 4), f));
  }
  __m512i PairScales(int h) const {
    return _mm512_permutexvar_epi16(_mm512_load_si512(kQ4KPicks.of[h]), sc16);
  }
};

template <> struct KUnit<kQ6_K> {
  static constexpr int kBytes = 210;
  const uint8_t* b;
  float d, dmin;
  __m512i sc16;  // the 16 scales as int16 (upper half unused)
  __m256i mins;  // 32 x scale: w = d * sc * q - d * (32 sc)
  void Load(const uint8_t* p) {
    b = p;
    d = dmin = F16(p + 208);
    const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192)));
    sc16 = _mm512_castsi256_si512(sc);
    mins = _mm256_slli_epi16(sc, 5);
  }
  __m512i Codes(int c) const {
    const int h = c / 2, shift = 4 * (c % 2);
    const __m512i ql = _mm512_loadu_si512(b + 64 * h);
    const __m512i low = _mm512_and_si512(_mm512_srli_epi16(ql, shift), _mm512_set1_epi8(0x0F));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
    const __m256i three = _mm256_set1_epi8(3);
    const __m512i high = Join(_mm256_and_si256(_mm256_srli_epi16(qh, shift), three),
                              _mm256_and_si256(_mm256_srli_epi16(qh, shift + 2), three));
    return _mm512_or_si512(low, _mm512_slli_epi16(high, 4));
  }
  __m512i PairScales(int h) const {
    return _mm512_permutexvar_epi16(_mm512_load_si512(kQ6KPicks.of[h]), sc16);
  }
};

// A super-block of 256 (ref::Quantizers::QuantizeSuper).
inline float QuantizeSuper(const float* x, int8_t q[kSuper], int16_t sums[16]) {
  __m512 peak = _mm512_setzero_ps();
  for (int i = 0; i < 16; ++i) peak = _mm512_max_ps(peak, _mm512_abs_ps(_mm512_loadu_ps(x + 16 * i)));
  const float top = _mm512_reduce_max_ps(peak);
  const __m512 inv = _mm512_set1_ps(top > 0.0f ? 127.0f / top : 0.0f);
  for (int i = 0; i < 16; ++i) {
    const __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16 * i), inv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * i), _mm512_cvtsepi32_epi8(r));
    sums[i] = int16_t(_mm512_reduce_add_epi32(r));
  }
  return top / 127.0f;
}

template <int F, int MB>
void KRowPass(const uint8_t* w_row, const SuperActivations& a, int64_t k_dim, int64_t m0,
              float* y, int64_t n_dim, int64_t n) {
  // Per lane: the super-blocks' d * (scaled integer sum) - dmin * (minimums
  // times activation sums), each times the row's activation scale. The
  // minimum term has 8 lanes, carried in the low half of the same register.
  __m512 acc[MB];
  SPECDEC_UNROLL for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
  KUnit<F> unit;
  for (int64_t u = 0; u < a.supers; ++u) {
    if (m0 == 0) PrefetchAhead<F>(w_row, u);  // the first pass asks ahead (block_dot.h)
    unit.Load(w_row + u * KUnit<F>::kBytes);
    __m512i isum[MB];
    SPECDEC_UNROLL for (int m = 0; m < MB; ++m) isum[m] = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      const __m512i q0 = unit.Codes(2 * h), q1 = unit.Codes(2 * h + 1);
      const __m512i sc = unit.PairScales(h);
      SPECDEC_UNROLL for (int m = 0; m < MB; ++m) {
        const int8_t* act = a.q.data() + (m0 + m) * k_dim + u * kSuper + 128 * h;
        const __m512i zero = _mm512_setzero_si512();
        const __m512i t0 = _mm512_dpbusd_epi32(zero, q0, _mm512_loadu_si512(act));
        const __m512i t1 = _mm512_dpbusd_epi32(zero, q1, _mm512_loadu_si512(act + 64));
        isum[m] = _mm512_dpwssd_epi32(isum[m], _mm512_packs_epi32(t0, t1), sc);
      }
    }
    const __m512 d = _mm512_set1_ps(unit.d);
    const __m256 dmin = _mm256_set1_ps(unit.dmin);
    SPECDEC_UNROLL for (int m = 0; m < MB; ++m) {
      const int64_t mu = (m0 + m) * a.supers + u;
      const __m256i s = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.sums.data() + mu * 16));
      const __m256 low = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(unit.mins, s)), dmin);
      const __m512 v = _mm512_fmsub_ps(_mm512_cvtepi32_ps(isum[m]), d, _mm512_zextps256_ps512(low));
      acc[m] = _mm512_fmadd_ps(v, _mm512_set1_ps(a.d[mu]), acc[m]);
    }
  }
  SPECDEC_UNROLL for (int m = 0; m < MB; ++m) y[(m0 + m) * n_dim + n] = Sum16(acc[m]);
}

// This path's k-quants.
struct KQuants {
  // Rows of x per pass of a k-quant row: two registers each (the integer sum of
  // the super-block and the float accumulator) beside the codes and scales.
  static constexpr int kMaxMPerKPass = 12;
  static constexpr auto QuantizeSuper = &avx512::QuantizeSuper;
  template <int F, int MB> static constexpr auto KRowPass = &avx512::KRowPass<F, MB>;
};

// q4_k interleaved by 16 output rows (models' matrices on CPU, stored_blocks.
// interleave_q4_k): one zmm lane per output row. Why: in the file's layout a
// lane holds 4 weights of one output row, so every row of x ends each block
// with a float epilogue and a reduction across lanes of its own; a 9-row
// product cost 3.8x a row (measured [8960, 1536]). With a lane per output row,
// one vpdpbusd multiplies 4 weights of 16 output rows by 4 activations
// broadcast from one row of x, and a row's float work is one multiply-add
// per 32 weights and 16 outputs: 8 rows cost 1.45x one row there (a prototype
// of this loop; memory-bound up to ~4 rows).
// Per 16 rows and super-block of 256 weights, kX16Bytes bytes: d[16] and
// dmin[16] (float16), sc[8][16] and mn[8][16] (the 6-bit scales and minimums,
// a byte each), then per sub-block j and group t of 8 weights one line of 64
// bytes: byte 4 * lane + b holds the code of weight 32j + 8t + b in its low
// nibble and of weight 32j + 8t + 4 + b in its high nibble.
// Activations are quantised per row and super-block (int8 codes, one scale
// da, the codes' sum asum_j per sub-block); per output lane
//   x . w ~= (d da) * sum over j of sc_j isum_j - (dmin da) * sum over j of mn_j asum_j
// with isum_j the sub-block's integer sum: exact integers to the super-block's
// end (ref::X16Q4Row), then two float steps per row, whatever rows share the
// call. With a scale per 32 instead, those float steps came once a sub-block
// and were about a third of the pass's instructions; one scale per 256 made 6,
// 9 and 16 rows ~10% faster (x16_pass_rows.cc, one Zen 4 core).
// A block of 32 (ref::Quantizers::QuantizeBlock32).
inline float QuantizeBlock32(const float* x, int8_t q[32], int32_t& low, int32_t& high) {
  const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
  const float top = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  const __m512 inv = _mm512_set1_ps(top > 0.0f ? 127.0f / top : 0.0f);
  const __m512i r0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv));  // nearest, ties even
  const __m512i r1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(r0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtsepi32_epi8(r1));
  low = _mm512_reduce_add_epi32(r0);
  high = _mm512_reduce_add_epi32(r1);
  return top / 127.0f;
}

// A pass (X16Pass, below) is rows [m0, m0 + MB) of x times the
// 16 output rows of `group`, a unit (X16Spec) at a time. Up to 6 rows, the low
// and high nibbles' products (q6_k, q5_0: the even and odd words') go to two
// integer sums per row (two dependency chains: one chain held 4 rows at ~75%
// of the speed of two); more rows have enough chains of their own. The sums
// are exact integers either way.
template <int MB>
constexpr bool kTwoChains = MB <= 6;

// isum[m] (row m's sum so far) plus, for k < K, the products of codes[k] and
// row m's word k (words[k * MB + m]) broadcast: the even k and the odd k in
// two chains up to 6 rows.
template <int MB, int K>
SPECDEC_INLINE void AddWordProducts(const __m512i (&codes)[K], const int32_t* words, __m512i (&isum)[MB]) {
  __m512i isum_odd[MB];
  _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) isum_odd[m] = _mm512_setzero_si512();
  _Pragma("GCC unroll 8") for (int k = 0; k < K; ++k) {
    _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) {
      __m512i& sum = (kTwoChains<MB> && k % 2) ? isum_odd[m] : isum[m];
      sum = _mm512_dpbusd_epi32(sum, codes[k], _mm512_set1_epi32(words[k * MB + m]));
    }
  }
  _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m)
    isum[m] = kTwoChains<MB> ? _mm512_add_epi32(isum[m], isum_odd[m]) : isum[m];
}

// 16 bytes (a scale or minimum per lane) as int32, zero- or sign-extended.
inline __m512i UnsignedBytes(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m512i SignedBytes(const uint8_t* p) {
  return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// A super-block of q4_k_x16 (d: its 16 rows' float16 d). A row's minimums
// term: per pair of sub-blocks one vpdpwssd of the lanes' (mn_2i, mn_2i+1)
// with the row's (asum_2i, asum_2i+1).
template <int MB>
SPECDEC_INLINE void X16Q4Unit(const uint8_t* p, int64_t u, const PassView& pass, __m512 d,
                              __m512 (&acc)[MB]) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512i total[MB];
  _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) total[m] = _mm512_setzero_si512();
  for (int j = 0; j < 8; ++j) {
    const __m512i sc = UnsignedBytes(p + 64 + 16 * j);
    __m512i isum[MB], isum_high[MB];
    _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) isum[m] = isum_high[m] = _mm512_setzero_si512();
    const int32_t* wj = pass.words + (u * 64 + 8 * j) * MB;  // this sub-block's 8 words per row
    _Pragma("GCC unroll 4") for (int t = 0; t < 4; ++t) {
      const uint8_t* line = p + kX16Codes + (4 * j + t) * 64;
      _mm_prefetch(reinterpret_cast<const char*>(line) + X16Spec<kQ4_KX16>::kAhead, _MM_HINT_T0);
      const __m512i codes = _mm512_loadu_si512(line);
      const __m512i lo = _mm512_and_si512(codes, low4);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(codes, 4), low4);
      _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) {
        isum[m] = _mm512_dpbusd_epi32(isum[m], lo, _mm512_set1_epi32(wj[(2 * t) * MB + m]));
        __m512i& high = kTwoChains<MB> ? isum_high[m] : isum[m];
        high = _mm512_dpbusd_epi32(high, hi, _mm512_set1_epi32(wj[(2 * t + 1) * MB + m]));
      }
    }
    _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) {
      const __m512i sum = kTwoChains<MB> ? _mm512_add_epi32(isum[m], isum_high[m]) : isum[m];
      total[m] = _mm512_add_epi32(total[m], _mm512_mullo_epi32(sum, sc));
    }
  }
  __m512i mins[MB];
  _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) mins[m] = _mm512_setzero_si512();
  _Pragma("GCC unroll 4") for (int i = 0; i < 4; ++i) {
    const __m512i mn_pairs = _mm512_or_si512(UnsignedBytes(p + 192 + 32 * i),
                                             _mm512_slli_epi32(UnsignedBytes(p + 208 + 32 * i), 16));
    _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m)
      mins[m] = _mm512_dpwssd_epi32(mins[m], mn_pairs, _mm512_set1_epi32(pass.pair_sums[(u * 4 + i) * MB + m]));
  }
  const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
  _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) {
    const __m512 da = _mm512_set1_ps(pass.da[u * MB + m]);
    acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total[m]), _mm512_mul_ps(d, da), acc[m]);
    acc[m] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mins[m]), _mm512_mul_ps(dmin, da), acc[m]);
  }
}

// q6_k interleaved the same way (stored_blocks.interleave_q6_k). Per 16 rows and
// super-block, kX16Q6Bytes bytes: d[16] (float16), sc[16][16] (int8 scales of the
// sub-blocks of 16), then per sub-block j two lines of the codes' low 4 bits
// (line t: byte 4 * lane + b holds weight 16j + 8t + b's in its low nibble and
// 16j + 8t + 4 + b's in its high nibble), then per sub-block one line of their
// high 2 bits (byte 4 * lane + b: bits 2k, 2k + 1 of weight 16j + 4k + b's).
// w = d sc (q - 32). Per output lane and super-block (one activation scale
// da), the sum stays an exact integer through its 16 sub-blocks j:
//   x . w ~= (d da) * sum over j of sc_j (isum_j - 32 asum_j)
// so a row's bits do not depend on the rows beside it, and one float fma per
// 256 weights and row is all the epilogue (a sub-block's float epilogue made
// one row ~1.2x slower than the file's layout).

template <int MB>
SPECDEC_INLINE void X16Q6Unit(const uint8_t* p, int64_t u, const PassView& pass, __m512 d,
                              __m512 (&acc)[MB]) {
  __m512i total[MB];
  _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) total[m] = _mm512_setzero_si512();
  _Pragma("GCC unroll 2") for (int j = 0; j < 16; ++j) {
    const __m512i sc = SignedBytes(p + 32 + 16 * j);
    const uint8_t* low = p + kX16Q6Low + 128 * j;
    const uint8_t* high = p + kX16Q6High + 64 * j;
    _mm_prefetch(reinterpret_cast<const char*>(low) + X16Spec<kQ6_KX16>::kAhead, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(low) + 64 + X16Spec<kQ6_KX16>::kAhead, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(high) + X16Spec<kQ6_KX16>::kAhead, _MM_HINT_T0);
    const __m512i lines[2] = {_mm512_loadu_si512(low), _mm512_loadu_si512(low + 64)};
    __m512i codes[4];
    X16SplitCodes<2>(lines, _mm512_loadu_si512(high), codes);
    const int32_t* wj = pass.words + (u * 64 + 4 * j) * MB;  // this sub-block's 4 words per row
    const int32_t* offset = pass.q6_offset + (u * 16 + j) * MB;
    __m512i isum[MB];
    _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m)
      isum[m] = _mm512_set1_epi32(offset[m]);  // the -32 of every code, paid up front
    AddWordProducts<MB>(codes, wj, isum);
    _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m)
      total[m] = _mm512_add_epi32(total[m], _mm512_mullo_epi32(isum[m], sc));
  }
  _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) {
    acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total[m]),
                             _mm512_mul_ps(d, _mm512_set1_ps(pass.da[u * MB + m])), acc[m]);
  }
}

// q5_0 interleaved the same way (stored_blocks.interleave_q5_0). Per 16 rows
// and block of 32 weights, kX16Q5Bytes bytes (22 a row, as in the file): d[16]
// (float16), then four lines of the codes' low 4 bits (line t: byte 4 * lane + b
// holds weight 8t + b's in its low nibble and 8t + 4 + b's in its high nibble),
// then one line of their fifth bits (byte 4 * lane + b: bit k is weight 4k + b's).
// w = d (q - 16); per output lane and block, whose activations share one scale da:
//   x . w ~= (d da) * (isum - 16 asum), an exact integer up to the one fma.
template <int MB>
SPECDEC_INLINE void X16Q5Unit(const uint8_t* p, int64_t b, const PassView& pass, __m512 d,
                              __m512 (&acc)[MB]) {
  const __m512i lines[4] = {_mm512_loadu_si512(p + 32), _mm512_loadu_si512(p + 96),
                            _mm512_loadu_si512(p + 160), _mm512_loadu_si512(p + 224)};
  __m512i codes[8];
  X16SplitCodes<1>(lines, _mm512_loadu_si512(p + 288), codes);
  __m512i isum[MB];
  _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m)
    isum[m] = _mm512_set1_epi32(-16 * pass.asum[b * MB + m]);  // the -16 of every code, up front
  AddWordProducts<MB>(codes, pass.words + 8 * b * MB, isum);
  _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) {
    acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[m]),
                             _mm512_mul_ps(d, _mm512_set1_ps(pass.da[b * MB + m])), acc[m]);
  }
}

// Per unit: its prefetch (X16Spec), its 16 rows' float16 d, its format's sums.
template <int F, int MB>
void X16Pass(const uint8_t* group, int64_t units, const PassView& pass, float* y, int64_t n_dim,
             int64_t lane0, int) {
  __m512 acc[MB];
  _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t u = 0; u < units; ++u) {
    const uint8_t* p = group + u * X16Spec<F>::kBytes;
    PrefetchX16Ahead<F>(p);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    if constexpr (F == kQ4_KX16) X16Q4Unit<MB>(p, u, pass, d, acc);
    else if constexpr (F == kQ6_KX16) X16Q6Unit<MB>(p, u, pass, d, acc);
    else X16Q5Unit<MB>(p, u, pass, d, acc);
  }
  _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) _mm512_storeu_ps(y + (pass.m0 + m) * n_dim + lane0, acc[m]);
}

// This path's interleaved layouts.
struct Interleaved {
  static constexpr int kMaxMPerX16Pass = 12, kX16Parts = 1, kX16WholeRows = 12;
  static constexpr auto QuantizeBlock32 = &avx512::QuantizeBlock32;
  template <int F, int MB> static constexpr auto X16Pass = &avx512::X16Pass<F, MB>;
};

}  // namespace avx512

struct Avx512 : avx512::Blocks, avx512::KQuants, avx512::Interleaved {
  static constexpr const char* kName = "avx512vnni";
};

}  // namespace blocks
}  // namespace specdec

#endif  // SPECDEC_JAX_NATIVE_BLOCK_DOT_AVX512_H_
