// checkpoint_pools.h: the random checkpoints a C++ backend is reloaded with,
// each a window of a pool of random values drawn once per layer.
//
// Note [Checkpoints from a pool]
// A reload needs a checkpoint whose every value differs from the last one's.
// Drawing each from the random generator cost a fifth of a harness run on
// the samples (callgrind: randn's normal_ alone, at some 60 instructions an
// element). So each checkpoint tensor has a pool of random values, drawn
// once per layer (floating and complex values from a normal distribution,
// integers from integer_range(), booleans from {0, 1}):
// numel + kPoolWindows elements, held as a tensor with the checkpoint layout
// at the start of its storage. The checkpoint of a seed is a window of the
// pool at an offset derived from the seed and, for floating dtypes, times a
// scale in [0.5, 2) derived from the seed (pool_window): from one seed to
// another every element changes, and not all by one factor (a multiple would
// quantize to the same bytes). This is the one generator of both languages:
// the Python module's CheckpointDrawer (python/reloadsafe/loading.py) calls
// these functions, so a Python and a C++ subject with the same layouts draw
// the same checkpoint for the same seed.
//
// A window of a dense CPU pool smaller than ATen's grain size (where at::mul
// would use one thread too) is scaled in one loop, in the op-math type
// at::mul uses (float for half and bfloat16), so the bytes are the ones
// `window.mul(scale)` gives, without the dispatcher's cost per tensor (a
// tenth of a harness run on the samples); any other pool goes through ATen
// ops.
//
// Invariant: every tensor a draw returns is new, with a storage of its own
// and the pool's sizes, dtype and device (the CPU, for pools drawn here),
// contiguous; the pools are only read.
#pragma once

#include "conformance/harness/subject.h"

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace reloadsafe::harness {

/// The windows a pool holds beyond its tensor's elements: how many offsets
/// a seed may map to.
constexpr int64_t kPoolWindows = 1031;

/// The integers an integer pool holds: [-128, 127], the range of int8 that
/// quantized weights span, clipped to the dtype's ([0, 127] for unsigned
/// dtypes), so a signed weight gets both signs and every value fits.
struct IntegerRange {
  int64_t low;
  int64_t high;  ///< inclusive
};
IntegerRange integer_range(at::ScalarType dtype);

/// Where the checkpoint of a seed lies in every pool, and its scale.
struct PoolWindow {
  int64_t offset = 0;  ///< in [0, kPoolWindows), in elements
  double scale = 1;    ///< in [0.5, 2); applied to floating dtypes only
};

/// The window of `seed` (a fixed function of the seed).
PoolWindow pool_window(uint64_t seed);

/// The pools for `layouts` (meta tensors with the checkpoint layouts; an
/// entry that is not a meta tensor is taken as a pool already), drawn from
/// one generator of a fixed seed: the same layouts give the same pools.
Checkpoint checkpoint_pools(const Checkpoint& layouts);

/// The checkpoint of `seed` from `pools` (checkpoint_pools), on the pools'
/// device (the CPU, where an mmap'd checkpoint lives, for pools drawn
/// here): each entry the pool's window of pool_window(seed), floating and
/// complex dtypes times its scale, as a new tensor.
Checkpoint draw_from_pools(const Checkpoint& pools, uint64_t seed);

}  // namespace reloadsafe::harness
