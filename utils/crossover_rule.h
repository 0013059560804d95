// crossover_rule.h: the size from which a copy should use streaming
// (non-temporal) stores instead of memcpy, chosen from timings of both ways
// at several sizes. dense_copy_ measures the timings once per thread count
// (Note [Crossover calibration] in dense_copy.cc) and asks this rule.
//
// Invariant: pure arithmetic on the timings it is given; the answer is one
// of their sizes, or "never". Copies above the sweep's sizes are decided band
// by band, each from a timing of its own (band_streams).
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

namespace reloadsafe {

/// One measured size: the seconds of one copy of `bytes` each way.
struct CopyTiming {
  size_t bytes = 0;
  double cached_seconds = 0;    // memcpy
  double streamed_seconds = 0;  // streaming stores
};

/// Streaming's handicap in the choice: its time counts 5% more, so that it
/// is chosen only where it wins clearly (it leaves nothing cached for the
/// next reader, which a copy's own time does not show).
inline constexpr double kStreamHandicap = 1.05;

/// The threshold that loses least over all `timings` (sizes ascending):
/// memcpy below it, streaming from it on, each size's loss being its chosen
/// way's excess over the better way as a fraction of the better way's time.
/// Of equal losses the larger threshold wins. std::nullopt: never stream
/// (also for no timings). Sizes with a time that is not positive count for
/// nothing.
std::optional<size_t> least_loss_crossover(const std::vector<CopyTiming>& timings);

/// For one size measured alone (a band above the sweep's range): whether
/// streaming is the choice there, by the same rule (its time counts
/// kStreamHandicap more; a tie, or a time that is not positive, is memcpy).
bool band_streams(const CopyTiming& timing);

/// The band of a copy of `bytes` (> 0): k for sizes [2^k, 2^(k+1)).
int copy_band(size_t bytes);

}  // namespace reloadsafe
