// parallel_items (parallel_items.h): every item runs exactly once on one or
// two threads, the largest first where one thread takes them all, and an
// item's exception reaches the caller.

#include "conformance/harness/internal/parallel_items.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace reloadsafe::harness {
namespace {

class ParallelItems : public ::testing::TestWithParam<int> {};

TEST_P(ParallelItems, RunsEveryItemOnce) {
  const int threads = at::get_num_threads();
  at::set_num_threads(GetParam());
  const std::vector<int64_t> sizes = {5, 900, 1, 40, 40, 7, 0, 3000, 2};
  std::vector<std::atomic<int>> runs(sizes.size());
  std::mutex mutex;
  std::vector<size_t> order;
  parallel_items(sizes, [&](size_t i) {
    ++runs[i];
    std::lock_guard<std::mutex> lock(mutex);
    order.push_back(i);
  });
  at::set_num_threads(threads);
  for (size_t i = 0; i < sizes.size(); ++i) EXPECT_EQ(runs[i].load(), 1) << i;
  if (GetParam() == 1) {
    EXPECT_EQ(order, (std::vector<size_t>{7, 1, 3, 4, 5, 0, 8, 2, 6}))
        << "largest first, ties in order";
  }
}

TEST_P(ParallelItems, AnItemsExceptionReachesTheCaller) {
  const int threads = at::get_num_threads();
  at::set_num_threads(GetParam());
  std::atomic<int> runs{0};
  EXPECT_THROW(parallel_items({1, 2, 3, 4},
                              [&](size_t i) {
                                ++runs;
                                if (i == 2) throw std::runtime_error("item 2");
                              }),
               std::runtime_error);
  at::set_num_threads(threads);
  EXPECT_GE(runs.load(), 1);
}

INSTANTIATE_TEST_SUITE_P(Threads, ParallelItems, ::testing::Values(1, 2),
                         [](const auto& info) { return std::to_string(info.param) + "_threads"; });

}  // namespace
}  // namespace reloadsafe::harness
