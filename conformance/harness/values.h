// values.h: the protocol's comparisons of values: two tensors' bytes the same,
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
