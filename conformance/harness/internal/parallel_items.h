// parallel_items.h: independent items of uneven sizes on LibTorch's intra-op
// threads, the largest first, each taken by whichever thread is free.
//
//   parallel_items(bytes_of_each_tensor, [&](size_t i) { digests[i] = digest(tensors[i]); });
//
// at::parallel_for hands each thread an equal count of a range: over a
// model's tensors that puts the embedding and a run of norms on one thread
// and the rest on another. Here the items are ordered by size, largest
// first, and each thread takes the next one as it finishes its last, so the
// threads end close together. An item's own work may call at::parallel_for:
// inside this one it runs on the calling thread.
//
// Invariant: work(i) runs exactly once for each item, on some thread; the
// first exception an item throws is rethrown once every thread has stopped
// taking items.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

namespace reloadsafe::harness {

/// Calls `work(i)` for every i in [0, sizes.size()), largest sizes first, on
/// the intra-op threads (see above). Items must not share mutable state.
template <typename F>
void parallel_items(const std::vector<int64_t>& sizes, F&& work) {
  std::vector<size_t> order(sizes.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  if (order.size() < 2 || at::get_num_threads() < 2 || at::in_parallel_region()) {
    for (size_t i : order) work(i);
    return;
  }
  std::atomic<size_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t /*begin*/, int64_t /*end*/) {
    for (size_t k = next++; k < order.size(); k = next++) work(order[k]);
  });
}

}  // namespace reloadsafe::harness
