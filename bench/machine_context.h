// machine_context.h: what a benchmark result needs to say about the machine
// it was measured on, so that results are only compared with results of the
// same kind of machine.
//
// Google Benchmark's JSON context already has the CPU count, frequency,
// caches and load average. These functions add what decides the speed of
// loading a checkpoint and what baselines are matched on: CPU model, kernel,
// the filesystem the scratch files live on, page size, LibTorch version, the
// build mode of the binary, and the GPU (name, integrated or discrete, driver)
// if there is one.
//
// Invariant: gathering the context never fails and never initialises CUDA
// through LibTorch: every value that cannot be read is reported as a reason
// ("none (libcuda.so.1 not found)"), so the same binary runs on machines with
// and without a GPU. The GPU is queried through the CUDA driver API, loaded
// with dlopen, so binaries that do not link LibTorch's CUDA library describe
// the GPU too.
//
// Usage:
//   for (const auto& [key, value] : reloadsafe::bench::machine_context()) {
//     benchmark::AddCustomContext(key, value);
//   }
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace reloadsafe::bench {

/// One key of the JSON context, with its value.
using ContextEntry = std::pair<std::string, std::string>;

/// The folder benchmarks put their scratch files in: $RELOADSAFE_BENCH_DIR,
/// else $TEST_TMPDIR (Bazel tests), else $TMPDIR, else /tmp.
std::string scratch_dir();

/// The filesystem type of the mount holding `path` ("ext4", "tmpfs", ...),
/// from /proc/self/mountinfo, with the mount point; a reason if unknown.
std::string filesystem_of(const std::string& path);

/// The first CUDA device as the driver reports it. `present` is false (and
/// `reason` says why) where there is no driver or no device.
struct GpuInfo {
  bool present = false;
  std::string reason;
  std::string name;
  bool integrated = false;
  int device_count = 0;
  std::string driver;  // "570.86.15 (CUDA 12.8)"
  double memory_gib = 0;
};

/// Queries the first CUDA device through libcuda.so.1 (cuInit,
/// cuDeviceGetName, ...). Cached: the driver is asked once per process.
const GpuInfo& gpu_info();

/// The machine kind that baselines are filed under: $RELOADSAFE_BENCH_KIND
/// if set, else the GPU's name as a slug ("nvidia-h200") where a GPU is
/// present, else "cpu-<N>core" with N the number of online CPUs.
std::string machine_kind();

/// Every context entry, in a fixed order: machine_kind, cpu_model, cpu_id
/// (x86 "family F model M", empty elsewhere), kernel,
/// scratch_dir, scratch_fs, page_size, libtorch_version, torch_threads,
/// omp_env (OMP_NUM_THREADS and OMP_WAIT_POLICY: on a small machine under
/// load, OpenMP's spin-waiting decides copy_ timings), reloadsafe_build,
/// gpu, and where a GPU is present gpu_integrated, gpu_driver,
/// gpu_memory_gib and gpu_count.
std::vector<ContextEntry> machine_context();

}  // namespace reloadsafe::bench
