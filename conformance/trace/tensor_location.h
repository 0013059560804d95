// tensor_location.h: where a tensor is, as a captured CUDA graph sees it.
//
// A graph bakes in a kernel argument's data pointer and reads it with the
// layout it had at capture. "Did this tensor move?" is therefore a question
// about a handful of facts: the storage (its identity, its data pointer and
// size), the data pointer of the tensor itself, and its layout (offset,
// sizes, strides, dtype, device). TensorLocation holds exactly those facts,
// and diff() answers the question with the same four verdicts wherever it is
// asked (the read trace, the capture, the protocol's declared tensors).
//
// Invariant: a TensorLocation never keeps the tensor or its storage alive
// and never dereferences the pointers it holds; they are identities for
// comparison. Comparing two locations whose storages were both freed in
// between is the caller's business (the read trace keeps a weak reference so
// that an identity is not reused while it looks).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/SmallVector.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace reloadsafe::trace {

/// `p` as reports print addresses ("0x7f3a..."; "0" for null).
std::string to_hex(const void* p);

/// Whether `t` dispatches in Python (a `__torch_dispatch__` subclass,
/// FakeTensor): its storage, if any, is not what kernels read, and touching
/// it may run Python or throw.
inline bool dispatches_in_python(const at::Tensor& t) {
  return t.unsafeGetTensorImpl()->key_set().has(c10::DispatchKey::Python);
}

/// Whether `t` is defined, not a Python tensor, and has a storage: a tensor
/// whose location means something.
inline bool has_plain_storage(const at::Tensor& t) {
  return t.defined() && !dispatches_in_python(t) && t.has_storage();
}

/// One way a tensor's location changed ("address", "storage", "storage
/// resized or moved", "layout"), with the before and after as reports print
/// them.
struct LocationChange {
  std::string what;
  std::string before;
  std::string after;
};

/// Where a tensor is. The storage fields are empty for a tensor without a
/// plain storage (a Python subclass, a sparse or mkldnn tensor).
struct TensorLocation {
  /// The storage's identity (its StorageImpl), for comparison only.
  const void* storage = nullptr;
  const void* storage_data = nullptr;  ///< the storage's data pointer (null if empty)
  size_t storage_nbytes = 0;
  const void* data_ptr = nullptr;  ///< storage_data + storage_offset * itemsize
  int64_t storage_offset = 0;      ///< in elements
  /// Inline up to kInlineDims dimensions: a trace makes one location per
  /// tensor read, and two heap vectors each were most of its allocations.
  static constexpr unsigned kInlineDims = 6;
  using Dims = c10::SmallVector<int64_t, kInlineDims>;
  Dims sizes;
  Dims strides;  ///< empty for a non-strided layout
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::Device device = c10::Device(c10::kCPU);

  /// The location of `t` (defined). Storage fields only for a tensor with a
  /// plain storage (has_plain_storage); nothing of `t` is copied or kept.
  static TensorLocation of(const at::Tensor& t);

  /// Makes this the location of `t`, as of() would, in place: a trace fills
  /// one location per tensor read inside the record that holds it, without
  /// moving a fresh one in.
  void reset_to(const at::Tensor& t);

  /// Whether `t` (defined, with a plain storage: has_plain_storage) is at
  /// this place: same_place(of(t)), without making a location.
  bool is_place_of(const at::Tensor& t) const;

  /// Whether the tensor has no elements: a kernel reads no byte of it
  /// (an empty constant a compiler lifts into its graph).
  bool no_elements() const {
    for (int64_t d : sizes) {
      if (d == 0) return true;
    }
    return false;
  }

  /// Same offset, sizes, strides, dtype and device.
  bool same_layout(const TensorLocation& other) const;

  /// Whether `t` (defined) has this layout: same_layout(of(t)), without
  /// making a location.
  bool is_layout_of(const at::Tensor& t) const;

  /// Same storage, storage bytes, data pointer and layout.
  bool same_place(const TensorLocation& after) const;

  /// "Float[16, 64] stride [64, 1] offset 0 on cpu".
  std::string layout() const;

  /// How `after` differs from this location, in the order a report lists
  /// them: the data pointer ("address"), the storage ("storage"; or, for the
  /// same storage object, "storage resized or moved"), the layout
  /// ("layout"). Empty when same_place(after). With `details` false, each
  /// change's before and after are left empty: for a caller that counts
  /// changes without showing them, which then formats no addresses.
  std::vector<LocationChange> diff(const TensorLocation& after, bool details = true) const;

 private:
  // is_layout_of() for `t` at storage offset `offset`.
  bool has_layout(const at::Tensor& t, int64_t offset) const;
};

}  // namespace reloadsafe::trace
