#include "utils/crossover_rule.h"

#include <algorithm>

namespace reloadsafe {
namespace {

// The time lost when memcpy copies timings[0, k) and streaming the rest.
double loss_with_threshold(const std::vector<CopyTiming>& timings, size_t k) {
  double loss = 0;
  for (size_t i = 0; i < timings.size(); ++i) {
    const double cached = timings[i].cached_seconds;
    const double streamed = timings[i].streamed_seconds * kStreamHandicap;
    if (!(cached > 0) || !(streamed > 0)) continue;
    const double best = std::min(cached, streamed);
    loss += ((i < k ? cached : streamed) - best) / best;
  }
  return loss;
}

}  // namespace

std::optional<size_t> least_loss_crossover(const std::vector<CopyTiming>& timings) {
  size_t best_k = timings.size();  // never stream
  double best_loss = loss_with_threshold(timings, best_k);
  for (size_t k = timings.size(); k-- > 0;) {
    const double loss = loss_with_threshold(timings, k);
    if (loss < best_loss) {
      best_loss = loss;
      best_k = k;
    }
  }
  if (best_k == timings.size()) return std::nullopt;
  return timings[best_k].bytes;
}

bool band_streams(const CopyTiming& timing) {
  return least_loss_crossover({timing}).has_value();
}

int copy_band(size_t bytes) {
  int band = 0;
  while (bytes > 1) {
    bytes >>= 1;
    ++band;
  }
  return band;
}

}  // namespace reloadsafe
