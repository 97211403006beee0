// y[M, N] = x[M, K] . w[N, K]^T (* scale[N]) for few rows M: the products of a
// decode step (M = batch) and of a scoring call (M = batch x (G + 1)) on CPU.
//
// Why a kernel of our own: such a product is bound by reading w, once. XLA's CPU
// dot runs it as a general matrix product whose register tiles are sized for
// many rows, so with M = 6 it spends ~2-3x the time of M = 1 (docs/results.md,
// "Scoring cost by width"). Here every weight vector loaded from memory is used
// for all M rows while it sits in a register, so M = 2..8 costs little more than
// M = 1. The same loop reads w stored in float32, bfloat16 or int8 (with a
// per-row scale) and widens it to float32 in registers: weight-only storage
// that shrinks the bytes read without changing x or the accumulation.
//
// Rows of w are split into chunks that the calling thread and spinning helper
// threads (one fewer than XLA's intra-op pool has) take from a shared counter,
// so no task ever waits for a thread that may be busy elsewhere (the caller
// alone can finish every chunk).
//
// Built and loaded at run time by specdec_jax/runtime/cpu_kernels.py.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>
#include <thread>

#include "xla/ffi/api/ffi.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace ffi = xla::ffi;

namespace {

constexpr int kMaxRowsPerTile = 4;  // rows of w sharing the loads of x
constexpr int kMaxMPerPass = 6;     // rows of x per pass over a tile of w

// Widening loads of 16 weights to float32.
struct F32W { using T = float; };
struct BF16W { using T = uint16_t; };
struct I8W { using T = int8_t; };

#if defined(__AVX512F__)
inline __m512 Load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 Load16(const uint16_t* p, __mmask16 m) {
  // bfloat16 is the top half of a float32: widen and shift.
  __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 Load16(const int8_t* p, __mmask16 m) {
  __m128i b = _mm_maskz_loadu_epi8(m, p);
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
}

#define SPECDEC_UNROLL _Pragma("GCC unroll 8")

// Accumulators must stay in registers: every loop over r and m is unrolled
// (otherwise GCC keeps the array on the stack and stores it each iteration,
// which halved the throughput when measured).
template <int R, int MB, typename T>
void Tile(const float* x, const T* w, const float* scale, float* y, int64_t k_dim,
          int64_t n_dim, int64_t row0, int64_t m0) {
  __m512 acc[R][MB];
  SPECDEC_UNROLL for (int r = 0; r < R; ++r) {
    SPECDEC_UNROLL for (int m = 0; m < MB; ++m) acc[r][m] = _mm512_setzero_ps();
  }
  // The tile reads R rows as R short streams, and the hardware prefetcher
  // restarts at every tile: the next tile is fetched into L2 here, spread over
  // this one (into L1 or not at all measured 1.3-1.7x slower at M = 1).
  constexpr int64_t kLine = 64;
  constexpr int64_t kLinesPerStep = R * 16 * int64_t(sizeof(T)) / kLine;  // the next tile's share
  const char* next = reinterpret_cast<const char*>(w + (row0 + R) * k_dim);
  const bool prefetch = kLinesPerStep > 0 && m0 == 0 && row0 + 2 * R <= n_dim;
  const int64_t full = k_dim / 16 * 16;
  for (int64_t k = 0; k < k_dim; k += 16) {
    const __mmask16 mask = k < full ? __mmask16(0xFFFF) : __mmask16((1u << (k_dim - k)) - 1);
    if (prefetch) {
      const char* at = next + (k / 16) * kLinesPerStep * kLine;
      SPECDEC_UNROLL for (int l = 0; l < kLinesPerStep; ++l) _mm_prefetch(at + l * kLine, _MM_HINT_T1);
    }
    __m512 wv[R];
    SPECDEC_UNROLL for (int r = 0; r < R; ++r) wv[r] = Load16(w + (row0 + r) * k_dim + k, mask);
    SPECDEC_UNROLL for (int m = 0; m < MB; ++m) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x + (m0 + m) * k_dim + k);
      SPECDEC_UNROLL for (int r = 0; r < R; ++r) acc[r][m] = _mm512_fmadd_ps(wv[r], xv, acc[r][m]);
    }
  }
  SPECDEC_UNROLL for (int r = 0; r < R; ++r) {
    const float s = scale ? scale[row0 + r] : 1.0f;
    SPECDEC_UNROLL for (int m = 0; m < MB; ++m) {
      y[(m0 + m) * n_dim + row0 + r] = _mm512_reduce_add_ps(acc[r][m]) * s;
    }
  }
}
#else
inline float Widen(float v) { return v; }
inline float Widen(uint16_t v) {
  uint32_t bits = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline float Widen(int8_t v) { return float(v); }

// Portable fallback: the same tiling with scalar loops the compiler may vectorise.
template <int R, int MB, typename T>
void Tile(const float* x, const T* w, const float* scale, float* y, int64_t k_dim,
          int64_t n_dim, int64_t row0, int64_t m0) {
  float acc[R][MB] = {};
  for (int64_t k = 0; k < k_dim; ++k) {
    for (int r = 0; r < R; ++r) {
      const float wv = Widen(w[(row0 + r) * k_dim + k]);
      for (int m = 0; m < MB; ++m) acc[r][m] += wv * x[(m0 + m) * k_dim + k];
    }
  }
  for (int r = 0; r < R; ++r) {
    const float s = scale ? scale[row0 + r] : 1.0f;
    for (int m = 0; m < MB; ++m) y[(m0 + m) * n_dim + row0 + r] = acc[r][m] * s;
  }
}
#endif

template <int R, typename T>
void TileRows(const float* x, const T* w, const float* scale, float* y, int64_t m_dim,
              int64_t k_dim, int64_t n_dim, int64_t row0) {
  for (int64_t m0 = 0; m0 < m_dim; m0 += kMaxMPerPass) {
    switch (std::min<int64_t>(kMaxMPerPass, m_dim - m0)) {
      case 1: Tile<R, 1>(x, w, scale, y, k_dim, n_dim, row0, m0); break;
      case 2: Tile<R, 2>(x, w, scale, y, k_dim, n_dim, row0, m0); break;
      case 3: Tile<R, 3>(x, w, scale, y, k_dim, n_dim, row0, m0); break;
      case 4: Tile<R, 4>(x, w, scale, y, k_dim, n_dim, row0, m0); break;
      case 5: Tile<R, 5>(x, w, scale, y, k_dim, n_dim, row0, m0); break;
      default: Tile<R, 6>(x, w, scale, y, k_dim, n_dim, row0, m0); break;
    }
  }
}

template <typename T>
void Rows(const float* x, const T* w, const float* scale, float* y, int64_t m_dim,
          int64_t k_dim, int64_t n_dim, int64_t begin, int64_t end) {
  int64_t row = begin;
  for (; row + kMaxRowsPerTile <= end; row += kMaxRowsPerTile)
    TileRows<kMaxRowsPerTile>(x, w, scale, y, m_dim, k_dim, n_dim, row);
  for (; row < end; ++row) TileRows<1>(x, w, scale, y, m_dim, k_dim, n_dim, row);
}

// Work shared between the calling thread and helper threads: chunks are taken
// from a shared counter, so the caller alone can finish every chunk and never
// waits on a helper that is busy elsewhere; it waits only for chunks a helper
// has already started. Held by shared_ptr because a helper may pick the job up
// after the call returned (it then finds no chunk left).
struct Job {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  int64_t num_chunks = 0;
  std::function<void(int64_t)> run;

  void Work() {
    int64_t finished = 0;
    for (int64_t c = next.fetch_add(1); c < num_chunks; c = next.fetch_add(1)) {
      run(c);
      ++finished;
    }
    if (finished > 0) done.fetch_add(finished, std::memory_order_release);
  }
};

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Helper threads of our own that spin for a short while after each job before
// they sleep. Why not XLA's intra-op pool: handing a chunk to it cost the
// caller ~7 us in Schedule and the chunk started ~15 us later (a sleeping
// thread woken by a system call), measured on a 2-core x86_64 machine; a step
// of the 1.5B target makes 169 products, most of them 0.1-0.4 ms long, so the
// hand-off alone was ~4 ms of a ~46 ms step, and a 256-row product ran 3x
// slower on two threads than on one. A spinning helper picks a job up within
// a fraction of a microsecond; between a step's products it never sleeps.
// There are pool.num_threads() - 1 helpers: with the caller, one thread per
// core that XLA's pool has, so no third busy thread takes a core's bandwidth.
class Helpers {
 public:
  static Helpers& Get(int64_t count) {
    static Helpers* helpers = new Helpers(count);  // never destroyed: threads outlive main
    return *helpers;
  }

  int64_t count() const { return count_; }

  void Post(std::shared_ptr<Job> job) {
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(job));
      pending_.fetch_add(1, std::memory_order_release);
      wake = sleepers_ > 0;
    }
    if (wake) ready_.notify_one();
  }

 private:
  // How long a helper spins for the next job before it sleeps: longer than the
  // gaps between a decode step's products, short enough that an idle process
  // gives its cores back at once.
  static constexpr std::chrono::microseconds kSpin{2000};

  explicit Helpers(int64_t count) : count_(count) {
    for (int64_t i = 0; i < count_; ++i) std::thread([this] { Loop(); }).detach();
  }

  std::shared_ptr<Job> Take() {  // with mu_ held and the queue not empty
    std::shared_ptr<Job> job = std::move(queue_.front());
    queue_.pop_front();
    pending_.fetch_sub(1, std::memory_order_relaxed);
    return job;
  }

  void Loop() {
    for (;;) {
      std::shared_ptr<Job> job;
      const auto give_up = std::chrono::steady_clock::now() + kSpin;
      while (!job) {
        if (pending_.load(std::memory_order_acquire) > 0) {
          std::lock_guard<std::mutex> lock(mu_);
          if (!queue_.empty()) job = Take();
        } else if (std::chrono::steady_clock::now() < give_up) {
          for (int i = 0; i < 64; ++i) CpuRelax();
        } else {
          std::unique_lock<std::mutex> lock(mu_);
          ++sleepers_;
          ready_.wait(lock, [this] { return !queue_.empty(); });
          --sleepers_;
          job = Take();
        }
      }
      job->Work();
    }
  }

  const int64_t count_;
  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::shared_ptr<Job>> queue_;  // guarded by mu_
  int sleepers_ = 0;                        // guarded by mu_
  std::atomic<int64_t> pending_{0};         // queue_.size(), read without the lock
};

// Splits rows [0, n_dim) of a weight matrix into chunks of whole `tile`s and
// runs `rows(begin, end)` on each, over the caller and the helpers.
void ParallelRows(ffi::ThreadPool& pool, int64_t n_dim, int64_t tile,
                  std::function<void(int64_t, int64_t)> rows) {
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  // Few long chunks: each is one sequential stream through w (the hardware
  // prefetcher's best case; many short interleaved chunks measured 1.6x slower),
  // two per thread so a late thread does not leave the others idle for long.
  const int64_t tiles = (n_dim + tile - 1) / tile;
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(2 * threads, tiles));
  const int64_t rows_per_chunk = (tiles + chunks - 1) / chunks * tile;
  auto job = std::make_shared<Job>();
  job->num_chunks = (n_dim + rows_per_chunk - 1) / rows_per_chunk;
  job->run = [=](int64_t c) {
    const int64_t begin = c * rows_per_chunk;
    rows(begin, std::min(n_dim, begin + rows_per_chunk));
  };
  if (threads > 1 && job->num_chunks > 1) {
    Helpers& helpers = Helpers::Get(threads - 1);
    for (int64_t i = 0; i < std::min(helpers.count(), job->num_chunks - 1); ++i) helpers.Post(job);
  }
  job->Work();
  // Only chunks a helper has started are left: wait for them without sleeping.
  while (job->done.load(std::memory_order_acquire) < job->num_chunks) CpuRelax();
}

template <typename T>
void Product(ffi::ThreadPool& pool, const float* x, const T* w, const float* scale, float* y,
             int64_t m_dim, int64_t k_dim, int64_t n_dim) {
  ParallelRows(pool, n_dim, kMaxRowsPerTile,
               [=](int64_t begin, int64_t end) {
                 Rows(x, w, scale, y, m_dim, k_dim, n_dim, begin, end);
               });
}

ffi::Error CheckShapes(ffi::AnyBuffer::Dimensions x, ffi::AnyBuffer::Dimensions w,
                       ffi::AnyBuffer::Dimensions y) {
  if (x.size() != 2 || w.size() != 2 || y.size() != 2 || x[1] != w[1] || y[0] != x[0] ||
      y[1] != w[0])
    return ffi::Error::InvalidArgument("small_m_matmul: expected x [M, K], w [N, K], y [M, N]");
  return ffi::Error::Success();
}

template <ffi::DataType WT>
ffi::Error Matmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<WT> w,
                  ffi::ResultBuffer<ffi::F32> y) {
  if (auto e = CheckShapes(x.dimensions(), w.dimensions(), y->dimensions()); e.failure()) return e;
  const auto dx = x.dimensions();
  Product(pool, x.typed_data(), w.typed_data(), static_cast<const float*>(nullptr), y->typed_data(),
          dx[0], dx[1], w.dimensions()[0]);
  return ffi::Error::Success();
}

ffi::Error MatmulScaledI8(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> w,
                          ffi::Buffer<ffi::F32> scale, ffi::ResultBuffer<ffi::F32> y) {
  if (auto e = CheckShapes(x.dimensions(), w.dimensions(), y->dimensions()); e.failure()) return e;
  if (scale.dimensions().size() != 1 || scale.dimensions()[0] != w.dimensions()[0])
    return ffi::Error::InvalidArgument("small_m_matmul: expected scale [N] for w [N, K]");
  const auto dx = x.dimensions();
  Product(pool, x.typed_data(), w.typed_data(), scale.typed_data(), y->typed_data(), dx[0], dx[1],
          w.dimensions()[0]);
  return ffi::Error::Success();
}


// ---------------------------------------------------------------------------
// Products with weights kept in their GGUF file's blocks (models/stored_blocks.py),
// activations quantised per row to int8: y[m, n] = x[m] . w[n] for M few rows.
//
// Every format reads as codes q (unsigned bytes) with a scale s and an offset o
// per group of weights: w = s * q + o (q4_k: s = d * sc, o = -dmin * m; q6_k:
// o = -32 s; q8_0: q + 128 with o = -128 s; ...). Each row of x is cut into
// chunks of 64, each quantised to int8 a = round(x / da), da = max |x| / 127,
// once per call. A chunk's 64 products are 16 integer sums of 4 (VNNI
// vpdpbusd: unsigned codes times signed activations), and
//   x . w ~= sum over chunks of da * sum over lanes (s * isum + o * asum)
// with asum the lane's sum of activations. The result for a row depends on that
// row of x and on w alone, computed in one fixed order: a row gets the same
// bits whether it is multiplied alone or with 16 others, which is what makes
// speculative decoding exact with respect to this function.
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define SPECDEC_HAS_BLOCKS 1
namespace blocks {

enum Format : int32_t {
  kQ8_0 = 0, kQ4_1 = 1, kQ5_0 = 2, kQ4_K = 3, kQ6_K = 4, kQ4_KX16 = 5, kQ6_KX16 = 6, kQ5_0X16 = 7
};
constexpr int kChunk = 64;  // weights per chunk (one zmm of codes)

inline float F16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

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
  const __m128 two = _mm_cvtph_ps(_mm_cvtsi32_si128(int(a) | (int(b) << 16)));
  return _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                               _mm512_castps128_ps512(two));
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

// x quantised per row and chunk of 64: int8 codes, scale, and per lane the
// sum of its 4 codes times the scale.
struct Activations {
  std::vector<int8_t> q;    // [M, K]
  std::vector<float> d;     // [M, K / 64]
  std::vector<float> sums;  // [M, K / 64, 16]
  int64_t chunks;
};

void Quantize(const float* x, int64_t m_dim, int64_t k_dim, Activations& a) {
  a.chunks = k_dim / kChunk;
  a.q.resize(m_dim * k_dim);
  a.d.resize(m_dim * a.chunks);
  a.sums.resize(m_dim * a.chunks * 16);
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t m = 0; m < m_dim; ++m) {
    for (int64_t c = 0; c < a.chunks; ++c) {
      const float* xc = x + m * k_dim + c * kChunk;
      __m512 v[4];
      __m512 peak = _mm512_setzero_ps();
      for (int i = 0; i < 4; ++i) {
        v[i] = _mm512_loadu_ps(xc + 16 * i);
        peak = _mm512_max_ps(peak, _mm512_abs_ps(v[i]));
      }
      const float top = _mm512_reduce_max_ps(peak);
      const float d = top / 127.0f;
      const __m512 inv = _mm512_set1_ps(top > 0.0f ? 127.0f / top : 0.0f);
      int8_t* qc = a.q.data() + m * k_dim + c * kChunk;
      for (int i = 0; i < 4; ++i) {
        const __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(v[i], inv));  // nearest, ties even
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qc + 16 * i), _mm512_cvtsepi32_epi8(r));
      }
      const __m512i codes = _mm512_loadu_si512(qc);
      const __m512 sums = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, codes));
      a.d[m * a.chunks + c] = d;
      _mm512_storeu_ps(a.sums.data() + (m * a.chunks + c) * 16, _mm512_mul_ps(sums, _mm512_set1_ps(d)));
    }
  }
}

constexpr int kMaxMPerBlockPass = 8;

// Calls f(std::integral_constant<int, n>) for 1 <= n <= Max (larger n: Max):
// the row count of a pass as a template argument (its accumulators stay in
// registers).
template <typename Fn, int... N>
void ForRowCountIn(int64_t n, Fn&& f, std::integer_sequence<int, N...>) {
  ((n == N + 1 ? (f(std::integral_constant<int, N + 1>{}), 0) : 0), ...);
}
template <int Max = kMaxMPerBlockPass, typename Fn>
void ForRowCount(int64_t n, Fn&& f) {
  ForRowCountIn(std::min<int64_t>(n, Max), f, std::make_integer_sequence<int, Max>{});
}

constexpr int64_t kAheadBytes = 2048;  // software prefetch distance of a pass

template <int F, int MB>
void RowPass(const uint8_t* w_row, const Activations& a, int64_t k_dim, int64_t m0,
             float* y, int64_t n_dim, int64_t n) {
  __m512 acc[MB];
  SPECDEC_UNROLL for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
  Unit<F> unit;
  const int64_t units = k_dim / Unit<F>::kWeights;
  constexpr int64_t kAhead = kAheadBytes / Unit<F>::kBytes;
  for (int64_t u = 0; u < units; ++u) {
    if (m0 == 0) {  // as the k-quants' passes do (KRowPass): the first pass asks ahead
      const char* ahead = reinterpret_cast<const char*>(w_row + (u + kAhead) * Unit<F>::kBytes);
      _mm_prefetch(ahead, _MM_HINT_T0);
      _mm_prefetch(ahead + Unit<F>::kBytes - 1, _MM_HINT_T0);
    }
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
  SPECDEC_UNROLL for (int m = 0; m < MB; ++m) y[(m0 + m) * n_dim + n] = _mm512_reduce_add_ps(acc[m]);
}

template <int F>
void BlockRows(const uint8_t* w, int64_t row_bytes, const Activations& a, int64_t m_dim,
               int64_t k_dim, float* y, int64_t n_dim, int64_t begin, int64_t end) {
  for (int64_t n = begin; n < end; ++n) {
    const uint8_t* w_row = w + n * row_bytes;
    for (int64_t m0 = 0; m0 < m_dim; m0 += kMaxMPerBlockPass) {
      ForRowCount(m_dim - m0, [&](auto rows) {
        RowPass<F, decltype(rows)::value>(w_row, a, k_dim, m0, y, n_dim, n);
      });
    }
  }
}

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
constexpr int kSuper = 256;

struct SuperActivations {
  std::vector<int8_t> q;      // [M, K]
  std::vector<float> d;       // [M, K / 256]
  std::vector<int16_t> sums;  // [M, K / 256, 16]: sums of the 16 groups of 16
  int64_t supers;
};

void QuantizeSuper(const float* x, int64_t m_dim, int64_t k_dim, SuperActivations& a) {
  a.supers = k_dim / kSuper;
  a.q.resize(m_dim * k_dim);
  a.d.resize(m_dim * a.supers);
  a.sums.resize(m_dim * a.supers * 16);
  for (int64_t m = 0; m < m_dim; ++m) {
    for (int64_t u = 0; u < a.supers; ++u) {
      const float* xu = x + m * k_dim + u * kSuper;
      __m512 peak = _mm512_setzero_ps();
      for (int i = 0; i < 16; ++i) peak = _mm512_max_ps(peak, _mm512_abs_ps(_mm512_loadu_ps(xu + 16 * i)));
      const float top = _mm512_reduce_max_ps(peak);
      const __m512 inv = _mm512_set1_ps(top > 0.0f ? 127.0f / top : 0.0f);
      int8_t* qu = a.q.data() + m * k_dim + u * kSuper;
      int16_t* su = a.sums.data() + (m * a.supers + u) * 16;
      for (int i = 0; i < 16; ++i) {
        const __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xu + 16 * i), inv));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qu + 16 * i), _mm512_cvtsepi32_epi8(r));
        su[i] = int16_t(_mm512_reduce_add_epi32(r));
      }
      a.d[m * a.supers + u] = top / 127.0f;
    }
  }
}

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
    // 12 bytes k[0..11] hold 8 six-bit scales and 8 six-bit minimums: scale j < 4
    // is k[j] & 63 and j >= 4 is (k[j + 4] & 15) | (k[j - 4] >> 6) << 4; minimum
    // j < 4 is k[j + 4] & 63 and j >= 4 is (k[j + 4] >> 4) | (k[j] >> 6) << 4.
    // Four bytes at a time, as 32-bit words:
    uint32_t w[3];
    std::memcpy(w, p + 4, 12);
    const uint32_t low6 = 0x3F3F3F3Fu, low4 = 0x0F0F0F0Fu, low2 = 0x03030303u;
    const uint32_t scales[2] = {w[0] & low6, (w[2] & low4) | (((w[0] >> 6) & low2) << 4)};
    const uint32_t minimums[2] = {w[1] & low6, ((w[2] >> 4) & low4) | (((w[1] >> 6) & low2) << 4)};
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

template <int F, int MB>
void KRowPass(const uint8_t* w_row, const SuperActivations& a, int64_t k_dim, int64_t m0,
              float* y, int64_t n_dim, int64_t n) {
  // Per lane: the super-blocks' d * (scaled integer sum) - dmin * (minimums
  // times activation sums), each times the row's activation scale. The
  // minimum term has 8 lanes, carried in the low half of the same register.
  __m512 acc[MB];
  SPECDEC_UNROLL for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
  KUnit<F> unit;
  // The weights stream from memory once per call; a pass of several rows
  // spends long enough on each super-block that the hardware prefetcher falls
  // behind on long rows (down's 8960 weights: 9 rows cost 1.3-2x as much with
  // the matrix out of cache as in it). The first pass asks for the bytes
  // kAheadBytes on (into the next row at a row's end: rows are contiguous).
  constexpr int64_t kAhead = kAheadBytes / KUnit<F>::kBytes;
  for (int64_t u = 0; u < a.supers; ++u) {
    if (m0 == 0) {
      const char* ahead = reinterpret_cast<const char*>(w_row + (u + kAhead) * KUnit<F>::kBytes);
      for (int l = 0; l < KUnit<F>::kBytes; l += 64) _mm_prefetch(ahead + l, _MM_HINT_T0);
    }
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
  SPECDEC_UNROLL for (int m = 0; m < MB; ++m) y[(m0 + m) * n_dim + n] = _mm512_reduce_add_ps(acc[m]);
}

// Rows of x per pass of a k-quant row: two registers each (the integer sum of
// the super-block and the float accumulator) beside the codes and scales.
constexpr int kMaxMPerKPass = 12;

template <int F>
void KRows(const uint8_t* w, int64_t row_bytes, const SuperActivations& a, int64_t m_dim,
           int64_t k_dim, float* y, int64_t n_dim, int64_t begin, int64_t end) {
  for (int64_t n = begin; n < end; ++n) {
    const uint8_t* w_row = w + n * row_bytes;
    // Passes of equal size (9 rows: one pass; 16: two of 8): each pass
    // unpacks the row's codes once more.
    const int64_t passes = (m_dim + kMaxMPerKPass - 1) / kMaxMPerKPass;
    const int64_t per_pass = (m_dim + passes - 1) / passes;
    for (int64_t m0 = 0; m0 < m_dim; m0 += per_pass) {
      ForRowCount<kMaxMPerKPass>(std::min(per_pass, m_dim - m0), [&](auto rows) {
        KRowPass<F, decltype(rows)::value>(w_row, a, k_dim, m0, y, n_dim, n);
      });
    }
  }
}

template <int F>
ffi::Error RunK(ffi::ThreadPool& pool, const float* x, const uint8_t* w, float* y, int64_t m_dim,
                int64_t k_dim, int64_t n_dim, int64_t row_bytes) {
  if (k_dim % kSuper != 0 || row_bytes != k_dim / kSuper * KUnit<F>::kBytes)
    return ffi::Error::InvalidArgument("block_matmul: rows of w do not hold K weights of this format");
  SuperActivations a;
  QuantizeSuper(x, m_dim, k_dim, a);
  const SuperActivations* act = &a;
  ParallelRows(pool, n_dim, 4, [=](int64_t begin, int64_t end) {
    KRows<F>(w, row_bytes, *act, m_dim, k_dim, y, n_dim, begin, end);
  });
  return ffi::Error::Success();
}

template <int F>
int64_t RowBytes(int64_t k_dim) { return k_dim / Unit<F>::kWeights * Unit<F>::kBytes; }

template <int F>
ffi::Error Run(ffi::ThreadPool& pool, const float* x, const uint8_t* w, float* y, int64_t m_dim,
               int64_t k_dim, int64_t n_dim, int64_t row_bytes) {
  if (k_dim % Unit<F>::kWeights != 0 || row_bytes != RowBytes<F>(k_dim))
    return ffi::Error::InvalidArgument("block_matmul: rows of w do not hold K weights of this format");
  Activations a;
  Quantize(x, m_dim, k_dim, a);
  const Activations* act = &a;
  ParallelRows(pool, n_dim, 4, [=](int64_t begin, int64_t end) {
    BlockRows<F>(w, row_bytes, *act, m_dim, k_dim, y, n_dim, begin, end);
  });
  return ffi::Error::Success();
}


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
// Activations are quantised per row and 32 (the sub-block): int8 codes, scale
// da, and da times the codes' sum; per output lane
//   x . w ~= sum over sub-blocks of da * (d sc) * isum - (da * asum) * (dmin mn)
// with isum the sub-block's integer sum: exact integers to each sub-block's
// end, then one float order per row, whatever rows share the call.
constexpr int kX16Lanes = 16;
constexpr int64_t kX16Bytes = 32 + 32 + 128 + 128 + 2048;
constexpr int kX16Codes = 320;  // offset of the code lines in a super-block
constexpr int kMaxMPerX16Pass = 12;
// Prefetch distance: in a prototype of this loop, 2 super-blocks ahead beat 1 and 5.
constexpr int64_t kX16AheadBytes = 2 * kX16Bytes;

// x per pass of rows: codes as int32 words of 4 (word k of row m at k * rows + m),
// so a broadcast of one row's 4 codes is one load.
struct PassActivations {
  std::vector<int32_t> words;  // per pass: [K / 4][rows]
  std::vector<float> d, dsum;  // per pass: [K / 32][rows]
  // per pass: [K / 16][rows]: -32 times the integer sum of each 16 codes (q6_k's
  // sub-blocks of 16, whose weights are q - 32)
  std::vector<int32_t> q6_offset;
  std::vector<int32_t> asum;  // per pass: [K / 32][rows]: the integer sum of each 32 codes
  std::vector<int64_t> first, rows;  // per pass: its first row of x and row count
};

void QuantizeBy32(const float* x, int64_t m_dim, int64_t k_dim, PassActivations& a) {
  const int64_t passes = (m_dim + kMaxMPerX16Pass - 1) / kMaxMPerX16Pass;
  const int64_t per_pass = (m_dim + passes - 1) / passes;
  a.words.resize(m_dim * k_dim / 4);
  a.d.resize(m_dim * k_dim / 32);
  a.dsum.resize(m_dim * k_dim / 32);
  a.q6_offset.resize(m_dim * k_dim / 16);
  a.asum.resize(m_dim * k_dim / 32);
  a.first.clear();
  a.rows.clear();
  alignas(64) int8_t codes[32];
  for (int64_t m0 = 0; m0 < m_dim; m0 += per_pass) {
    const int64_t rows = std::min(per_pass, m_dim - m0);
    a.first.push_back(m0);
    a.rows.push_back(rows);
    int32_t* words = a.words.data() + m0 * k_dim / 4;
    float* d = a.d.data() + m0 * k_dim / 32;
    float* dsum = a.dsum.data() + m0 * k_dim / 32;
    int32_t* q6_offset = a.q6_offset.data() + m0 * k_dim / 16;
    int32_t* asum = a.asum.data() + m0 * k_dim / 32;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < k_dim / 32; ++b) {
        const float* xb = x + (m0 + r) * k_dim + 32 * b;
        const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
        const float top = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const __m512 inv = _mm512_set1_ps(top > 0.0f ? 127.0f / top : 0.0f);
        const __m512i r0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv));  // nearest, ties even
        const __m512i r1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(codes), _mm512_cvtsepi32_epi8(r0));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + 16), _mm512_cvtsepi32_epi8(r1));
        const float da = top / 127.0f;
        d[b * rows + r] = da;
        asum[b * rows + r] = _mm512_reduce_add_epi32(_mm512_add_epi32(r0, r1));
        dsum[b * rows + r] = da * float(asum[b * rows + r]);
        q6_offset[2 * b * rows + r] = -32 * _mm512_reduce_add_epi32(r0);
        q6_offset[(2 * b + 1) * rows + r] = -32 * _mm512_reduce_add_epi32(r1);
        for (int w = 0; w < 8; ++w) std::memcpy(&words[(8 * b + w) * rows + r], codes + 4 * w, 4);
      }
    }
  }
}

inline __m512 BytesToFloats(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// Rows [m0, m0 + MB) of x times the 16 output rows of `group`. Up to 6 rows,
// the low and high nibbles' products go to two integer sums per row (two
// dependency chains: one chain held 4 rows at ~75% of the speed of two); more
// rows have enough chains of their own. The sums are exact integers either way.
template <int MB>
void X16Pass(const uint8_t* group, int64_t supers, const int32_t* words, const float* d_act,
             const float* dsum_act, float* y, int64_t n_dim, int64_t m0, int64_t lane0) {
  constexpr bool kTwoChains = MB <= 6;
  __m512 acc[MB];
  _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (int64_t u = 0; u < supers; ++u) {
    const uint8_t* p = group + u * kX16Bytes;
    const char* ahead = reinterpret_cast<const char*>(p + kX16AheadBytes);
    for (int l = 0; l < kX16Codes; l += 64) _mm_prefetch(ahead + l, _MM_HINT_T0);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
    for (int j = 0; j < 8; ++j) {
      const __m512 scale = _mm512_mul_ps(d, BytesToFloats(p + 64 + 16 * j));
      const __m512 offset = _mm512_mul_ps(dmin, BytesToFloats(p + 192 + 16 * j));
      __m512i isum[MB], isum_high[MB];
      _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) isum[m] = isum_high[m] = _mm512_setzero_si512();
      const int32_t* wj = words + (u * 64 + 8 * j) * MB;  // this sub-block's 8 words per row
      _Pragma("GCC unroll 4") for (int t = 0; t < 4; ++t) {
        const uint8_t* line = p + kX16Codes + (4 * j + t) * 64;
        _mm_prefetch(reinterpret_cast<const char*>(line) + kX16AheadBytes, _MM_HINT_T0);
        const __m512i codes = _mm512_loadu_si512(line);
        const __m512i lo = _mm512_and_si512(codes, low4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(codes, 4), low4);
        _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) {
          isum[m] = _mm512_dpbusd_epi32(isum[m], lo, _mm512_set1_epi32(wj[(2 * t) * MB + m]));
          __m512i& high = kTwoChains ? isum_high[m] : isum[m];
          high = _mm512_dpbusd_epi32(high, hi, _mm512_set1_epi32(wj[(2 * t + 1) * MB + m]));
        }
      }
      const int64_t b = u * 8 + j;
      _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) {
        const __m512i sum = kTwoChains ? _mm512_add_epi32(isum[m], isum_high[m]) : isum[m];
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum),
                                 _mm512_mul_ps(scale, _mm512_set1_ps(d_act[b * MB + m])), acc[m]);
        acc[m] = _mm512_fnmadd_ps(offset, _mm512_set1_ps(dsum_act[b * MB + m]), acc[m]);
      }
    }
  }
  _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) _mm512_storeu_ps(y + (m0 + m) * n_dim + lane0, acc[m]);
}

// q6_k interleaved the same way (stored_blocks.interleave_q6_k). Per 16 rows and
// super-block, kX16Q6Bytes bytes: d[16] (float16), sc[16][16] (int8 scales of the
// sub-blocks of 16), then per sub-block j two lines of the codes' low 4 bits
// (line t: byte 4 * lane + b holds weight 16j + 8t + b's in its low nibble and
// 16j + 8t + 4 + b's in its high nibble), then per sub-block one line of their
// high 2 bits (byte 4 * lane + b: bits 2k, 2k + 1 of weight 16j + 4k + b's).
// w = d sc (q - 32). Per output lane and block b of 32 weights (one activation
// scale da), the sum stays an exact integer through both sub-blocks j of b:
//   x . w ~= sum over b of (d da) * sum over j in b of sc_j (isum_j - 32 asum_j)
// so a row's bits do not depend on the rows beside it, and one float fma per 32
// weights and row is all the epilogue (a sub-block's float epilogue, as q4_k's
// pass has per 32, made one row ~1.2x slower than the file's layout).
// |isum_j - 32 asum_j| <= 16 * 127 * (63 + 32) and |sc| <= 128: far from overflow.
constexpr int64_t kX16Q6Bytes = 32 + 256 + 2048 + 1024;
constexpr int kX16Q6Low = 288, kX16Q6High = 288 + 2048;

template <int MB>
void X16Q6Pass(const uint8_t* group, int64_t supers, const int32_t* words, const float* d_act,
               const int32_t* q6_offset, float* y, int64_t n_dim, int64_t m0, int64_t lane0) {
  constexpr bool kTwoChains = MB <= 6;
  __m512 acc[MB];
  _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0F), high2 = _mm512_set1_epi8(0x30);
  for (int64_t u = 0; u < supers; ++u) {
    const uint8_t* p = group + u * kX16Q6Bytes;
    const char* ahead = reinterpret_cast<const char*>(p + 2 * kX16Q6Bytes);
    for (int l = 0; l < kX16Q6Low; l += 64) _mm_prefetch(ahead + l, _MM_HINT_T0);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    for (int jp = 0; jp < 8; ++jp) {
      __m512i block_sum[MB];
      _Pragma("GCC unroll 2") for (int half = 0; half < 2; ++half) {
        const int j = 2 * jp + half;
        const __m512i sc = _mm512_cvtepi8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32 + 16 * j)));
        const uint8_t* low = p + kX16Q6Low + 128 * j;
        const uint8_t* high = p + kX16Q6High + 64 * j;
        _mm_prefetch(reinterpret_cast<const char*>(low) + 2 * kX16Q6Bytes, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(low) + 64 + 2 * kX16Q6Bytes, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(high) + 2 * kX16Q6Bytes, _MM_HINT_T0);
        const __m512i l0 = _mm512_loadu_si512(low), l1 = _mm512_loadu_si512(low + 64);
        const __m512i h = _mm512_loadu_si512(high);
        const __m512i codes[4] = {
            _mm512_or_si512(_mm512_and_si512(l0, low4), _mm512_and_si512(_mm512_slli_epi16(h, 4), high2)),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), low4),
                            _mm512_and_si512(_mm512_slli_epi16(h, 2), high2)),
            _mm512_or_si512(_mm512_and_si512(l1, low4), _mm512_and_si512(h, high2)),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), low4),
                            _mm512_and_si512(_mm512_srli_epi16(h, 2), high2))};
        const int32_t* wj = words + (u * 64 + 4 * j) * MB;  // this sub-block's 4 words per row
        const int32_t* offset = q6_offset + (u * 16 + j) * MB;
        __m512i isum[MB], isum_odd[MB];
        _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) {
          isum[m] = _mm512_set1_epi32(offset[m]);  // the -32 of every code, paid up front
          isum_odd[m] = _mm512_setzero_si512();
        }
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; ++k) {
          _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) {
            __m512i& sum = (kTwoChains && k % 2) ? isum_odd[m] : isum[m];
            sum = _mm512_dpbusd_epi32(sum, codes[k], _mm512_set1_epi32(wj[k * MB + m]));
          }
        }
        _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) {
          const __m512i sum = kTwoChains ? _mm512_add_epi32(isum[m], isum_odd[m]) : isum[m];
          const __m512i scaled = _mm512_mullo_epi32(sum, sc);
          block_sum[m] = half ? _mm512_add_epi32(block_sum[m], scaled) : scaled;
        }
      }
      const int64_t b = u * 8 + jp;
      _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) {
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(block_sum[m]),
                                 _mm512_mul_ps(d, _mm512_set1_ps(d_act[b * MB + m])), acc[m]);
      }
    }
  }
  _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) _mm512_storeu_ps(y + (m0 + m) * n_dim + lane0, acc[m]);
}

// q5_0 interleaved the same way (stored_blocks.interleave_q5_0). Per 16 rows
// and block of 32 weights, kX16Q5Bytes bytes (22 a row, as in the file): d[16]
// (float16), then four lines of the codes' low 4 bits (line t: byte 4 * lane + b
// holds weight 8t + b's in its low nibble and 8t + 4 + b's in its high nibble),
// then one line of their fifth bits (byte 4 * lane + b: bit k is weight 4k + b's).
// w = d (q - 16); per output lane and block, whose activations share one scale da:
//   x . w ~= (d da) * (isum - 16 asum), an exact integer up to the one fma.
constexpr int64_t kX16Q5Bytes = 32 + 256 + 64;
constexpr int64_t kX16Q5Ahead = 4 * kX16Q5Bytes;

template <int MB>
void X16Q5Pass(const uint8_t* group, int64_t blocks, const int32_t* words, const float* d_act,
               const int32_t* asum, float* y, int64_t n_dim, int64_t m0, int64_t lane0) {
  constexpr bool kTwoChains = MB <= 6;
  __m512 acc[MB];
  _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0F), fifth = _mm512_set1_epi8(0x10);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* p = group + b * kX16Q5Bytes;
    const char* ahead = reinterpret_cast<const char*>(p) + kX16Q5Ahead;
    for (int l = 0; l < kX16Q5Bytes; l += 64) _mm_prefetch(ahead + l, _MM_HINT_T0);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    const __m512i line[4] = {_mm512_loadu_si512(p + 32), _mm512_loadu_si512(p + 96),
                             _mm512_loadu_si512(p + 160), _mm512_loadu_si512(p + 224)};
    const __m512i h = _mm512_loadu_si512(p + 288);
    // bit k of each byte of h moved to bit 4 (16-bit shifts: bit 4 of a byte
    // only ever comes from its own byte for shifts of at most 4)
    const __m512i high[8] = {
        _mm512_and_si512(_mm512_slli_epi16(h, 4), fifth), _mm512_and_si512(_mm512_slli_epi16(h, 3), fifth),
        _mm512_and_si512(_mm512_slli_epi16(h, 2), fifth), _mm512_and_si512(_mm512_slli_epi16(h, 1), fifth),
        _mm512_and_si512(h, fifth), _mm512_and_si512(_mm512_srli_epi16(h, 1), fifth),
        _mm512_and_si512(_mm512_srli_epi16(h, 2), fifth), _mm512_and_si512(_mm512_srli_epi16(h, 3), fifth)};
    __m512i codes[8];
    _Pragma("GCC unroll 4") for (int t = 0; t < 4; ++t) {
      codes[2 * t] = _mm512_or_si512(_mm512_and_si512(line[t], low4), high[2 * t]);
      codes[2 * t + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(line[t], 4), low4),
                                         high[2 * t + 1]);
    }
    __m512i isum[MB], isum_odd[MB];
    _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) {
      isum[m] = _mm512_set1_epi32(-16 * asum[b * MB + m]);  // the -16 of every code, up front
      isum_odd[m] = _mm512_setzero_si512();
    }
    const int32_t* wb = words + 8 * b * MB;
    _Pragma("GCC unroll 8") for (int k = 0; k < 8; ++k) {
      _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) {
        __m512i& sum = (kTwoChains && k % 2) ? isum_odd[m] : isum[m];
        sum = _mm512_dpbusd_epi32(sum, codes[k], _mm512_set1_epi32(wb[k * MB + m]));
      }
    }
    _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) {
      const __m512i sum = kTwoChains ? _mm512_add_epi32(isum[m], isum_odd[m]) : isum[m];
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum),
                               _mm512_mul_ps(d, _mm512_set1_ps(d_act[b * MB + m])), acc[m]);
    }
  }
  _Pragma("GCC unroll 16") for (int m = 0; m < MB; ++m) _mm512_storeu_ps(y + (m0 + m) * n_dim + lane0, acc[m]);
}

template <int F>
ffi::Error RunX16(ffi::ThreadPool& pool, const float* x, const uint8_t* w, float* y, int64_t m_dim,
                  int64_t k_dim, int64_t n_dim, int64_t row_bytes) {
  // a "unit": a super-block of 256 weights (the k-quants) or a block of 32 (q5_0)
  constexpr int64_t kUnit = F == kQ5_0X16 ? 32 : kSuper;
  constexpr int64_t kGroupBytes = F == kQ6_KX16 ? kX16Q6Bytes
                                  : F == kQ5_0X16 ? kX16Q5Bytes : kX16Bytes;
  const int64_t units = k_dim / kUnit;
  if (k_dim % kUnit != 0 || n_dim % kX16Lanes != 0 ||
      row_bytes * kX16Lanes != units * kGroupBytes)
    return ffi::Error::InvalidArgument(
        "block_matmul: w is not a format interleaved by 16 rows of K weights (stored_blocks.interleave)");
  PassActivations a;
  QuantizeBy32(x, m_dim, k_dim, a);
  const PassActivations* act = &a;
  ParallelRows(pool, n_dim / kX16Lanes, 1, [=](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const uint8_t* group = w + g * units * kGroupBytes;
      for (size_t p = 0; p < act->first.size(); ++p) {
        const int64_t m0 = act->first[p];
        const int32_t* words = act->words.data() + m0 * k_dim / 4;
        const float* d = act->d.data() + m0 * k_dim / 32;
        const float* dsum = act->dsum.data() + m0 * k_dim / 32;
        const int32_t* asum = act->asum.data() + m0 * k_dim / 32;
        const int32_t* q6_offset = act->q6_offset.data() + m0 * k_dim / 16;
        ForRowCount<kMaxMPerX16Pass>(act->rows[p], [&](auto rows) {
          constexpr int kRows = decltype(rows)::value;
          if constexpr (F == kQ6_KX16) {
            X16Q6Pass<kRows>(group, units, words, d, q6_offset, y, n_dim, m0, g * kX16Lanes);
          } else if constexpr (F == kQ5_0X16) {
            X16Q5Pass<kRows>(group, units, words, d, asum, y, n_dim, m0, g * kX16Lanes);
          } else {
            X16Pass<kRows>(group, units, words, d, dsum, y, n_dim, m0, g * kX16Lanes);
          }
        });
      }
    }
  });
  return ffi::Error::Success();
}

}  // namespace blocks

ffi::Error BlockMatmulI8(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> w,
                         ffi::ResultBuffer<ffi::F32> y, int32_t format) {
  const auto dx = x.dimensions(), dw = w.dimensions(), dy = y->dimensions();
  if (dx.size() != 2 || dw.size() != 2 || dy.size() != 2 || dy[0] != dx[0] || dy[1] != dw[0])
    return ffi::Error::InvalidArgument("block_matmul: expected x [M, K], w [N, row bytes], y [M, N]");
  const float* xp = x.typed_data();
  const uint8_t* wp = w.typed_data();
  float* yp = y->typed_data();
  switch (format) {
    case blocks::kQ8_0: return blocks::Run<blocks::kQ8_0>(pool, xp, wp, yp, dx[0], dx[1], dw[0], dw[1]);
    case blocks::kQ4_1: return blocks::Run<blocks::kQ4_1>(pool, xp, wp, yp, dx[0], dx[1], dw[0], dw[1]);
    case blocks::kQ5_0: return blocks::Run<blocks::kQ5_0>(pool, xp, wp, yp, dx[0], dx[1], dw[0], dw[1]);
    case blocks::kQ4_K: return blocks::RunK<blocks::kQ4_K>(pool, xp, wp, yp, dx[0], dx[1], dw[0], dw[1]);
    case blocks::kQ6_K: return blocks::RunK<blocks::kQ6_K>(pool, xp, wp, yp, dx[0], dx[1], dw[0], dw[1]);
    case blocks::kQ6_KX16: return blocks::RunX16<blocks::kQ6_KX16>(pool, xp, wp, yp, dx[0], dx[1], dw[0], dw[1]);
    case blocks::kQ4_KX16: return blocks::RunX16<blocks::kQ4_KX16>(pool, xp, wp, yp, dx[0], dx[1], dw[0], dw[1]);
    case blocks::kQ5_0X16: return blocks::RunX16<blocks::kQ5_0X16>(pool, xp, wp, yp, dx[0], dx[1], dw[0], dw[1]);
    default: return ffi::Error::InvalidArgument("block_matmul: unknown block format");
  }
}
#endif  // VNNI

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SmallMMatmulF32, Matmul<ffi::F32>,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(SmallMMatmulBF16, Matmul<ffi::BF16>,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(SmallMMatmulI8, MatmulScaledI8,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

#if defined(SPECDEC_HAS_BLOCKS)
XLA_FFI_DEFINE_HANDLER_SYMBOL(SmallMBlockMatmulI8, BlockMatmulI8,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("format"));
#endif

// Whether this build has the block kernel (AVX-512 VNNI): read by the loader.
extern "C" int SpecdecHasBlockKernel() {
#if defined(SPECDEC_HAS_BLOCKS)
  return 1;
#else
  return 0;
#endif
}
