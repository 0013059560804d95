#include "utils/crossover_rule.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace reloadsafe {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// Timings at 1, 2, 4, ... MiB from the ratios streamed / cached (cached
// time proportional to the size).
std::vector<CopyTiming> timings_from_ratios(const std::vector<double>& ratios) {
  std::vector<CopyTiming> out;
  size_t bytes = kMiB;
  for (double r : ratios) {
    const double cached = static_cast<double>(bytes) / 1e10;
    out.push_back({bytes, cached, cached * r});
    bytes *= 2;
  }
  return out;
}

struct Case {
  std::string name;
  std::vector<double> ratios;  // streamed / cached at 1, 2, 4, ... MiB
  std::optional<size_t> want;
};

TEST(LeastLossCrossover, Table) {
  const Case cases[] = {
      {"clear crossover at 8 MiB", {1.3, 1.2, 1.1, 0.7, 0.6, 0.6, 0.6}, 8 * kMiB},
      // The failure of the old three-in-a-row rule: one noisy size (32 MiB)
      // inside the streaming region must not push the crossover past it.
      {"one noisy size inside the streaming region",
       {1.3, 1.2, 0.7, 0.7, 0.99, 0.6, 0.6},
       4 * kMiB},
      {"one noisy win among the memcpy sizes", {1.3, 0.8, 1.3, 1.2, 0.6, 0.6, 0.6}, 16 * kMiB},
      {"streaming never wins", {1.3, 1.2, 1.1, 1.05, 1.1, 1.2, 1.3}, std::nullopt},
      {"streaming wins everywhere", {0.7, 0.7, 0.6, 0.6}, kMiB},
      // Within the handicap (5%) streaming does not count as a win.
      {"streaming only marginally faster", {1.0, 0.99, 0.98, 0.97, 0.97}, std::nullopt},
      {"no timings", {}, std::nullopt},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(least_loss_crossover(timings_from_ratios(c.ratios)), c.want);
  }
}

TEST(LeastLossCrossover, TimesThatAreNotPositiveCountForNothing) {
  std::vector<CopyTiming> t = timings_from_ratios({1.3, 1.2, 0.6, 0.6});
  t.insert(t.begin() + 1, CopyTiming{3 * kMiB / 2, 0.0, -1.0});
  EXPECT_EQ(least_loss_crossover(t), 4 * kMiB);
}

TEST(LeastLossCrossover, OfEqualLossesTheLargerThresholdWins) {
  // Exactly equal ways at every size (after the handicap): never stream.
  std::vector<CopyTiming> t;
  for (size_t b = kMiB; b <= 8 * kMiB; b *= 2) t.push_back({b, 1.05, 1.0});
  EXPECT_EQ(least_loss_crossover(t), std::nullopt);
}

// One band above the sweep, measured alone: the same rule on one size.
TEST(BandStreams, Table) {
  struct BandCase {
    std::string name;
    double cached, streamed;  // seconds of one copy each way
    bool want;
  };
  const BandCase cases[] = {
      {"streaming clearly faster (EPYC, 256 MiB: 13 vs 3.6 GB/s)", 0.074, 0.021, true},
      {"memcpy clearly faster", 0.010, 0.020, false},
      {"streaming 4% faster: within the handicap", 0.0104, 0.0100, false},
      {"streaming 10% faster: beyond the handicap", 0.0110, 0.0100, true},
      {"a tie", 0.010, 0.010, false},
      {"memcpy time missing", 0.0, 0.010, false},
      {"streaming time missing", 0.010, -1.0, false},
  };
  for (const BandCase& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(band_streams(CopyTiming{256 * kMiB, c.cached, c.streamed}), c.want);
  }
}

TEST(CopyBand, PowersOfTwoStartABand) {
  const std::pair<size_t, int> cases[] = {
      {1, 0},
      {2, 1},
      {3, 1},
      {128 * kMiB - 1, 26},
      {128 * kMiB, 27},
      {200 * kMiB, 27},
      {256 * kMiB, 28},
      {512 * kMiB + 5, 29},
      {size_t{1} << 40, 40},
  };
  for (const auto& [bytes, band] : cases) EXPECT_EQ(copy_band(bytes), band) << bytes;
}

}  // namespace
}  // namespace reloadsafe
