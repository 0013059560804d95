// copy_bench: ways of getting checkpoint bytes from a file into a weight, and
// the hardware limits they are judged against, in one run.
//
//   bazel run -c opt //bench:copy_bench -- --benchmark_out=$PWD/copy.json
//   bazel run -c opt //bench:copy_bench -- --reloadsafe_large   # adds 1 GiB
//
// Names: BM_FileCopy/<destination>/<cache>/<strategy>/bytes:<N>/manual_time
//   destination  cpu (one thread); cpu_all_cores (LibTorch threads = the CPUs
//                this process may use; warm only); cuda_discrete or
//                cuda_integrated (from the device's cudaDevAttrIntegrated)
//                where a CUDA device is visible
//   cache        warm: resident as a writer's large writes leave it;
//                reread: resident after a re-read from disk (readahead's
//                folios; mmap_copy and pread, one thread, not judged);
//                cold: evicted (POSIX_FADV_DONTNEED) before each iteration
//                (Note [Page-cache folios] in checkpoint_file.h)
//   strategy     mmap_copy, copy_weight_touch, populate_read, map_populate,
//                pread (CPU), pread_pinned_staging (CUDA), file_loader (the
//                same bytes as a safetensors file, through utils/file_loader.h:
//                on the destination's thread count); see kStrategies
// and BM_Limit/<destination>/<limit>/bytes:<N>/manual_time for the limits:
// memcpy and AVX2 streaming-store copies between resident buffers (the copy
// limit of a size is the faster of the two; split over the threads for
// cpu_all_cores), the file's sequential read when cold, and pinned
// host-to-device copies. Strategies that copy out of a mapping into a CPU
// destination use dense_copy_ (utils/dense_copy.h), as copy_weight_ does.
//
// Every iteration maps the file afresh, so page faults are part of the
// measured cost, as when a safetensors checkpoint is loaded; mapping and
// unmapping are timed too. Only the load is timed (manual time, steady
// clock, ending after the device has finished): cache eviction and the
// residency probe run outside it. Counters per iteration: minor_faults,
// major_faults, and resident_at_start (the fraction of the file's pages in
// the page cache when the timed region starts: 1 warm, about 0 cold).

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "bench/bench_main.h"
#include "bench/checkpoint_file.h"
#include "bench/limit_copy.h"
#include "utils/copy_weight.h"
#include "utils/dense_copy.h"
#include "utils/file_loader.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <benchmark/benchmark.h>

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#if RELOADSAFE_BENCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14; older C libraries lack the name
#endif

namespace reloadsafe::bench {
namespace {

using Clock = std::chrono::steady_clock;

enum class Cache { kWarm, kReread, kCold };

const char* cache_name(Cache c) {
  switch (c) {
    case Cache::kWarm:
      return "warm";
    case Cache::kReread:
      return "reread";
    case Cache::kCold:
      return "cold";
  }
  return "?";
}

enum class StrategyId {
  kMmapCopy,
  kCopyWeightTouch,
  kPopulateRead,
  kMapPopulate,
  kPread,
  kStaging,
  kFileLoader
};

struct Strategy {
  StrategyId id;
  const char* name;   // in the benchmark name: never rename (baselines match on it)
  const char* label;  // the benchmark's label in the results
  bool to_cpu;
  bool to_cuda;
};

constexpr Strategy kStrategies[] = {
    {StrategyId::kMmapCopy, "mmap_copy", "copy_ from a fresh read-only mapping", true, true},
    {StrategyId::kCopyWeightTouch, "copy_weight_touch",
     "copy_weight_, integrated path forced (ScopedIntegratedGpuOverride): page touch, copy_", true,
     true},
    {StrategyId::kPopulateRead, "populate_read",
     "madvise(MADV_POPULATE_READ) on the mapping, then copy_", true, true},
    {StrategyId::kMapPopulate, "map_populate", "mmap(MAP_POPULATE), then copy_", true, true},
    {StrategyId::kPread, "pread", "pread straight into the destination, no mapping", true, false},
    {StrategyId::kStaging, "pread_pinned_staging",
     "pread into two reused pinned buffers, host-to-device copies overlapped on a stream", false,
     true},
    {StrategyId::kFileLoader, "file_loader",
     "FileLoader::load_ of a safetensors file (utils/file_loader.h): a populated mapping "
     "copied into a CPU tensor, its pinned staging ring to a device",
     true, true},
};

/// Where the bytes go.
struct Destination {
  bool cuda = false;
  std::string name;  // cpu, cpu_all_cores, cuda_discrete, cuda_integrated
  int threads = 1;   // LibTorch threads while it runs
};

// Copies a mapping's bytes into the destination: dense_copy_ on the CPU (the
// copy the utilities make), copy_ to a device.
void copy_out(const Destination& dest, at::Tensor& dst, const at::Tensor& src) {
  if (dest.cuda) {
    dst.copy_(src);
  } else {
    dense_copy_(dst, src);
  }
}

at::Tensor resident_cpu_bytes(int64_t n, uint8_t value) {
  at::Tensor t = at::empty({n}, at::kByte);
  t.fill_(value);  // faults every page in before anything is timed
  return t;
}

// Note [The limit's source pages]
// A resident file written in large writes is mapped in 2 MiB pages (Note
// [Page-cache folios] in checkpoint_file.h), and a copy out of 2 MiB pages
// takes fewer TLB misses than one out of LibTorch's 4 KiB-page buffers:
// about 5-15% less time here. A limit that the strategies judged against it
// can beat is no limit, so the limit copies read a source in 2 MiB pages
// (anonymous, 2 MiB-aligned, madvise(MADV_HUGEPAGE)) where transparent huge
// pages are allowed; the destination is a LibTorch buffer, as for the
// strategies. `*huge` says whether the advice was taken.
at::Tensor resident_source_bytes(int64_t n, uint8_t value, bool* huge) {
  constexpr int64_t kHuge = 2 << 20;
  const int64_t reserved = n + kHuge;
  void* base = mmap(nullptr, reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TORCH_CHECK(base != MAP_FAILED, "mmap of ", reserved,
              " bytes for the limit's source failed: ", std::strerror(errno));
  const auto addr = reinterpret_cast<uintptr_t>(base);
  void* aligned = reinterpret_cast<void*>((addr + kHuge - 1) & ~static_cast<uintptr_t>(kHuge - 1));
  *huge = madvise(aligned, n, MADV_HUGEPAGE) == 0;
  at::Tensor t = at::from_blob(
      aligned, {n}, [base, reserved](void*) { munmap(base, reserved); },
      at::TensorOptions().dtype(at::kByte));
  t.fill_(value);
  return t;
}

#if RELOADSAFE_BENCH_CUDA
at::Tensor cuda_bytes(int64_t n) {
  return at::zeros({n}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA, 0));
}

at::Tensor pinned_bytes(int64_t n) {
  return at::empty({n}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
}

// Note [Pinned staging]
// A host-to-device copy from pageable memory is staged by the driver through
// its own pinned buffers, one chunk at a time, without overlapping the reads
// that fill them. Here the loader stages itself: it preads a chunk into one of
// two pinned buffers while the DMA engine copies the other one out, so disk
// (or page cache) reads and the copy overlap. An event per buffer says when
// its last copy has finished and it may be refilled. Both buffers live as long
// as the loader: pinning memory costs far more than a copy.
class PinnedStaging {
 public:
  explicit PinnedStaging(int64_t chunk_bytes) : stream_(c10::cuda::getStreamFromPool()) {
    for (at::Tensor& b : buffers_) b = pinned_bytes(chunk_bytes);
  }

  /// Copies all of `file` into `dst` (a CUDA byte tensor of the file's size);
  /// returns when the copies have finished.
  void load(const CheckpointFile& file, at::Tensor& dst) {
    const int64_t chunk = buffers_[0].numel();
    auto* out = static_cast<uint8_t*>(dst.data_ptr());
    int slot = 0;
    for (int64_t off = 0; off < file.nbytes(); off += chunk, slot ^= 1) {
      const int64_t n = std::min(chunk, file.nbytes() - off);
      copied_[slot].synchronize();  // no-op until the event is first recorded
      file.read(buffers_[slot].data_ptr(), off, n);
      C10_CUDA_CHECK(cudaMemcpyAsync(out + off, buffers_[slot].data_ptr(), n,
                                     cudaMemcpyHostToDevice, stream_.stream()));
      copied_[slot].record(stream_);
    }
    stream_.synchronize();
  }

 private:
  at::Tensor buffers_[2];
  at::cuda::CUDAEvent copied_[2];
  c10::cuda::CUDAStream stream_;
};

constexpr int64_t kStagingChunk = 16 << 20;
#endif  // RELOADSAFE_BENCH_CUDA

// Waits until the device has finished all work queued so far (the timed
// region ends after the copy, not after its launch).
void finish(const Destination& dest) {
#if RELOADSAFE_BENCH_CUDA
  if (dest.cuda) c10::cuda::getCurrentCUDAStream().synchronize();
#endif
}

// Runs `load` once per iteration, timing only it, and sets the counters.
// `file` (may be null) is evicted first when `cache` is cold.
template <class Load>
void time_iterations(benchmark::State& state, const CheckpointFile* file, Cache cache,
                     Load&& load) {
  double resident = 0;
  int64_t minor = 0;
  int64_t major = 0;
  for (auto _ : state) {
    if (file != nullptr) {
      if (cache == Cache::kCold) file->drop_cached();
      resident += file->resident_fraction();
    }
    const FaultCount f0 = FaultCount::now();
    const Clock::time_point t0 = Clock::now();
    load();
    const Clock::time_point t1 = Clock::now();
    const FaultCount f1 = FaultCount::now();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
    minor += f1.minor - f0.minor;
    major += f1.major - f0.major;
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
  state.counters["minor_faults"] =
      benchmark::Counter(static_cast<double>(minor), benchmark::Counter::kAvgIterations);
  state.counters["major_faults"] =
      benchmark::Counter(static_cast<double>(major), benchmark::Counter::kAvgIterations);
  if (file != nullptr) {
    state.counters["resident_at_start"] =
        benchmark::Counter(resident, benchmark::Counter::kAvgIterations);
  }
}

void file_copy(benchmark::State& state, const Destination& dest, Cache cache,
               const Strategy& strategy) {
  guarded(state, [&] {
    ScopedThreads scoped(dest.threads);
    const int64_t nbytes = state.range(0);
    // The loader reads the format; the others the same bytes, headerless.
    const bool loader = strategy.id == StrategyId::kFileLoader;
    const CheckpointFile& file =
        loader ? CheckpointFile::shared_safetensors(nbytes) : CheckpointFile::shared(nbytes);
    at::Tensor dst;
#if RELOADSAFE_BENCH_CUDA
    std::unique_ptr<PinnedStaging> staging;
    if (dest.cuda) dst = cuda_bytes(nbytes);
    if (strategy.id == StrategyId::kStaging) {
      staging = std::make_unique<PinnedStaging>(std::min(nbytes, kStagingChunk));
    }
#endif
    if (!dest.cuda) dst = resident_cpu_bytes(nbytes, 0);
    if (cache == Cache::kWarm) file.make_warm_as_written();
    if (cache == Cache::kReread) file.make_warm_reread();
#if RELOADSAFE_BENCH_CUDA
    // The zero fill runs on the current stream; staging copies on another.
    if (dest.cuda) c10::cuda::device_synchronize();
#endif
    // One loader per benchmark, as an engine keeps one across reloads: its
    // staging ring is allocated by the untimed first load.
    std::unique_ptr<FileLoader> file_loader;
    LoadTargets targets;
    if (loader) {
      FileLoaderOptions options;
      options.threads = dest.threads;
      file_loader = std::make_unique<FileLoader>(options);
      targets["weight"] = {dst, std::nullopt};
      file_loader->load_({file.path()}, targets);
      dst.zero_();  // so that the check after the timed loads sees their bytes
#if RELOADSAFE_BENCH_CUDA
      if (dest.cuda) c10::cuda::device_synchronize();
#endif
      if (cache == Cache::kWarm) file.make_warm_as_written();
    }

    time_iterations(state, &file, cache, [&] {
      switch (strategy.id) {
        case StrategyId::kMmapCopy: {
          ReadOnlyMapping map(file);
          copy_out(dest, dst, map.bytes());
          break;
        }
        case StrategyId::kCopyWeightTouch: {
          ScopedIntegratedGpuOverride integrated(true);
          ReadOnlyMapping map(file);
          copy_weight_(dst, map.bytes());
          break;
        }
        case StrategyId::kPopulateRead: {
          ReadOnlyMapping map(file);
          TORCH_CHECK(madvise(map.data(), map.nbytes(), MADV_POPULATE_READ) == 0,
                      "madvise(MADV_POPULATE_READ) failed: ", std::strerror(errno));
          copy_out(dest, dst, map.bytes());
          break;
        }
        case StrategyId::kMapPopulate: {
          ReadOnlyMapping map(file, MAP_POPULATE);
          copy_out(dest, dst, map.bytes());
          break;
        }
        case StrategyId::kPread:
          file.read(dst.data_ptr(), 0, nbytes);
          break;
        case StrategyId::kStaging:
#if RELOADSAFE_BENCH_CUDA
          staging->load(file, dst);
#endif
          break;
        case StrategyId::kFileLoader:
          file_loader->load_({file.path()}, targets);
          break;
      }
      finish(dest);
    });
    state.SetLabel(strategy.label);
    if (!file.holds_contents(dst)) {
      state.SkipWithError("the destination does not hold the file's bytes after the copy");
    }
  });
}

// Copies between resident buffers: memcpy or streaming stores, on one thread
// or split over `threads` (one contiguous chunk each).
void limit_copy(benchmark::State& state, int threads, bool stream) {
  guarded(state, [&] {
    ScopedThreads scoped(threads);
    const int64_t nbytes = state.range(0);
    bool huge = false;
    at::Tensor src = resident_source_bytes(nbytes, 1, &huge);
    at::Tensor dst = resident_cpu_bytes(nbytes, 0);
    auto* d = static_cast<uint8_t*>(dst.data_ptr());
    const auto* s = static_cast<const uint8_t*>(src.const_data_ptr());
    time_iterations(state, nullptr, Cache::kWarm, [&] {
      limit_copy_bytes(d, s, nbytes, threads, stream);
      benchmark::ClobberMemory();
    });
    state.SetLabel(std::string(stream ? "AVX2 streaming stores" : "memcpy") +
                   " between resident buffers (" + std::to_string(threads) + " thread" +
                   (threads == 1 ? "" : "s") +
                   (huge ? "; source MADV_HUGEPAGE)" : "; source in 4 KiB pages)"));
  });
}

void limit_cold_read(benchmark::State& state) {
  guarded(state, [&] {
    const int64_t nbytes = state.range(0);
    const CheckpointFile& file = CheckpointFile::shared(nbytes);
    // A buffer that stays in cache: what is measured is the file's read.
    at::Tensor buf = resident_cpu_bytes(std::min<int64_t>(nbytes, 8 << 20), 0);
    time_iterations(state, &file, Cache::kCold, [&] {
      for (int64_t off = 0; off < nbytes; off += buf.numel()) {
        file.read(buf.data_ptr(), off, std::min(buf.numel(), nbytes - off));
      }
    });
    state.SetLabel("sequential pread of the evicted file, 8 MiB requests");
  });
}

#if RELOADSAFE_BENCH_CUDA
void limit_pinned_h2d(benchmark::State& state) {
  guarded(state, [&] {
    const int64_t nbytes = state.range(0);
    at::Tensor src = pinned_bytes(nbytes);
    src.fill_(1);
    at::Tensor dst = cuda_bytes(nbytes);
    c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool();
    c10::cuda::device_synchronize();  // the zero fill ran on another stream
    time_iterations(state, nullptr, Cache::kWarm, [&] {
      C10_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), nbytes, cudaMemcpyHostToDevice,
                                     stream.stream()));
      stream.synchronize();
    });
    state.SetLabel("cudaMemcpyAsync from pinned host memory");
  });
}
#endif

// The CUDA destination, or why there is none.
std::optional<Destination> cuda_destination(std::string* why) {
#if RELOADSAFE_BENCH_CUDA
  if (!at::hasCUDA()) {
    *why = "skipped: at::hasCUDA() is false (no CUDA device visible)";
    return std::nullopt;
  }
  c10::cuda::set_device(0);
  const bool integrated = is_integrated_gpu(c10::Device(at::kCUDA, 0));
  *why = std::string(integrated ? "cuda_integrated" : "cuda_discrete") + " (device 0, " +
         at::cuda::getDeviceProperties(0)->name + ")";
  return Destination{true, integrated ? "cuda_integrated" : "cuda_discrete"};
#else
  *why = "not compiled: no CUDA Toolkit when the workspace was configured";
  return std::nullopt;
#endif
}

benchmark::internal::Benchmark* with_sizes(benchmark::internal::Benchmark* b,
                                           const std::vector<int64_t>& sizes) {
  b->ArgName("bytes");
  for (int64_t n : sizes) b->Arg(n);
  return b->UseManualTime()->Unit(benchmark::kMicrosecond);
}

BenchMainOptions register_benchmarks(bool large) {
  std::vector<int64_t> sizes = {1 << 20, 16 << 20, 64 << 20, 256 << 20};
  if (large) sizes.push_back(int64_t{1} << 30);

  BenchMainOptions options;
  options.help =
      "  --reloadsafe_large                also measure 1 GiB (a 1 GiB scratch file, 3 GiB of "
      "memory)\n";
  options.copy_sizes = sizes;
  std::string populate_why;
  const bool populate_ok = populate_read_supported(&populate_why);
  std::string cuda_why;
  const int cores = all_cores();
  std::vector<Destination> dests = {{false, "cpu", 1}, {false, "cpu_all_cores", cores}};
  if (auto cuda = cuda_destination(&cuda_why)) dests.push_back(*cuda);
  std::cerr << "copy_bench: CUDA destination: " << cuda_why << "\n";
  if (!populate_ok) std::cerr << "copy_bench: populate_read skipped: " << populate_why << "\n";

#if RELOADSAFE_BENCH_CUDA
  // The pinned H2D limit is registered (and so runs) before every other
  // series: a GPU run cut short by its time limit still has the limit the
  // CUDA targets are judged against.
  for (const Destination& dest : dests) {
    if (!dest.cuda) continue;
    const std::string limit = "BM_Limit/" + dest.name + "/pinned_h2d";
    with_sizes(benchmark::RegisterBenchmark(limit.c_str(), limit_pinned_h2d), sizes);
    options.targets.push_back({Target::Kind::kBestAtLeast,
                               "file -> " + dest.name + ": best warm strategy / pinned H2D limit",
                               "BM_FileCopy/" + dest.name + "/warm/", limit + "/", 64 << 20, 0.8});
  }
#endif
  for (const Destination& dest : dests) {
    for (Cache cache : {Cache::kWarm, Cache::kReread, Cache::kCold}) {
      // The all-cores series is warm only: cold, the disk is the limit.
      if (dest.threads > 1 && cache != Cache::kWarm) continue;
      for (const Strategy& s : kStrategies) {
        if (!(dest.cuda ? s.to_cuda : s.to_cpu)) continue;
        if (s.id == StrategyId::kPopulateRead && !populate_ok) continue;
        // Re-read: how much the page cache's folios cost the two kinds of
        // CPU load (a mapping, a read), for information.
        if (cache == Cache::kReread &&
            (dest.cuda || (s.id != StrategyId::kMmapCopy && s.id != StrategyId::kPread))) {
          continue;
        }
        const std::string name =
            "BM_FileCopy/" + dest.name + "/" + cache_name(cache) + "/" + s.name;
        with_sizes(benchmark::RegisterBenchmark(
                       name.c_str(),
                       [dest, cache, s](benchmark::State& st) { file_copy(st, dest, cache, s); }),
                   sizes);
      }
    }
  }
  for (const Destination& dest : dests) {
    if (dest.cuda) continue;
    const int t = dest.threads;
    const std::string prefix = "BM_Limit/" + dest.name + "/";
    with_sizes(
        benchmark::RegisterBenchmark((prefix + "memcpy").c_str(),
                                     [t](benchmark::State& st) { limit_copy(st, t, false); }),
        sizes);
    with_sizes(benchmark::RegisterBenchmark((prefix + "stream_copy").c_str(),
                                            [t](benchmark::State& st) { limit_copy(st, t, true); }),
               sizes);
    options.targets.push_back({Target::Kind::kBestAtLeast,
                               "file -> " + dest.name + ": best warm strategy / copy limit (" +
                                   std::to_string(t) + (t == 1 ? " thread)" : " threads)"),
                               "BM_FileCopy/" + dest.name + "/warm/",
                               prefix + "memcpy/|" + prefix + "stream_copy/", 16 << 20, 0.9});
    // The loader on its own (issue 42): utils/file_loader.h at the copy limit.
    options.targets.push_back({Target::Kind::kBestAtLeast,
                               "file -> " + dest.name + ": file_loader / copy limit",
                               "BM_FileCopy/" + dest.name + "/warm/file_loader/",
                               prefix + "memcpy/|" + prefix + "stream_copy/", 64 << 20, 0.9});
  }
  with_sizes(benchmark::RegisterBenchmark("BM_Limit/cpu/cold_seq_read", limit_cold_read), sizes);

  std::string size_list;
  for (int64_t n : sizes) size_list += (size_list.empty() ? "" : ",") + std::to_string(n);
  for (const Destination& dest : dests) {
    if (dest.threads > 1) continue;  // no cold series
    options.references.emplace_back("BM_FileCopy/" + dest.name + "/cold/",
                                    "BM_Limit/cpu/cold_seq_read/");
    if (!dest.cuda) {
      options.references.emplace_back("BM_FileCopy/" + dest.name + "/reread/",
                                      "BM_Limit/cpu/memcpy/|BM_Limit/cpu/stream_copy/");
      // Readahead's folio sizes depend on free memory's fragmentation: the
      // same code on the same machine measured 21.9 and 28.3 ms at 256 MiB.
      options.informational.push_back("BM_FileCopy/" + dest.name + "/reread/");
    }
  }
  // Every file copy reads through the page cache, whose mapping and copying
  // the kernel owns: fc-v657 and fc-v1272 kernels on one CPU model measured
  // warm 256 MiB mapped copies 4x apart (21 and 82 ms) with the same binary.
  options.kernel_dependent.push_back("BM_FileCopy/");
  options.context = {{"copy_bench_sizes", size_list},
                     {"copy_bench_all_cores_threads", std::to_string(cores)},
                     {"copy_bench_cuda_destination", cuda_why},
                     {"copy_bench_populate_read", populate_ok ? "supported" : populate_why}};
  return options;
}

}  // namespace
}  // namespace reloadsafe::bench

int main(int argc, char** argv) {
  using namespace reloadsafe::bench;
  const bool large = take_flag(&argc, argv, "reloadsafe_large").has_value();
  return run_benchmarks(argc, argv, register_benchmarks(large));
}
