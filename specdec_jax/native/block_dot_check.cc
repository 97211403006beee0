// Holds every path of the block kernel that this build compiles (block_dot.h)
// to the scalar reference, bit for bit: for each format and layout, products
// of M = 1..17 rows of x (the rows differ per M) with deterministic
// pseudo-random blocks, the activations quantised by each path, and hard
// cases (zero rows, float16 scales of 0, -0, subnormal and +-65504, codes at
// their maximum, activations at rounding ties, all at max |x|, and chunks so
// small that 127 / max |x| is infinite). Prints a line per format and path and
// exits 1 on any difference, 0 when every compiled path equals the reference.
//
//   g++ -O2 -std=c++17 -ffp-contract=off -march=haswell block_dot_check.cc -o check && ./check
//
// (tests/test_block_dot.py builds it for each target this machine can run.)

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "block_dot.h"

using namespace specdec::blocks;

namespace {

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t Next() {  // splitmix64
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double Uniform() { return double(Next() >> 11) * (1.0 / 9007199254740992.0); }
  int Below(int n) { return int(Next() % uint64_t(n)); }
  double Normal() {  // sum of 12 uniforms: enough for test data
    double s = -6.0;
    for (int i = 0; i < 12; ++i) s += Uniform();
    return s;
  }
};

uint16_t FloatToHalf(float f) {  // round to nearest (test data only: finite, in range)
  uint32_t b;
  std::memcpy(&b, &f, 4);
  const uint32_t sign = (b >> 16) & 0x8000u;
  const int exponent = int((b >> 23) & 0xFF) - 127 + 15;
  uint32_t mantissa = b & 0x7FFFFFu;
  if (exponent >= 31) return uint16_t(sign | 0x7BFF);
  if (exponent <= 0) {
    if (exponent < -10) return uint16_t(sign);
    mantissa |= 0x800000u;
    const int shift = 14 - exponent;
    return uint16_t(sign | ((mantissa + (1u << (shift - 1))) >> shift));
  }
  const uint32_t h = sign | uint32_t(exponent) << 10 | (mantissa >> 13);
  return uint16_t(h + ((mantissa >> 12) & 1));
}

// A float16 scale: mostly of order `scale` with either sign, 1 in 8 a hard value.
uint16_t RandomHalf(Rng& rng, float scale) {
  static const uint16_t kHard[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x7BFF, 0xFBFF, 0x3C00};
  if (rng.Below(8) == 0) return kHard[rng.Below(8)];
  return FloatToHalf(float(rng.Normal() * scale));
}
void PutHalf(uint8_t* p, uint16_t h) { std::memcpy(p, &h, 2); }

int RowBytes(int f, int64_t k) {
  switch (f) {
    case kQ8_0: return int(k / 32 * 34);
    case kQ4_1: return int(k / 32 * 20);
    case kQ5_0: case kQ5_0X16: return int(k / 32 * 22);
    case kQ4_K: return int(k / 256 * 144);
    case kQ6_K: case kQ6_KX16: return int(k / 256 * 210);
    default: return int(k / 256 * 148);  // q4_k_x16
  }
}

// uint8 [n, row bytes]: random codes, valid float16 scales (a few hard ones),
// and here and there a block whose codes are all at their maximum.
std::vector<uint8_t> RandomBlocks(int f, int64_t n, int64_t k, Rng& rng) {
  const int64_t row_bytes = RowBytes(f, k);
  std::vector<uint8_t> w(n * row_bytes);
  for (auto& b : w) b = uint8_t(rng.Next());
  const float scale = 0.05f;
  if (f <= kQ6_K) {  // file layouts: per block
    const int block = f == kQ8_0 ? 34 : f == kQ4_1 ? 20 : f == kQ5_0 ? 22 : f == kQ4_K ? 144 : 210;
    for (int64_t at = 0; at + block <= int64_t(w.size()); at += block) {
      uint8_t* p = w.data() + at;
      const bool full = rng.Below(16) == 0;
      switch (f) {
        case kQ8_0:
          PutHalf(p, RandomHalf(rng, scale));
          if (full) std::memset(p + 2, rng.Below(2) ? 0x7F : 0x80, 32);  // +127 or -128
          break;
        case kQ4_1:
          PutHalf(p, RandomHalf(rng, scale));
          PutHalf(p + 2, RandomHalf(rng, scale));
          if (full) std::memset(p + 4, 0xFF, 16);
          break;
        case kQ5_0:
          PutHalf(p, RandomHalf(rng, scale));
          if (full) std::memset(p + 2, 0xFF, 20);
          break;
        case kQ4_K:
          PutHalf(p, RandomHalf(rng, scale));
          PutHalf(p + 2, RandomHalf(rng, scale));
          if (full) std::memset(p + 4, 0xFF, 140);  // scales, minimums 63 and codes 15
          break;
        case kQ6_K:
          PutHalf(p + 208, RandomHalf(rng, scale));
          if (full) {
            std::memset(p, 0xFF, 192);                    // codes 63
            std::memset(p + 192, rng.Below(2) ? 0x80 : 0x7F, 16);  // scales -128 or 127
          }
          break;
      }
    }
    return w;
  }
  // interleaved by 16 rows: per group and unit, 16 float16 d (and dmin)
  const int64_t unit = f == kQ5_0X16 ? 32 : 256;
  const int64_t group_bytes = f == kQ4_KX16 ? kX16Bytes : f == kQ6_KX16 ? kX16Q6Bytes : kX16Q5Bytes;
  for (int64_t at = 0; at + group_bytes <= int64_t(w.size()); at += group_bytes) {
    uint8_t* p = w.data() + at;
    const bool full = rng.Below(16) == 0;
    for (int lane = 0; lane < 16; ++lane) {
      PutHalf(p + 2 * lane, RandomHalf(rng, scale));
      if (f == kQ4_KX16) PutHalf(p + 32 + 2 * lane, RandomHalf(rng, scale));
    }
    if (f == kQ4_KX16) {
      for (int i = 64; i < 320; ++i) p[i] &= 63;  // 6-bit scales and minimums
      if (full) std::memset(p + 64, 63, 256), std::memset(p + kX16Codes, 0xFF, 2048);
    } else if (f == kQ6_KX16) {
      if (full) std::memset(p + 32, rng.Below(2) ? 0x80 : 0x7F, 256), std::memset(p + kX16Q6Low, 0xFF, 3072);
    } else if (full) {
      std::memset(p + 32, 0xFF, 320);
    }
  }
  (void)unit;
  return w;
}

constexpr int kRows = 17;

// 17 rows of x, each a case of its own.
std::vector<float> Activations17(int64_t k, Rng& rng) {
  std::vector<float> x(kRows * k);
  for (int r = 0; r < kRows; ++r) {
    float* row = x.data() + r * k;
    for (int64_t i = 0; i < k; ++i) {
      const double z = rng.Normal();
      float v;
      switch (r) {
        case 1: v = 0.0f; break;                                          // a zero row
        case 2: v = rng.Below(7) == 0 ? 0.0f : float(z * 1e3); break;    // large, some zeros
        case 3: v = i % 32 == 0 ? 127.0f : float(rng.Below(253) - 126) + 0.5f; break;  // ties at inv = 1
        case 4: v = i % 32 == 0 ? -254.0f : float(2 * (rng.Below(253) - 126) + 1); break;  // inv = 0.5
        case 5: v = rng.Below(2) ? 3.0f : -3.0f; break;                   // all at max |x|: codes +-127
        case 6: v = rng.Below(3) == 0 ? 0.0f : float(z * 1e-39); break;   // 127 / max is infinite
        case 7: v = float(z * 1e20); break;
        case 8: v = i < k / 2 ? 0.0f : float(z); break;                   // a zero half
        case 9: v = i % 64 < 32 ? float(z * 1e-3) : float(z * 10.0); break;
        default: v = rng.Below(5) == 0 ? 0.0f : float(z * (0.01 + r)); break;
      }
      row[i] = v;
    }
  }
  return x;
}

struct Counter {
  int64_t compared = 0, differing = 0;
  std::string first;
};

void CompareFloats(const float* want, const float* got, int64_t count, const char* what, Counter& c) {
  for (int64_t i = 0; i < count; ++i) {
    ++c.compared;
    if (std::memcmp(want + i, got + i, 4) != 0) {
      if (c.differing++ == 0) {
        char line[200];
        uint32_t a, b;
        std::memcpy(&a, want + i, 4);
        std::memcpy(&b, got + i, 4);
        std::snprintf(line, sizeof line, "%s[%" PRId64 "]: reference %.9g (%08x), path %.9g (%08x)",
                      what, i, double(want[i]), a, double(got[i]), b);
        c.first = line;
      }
    }
  }
}
template <typename T>
void CompareInts(const T* want, const T* got, int64_t count, const char* what, Counter& c) {
  for (int64_t i = 0; i < count; ++i) {
    ++c.compared;
    if (want[i] != got[i] && c.differing++ == 0)
      c.first = std::string(what) + "[" + std::to_string(i) + "]: reference " +
                std::to_string(int64_t(want[i])) + ", path " + std::to_string(int64_t(got[i]));
  }
}

template <class P>
const char* Run(int32_t f, const float* x, const uint8_t* w, float* y, int64_t m, int64_t k,
                int64_t n, int64_t row_bytes) {
  // three chunks of whole tiles in turn, as ParallelRows splits rows over threads
  auto in_turn = [](int64_t items, int64_t tile, const auto& fn) {
    const int64_t tiles = (items + tile - 1) / tile;
    const int64_t per = (tiles + 2) / 3 * tile;
    for (int64_t b = 0; b < items; b += per) fn(b, std::min(items, b + per));
  };
  return Product<P>(f, x, w, y, m, k, n, row_bytes, in_turn);
}

// Vectors of the reference and of a path, element for element (floats bit for bit).
void Compare(const std::vector<float>& want, const std::vector<float>& got, const char* what, Counter& c) {
  CompareFloats(want.data(), got.data(), int64_t(want.size()), what, c);
}
template <typename T>
void Compare(const std::vector<T>& want, const std::vector<T>& got, const char* what, Counter& c) {
  CompareInts(want.data(), got.data(), int64_t(want.size()), what, c);
}

// Rows of x quantised into activations A by the reference and by path P.
template <class P, class A>
std::pair<A, A> QuantizeBoth(const float* x, int64_t m, int64_t k) {
  std::pair<A, A> both;
  Quantize<Reference>(x, m, k, both.first);
  Quantize<P>(x, m, k, both.second);
  return both;
}

// The path's quantised activations against the reference's (layouts aside).
template <class P>
void CompareActivations(const float* x, int64_t m, int64_t k, Counter& c) {
  const auto [ra, pa] = QuantizeBoth<P, Activations>(x, m, k);
  Compare(ra.q, pa.q, "codes per 64", c);
  Compare(ra.d, pa.d, "scales per 64", c);
  Compare(ra.sums, pa.sums, "lane sums per 64", c);
  const auto [rs, ps] = QuantizeBoth<P, SuperActivations>(x, m, k);
  Compare(rs.q, ps.q, "codes per 256", c);
  Compare(rs.d, ps.d, "scales per 256", c);
  Compare(rs.sums, ps.sums, "group sums per 256", c);
  for (const int64_t unit : {int64_t(32), int64_t(kSuper)}) {  // q5_0_x16's, the k-quants' x16
    PassActivations rp, pp;
    Quantize<Reference>(x, m, k, unit, rp);
    Quantize<P>(x, m, k, unit, pp);
    for (int64_t row = 0; row < m; ++row) {
      const PassRow a(rp, k, row), b(pp, k, row);
      for (int64_t i = 0; i < k; ++i) {
        const int8_t want = a.code(i), got = b.code(i);
        CompareInts(&want, &got, 1, "interleaved codes", c);
      }
      for (int64_t u = 0; u < k / unit; ++u) {
        const float da = a.d(u), db = b.d(u);
        CompareFloats(&da, &db, 1, "interleaved scales", c);
      }
      for (int64_t blk = 0; blk < k / 32; ++blk) {
        const int32_t ia[4] = {a.asum(blk), a.q6_offset(2 * blk), a.q6_offset(2 * blk + 1), a.half_sums(blk)};
        const int32_t ib[4] = {b.asum(blk), b.q6_offset(2 * blk), b.q6_offset(2 * blk + 1), b.half_sums(blk)};
        CompareInts(ia, ib, 4, "interleaved sums per 32", c);
      }
      for (int64_t i = 0; i < (unit == kSuper ? k / 64 : 0); ++i) {  // filled for the k-quants only
        const int32_t pa = a.pair_sums(i), pb = b.pair_sums(i);
        CompareInts(&pa, &pb, 1, "interleaved pair sums per 64", c);
      }
    }
  }
}

struct Shape { int64_t k, n; };

// FNV-1a over every reference output: the same number on every CPU (the
// reference is plain C++ whose float operations are all correctly rounded).
uint64_t g_digest = 1469598103934665603ull;
void Digest(const float* y, int64_t count) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(y);
  for (int64_t i = 0; i < count * 4; ++i) g_digest = (g_digest ^ bytes[i]) * 1099511628211ull;
}

// Every format on path P against the reference; returns the number of formats that differ.
template <class P>
int CheckPath(const char* name, const std::vector<Shape>& shapes, uint64_t seed, bool digest) {
  int failures = 0;
  for (const Shape& shape : shapes) {
    Rng rng(seed + uint64_t(shape.k));
    const std::vector<float> x17 = Activations17(shape.k, rng);
    Counter act;
    CompareActivations<P>(x17.data(), kRows, shape.k, act);
    std::printf("%-9s %-13s K=%-5" PRId64 " activations of 17 rows: %s%s\n", "quantise", name, shape.k,
                act.differing ? "DIFFER " : "identical", act.first.c_str());
    failures += act.differing != 0;
    for (int f = 0; f < kNumFormats; ++f) {
      const std::vector<uint8_t> w = RandomBlocks(f, shape.n, shape.k, rng);
      const int64_t row_bytes = RowBytes(f, shape.k);
      Counter c;
      for (int64_t m = 1; m <= kRows; ++m) {
        std::vector<float> x(m * shape.k);
        for (int64_t i = 0; i < m; ++i)  // rows (m + i) mod 17: each M its own mix
          std::memcpy(x.data() + i * shape.k, x17.data() + ((m + i) % kRows) * shape.k,
                      shape.k * sizeof(float));
        std::vector<float> want(m * shape.n, -1.0f), got(m * shape.n, -2.0f);
        const char* e1 = Run<Reference>(f, x.data(), w.data(), want.data(), m, shape.k, shape.n, row_bytes);
        const char* e2 = Run<P>(f, x.data(), w.data(), got.data(), m, shape.k, shape.n, row_bytes);
        if (e1 || e2) {
          std::printf("%s: %s\n", FormatName(f), e1 ? e1 : e2);
          return failures + 1;
        }
        if (digest) Digest(want.data(), m * shape.n);
        const std::string what = "M=" + std::to_string(m) + " y";
        CompareFloats(want.data(), got.data(), m * shape.n, what.c_str(), c);
      }
      std::printf("%-9s %-13s K=%-5" PRId64 " N=%-3" PRId64 " M=1..17: %s%s\n", FormatName(f), name,
                  shape.k, shape.n, c.differing ? "DIFFER " : "identical",
                  c.differing ? (std::to_string(c.differing) + " of " + std::to_string(c.compared) +
                                 " outputs; first " + c.first).c_str() : "");
      failures += c.differing != 0;
    }
  }
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  (void)argc;
  (void)argv;
  // K: 3 super-blocks (odd counts of units and chunk pairs), and 5 (longer rows).
  const std::vector<Shape> shapes = {{768, 48}, {1280, 32}};
  const uint64_t seed = 73;
  std::printf("block_dot_check: best path %s; compiled:", Best::kName);
  int paths = 0;
#if defined(SPECDEC_BLOCKS_AVX512)
  std::printf(" %s", Avx512::kName), ++paths;
#endif
#if defined(SPECDEC_BLOCKS_AVXVNNI)
  std::printf(" %s", Avx256<true>::kName), ++paths;
#endif
#if defined(SPECDEC_BLOCKS_AVX2)
  std::printf(" %s", Avx256<false>::kName), ++paths;
#endif
#if defined(SPECDEC_BLOCKS_NEON)
  std::printf(" %s", Neon::kName), ++paths;
#endif
  std::printf(" %s (the reference)\n", Reference::kName);
  int failures = 0;
  bool digest = true;  // of the first path's run: every path runs the same reference products
#if defined(SPECDEC_BLOCKS_AVX512)
  failures += CheckPath<Avx512>(Avx512::kName, shapes, seed, digest), digest = false;
#endif
#if defined(SPECDEC_BLOCKS_AVXVNNI)
  failures += CheckPath<Avx256<true>>(Avx256<true>::kName, shapes, seed, digest), digest = false;
#endif
#if defined(SPECDEC_BLOCKS_AVX2)
  failures += CheckPath<Avx256<false>>(Avx256<false>::kName, shapes, seed, digest), digest = false;
#endif
#if defined(SPECDEC_BLOCKS_NEON)
  failures += CheckPath<Neon>(Neon::kName, shapes, seed, digest), digest = false;
#endif
  if (paths == 0) {
    // Only the reference: run it on every format (it must build and run without SIMD).
    failures += CheckPath<Reference>("scalar-only", shapes, seed, digest);
  }
  std::printf("block_dot_check: reference outputs digest %016" PRIx64 "\n", g_digest);
  std::printf("block_dot_check: %s\n", failures ? "FAILED: a path differs from the reference"
                                                 : "every compiled path equals the reference bit for bit");
  return failures ? 1 : 0;
}
