// How many rows of x a pass over an interleaved group should take: this
// build's widest block-kernel path (block_dot.h's Best) timed on one core
// with its own cap (kMaxMPerX16Pass) beside other caps, in one process.
//
// A product of M rows is read in passes of at most the cap's rows (equal
// passes: M = 9 under a cap of 8 is 5 + 4); each pass reads the group's codes
// again and unpacks them again, and each row of a pass keeps its
// accumulators in registers, so the best cap is a trade that only timing
// settles. What it times, to keep the noise of a shared 2-core machine out:
// the thread's CPU time (not wall time), the minimum of --calls calls per
// round, rounds that alternate the caps, and weights copied until they span
// more than 200 MB, each call reading the next copy, so every call reads from
// memory as a decoding step does, not from the last level cache.
// The outputs of all caps are compared bit for bit (a cap changes only
// which rows share a pass, never a row's sums).
//
//   g++ -O3 -march=native -std=c++17 -ffp-contract=off -I specdec_jax/native
//       benchmarks/scripts/x16_pass_rows.cc -o /tmp/x16_pass_rows
//   taskset -c 1 /tmp/x16_pass_rows q4_k_x16 17920 1536 --rows 1 5 9 12 16 17
//
// Arguments: a format (q4_k_x16, q6_k_x16, q5_0_x16), N (output rows, a
// multiple of 16), K, then --rows M..., --calls C (20), --rounds R (5),
// --bytes B (200000000: the weights' span). The caps timed: 4, 8, 12, 16
// and the path's own. Prints a line per M: the milliseconds of each cap and
// its ratio to the path's own.

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "block_dot.h"

using namespace specdec::blocks;

namespace {

// Best with another cap on the rows of an x16 pass; everything else its own.
template <int kCap>
struct WithCap : Best {
  static constexpr int kMaxMPerX16Pass = kCap;
};

double ThreadSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

struct Serial {  // the product's chunks on this thread, in turn
  template <class Fn>
  void operator()(int64_t items, int64_t, Fn&& fn) const { fn(0, items); }
};

struct Setup {
  int format;
  int64_t n, k, row_bytes, copy_bytes;
  int copies;
  std::vector<uint8_t> w;
};

uint64_t g_state = 0x9E3779B97F4A7C15ull;
uint64_t Next() {  // splitmix64
  uint64_t z = (g_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A unit of the format (X16Spec): the weights of a row it holds, its bytes.
struct Unit {
  int64_t weights, bytes;
};
Unit UnitOf(int format) {
  switch (format) {
    case kQ4_KX16: return {X16Spec<kQ4_KX16>::kWeights, X16Spec<kQ4_KX16>::kBytes};
    case kQ6_KX16: return {X16Spec<kQ6_KX16>::kWeights, X16Spec<kQ6_KX16>::kBytes};
    default: return {X16Spec<kQ5_0X16>::kWeights, X16Spec<kQ5_0X16>::kBytes};
  }
}

// Random codes and scales; the 16 float16 d (and q4_k_x16's 16 dmin) at the
// start of every unit set to small normal values, so no product is NaN.
Setup MakeWeights(int format, int64_t n, int64_t k, int64_t span) {
  Setup s{format, n, k, 0, 0, 1, {}};
  const Unit unit = UnitOf(format);
  const int64_t units = n / kX16Lanes * (k / unit.weights);
  s.copy_bytes = units * unit.bytes;
  s.row_bytes = s.copy_bytes / n;
  s.copies = int(std::max<int64_t>(1, span / s.copy_bytes));
  s.w.resize(size_t(s.copy_bytes) * s.copies);
  for (auto& b : s.w) b = uint8_t(Next());
  const int halves = format == kQ4_KX16 ? 32 : 16;
  for (int64_t u = 0; u < units * s.copies; ++u) {
    for (int h = 0; h < halves; ++h) {
      const uint16_t half = uint16_t(0x2000 + (Next() & 0x3FF));  // about 0.008
      std::memcpy(s.w.data() + u * unit.bytes + 2 * h, &half, 2);
    }
  }
  return s;
}

template <class P>
double MinSeconds(const Setup& s, const std::vector<float>& x, int64_t m, int calls, std::vector<float>& y) {
  double best = 1e30;
  for (int c = 0; c < calls; ++c) {
    const uint8_t* w = s.w.data() + size_t(c % s.copies) * s.copy_bytes;
    const double t0 = ThreadSeconds();
    const char* error = Product<P>(s.format, x.data(), w, y.data(), m, s.k, s.n, s.row_bytes, Serial());
    const double t = ThreadSeconds() - t0;
    if (error) {
      std::fprintf(stderr, "%s\n", error);
      std::exit(2);
    }
    best = std::min(best, t);
  }
  return best;
}

int FormatOf(const std::string& name) {
  if (name == "q4_k_x16") return kQ4_KX16;
  if (name == "q6_k_x16") return kQ6_KX16;
  if (name == "q5_0_x16") return kQ5_0X16;
  std::fprintf(stderr, "unknown format %s: give q4_k_x16, q6_k_x16 or q5_0_x16\n", name.c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s FORMAT N K [--rows M...] [--calls C] [--rounds R] [--bytes B]\n", argv[0]);
    return 2;
  }
  const int format = FormatOf(argv[1]);
  const int64_t n = std::atoll(argv[2]), k = std::atoll(argv[3]);
  std::vector<int64_t> rows;
  int calls = 20, rounds = 5;
  int64_t span = 200000000;
  for (int i = 4; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--rows") {
      while (i + 1 < argc && argv[i + 1][0] != '-') rows.push_back(std::atoll(argv[++i]));
    } else if (arg == "--calls" && i + 1 < argc) {
      calls = std::atoi(argv[++i]);
    } else if (arg == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (arg == "--bytes" && i + 1 < argc) {
      span = std::atoll(argv[++i]);
    } else {
      std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  if (rows.empty()) rows = {1, 5, 9, 12, 16, 17};
  const int64_t unit = UnitOf(format).weights;
  if (n <= 0 || n % kX16Lanes != 0 || k <= 0 || k % unit != 0 || calls < 1 || rounds < 1) {
    std::fprintf(stderr, "N must be a positive multiple of 16, K of %lld (%s); calls and rounds >= 1\n",
                 (long long)unit, argv[1]);
    return 2;
  }
  if (!kBestIsSimd) {  // the reference takes one row a pass: no cap to choose
    std::fprintf(stderr, "this build has no SIMD path of the block kernel (compile with -march=native)\n");
    return 2;
  }
  const Setup s = MakeWeights(format, n, k, span);
  std::printf("x16_pass_rows: path %s (its cap %d rows a pass), %s N=%lld K=%lld, %d copies of %.1f MB,"
              " min of %d calls x %d rounds, thread CPU ms\n",
              Best::kName, Best::kMaxMPerX16Pass, argv[1], (long long)n, (long long)k, s.copies,
              s.copy_bytes / 1e6, calls, rounds);
  using Timer = double (*)(const Setup&, const std::vector<float>&, int64_t, int, std::vector<float>&);
  const int caps[] = {Best::kMaxMPerX16Pass, 4, 8, 12, 16};
  const Timer timers[] = {&MinSeconds<Best>, &MinSeconds<WithCap<4>>, &MinSeconds<WithCap<8>>,
                          &MinSeconds<WithCap<12>>, &MinSeconds<WithCap<16>>};
  constexpr int kTimers = 5;
  int differing = 0;
  for (const int64_t m : rows) {
    std::vector<float> x(size_t(m * k));
    for (auto& v : x) v = float(int64_t(Next() % 20001) - 10000) / 3000.0f;
    std::vector<std::vector<float>> y(kTimers, std::vector<float>(size_t(m * n)));
    double best[kTimers];
    std::fill(best, best + kTimers, 1e30);
    for (int r = 0; r < rounds; ++r)
      for (int t = 0; t < kTimers; ++t) best[t] = std::min(best[t], timers[t](s, x, m, calls, y[t]));
    std::printf("M=%-3lld", (long long)m);
    for (int t = 0; t < kTimers; ++t) {
      const bool same = std::memcmp(y[t].data(), y[0].data(), y[0].size() * sizeof(float)) == 0;
      std::printf("  cap %-2d %8.3f ms (%.2f)%s", caps[t], best[t] * 1e3, best[t] / best[0],
                  same ? "" : " DIFFERS");
      differing += !same;
    }
    std::printf("\n");
  }
  std::printf("x16_pass_rows: %s\n", differing ? "FAILED: caps gave different outputs"
                                               : "every cap gave the same outputs bit for bit");
  return differing ? 1 : 0;
}
