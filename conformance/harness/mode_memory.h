// mode_memory.h: the memory one mode of the protocol counts: live bytes
// after the cold load and after each reload, told apart from what the
// layers built aside keep, and the growth check at the mode's end.
//
// Note [What the layers made aside keep]
// Each reload is compared with layers the protocol builds aside (cold
// loads, and the cold states of compare_state). A factory or a library
// that keeps every layer it builds (a module-level registry, a cache keyed
// by layer) keeps those alive too, which is a leak of theirs and not the
// reload's: a reload that keeps its memory must not be flagged for it. On
// the CPU the census tells the two apart by when a block was allocated:
// what the aside steps allocated and is still alive is counted apart
// (the kept cold-load outputs, counted already, left out), and its growth
// is a warning naming the layers made aside; the rest is the live layer's.
// Elsewhere (the device's allocator has no such record) it stays in the
// reload's count.
//
// Invariant: on the CPU the census and the quarantine of freed storages
// (Note [Poison quarantine]) live exactly as long as the ModeMemory, so the
// process's allocator is as it was once the mode ends.
#pragma once

#include "conformance/harness/cold_loads.h"
#include "conformance/harness/report.h"
#include "conformance/harness/run_options.h"
#include "conformance/harness/subject.h"
#include "conformance/harness/violation_sink.h"
#include "conformance/trace/memory_census.h"

#include <cstdint>
#include <optional>
#include <vector>

namespace reloadsafe::harness {

/// The memory of one mode, recorded into its report's memory_bytes.
class ModeMemory {
 public:
  /// Starts the census and the quarantine on the CPU.
  ModeMemory(const RunOptions& options, const SubjectInfo& info, const ColdLoadOutputs& cold_loads,
             ModeReport& report);

  /// Runs `step`, something built aside, and remembers what it allocated
  /// (Note [What the layers made aside keep]); returns what it returns.
  template <typename F>
  auto aside(F&& step) -> decltype(step()) {
    const std::optional<uint64_t> from = census_ ? trace::cpu_allocation_epoch() : std::nullopt;
    auto out = step();
    if (from) {
      const uint64_t to = trace::cpu_allocation_epoch().value_or(*from);
      if (to > *from) aside_epochs_.emplace_back(*from, to);
    }
    return out;
  }

  /// After the capture: the baseline. The cold-load outputs kept so far are
  /// not the subject's (Note [One cold load per checkpoint]).
  void start();
  /// Appends the live bytes now to the report's memory_bytes (what the
  /// layers made aside keep, the kept cold-load outputs made since start()
  /// and `checks_own` bytes the check holds for itself not counted).
  void record(int64_t checks_own = 0);
  /// At the mode's end: growth after the first reload beyond the subject's
  /// tolerance is a violation; growth of what the layers made aside keep is
  /// a warning.
  void check(ViolationSink& sink);

  /// Live bytes on the run's device, 0 where they are not counted.
  int64_t live_bytes() const;
  /// The quarantine a reload's load runs under (null off the CPU).
  trace::Quarantine* quarantine() { return quarantine_ ? &*quarantine_ : nullptr; }

 private:
  int64_t aside_live_bytes() const;

  const RunOptions& options_;
  const SubjectInfo& info_;
  const ColdLoadOutputs& cold_loads_;
  ModeReport& report_;
  std::optional<trace::CpuCensusScope> census_;
  std::optional<trace::Quarantine> quarantine_;
  int64_t kept_before_ = 0;
  std::vector<trace::EpochRange> aside_epochs_;
  std::vector<int64_t> aside_bytes_;  // per record(), what they keep
};

}  // namespace reloadsafe::harness
