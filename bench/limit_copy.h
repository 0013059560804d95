// limit_copy.h: the copy that sets the benchmarks' CPU limits.
//
// A limit is the speed of the plainest copy between two resident buffers:
// memcpy, or AVX2 streaming stores (utils/dense_copy.h), on one thread or
// split over `threads` threads (each copies one contiguous chunk). copy_bench
// and replace_bench time it beside their strategies, in the same run.
//
// Invariant: writes exactly dst[0, n) from src[0, n), and nothing else.
#pragma once

#include <cstdint>

namespace reloadsafe::bench {

/// Copies `n` bytes from `src` to `dst` (not overlapping) with memcpy or, if
/// `stream`, streaming stores; split over `threads` LibTorch threads when
/// `threads` > 1 (set the thread count first, e.g. with ScopedThreads).
void limit_copy_bytes(uint8_t* dst, const uint8_t* src, int64_t n, int threads, bool stream);

}  // namespace reloadsafe::bench
