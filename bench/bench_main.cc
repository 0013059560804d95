#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "bench/bench_main.h"

#include "utils/dense_copy.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <benchmark/benchmark.h>

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>

namespace reloadsafe::bench {
namespace {

// The value Google Benchmark will see for one of its own flags (it parses
// them again; this only decides which display reporter to build).
std::string benchmark_flag(int argc, char** argv, const std::string& name,
                           const std::string& fallback) {
  std::string value = fallback;
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) value = argv[i] + prefix.size();
  }
  return value;
}

bool truthy_flag(const std::string& v) {
  return v == "true" || v == "yes" || v == "1" || v == "on" || v == "t" || v == "y";
}

// Google Benchmark's default display reporter, recording what it reports.
// ConsoleReporter options as benchmark chooses them: colour on a terminal
// (--benchmark_color=auto), a counter table with --benchmark_counters_tabular.
std::unique_ptr<benchmark::BenchmarkReporter> make_display_reporter(
    int argc, char** argv, const std::map<std::string, Measurement>** measured) {
  const std::string format = benchmark_flag(argc, argv, "benchmark_format", "console");
  if (format == "json") {
    auto reporter = std::make_unique<RecordingReporter<benchmark::JSONReporter>>();
    *measured = &reporter->measured();
    return reporter;
  }
  if (format != "console") return nullptr;  // csv: benchmark's own (deprecated) reporter
  const std::string color = benchmark_flag(argc, argv, "benchmark_color", "auto");
  const char* term = std::getenv("TERM");
  const bool use_color =
      color == "auto" ? isatty(STDOUT_FILENO) && term != nullptr && std::strcmp(term, "dumb") != 0
                      : truthy_flag(color);
  const bool tabular =
      truthy_flag(benchmark_flag(argc, argv, "benchmark_counters_tabular", "false"));
  int options = benchmark::ConsoleReporter::OO_None;
  if (use_color) options |= benchmark::ConsoleReporter::OO_Color;
  if (tabular) options |= benchmark::ConsoleReporter::OO_Tabular;
  auto reporter = std::make_unique<RecordingReporter<benchmark::ConsoleReporter>>(
      static_cast<benchmark::ConsoleReporter::OutputOptions>(options));
  *measured = &reporter->measured();
  return reporter;
}

std::string basis_of(const std::map<std::string, Measurement>& measured) {
  int64_t reps = 1;
  for (const auto& [name, m] : measured) reps = std::max(reps, m.repetitions);
  return reps > 1 ? "medians of " + std::to_string(reps) + " repetitions, this run"
                  : "one run of each benchmark; repeat with --benchmark_repetitions=N "
                    "for medians";
}

// Whether `t` divides one benchmark prefix by another (a median target's
// patterns name no benchmark prefix, and a time or counter target no limit).
bool pairs_two_prefixes(const Target& t) {
  switch (t.kind) {
    case Target::Kind::kBestAtLeast:
    case Target::Kind::kEachAtLeast:
    case Target::Kind::kTimeRatioAtMost:
      return true;
    case Target::Kind::kTimeAtMost:
    case Target::Kind::kMedianTimeRatioAtMost:
    case Target::Kind::kCounterAtMost:
    case Target::Kind::kMedianCounterAtMost:
      return false;
  }
  return false;
}

// "prefix=limit;..." for the context: the ratio targets' pairs, then the
// binary's other references, each once.
std::string references_of(const BenchMainOptions& options) {
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const Target& t : options.targets) {
    if (pairs_two_prefixes(t)) pairs.emplace_back(t.candidates, t.limit);
  }
  for (const LimitReference& r : options.references) pairs.emplace_back(r.benchmarks, r.limit);
  std::string out;
  std::set<std::string> seen;
  for (const auto& [prefix, limit] : pairs) {
    if (!seen.insert(prefix).second) continue;
    out += (out.empty() ? "" : ";") + prefix + "=" + limit;
  }
  return out;
}

}  // namespace

std::optional<std::string> take_flag(int* argc, char** argv, const std::string& name) {
  std::optional<std::string> value;
  const std::string bare = "--" + name;
  const std::string with_value = bare + "=";
  int kept = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string arg = argv[i];
    if (arg == bare) {
      value = "";
    } else if (arg.rfind(with_value, 0) == 0) {
      value = arg.substr(with_value.size());
    } else {
      argv[kept++] = argv[i];
    }
  }
  *argc = kept;
  argv[kept] = nullptr;
  return value;
}

ScopedThreads::ScopedThreads(int threads) : previous_(at::get_num_threads()) {
  if (threads != previous_) at::set_num_threads(threads);
}

ScopedThreads::~ScopedThreads() {
  if (at::get_num_threads() != previous_) at::set_num_threads(previous_);
}

int all_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
}

std::vector<ContextEntry> calibrate_dense_copy(const std::vector<int64_t>& copy_sizes) {
  const auto describe = [](int64_t bytes) {
    return bytes == std::numeric_limits<int64_t>::max() ? std::string("never")
                                                        : std::to_string(bytes);
  };
  std::vector<ContextEntry> entries = {
      {"dense_copy_avx2", stream_copy_supported() ? "yes" : "no (memcpy only)"}};
  for (int threads : {1, all_cores()}) {
    ScopedThreads scoped(threads);
    entries.push_back({"dense_copy_stream_from_bytes_threads_" + std::to_string(threads),
                       describe(stream_crossover_bytes())});
    for (int64_t n : copy_sizes) {
      if (!large_copy_streams(static_cast<size_t>(n)).has_value()) {
        // The first copy of a band measures it (on its own buffers).
        const at::Tensor src = at::ones({n}, at::kByte);
        at::Tensor dst = at::empty({n}, at::kByte);
        dense_copy_(dst, src);
      }
      if (const std::optional<bool> streams = large_copy_streams(static_cast<size_t>(n))) {
        entries.push_back(
            {"dense_copy_band_" + std::to_string(n) + "_threads_" + std::to_string(threads),
             *streams ? "stream" : "memcpy"});
      }
    }
    if (threads == all_cores()) break;
  }
  return entries;
}

int run_benchmarks(int argc, char** argv, const BenchMainOptions& options) {
  const std::optional<std::string> targets_out = take_flag(&argc, argv, "reloadsafe_targets_out");
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0) {
      std::cout << "reloadsafe benchmark flags:\n"
                << "  --reloadsafe_targets_out=<file>  write the target results as JSON\n"
                << options.help << "\nGoogle Benchmark flags:\n";
      break;
    }
  }
  for (const auto& [key, value] : machine_context()) benchmark::AddCustomContext(key, value);
  for (const auto& [key, value] : options.context) benchmark::AddCustomContext(key, value);
  for (const auto& [key, value] : calibrate_dense_copy(options.copy_sizes))
    benchmark::AddCustomContext(key, value);
  benchmark::AddCustomContext("reloadsafe_references", references_of(options));
  const auto add_prefixes = [](const char* key, const std::vector<std::string>& list) {
    if (list.empty()) return;
    std::string prefixes;
    for (const std::string& p : list) prefixes += (prefixes.empty() ? "" : ";") + p;
    benchmark::AddCustomContext(key, prefixes);
  };
  add_prefixes("reloadsafe_informational", options.informational);
  add_prefixes("reloadsafe_kernel_dependent", options.kernel_dependent);

  // Read before Initialize, which removes benchmark's flags from argv.
  const std::map<std::string, Measurement>* measured = nullptr;
  std::unique_ptr<benchmark::BenchmarkReporter> display =
      make_display_reporter(argc, argv, &measured);
  // With JSON on stdout, the table goes to stderr so stdout stays valid JSON.
  const bool console = benchmark_flag(argc, argv, "benchmark_format", "console") == "console";
  std::ostream& out = console ? std::cout : std::cerr;

  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks(display.get());
  benchmark::Shutdown();

  if (measured == nullptr) {
    out << "\nTargets: not judged with --benchmark_format=csv (use the default console "
           "format, or json)\n";
    return 0;
  }
  const std::string basis = basis_of(*measured);
  const std::vector<TargetResult> results = evaluate_targets(options.targets, *measured);
  print_target_results(out, results, basis);
  if (targets_out.has_value()) {
    std::ofstream file(*targets_out);
    write_target_results_json(file, results, basis);
    if (!file) {
      std::cerr << "could not write the target results to " << *targets_out << "\n";
      return 1;
    }
  }
  return 0;
}

}  // namespace reloadsafe::bench
