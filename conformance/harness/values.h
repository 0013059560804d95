// values.h: the protocol's comparisons of values: a tensor's bytes unchanged,
// and an output close to the one a cold load gives.
//
// Invariant: nothing here changes a tensor it is given, and a comparison of
// dense CPU tensors runs no tensor op (nothing the allocation census counts,
// nothing a read trace records).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace reloadsafe::harness {

/// Whether `t`'s bytes can be read in place as one run: a dense, contiguous
/// CPU tensor with a storage that does not dispatch in Python.
bool plain_cpu_bytes(const at::Tensor& t);

/// Byte for byte (NaN payloads included, which an element-wise == is not).
/// A sparse or mkldnn tensor is compared as the dense tensor it stands for.
bool same_bytes(const at::Tensor& a, const at::Tensor& b);

/// A tensor's bytes as they are now, to tell later whether anything wrote
/// into it: for a dense CPU tensor a plain copy of its bytes (no tensor op),
/// else a clone.
class Snapshot {
 public:
  explicit Snapshot(const at::Tensor& t);
  /// Whether `t` holds the bytes taken.
  bool unchanged(const at::Tensor& t) const;

 private:
  bool bytes_taken_ = false;
  std::vector<unsigned char> bytes_;
  at::Tensor clone_;
};

/// The relative and the absolute tolerance of close().
constexpr double kCloseTolerance = 1e-5;

/// Close within rtol = atol = kCloseTolerance, NaN and infinities at the
/// same places comparing equal: a layer may legitimately compute them, and a
/// stale read of poisoned memory (Note [Poison quarantine] in
/// memory_census.h) still differs from a cold load. Sparse and mkldnn tensors
/// compare densely.
bool close(const at::Tensor& a, const at::Tensor& b);

/// "max |diff| 0.25", or "shape [2, 3] vs [3, 2]": how `a` and `b` differ.
std::string max_diff(const at::Tensor& a, const at::Tensor& b);

}  // namespace reloadsafe::harness
