// dense_copy.h: byte copies between dense CPU tensors at the machine's limit.
//
// Invariant: dense_copy_(dst, src) leaves `dst` holding exactly what
// `dst.copy_(src)` would, and never allocates, resizes or moves a storage.
// It copies the bytes itself only when that is the same thing byte for byte:
// both tensors on the CPU, strided, of one dtype, with the same sizes and
// strides, non-overlapping and dense, no conjugate/negative bit, memory
// ranges that do not overlap, and nothing for autograd or inference mode to
// record or refuse. Anything else is handed to `copy_` unchanged.
//
// How it copies: the byte range is split over LibTorch's threads
// (at::parallel_for) and each chunk is copied either with memcpy or with
// AVX2 streaming (non-temporal) stores, which write around the cache and win
// once a copy no longer fits in it. Which one, is decided by the size of the
// copy against a crossover measured on this machine, for the current thread
// count, the first time a copy large enough to matter is made (about half
// a second, once; thread-safe; see Note [Crossover calibration] in the
// source and utils/crossover_rule.h). Copies of 128 MiB and more are decided
// per band of sizes [2^k, 2^(k+1)), by timing both ways on the first copy
// made in the band (it costs about three more copies of that size, once per
// band and thread count; Note [Copies above the calibrated range]).
// Nothing here is tuned to one CPU. Without AVX2 (checked at run time) every
// chunk uses memcpy. memcpy of a dense same-dtype range is what `copy_`
// produces, minus its per-call set-up (TensorIterator, dispatch).
//
// Usage:
//   reloadsafe::dense_copy_(param_data, loaded);   // as param_data.copy_(loaded)
//   if (!reloadsafe::try_dense_copy(dst, src)) dst.copy_(src);
//
// Environment: RELOADSAFE_STREAM_CROSSOVER=<bytes> fixes the crossover for
// every size (0: always stream, a huge number: never) instead of measuring
// it; for tests and experiments.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <optional>

namespace reloadsafe {

/// `dst.copy_(src)`, through the byte path when both are dense CPU tensors of
/// the same dtype and layout (see the invariant above). Returns `dst`.
const at::Tensor& dense_copy_(const at::Tensor& dst, const at::Tensor& src);

/// Copies through the byte path and returns true when it applies; returns
/// false, touching nothing, when `copy_` must do it.
bool try_dense_copy(const at::Tensor& dst, const at::Tensor& src);

/// Whether the byte path would be taken for these tensors (no copy made).
bool dense_copy_applies(const at::Tensor& dst, const at::Tensor& src);

/// Whether this CPU can run the streaming-store copy (AVX2, checked at run
/// time).
bool stream_copy_supported();

/// Copies `n` bytes with AVX2 streaming stores on the calling thread (aligned
/// head and tail with memcpy, then an sfence). The ranges must not overlap.
/// Falls back to memcpy where stream_copy_supported() is false.
void stream_copy_bytes(void* dst, const void* src, size_t n);

/// Copies `n` bytes split over LibTorch's threads, each chunk with streaming
/// stores (`stream` true) or memcpy. The ranges must not overlap.
void parallel_copy_bytes(void* dst, const void* src, size_t n, bool stream);

/// The size from which dense_copy_ uses streaming stores with the current
/// thread count, measuring it the first time (INT64_MAX: never), for copies
/// below 128 MiB (and all sizes when RELOADSAFE_STREAM_CROSSOVER is set).
int64_t stream_crossover_bytes();

/// For a copy of `bytes` >= 128 MiB: whether its band streams with the
/// current thread count, once a copy in that band has measured it; nothing
/// before that, or for smaller sizes.
std::optional<bool> large_copy_streams(size_t bytes);

}  // namespace reloadsafe
