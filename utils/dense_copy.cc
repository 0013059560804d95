#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "utils/dense_copy.h"

#include "utils/crossover_rule.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace reloadsafe {
namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
// Chunks handed to one thread are at least this large: below it, starting a
// parallel region costs more than the copy it would split.
constexpr int64_t kGrainBytes = 256 << 10;
constexpr int64_t kBlock = 64;  // chunk boundaries fall on cache lines
// The smallest copy the crossover is measured for, and asked for: streaming
// stores cannot win on a copy that stays in the per-core caches.
constexpr size_t kFirstCandidate = 256 << 10;
// The largest size of the crossover's sweep. Copies from twice that on are
// decided band by band (Note [Copies above the calibrated range]).
constexpr size_t kCalibratedUpTo = size_t{64} << 20;

#if defined(__x86_64__) || defined(__i386__)
#define RELOADSAFE_HAVE_AVX2_PATH 1

// One thread's streaming copy. Loads are unaligned; stores are 32-byte
// aligned (the head up to the first aligned destination byte and the tail
// go through memcpy), four 32-byte stores per loop so each iteration fills
// two cache lines' worth of write-combining buffers. The sfence makes the
// weakly ordered stores visible before the caller (or the parallel region's
// barrier) goes on.
__attribute__((target("avx2"))) void stream_copy_avx2(uint8_t* d, const uint8_t* s, size_t n) {
  size_t head = static_cast<size_t>(-reinterpret_cast<uintptr_t>(d)) & 31;
  if (head > n) head = n;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  size_t blocks = n / 128;
  for (size_t i = 0; i < blocks; ++i, d += 128, s += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 64));
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 96), e);
  }
  n -= blocks * 128;
  size_t rest32 = n / 32;
  for (size_t i = 0; i < rest32; ++i, d += 32, s += 32) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
  }
  std::memcpy(d, s, n - rest32 * 32);
  _mm_sfence();
}
#endif

bool detect_avx2() {
#ifdef RELOADSAFE_HAVE_AVX2_PATH
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

void copy_chunk(uint8_t* d, const uint8_t* s, size_t n, bool stream) {
#ifdef RELOADSAFE_HAVE_AVX2_PATH
  if (stream && stream_copy_supported()) {
    stream_copy_avx2(d, s, n);
    return;
  }
#endif
  std::memcpy(d, s, n);
}

// Calls f(begin, end) for the byte ranges one copy of n bytes is split into:
// one range on the calling thread when the copy is small or LibTorch has one
// thread, else cache-line-aligned chunks of at least kGrainBytes over
// LibTorch's threads.
template <class F>
void for_each_chunk(size_t n, F&& f) {
  const auto bytes = static_cast<int64_t>(n);
  if (bytes < 2 * kGrainBytes || at::get_num_threads() == 1) {
    f(int64_t{0}, bytes);
    return;
  }
  const int64_t blocks = (bytes + kBlock - 1) / kBlock;
  at::parallel_for(0, blocks, kGrainBytes / kBlock,
                   [&](int64_t b, int64_t e) { f(b * kBlock, std::min(e * kBlock, bytes)); });
}

// Note [Crossover calibration]
// Streaming stores bypass the cache: they lose while source and destination
// fit in it (the next reader finds nothing cached, and cached stores are
// fast), and win once they do not (no read-for-ownership of the destination,
// no eviction traffic). Where that happens depends on the cache sizes, the
// memory system and the number of threads copying, so it is measured, not
// assumed: both ways, through the same parallel split dense_copy_ uses, at
// sizes doubling from 256 KiB to 64 MiB. Each way runs in blocks of
// back-to-back copies (as the benchmarks' limits do: alternating single
// copies would leave the destination evicted by the streaming copy before
// every memcpy), at least three copies and 16 MiB per block after an untimed
// first one, two blocks each way, keeping each way's faster block mean: load
// from other processes only adds time. Time is each chunk's thread CPU time
// (seconds_of), which preemption does not inflate.
//
// The crossover is then the threshold that loses least over all the sizes
// measured (least_loss_crossover, utils/crossover_rule.h): memcpy below it, streaming from it on,
// each size's loss being its chosen way's excess over the better way, as a fraction of the better
// way's time. Streaming is charged 5% extra, so that it is chosen only where it wins clearly (it
// leaves nothing cached for the next reader, which these copies do not measure). An earlier rule
// (the first of three consecutive sizes where streaming won by 5%) let one noisy size restart the
// count: in one process of five the crossover came out at 64 MiB instead of 4-8 MiB, and its 16 MiB
// copies ran 1.5x slower. A single noisy size moves the least-loss threshold only when the two ways
// are close there, where the choice costs little either way. Per thread count: 0 not measured yet,
// -1 never, else the crossover in bytes (zero-initialised: static storage).
constexpr int kMaxThreads = 512;
std::atomic<int64_t> crossover_by_threads[kMaxThreads + 1];
std::mutex calibration_mutex;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The copy's critical path: the slowest chunk of the same split
// parallel_copy_bytes makes, each timed with its own thread's CPU clock, so
// that time a thread spends preempted by other processes (on a shared
// machine, most of a wall-clock measurement) does not count.
double seconds_of(uint8_t* d, const uint8_t* s, size_t n, bool stream) {
  std::mutex m;
  double slowest = 0;
  for_each_chunk(n, [&](int64_t begin, int64_t end) {
    const double t0 = thread_cpu_seconds();
    copy_chunk(d + begin, s + begin, static_cast<size_t>(end - begin), stream);
    const double dt = thread_cpu_seconds() - t0;
    std::lock_guard<std::mutex> lock(m);
    slowest = std::max(slowest, dt);
  });
  return slowest;
}

// Bytes copied per timed block at least (many copies of a small size).
constexpr size_t kBlockBytes = size_t{16} << 20;

// A block of `reps` back-to-back copies, the first untimed (it finds the
// cache as the other way left it); the mean of the others.
double block_seconds(uint8_t* d, const uint8_t* s, size_t n, bool stream, int reps) {
  seconds_of(d, s, n, stream);
  double total = 0;
  for (int i = 0; i < reps; ++i) total += seconds_of(d, s, n, stream);
  return total / reps;
}

int64_t measure_crossover() {
  if (!stream_copy_supported()) return kNever;
  constexpr size_t kLast = kCalibratedUpTo;
  std::unique_ptr<uint8_t, FreeDeleter> src(static_cast<uint8_t*>(std::aligned_alloc(64, kLast)));
  std::unique_ptr<uint8_t, FreeDeleter> dst(static_cast<uint8_t*>(std::aligned_alloc(64, kLast)));
  if (!src || !dst) return kNever;   // no memory to measure with: keep copy_'s behaviour
  std::memset(src.get(), 1, kLast);  // fault everything in, outside the timing
  std::memset(dst.get(), 0, kLast);
  std::vector<CopyTiming> timings;
  for (size_t n = kFirstCandidate; n <= kLast; n *= 2) {
    double cached = std::numeric_limits<double>::infinity();
    double streamed = cached;
    // Small sizes copy many times per block, so that each block's total
    // (the measurement) is long enough not to hinge on one time slice.
    const int reps = static_cast<int>(std::max<size_t>(3, kBlockBytes / n));
    for (int round = 0; round < 2; ++round) {
      cached = std::min(cached, block_seconds(dst.get(), src.get(), n, false, reps));
      streamed = std::min(streamed, block_seconds(dst.get(), src.get(), n, true, reps));
    }
    timings.push_back({n, cached, streamed});
  }
  const std::optional<size_t> crossover = least_loss_crossover(timings);
  return crossover ? static_cast<int64_t>(*crossover) : kNever;
}

// Note [Copies above the calibrated range]
// The sweep stops at 64 MiB: measuring larger copies up front would cost
// seconds and gigabytes of scratch memory on the first large copy of every
// process. But the choice above it cannot be read off the sizes below it:
// glibc's memcpy changes method above its own non-temporal threshold (3/4 of
// what it takes for the shared cache size; 192 MiB on this project's EPYC
// VMs, where its large-copy path then ran at about 3.6 GB/s against 13 for
// streaming stores), and on an Intel host memcpy went from 6.3 GB/s at 64
// MiB to 9.7 at 256 MiB. So from twice the sweep's last size on, each band
// of sizes [2^k, 2^(k+1)) is decided by measuring the first copy made in
// it, on that copy's own buffers (no scratch memory): memcpy, streaming,
// streaming, memcpy, each timed as the sweep times a copy (seconds_of: the
// slowest chunk's thread CPU time), and the faster of each way's two
// compared by the same rule as the sweep's sizes (band_streams,
// utils/crossover_rule.h). The destination holds the source's bytes after
// the first of the four; the other three are the once-per-band (and thread
// count) price. Every size is thus decided by a measurement on this
// machine: below 256 KiB memcpy (streaming cannot win inside the per-core
// caches), up to 128 MiB the sweep's crossover, above it its band's own.
constexpr int kBands = 64;  // band k: sizes [2^k, 2^(k+1))
enum : uint8_t { kBandUnmeasured = 0, kBandMemcpy = 1, kBandStream = 2 };
std::atomic<uint8_t> band_choice[kMaxThreads + 1][kBands];  // zero: unmeasured

// Copies n bytes (a first copy in its band) while measuring both ways;
// returns the band's choice.
uint8_t measure_band(uint8_t* d, const uint8_t* s, size_t n) {
  double cached = std::numeric_limits<double>::infinity();
  double streamed = cached;
  cached = std::min(cached, seconds_of(d, s, n, false));
  streamed = std::min(streamed, seconds_of(d, s, n, true));
  streamed = std::min(streamed, seconds_of(d, s, n, true));
  cached = std::min(cached, seconds_of(d, s, n, false));
  return band_streams(CopyTiming{n, cached, streamed}) ? kBandStream : kBandMemcpy;
}

std::atomic<uint8_t>& band_slot(size_t n) {
  const int threads = std::clamp(at::get_num_threads(), 1, kMaxThreads);
  return band_choice[threads][copy_band(n)];
}

std::optional<int64_t> crossover_from_env() {
  const char* v = std::getenv("RELOADSAFE_STREAM_CROSSOVER");
  if (v == nullptr || *v == '\0') return std::nullopt;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  TORCH_CHECK(end != v && *end == '\0' && n >= 0, "RELOADSAFE_STREAM_CROSSOVER='", v,
              "' is not a byte count; give a non-negative integer or unset it");
  return static_cast<int64_t>(n);
}

bool ranges_overlap(const uint8_t* a, const uint8_t* b, size_t n) {
  return a < b + n && b < a + n;
}

}  // namespace

bool stream_copy_supported() {
  static const bool supported = detect_avx2();
  return supported;
}

void stream_copy_bytes(void* dst, const void* src, size_t n) {
  copy_chunk(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n, true);
}

void parallel_copy_bytes(void* dst, const void* src, size_t n, bool stream) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  for_each_chunk(n, [&](int64_t begin, int64_t end) {
    copy_chunk(d + begin, s + begin, static_cast<size_t>(end - begin), stream);
  });
}

namespace {

// One dense copy, memcpy or streaming as measured for its size (Note
// [Crossover calibration], Note [Copies above the calibrated range]).
void copy_dense_bytes(uint8_t* d, const uint8_t* s, size_t n) {
  // The crossover is only asked for copies that could reach it (the
  // measurement starts at 256 KiB): small copies never pay for it.
  if (n < kFirstCandidate) {
    parallel_copy_bytes(d, s, n, false);
    return;
  }
  static const std::optional<int64_t> fixed = crossover_from_env();
  if (fixed || n < 2 * kCalibratedUpTo || !stream_copy_supported()) {
    parallel_copy_bytes(d, s, n, static_cast<int64_t>(n) >= stream_crossover_bytes());
    return;
  }
  std::atomic<uint8_t>& slot = band_slot(n);
  uint8_t choice = slot.load(std::memory_order_acquire);
  if (choice == kBandUnmeasured) {
    std::lock_guard<std::mutex> lock(calibration_mutex);
    choice = slot.load(std::memory_order_relaxed);
    if (choice == kBandUnmeasured) {
      slot.store(measure_band(d, s, n), std::memory_order_release);
      return;  // the measurement made the copy
    }
  }
  parallel_copy_bytes(d, s, n, choice == kBandStream);
}

}  // namespace

std::optional<bool> large_copy_streams(size_t bytes) {
  if (bytes < 2 * kCalibratedUpTo) return std::nullopt;
  const uint8_t choice = band_slot(bytes).load(std::memory_order_acquire);
  if (choice == kBandUnmeasured) return std::nullopt;
  return choice == kBandStream;
}

int64_t stream_crossover_bytes() {
  static const std::optional<int64_t> fixed = crossover_from_env();
  if (fixed) return *fixed;
  const int threads = std::clamp(at::get_num_threads(), 1, kMaxThreads);
  std::atomic<int64_t>& slot = crossover_by_threads[threads];
  int64_t value = slot.load(std::memory_order_acquire);
  if (value == 0) {
    std::lock_guard<std::mutex> lock(calibration_mutex);
    value = slot.load(std::memory_order_relaxed);
    if (value == 0) {
      const int64_t measured = measure_crossover();
      value = measured == kNever ? -1 : measured;
      slot.store(value, std::memory_order_release);
    }
  }
  return value < 0 ? kNever : value;
}

bool dense_copy_applies(const at::Tensor& dst, const at::Tensor& src) {
  if (!dst.defined() || !src.defined()) return false;
  if (!dst.device().is_cpu() || !src.device().is_cpu()) return false;
  if (dst.layout() != at::kStrided || src.layout() != at::kStrided) return false;
  if (dst.scalar_type() != src.scalar_type() || dst.is_quantized()) return false;
  if (dst.sizes() != src.sizes() || dst.strides() != src.strides()) return false;
  if (!dst.is_non_overlapping_and_dense()) return false;  // src has the same layout
  if (dst.is_conj() || src.is_conj() || dst.is_neg() || src.is_neg()) return false;
  // What copy_ would refuse or record for autograd: leave it to copy_.
  if (dst.requires_grad() || (src.requires_grad() && c10::GradMode::is_enabled())) return false;
  if (dst.is_inference() && !c10::InferenceMode::is_enabled()) return false;
  if (!dst.has_storage() || !src.has_storage()) return false;
  const size_t n = static_cast<size_t>(dst.numel()) * dst.element_size();
  if (n == 0) return true;
  return !ranges_overlap(static_cast<const uint8_t*>(dst.const_data_ptr()),
                         static_cast<const uint8_t*>(src.const_data_ptr()), n);
}

bool try_dense_copy(const at::Tensor& dst, const at::Tensor& src) {
  if (!dense_copy_applies(dst, src)) return false;
  const auto n = static_cast<size_t>(dst.numel() * dst.element_size());
  if (n > 0) {
    copy_dense_bytes(static_cast<uint8_t*>(dst.mutable_data_ptr()),
                     static_cast<const uint8_t*>(src.const_data_ptr()), n);
  }
  dst.unsafeGetTensorImpl()->bump_version();  // as copy_ does: an in-place write
  return true;
}

const at::Tensor& dense_copy_(const at::Tensor& dst, const at::Tensor& src) {
  if (!try_dense_copy(dst, src)) dst.copy_(src);
  return dst;
}

}  // namespace reloadsafe
