// checkpoint_pools.h: the random checkpoints a C++ backend is reloaded with,
// each a window of a pool of random values drawn once per layer.
//
// Note [Checkpoints from a pool]
// A reload needs a checkpoint whose every value differs from the last one's.
// Drawing each from the random generator cost a fifth of a harness run on
// the samples (callgrind: randn's normal_ alone, at some 60 instructions an
// element). So the checkpoints draw from pools of random values, drawn once
// per layer (floating and complex values from a normal distribution,
// integers from integer_range(), booleans from {0, 1}): one pool per dtype,
// kSharedPoolElements + kPoolWindows elements (about 4 MiB in float32),
// which every tensor of that dtype draws from. A tensor's name puts it at a
// `base` in its dtype's pool; the checkpoint of a seed holds, for element j,
// the pool's element (base + j) mod kSharedPoolElements of a window at an
// offset derived from the seed and, for floating dtypes, times a scale in
// [0.5, 2) derived from the seed (pool_window): from one seed to another the
// elements change (all but a chance few of a large tensor's, whose two
// products round to the same value), and not all by one factor (a multiple
// would quantize to the same bytes). A tensor's values repeat every
// kSharedPoolElements elements (a prime: no row length divides it, so no
// two rows of a matrix repeat each other). A pool of its own per tensor, as
// the pools were at first, held a whole model's bytes more for a real model
// for the whole check. This is the one generator of both languages: the
// Python module's CheckpointDrawer (python/reloadsafe/loading.py) draws with
// CheckpointPools, so a Python and a C++ subject with the same layouts draw
// the same checkpoint for the same seed.
//
// A tensor's values are scaled in one loop, in the op-math type at::mul uses
// (float for half and bfloat16), so the bytes are the ones `window.mul(scale)`
// gives, without the dispatcher's cost per tensor (a tenth of a harness run
// on the samples); the stretches of a tensor longer than the pool in
// parallel; complex values, and a pool given as a tensor (the tests'), go
// through ATen ops.
//
// Invariant: every tensor a draw returns is new, with a storage of its own
// and the layout's sizes and dtype, on the pools' device (the CPU, for pools
// drawn here), contiguous; the pools are only read.
#pragma once

#include "conformance/harness/subject.h"

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

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

/// The elements of a pool's window: the period of a tensor's values (a
/// prime).
constexpr int64_t kSharedPoolElements = 1048573;

/// The pools the checkpoints of one set of layouts are drawn from (Note
/// [Checkpoints from a pool]).
class CheckpointPools {
 public:
  /// The pools for `layouts` (meta tensors with the checkpoint layouts; an
  /// entry that is not a meta tensor is taken as a pool of that tensor's
  /// own, whose storage holds kPoolWindows elements more), drawn from
  /// generators of fixed seeds: the same dtypes give the same pools.
  explicit CheckpointPools(const Checkpoint& layouts);

  /// The checkpoint of `seed`, in the layouts' (name) order: each entry its
  /// pool's window of pool_window(seed), floating and complex dtypes times
  /// its scale, as a new tensor.
  Checkpoint draw(uint64_t seed) const;

  /// The pool `name` draws from: its dtype's (one dimension), or the one
  /// it was given.
  const at::Tensor& pool(const std::string& name) const;

  /// Where `name` starts in its dtype's pool; nothing for a given pool.
  std::optional<int64_t> base(const std::string& name) const;

  /// The bytes every pool holds together.
  int64_t nbytes() const;

 private:
  struct Entry {
    at::Tensor pool;              // the dtype's pool, or the one given
    at::Tensor layout;            // the layout (a meta tensor), for a dtype's pool
    std::optional<int64_t> base;  // where it starts in the dtype's pool
  };
  std::map<std::string, Entry> entries_;
};
}  // namespace reloadsafe::harness
