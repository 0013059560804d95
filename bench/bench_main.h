// bench_main.h: the main() of reloadsafe's benchmark binaries, in place of
// BENCHMARK_MAIN().
//
// On top of what BENCHMARK_MAIN() does, it adds the machine context
// (machine_context.h) to the results, and after the run it judges the
// binary's targets (targets.h) on the results of that run: on the median of
// the repetitions when the benchmarks were repeated.
//
// Flags of its own (removed before Google Benchmark sees the arguments):
//   --reloadsafe_targets_out=<file>  also write the target results as JSON.
// A binary's own flags are taken with take_flag() before run_benchmarks().
//
// Usage:
//   int main(int argc, char** argv) {
//     const bool large = reloadsafe::bench::take_flag(&argc, argv, "my_flag").has_value();
//     reloadsafe::bench::BenchMainOptions options = register_benchmarks(large);
//     options.references.emplace_back("BM_Copy/cold/", "BM_Limit/cold_read/");
//     options.context.emplace_back("my_flag", large ? "on" : "off");
//     options.help = "  --my_flag  also register the large benchmarks\n";
//     return reloadsafe::bench::run_benchmarks(argc, argv, options);
//   }
#pragma once

#include "bench/machine_context.h"
#include "bench/targets.h"

#include <benchmark/benchmark.h>

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace reloadsafe::bench {

/// Removes `--<name>` or `--<name>=<value>` from argv (the last one wins if
/// given more than once) and returns its value: "" when given without one,
/// std::nullopt when not given.
std::optional<std::string> take_flag(int* argc, char** argv, const std::string& name);

/// A benchmark measured against a limit of the same run, by name prefixes.
/// Its own type (not a pair of strings, as ContextEntry is), so a reference
/// and a context entry cannot be given in each other's place.
struct LimitReference {
  LimitReference(std::string benchmarks, std::string limit)
      : benchmarks(std::move(benchmarks)), limit(std::move(limit)) {}
  /// Name prefix of the benchmarks (e.g. "BM_FileCopy/cpu/cold/").
  std::string benchmarks;
  /// Name prefix of the limit they are judged against.
  std::string limit;
};

/// What a benchmark binary adds to the common main. Set the fields by name
/// (see the usage above).
struct BenchMainOptions {
  /// Targets judged at the end of the run.
  std::vector<Target> targets;
  /// Benchmarks (name prefix) and the limit (name prefix) each is measured
  /// against, besides those the ratio targets name. Written to the context as
  /// `reloadsafe_references` ("prefix=limit;..."): bench/compare.py judges a
  /// slowdown relative to the limit of the same run, so a machine that is
  /// slower as a whole is not taken for a regression.
  std::vector<LimitReference> references;
  /// Name prefixes of benchmarks whose speed depends on state outside the
  /// code (the page cache's folio sizes after readahead, which depend on
  /// how fragmented free memory is). Written to the context as
  /// `reloadsafe_informational` ("a/;b/"): bench/compare.py reports their
  /// differences as information ("varies"), never as a regression.
  std::vector<std::string> informational;
  /// Name prefixes of benchmarks whose speed depends on the operating
  /// system's kernel (reads through the page cache: how a kernel maps and
  /// copies cached pages changed a warm 256 MiB mapped copy 4x between two
  /// kernels on the same CPU model). Written to the context as
  /// `reloadsafe_kernel_dependent` ("a/;b/"): against a baseline recorded
  /// under another kernel, bench/compare.py reports their differences as
  /// information ("other kernel"), never as a regression.
  std::vector<std::string> kernel_dependent;
  /// Context entries besides machine_context() (e.g. which optional
  /// benchmarks were registered).
  std::vector<ContextEntry> context;
  /// Lines describing the binary's own flags, printed by --help.
  std::string help;
  /// Sizes the binary's dense copies make. dense_copy_ decides copies of
  /// 128 MiB and more by measuring the first copy of their band (Note
  /// [Copies above the calibrated range] in utils/dense_copy.cc): the main
  /// makes one of each, on both thread counts, before any benchmark runs.
  std::vector<int64_t> copy_sizes;
};

/// Calls `body`, turning an exception into a failed benchmark with its
/// message (a benchmark that checks its own result throws on a wrong one).
template <class Body>
void guarded(benchmark::State& state, Body&& body) {
  try {
    body();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

/// Sets LibTorch's thread count for the life of the object, then restores
/// it. Each benchmark series says how many threads it runs on: 1 (the
/// one-thread series) or all_cores() (the all-cores series).
class ScopedThreads {
 public:
  explicit ScopedThreads(int threads);
  ~ScopedThreads();
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int previous_;
};

/// The number of CPUs this process may run on (the all-cores series' thread
/// count).
int all_cores();

/// Measures dense_copy_'s streaming crossover for 1 and all_cores() threads
/// before any benchmark runs, and the bands of `copy_sizes` above it (one
/// dense copy of each size), so that no timed iteration pays for it, and
/// returns the context entries that record them
/// (`dense_copy_stream_from_bytes_threads_<N>`,
/// `dense_copy_band_<bytes>_threads_<N>`: stream or memcpy).
std::vector<ContextEntry> calibrate_dense_copy(const std::vector<int64_t>& copy_sizes = {});

/// Initialises Google Benchmark with argv, runs the benchmarks the flags
/// select, prints the targets, and returns the exit status: 1 for an
/// unrecognised argument, else 0 (targets are reported, not enforced).
int run_benchmarks(int argc, char** argv, const BenchMainOptions& options);

}  // namespace reloadsafe::bench
