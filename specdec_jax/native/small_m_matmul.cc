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
// Rows of w are split into chunks that the calling thread and XLA's intra-op
// thread pool take from a shared counter, so no task ever waits for a thread
// that may be busy elsewhere (the caller alone can finish every chunk).
//
// Built and loaded at run time by specdec_jax/runtime/cpu_kernels.py.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
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

// Work shared between pool tasks and, only if the pool is slow to start them,
// the calling thread. It is held by shared_ptr because a task may start after
// the call returned (it then finds no chunk left). On a long product the
// caller sleeps instead of working alongside: XLA's pool threads spin while
// idle, so a third busy thread on a machine with as many cores as pool threads
// halves the bandwidth each one gets (measured: 40 ms vs 24 ms for a 933 MB
// product). On a short one it works at once (see Product).
struct Job {
  std::atomic<int64_t> next{0};
  int64_t num_chunks = 0;
  int64_t done = 0;  // guarded by mu
  std::mutex mu;
  std::condition_variable all_done;
  std::function<void(int64_t)> run;

  void Work() {
    int64_t finished = 0;
    for (int64_t c = next.fetch_add(1); c < num_chunks; c = next.fetch_add(1)) {
      run(c);
      ++finished;
    }
    if (finished == 0) return;
    std::lock_guard<std::mutex> lock(mu);
    done += finished;
    if (done == num_chunks) all_done.notify_all();
  }

  // How long the caller sleeps before taking chunks itself (0: at once).
  std::chrono::microseconds patience{500};

  void Wait() {
    std::unique_lock<std::mutex> lock(mu);
    while (done < num_chunks) {
      if (all_done.wait_for(lock, patience) == std::cv_status::timeout &&
          next.load() < num_chunks) {
        // No pool thread has come for the remaining chunks: do them here, so
        // a call never waits on a thread that is busy elsewhere.
        lock.unlock();
        Work();
        lock.lock();
      }
    }
  }
};

template <typename T>
void Product(ffi::ThreadPool& pool, const float* x, const T* w, const float* scale, float* y,
             int64_t m_dim, int64_t k_dim, int64_t n_dim) {
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  // Few long chunks: each is one sequential stream through w (the hardware
  // prefetcher's best case; many short interleaved chunks measured 1.6x slower),
  // two per thread so a late thread does not leave the others idle for long.
  const int64_t tiles = (n_dim + kMaxRowsPerTile - 1) / kMaxRowsPerTile;
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(2 * threads, tiles));
  const int64_t rows_per_chunk = (tiles + chunks - 1) / chunks * kMaxRowsPerTile;
  auto job = std::make_shared<Job>();
  job->num_chunks = (n_dim + rows_per_chunk - 1) / rows_per_chunk;
  job->run = [=](int64_t c) {
    const int64_t begin = c * rows_per_chunk;
    Rows(x, w, scale, y, m_dim, k_dim, n_dim, begin, std::min(n_dim, begin + rows_per_chunk));
  };
  if (threads == 1 || job->num_chunks == 1) {
    job->Work();
    return;
  }
  // A product shorter than this is done in a fraction of a millisecond,
  // where waking a pool thread that went to sleep during the step's other
  // ops costs as much again: the caller takes chunks at once. Longer ones
  // (a float32 output head, 0.9 GB) lose more to a third busy thread on the
  // cores than they gain. Measured on a 2-core x86_64 machine, in-loop steps:
  // int8 0.5B step 39 -> 30 ms, float32 1.5B 7-token call 310 -> 280 ms;
  // the same rule applied to the head too: 280 -> 450 ms.
  constexpr int64_t kHelpAtOnceBytes = int64_t{256} << 20;
  if (n_dim * k_dim * static_cast<int64_t>(sizeof(T)) < kHelpAtOnceBytes)
    job->patience = std::chrono::microseconds(0);
  for (int64_t i = 0; i < std::min(threads, job->num_chunks); ++i) pool.Schedule([job] { job->Work(); });
  job->Wait();
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
