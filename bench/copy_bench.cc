// Ways of getting checkpoint bytes from a file into a weight on the CPU, and
// the limits they are judged against. Each iteration maps the file afresh
// (warm page cache: the file stays resident), so page faults are part of the
// measured cost, as when a checkpoint is loaded from safetensors.
//
//   bazel run -c opt //bench:copy_bench -- --benchmark_out=copy.json
#include "utils/copy_weight.h"

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace reloadsafe {
namespace {

// A temporary file of `nbytes` bytes, removed on destruction.
class TempFile {
 public:
  explicit TempFile(int64_t nbytes) : nbytes_(nbytes) {
    const char* dir = std::getenv("TEST_TMPDIR");
    path_ = std::string(dir ? dir : "/tmp") + "/reloadsafe_bench_XXXXXX";
    fd_ = mkstemp(path_.data());
    std::string chunk(1 << 20, '\x5a');
    for (int64_t done = 0; done < nbytes;) {
      const auto n = static_cast<size_t>(std::min<int64_t>(chunk.size(), nbytes - done));
      done += write(fd_, chunk.data(), n);
    }
    fsync(fd_);
  }
  ~TempFile() {
    close(fd_);
    unlink(path_.c_str());
  }
  int fd() const { return fd_; }
  int64_t nbytes() const { return nbytes_; }

 private:
  int64_t nbytes_;
  std::string path_;
  int fd_;
};

// A read-only mapping of a file, unmapped on destruction.
struct Mapping {
  Mapping(const TempFile& f, int extra_flags) : nbytes(f.nbytes()) {
    ptr = mmap(nullptr, nbytes, PROT_READ, MAP_PRIVATE | extra_flags, f.fd(), 0);
    if (ptr == MAP_FAILED) std::abort();
  }
  ~Mapping() { munmap(ptr, nbytes); }
  at::Tensor tensor() const {
    return at::from_blob(ptr, {static_cast<int64_t>(nbytes)}, at::kByte);
  }
  size_t nbytes;
  void* ptr;
};

enum Strategy { kCopy, kCopyWeight, kPopulateRead, kMapPopulate, kPread, kMemcpyLimit };

void add_fault_counters(benchmark::State& state, const rusage& before) {
  rusage after{};
  getrusage(RUSAGE_SELF, &after);
  const double iters = static_cast<double>(state.iterations());
  state.counters["minor_faults"] = (after.ru_minflt - before.ru_minflt) / iters;
  state.counters["major_faults"] = (after.ru_majflt - before.ru_majflt) / iters;
}

void BM_FileToCpu(benchmark::State& state) {
  const auto strategy = static_cast<Strategy>(state.range(0));
  const int64_t nbytes = state.range(1);
  TempFile file(nbytes);
  at::Tensor dst = at::zeros({nbytes}, at::kByte);
  at::Tensor resident = at::ones({nbytes}, at::kByte);
  ScopedIntegratedGpuOverride integrated(strategy == kCopyWeight);
  rusage before{};
  getrusage(RUSAGE_SELF, &before);
  for (auto _ : state) {
    switch (strategy) {
      case kCopy:
      case kCopyWeight: {
        Mapping m(file, 0);
        copy_weight_(dst, m.tensor());
        break;
      }
      case kPopulateRead: {
        Mapping m(file, 0);
#ifdef MADV_POPULATE_READ
        madvise(m.ptr, m.nbytes, MADV_POPULATE_READ);
#endif
        dst.copy_(m.tensor());
        break;
      }
      case kMapPopulate: {
        Mapping m(file, MAP_POPULATE);
        dst.copy_(m.tensor());
        break;
      }
      case kPread: {
        auto* out = static_cast<char*>(dst.data_ptr());
        for (int64_t done = 0; done < nbytes;) {
          const ssize_t n = pread(file.fd(), out + done, nbytes - done, done);
          if (n <= 0) {
            state.SkipWithError("pread failed");
            break;
          }
          done += n;
        }
        break;
      }
      case kMemcpyLimit:
        std::memcpy(dst.data_ptr(), resident.data_ptr(), nbytes);
        break;
    }
    benchmark::DoNotOptimize(dst.data_ptr());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * nbytes);
  add_fault_counters(state, before);
  static const char* kNames[] = {"copy_",        "copy_weight_", "populate_read",
                                 "map_populate", "pread",        "memcpy_limit"};
  state.SetLabel(kNames[strategy]);
}

BENCHMARK(BM_FileToCpu)
    ->ArgNames({"strategy", "bytes"})
    ->ArgsProduct({{kCopy, kCopyWeight, kPopulateRead, kMapPopulate, kPread, kMemcpyLimit},
                   {1 << 20, 16 << 20, 64 << 20, 256 << 20}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace reloadsafe

BENCHMARK_MAIN();
