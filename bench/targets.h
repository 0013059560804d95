// targets.h: performance targets, checked by a benchmark binary on its own
// results at the end of a run.
//
// A target is a ratio between two benchmarks of the same run (a strategy
// against the hardware limit it is judged by), or an absolute time for
// decisions that do no copying. Ratios within one run hold on a noisy shared
// machine where absolute numbers do not: both sides see the same machine.
//
// Benchmark names follow one scheme, which targets and bench/compare.py rely
// on (bench/README.md):
//
//   <family>/<group>.../<series>/bytes:<N>[/manual_time|/real_time]
//   e.g. BM_FileCopy/cpu/warm/pread/bytes:67108864/manual_time
//
// A ratio target compares a candidate with the limit of the same `bytes`
// (the fastest of the limit's alternatives in that run).
// Invariant: a target that has nothing to compare (its sizes were filtered
// out, a benchmark failed) is reported as not applicable, never as met.
//
// Usage:
//   Target t = {Target::Kind::kBestAtLeast, "best warm strategy to cpu vs memcpy",
//               "BM_FileCopy/cpu/warm/", "BM_Limit/cpu/memcpy/", 64 << 20, 0.8};
//   print_target_results(std::cout, evaluate_targets({t}, measurements), "");
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace reloadsafe::bench {

/// What one benchmark measured: its throughput (0 if it sets no bytes) and
/// its time per iteration (CPU time for a /process_time benchmark, else real
/// or manual time).
struct Measurement {
  double bytes_per_second = 0;
  double time_ns = 0;
  /// How many repetitions the figures summarise (1: a single run; more: the
  /// figures are the median over them).
  int64_t repetitions = 1;
  /// The benchmark's user counters, by name (medians when repeated).
  std::map<std::string, double> counters;
};

/// A performance target.
struct Target {
  enum class Kind {
    kBestAtLeast,  ///< the fastest candidate of each size: throughput / limit's >= bound
    kEachAtLeast,  ///< every candidate of each size: throughput / limit's >= bound
    kTimeAtMost,   ///< every candidate: time per iteration <= bound nanoseconds
    /// every candidate: time per iteration / the limit's (same bytes, or both
    /// without a size) <= bound: a cost against the work it cannot avoid
    kTimeRatioAtMost,
    /// the median over subjects of time / the limit's time <= bound. Here
    /// `candidates` and `limit` are patterns in which one `*` stands for one
    /// name component, the subject ("BM_HarnessRun/*/traced/" against
    /// "BM_HarnessRun/*/untraced/"): a candidate is paired with the limit of
    /// the same subject (the fastest, for several), and one row judges the
    /// median of the pairs' ratios
    kMedianTimeRatioAtMost,
    /// every candidate: its counter `counter` (such as a ratio the benchmark
    /// measured itself: Note [Paired ratios] in harness_bench.cc) <= bound;
    /// `limit` is unused
    kCounterAtMost,
    /// the median over candidates of their counter `counter` <= bound;
    /// `candidates` is a pattern with one `*` (as for
    /// kMedianTimeRatioAtMost), `limit` is unused
    kMedianCounterAtMost,
  };
  Kind kind;
  std::string description;
  /// Name prefix of the benchmarks measured (e.g. "BM_FileCopy/cpu/warm/").
  std::string candidates;
  /// Name prefix of the limit they are divided by (ratio kinds only); several
  /// alternatives separated by '|' (e.g. "BM_Limit/cpu/memcpy/|BM_Limit/cpu/stream_copy/"):
  /// the limit of a size is then the fastest of them in the run.
  std::string limit;
  /// Sizes below this are not judged (ratio kinds only; names without a
  /// size are judged by kTimeRatioAtMost).
  int64_t min_bytes = 0;
  /// The ratio to reach, or the time in nanoseconds not to exceed.
  double bound = 0;
  /// The counter judged (counter kinds only).
  std::string counter = {};
};

/// One judged comparison.
struct TargetResult {
  std::string description;
  int64_t bytes = 0;  ///< 0 for kTimeAtMost
  double value = 0;   ///< the ratio, or the time in ns
  double bound = 0;
  bool at_most = false;  ///< value must be <= bound (else >= bound)
  bool met = false;
  std::string candidate;  ///< the benchmark judged (the best one for kBestAtLeast)
  bool is_time = false;   ///< value and bound are nanoseconds (kTimeAtMost), else a ratio
};

/// The alternatives of a Target::limit ("a|b" -> {"a", "b"}).
std::vector<std::string> limit_prefixes(const std::string& limit);

/// The `bytes:<N>` argument of a benchmark name, if it has one.
std::optional<int64_t> bytes_of(const std::string& name);

/// The component of `name` that the one `*` of `pattern` stands for, if
/// `name` starts with the pattern ("BM_Run/*/traced/" and
/// "BM_Run/marlin/traced/process_time" -> "marlin"). A pattern without `*`
/// or a component with a '/' matches nothing.
std::optional<std::string> subject_of(const std::string& pattern, const std::string& name);

/// Judges each target on `measured` (keyed by benchmark name without the
/// aggregate suffix). Targets with nothing to compare produce no rows.
std::vector<TargetResult> evaluate_targets(const std::vector<Target>& targets,
                                           const std::map<std::string, Measurement>& measured);

/// Prints the results as a table; says so when there are none.
void print_target_results(std::ostream& out, const std::vector<TargetResult>& results,
                          const std::string& basis);

/// Writes the results as a JSON array (for bench/compare.py).
void write_target_results_json(std::ostream& out, const std::vector<TargetResult>& results,
                               const std::string& basis);

/// A Google Benchmark reporter (`Base`: ConsoleReporter or JSONReporter) that
/// also records each benchmark's measurement: the median aggregate when the
/// benchmark was repeated, else its single run. Failed runs are not recorded.
template <class Base>
class RecordingReporter : public Base {
 public:
  using Base::Base;

  void ReportRuns(const std::vector<benchmark::BenchmarkReporter::Run>& runs) override {
    for (const auto& run : runs) record(run);
    Base::ReportRuns(runs);
  }

  const std::map<std::string, Measurement>& measured() const { return measured_; }

 private:
  void record(const benchmark::BenchmarkReporter::Run& run) {
    using Run = benchmark::BenchmarkReporter::Run;
    if (run.error_occurred) return;
    const bool single = run.run_type == Run::RT_Iteration && run.repetitions <= 1;
    const bool median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
    if (!single && !median) return;
    Measurement m;
    // A benchmark measured in process CPU time (MeasureProcessCPUTime(), its
    // name ends in /process_time) is judged by that time, as compare.py does.
    const double time = run.run_name.time_type == "process_time" ? run.GetAdjustedCPUTime()
                                                                 : run.GetAdjustedRealTime();
    m.time_ns = time / benchmark::GetTimeUnitMultiplier(run.time_unit) * 1e9;
    if (auto it = run.counters.find("bytes_per_second"); it != run.counters.end()) {
      m.bytes_per_second = it->second.value;
    }
    for (const auto& [name, counter] : run.counters) m.counters[name] = counter.value;
    m.repetitions = std::max<int64_t>(1, run.repetitions);
    measured_[run.run_name.str()] = m;
  }

  std::map<std::string, Measurement> measured_;
};

}  // namespace reloadsafe::bench
