// sparse_parts.h: the dense tensors that hold a sparse tensor's bytes.
//
// A sparse tensor (COO, CSR, CSC, BSR, BSC) has no storage of its own: its
// index and value tensors hold what a kernel reads, and they are what a
// captured graph keeps the addresses of. The trace records a sparse argument
// as a read of each part, and a layer's names name each part, so a reload
// that rebuilds a sparse tensor moves parts that are checked like any tensor.
// The parts are named by the method that returns each (Python's walk uses the
// same names): "_indices" and "_values" for COO; "crow_indices",
// "col_indices" and "values" for CSR and BSR; "ccol_indices", "row_indices"
// and "values" for CSC and BSC.
//
// Invariant: nothing here runs an op, allocates or touches a storage: a part
// is a handle to the sparse tensor's own member tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <string>

namespace reloadsafe::trace {

/// One part of a sparse tensor: its place among the parts and its name.
struct SparsePart {
  int index;
  const char* name;
};

/// How many parts `t` has: 2 for COO, 3 for the compressed layouts, 0 for
/// anything else (a dense tensor, a Python subclass, an undefined tensor).
size_t sparse_part_count(const at::Tensor& t);

/// Part `k` of `t` (k < sparse_part_count(t)): a handle to the sparse
/// tensor's own member tensor (no view, no copy).
at::Tensor sparse_part(const at::Tensor& t, size_t k);

/// The name and index of part `k` of `t` (k < sparse_part_count(t)).
const SparsePart& sparse_part_info(const at::Tensor& t, size_t k);

/// `fn(name, t)` for a tensor that is not sparse; for a sparse one,
/// `fn(name + "." + part name, part)` for each of its parts instead.
template <typename Fn>
void for_each_part(const std::string& name, const at::Tensor& t, Fn&& fn) {
  const size_t parts = sparse_part_count(t);
  if (parts == 0) fn(name, t);
  for (size_t k = 0; k < parts; ++k) {
    fn(name + "." + sparse_part_info(t, k).name, sparse_part(t, k));
  }
}

}  // namespace reloadsafe::trace
