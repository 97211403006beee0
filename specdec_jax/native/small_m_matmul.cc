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
// The same library holds the attention of a step or scoring call over the cache,
// each query alone (CacheAttention below, cache_attention.h).
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
#include "block_dot.h"
#include "cache_attention.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>  // _mm_getcsr; the AVX-512 float kernels
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

#ifndef SPECDEC_UNROLL
#define SPECDEC_UNROLL _Pragma("GCC unroll 8")
#endif

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
// The floating-point control state (x86 MXCSR, AArch64 FPCR): rounding mode
// and whether subnormals are flushed. XLA's threads flush them (FTZ / DAZ);
// a helper takes the state of the thread that posted the job for as long as
// it works on it, so an output's bits never depend on which thread computed
// its chunk. (Helpers inherit the state of the thread that created them,
// which need not be the caller's: a product whose scales times activations
// fall among subnormals gave all zeros through XLA and nonzero outputs in a
// thread without FTZ, measured.)
#if defined(__x86_64__) || defined(__i386__)
inline uint64_t FpControl() { return _mm_getcsr(); }
inline void SetFpControl(uint64_t state) { _mm_setcsr(static_cast<unsigned>(state)); }
#elif defined(__aarch64__)
inline uint64_t FpControl() {
  uint64_t state;
  __asm__ __volatile__("mrs %0, fpcr" : "=r"(state));
  return state;
}
inline void SetFpControl(uint64_t state) { __asm__ __volatile__("msr fpcr, %0" : : "r"(state)); }
#else
inline uint64_t FpControl() { return 0; }
inline void SetFpControl(uint64_t) {}
#endif

struct Job {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  int64_t num_chunks = 0;
  uint64_t fp_control = FpControl();  // the posting thread's (see FpControl)
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
      const uint64_t own = FpControl();
      SetFpControl(job->fp_control);
      job->Work();
      SetFpControl(own);
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
// activations quantised per row to int8: block_dot.h (no XLA there), on the
// widest path the compiler targets (blocks::Best), over the caller and the
// helper threads.
ffi::Error BlockMatmulI8(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> w,
                         ffi::ResultBuffer<ffi::F32> y, int32_t format) {
  const auto dx = x.dimensions(), dw = w.dimensions(), dy = y->dimensions();
  if (dx.size() != 2 || dw.size() != 2 || dy.size() != 2 || dy[0] != dx[0] || dy[1] != dw[0])
    return ffi::Error::InvalidArgument("block_matmul: expected x [M, K], w [N, row bytes], y [M, N]");
  auto parallel = [&pool](int64_t items, int64_t tile, const std::function<void(int64_t, int64_t)>& fn) {
    ParallelRows(pool, items, tile, fn);
  };
  const char* error = specdec::blocks::Product<specdec::blocks::Best>(
      format, x.typed_data(), w.typed_data(), y->typed_data(), dx[0], dx[1], dw[0], dw[1], parallel);
  return error ? ffi::Error::InvalidArgument(error) : ffi::Error::Success();
}

// ---------------------------------------------------------------------------
// Attention of a step or scoring call's queries over the cache, each query
// alone (cache_attention.h): q [B, K, H, G, D], keys and values [B, H, S, D]
// (heads-major), visible [B, K, S]; out [B, K, H, G, D]. One task per
// (row, query, key/value head), over the caller and the helper threads.
ffi::Error CacheAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q,
                          ffi::Buffer<ffi::F32> keys, ffi::Buffer<ffi::F32> values,
                          ffi::Buffer<ffi::PRED> visible, ffi::ResultBuffer<ffi::F32> out,
                          float scale) {
  const auto dq = q.dimensions(), dk = keys.dimensions(), dv = values.dimensions(),
             dm = visible.dimensions(), dout = out->dimensions();
  const bool shapes_ok =
      dq.size() == 5 && dk.size() == 4 && dv.size() == 4 && dm.size() == 3 &&
      dout.size() == 5 && dk[0] == dq[0] && dk[1] == dq[2] && dk[3] == dq[4] &&
      dv[0] == dk[0] && dv[1] == dk[1] && dv[2] == dk[2] && dv[3] == dk[3] &&
      dm[0] == dq[0] && dm[1] == dq[1] && dm[2] == dk[2] &&
      std::equal(dq.begin(), dq.end(), dout.begin());
  if (!shapes_ok)
    return ffi::Error::InvalidArgument(
        "cache_attention: expected q [B, K, H, G, D], keys and values [B, H, S, D], "
        "visible [B, K, S], out [B, K, H, G, D]");
  const int64_t batch = dq[0], queries = dq[1], heads = dq[2], groups = dq[3], dims = dq[4];
  const int64_t positions = dk[2];
  const float* q_data = q.typed_data();
  const float* k_data = keys.typed_data();
  const float* v_data = values.typed_data();
  const bool* m_data = visible.typed_data();
  float* o_data = out->typed_data();
  if (batch * queries * heads == 0) return ffi::Error::Success();  // nothing to score (K = 0)
  ParallelRows(pool, batch * queries * heads, 1, [=](int64_t begin, int64_t end) {
    std::vector<float> scratch(specdec::attention::ScratchFloats(groups, positions));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t h = task % heads, bk = task / heads, b = bk / queries;
      const int64_t head_offset = (b * heads + h) * positions * dims;
      const int64_t query_offset = task * groups * dims;  // [B, K, H] flattened, then G, D
      specdec::attention::AttendHead(q_data + query_offset, k_data + head_offset,
                                     v_data + head_offset, m_data + bk * positions, groups,
                                     positions, dims, scale, scratch.data(),
                                     o_data + query_offset);
    }
  });
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(SmallMBlockMatmulI8, BlockMatmulI8,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("format"));

// Whether this build's block kernel is a SIMD path (read by the loader, which
// registers the block kernel only then): the scalar reference is the oracle
// of block_dot_check.cc, not a kernel to run models on (it measured slower
// than XLA's float32 dot of the dequantised matrix; runtime/cpu_kernels.py).
extern "C" int SpecdecHasBlockKernel() { return specdec::blocks::kBestIsSimd ? 1 : 0; }

// The block kernel's path in this build: "avx512vnni", "avxvnni", "avx2",
// "neon-dotprod" or "scalar".
extern "C" const char* SpecdecBlockKernelIsa() { return specdec::blocks::Best::kName; }

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecCacheAttention, CacheAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale"));
