// spec_model.h: an independent model of the specification's layout rules, and
// byte-level observation of tensors, shared by the property tests and the
// libFuzzer targets.
//
// The model is written from the text of the specification
// (vllm-model-executor-utils.txt: `_extent`, `_in_own_storage`) with 128-bit
// arithmetic, so that it cannot share an overflow bug with the implementation
// (utils/storage_fit.cc, which uses checked int64 arithmetic). Nothing here
// calls the utilities under test.
//
// The observation helpers read tensors as raw bytes through their storage, so
// a comparison is exact for every dtype (float NaN payloads, float8, bool)
// and needs no kernel of the dtype.
//
// Usage:
//   std::optional<int64_t> span = model::extent(shape, stride);  // nullopt: > INT64_MAX
//   bool placed = model::places(query);
//   RC_ASSERT(same_elements(result, fresh));
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/Storage.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

namespace reloadsafe::fuzz {

// ---------------------------------------------------------------------------
// Dtypes

/// Every dtype of this LibTorch whose tensors at::empty creates and copy_
/// copies to the same dtype. Left out: the quantized dtypes (they need a
/// quantizer) and the sub-byte UInt1-7/Int1-7 (LibTorch has no copy kernel
/// for them). Byte first: counterexamples shrink towards it.
inline const std::vector<at::ScalarType>& all_dtypes() {
  static const std::vector<at::ScalarType> dtypes = {
      at::kByte,
      at::kChar,
      at::kShort,
      at::kInt,
      at::kLong,
      at::kHalf,
      at::kBFloat16,
      at::kFloat,
      at::kDouble,
      at::kBool,
      at::ScalarType::Float8_e4m3fn,
      at::ScalarType::Float8_e5m2,
      at::ScalarType::Float8_e4m3fnuz,
      at::ScalarType::Float8_e5m2fnuz,
      at::ScalarType::Float8_e8m0fnu,
      at::ScalarType::UInt16,
      at::ScalarType::UInt32,
      at::ScalarType::UInt64,
      at::kComplexHalf,
      at::kComplexFloat,
      at::kComplexDouble,
      at::ScalarType::Bits8,
      at::ScalarType::Bits16,
      at::ScalarType::Bits1x8,
      at::ScalarType::Bits2x4,
      at::ScalarType::Bits4x2,
      at::ScalarType::Float4_e2m1fn_x2,
  };
  return dtypes;
}

/// The dtypes copy_ converts between (all of all_dtypes() but the bits types
/// and Float4_e2m1fn_x2, which copy only to themselves).
inline const std::vector<at::ScalarType>& convertible_dtypes() {
  static const std::vector<at::ScalarType> dtypes = [] {
    std::vector<at::ScalarType> out;
    for (at::ScalarType t : all_dtypes()) {
      if (!c10::isBitsType(t) && t != at::ScalarType::Float4_e2m1fn_x2) out.push_back(t);
    }
    return out;
  }();
  return dtypes;
}

inline int64_t itemsize(at::ScalarType t) {
  return static_cast<int64_t>(c10::elementSize(t));
}

namespace model {

using Int128 = __int128;

inline constexpr Int128 kInt64Max = std::numeric_limits<int64_t>::max();

/// Number of elements of `shape`, saturated at INT64_MAX + 1 (so "too many"
/// stays distinguishable from every real count). Sizes must be >= 0.
inline Int128 numel(const std::vector<int64_t>& shape) {
  Int128 n = 1;
  for (int64_t s : shape) {
    if (s == 0) return 0;
  }
  for (int64_t s : shape) {
    n *= s;
    if (n > kInt64Max) return kInt64Max + 1;
  }
  return n;
}

/// The specification's `_extent`: 0 for no elements, else
/// 1 + sum((size - 1) * stride). nullopt when it exceeds INT64_MAX (the
/// reference, in Python, would carry on with a big integer; the port reports
/// overflow). Sizes and strides must be >= 0 and of equal rank.
inline std::optional<int64_t> extent(const std::vector<int64_t>& shape,
                                     const std::vector<int64_t>& stride) {
  if (numel(shape) == 0) return 0;
  Int128 span = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    // Each term is below 2^126; the sum is checked after every term, so it
    // never exceeds 2^127.
    span += static_cast<Int128>(shape[d] - 1) * stride[d];
    if (span > kInt64Max) return std::nullopt;
  }
  return static_cast<int64_t>(span);
}

/// Whether some dimension of more than one element has stride 0: several
/// indices then share one memory location, and copy_ refuses such a
/// destination (when it has elements).
inline bool has_expanded_dim(const std::vector<int64_t>& shape,
                             const std::vector<int64_t>& stride) {
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] > 1 && stride[d] == 0) return true;
  }
  return false;
}

/// Offsets (in elements, from the first element) of every element of the
/// layout, in row-major index order. Only for layouts with few elements.
inline std::vector<int64_t> element_offsets(const std::vector<int64_t>& shape,
                                            const std::vector<int64_t>& stride) {
  std::vector<int64_t> out;
  if (numel(shape) == 0) return out;
  out.push_back(0);
  for (size_t d = 0; d < shape.size(); ++d) {
    std::vector<int64_t> next;
    next.reserve(out.size() * static_cast<size_t>(shape[d]));
    for (int64_t base : out) {
      for (int64_t i = 0; i < shape[d]; ++i) next.push_back(base + i * stride[d]);
    }
    out = std::move(next);
  }
  return out;
}

/// Whether two indices of the layout map to one memory location.
inline bool self_overlapping(const std::vector<int64_t>& shape,
                             const std::vector<int64_t>& stride) {
  std::vector<int64_t> offsets = element_offsets(shape, stride);
  std::sort(offsets.begin(), offsets.end());
  return std::adjacent_find(offsets.begin(), offsets.end()) != offsets.end();
}

/// What `_in_own_storage(old, new, whole_storage)` looks at.
struct FitQuery {
  // old: its element size, element count, extent, storage offset (elements)
  // and the byte size of its storage.
  int64_t old_itemsize = 1;
  Int128 old_numel = 0;
  std::optional<int64_t> old_span = 0;
  int64_t old_offset = 0;
  int64_t storage_nbytes = 0;
  // new: its element size, element count and extent.
  int64_t new_itemsize = 1;
  Int128 new_numel = 0;
  std::optional<int64_t> new_span = 0;
  // Same device; and whether new's storage has old's storage's data pointer
  // (a view of old's storage, or two storages without bytes: both null).
  bool same_device = true;
  bool same_data_ptr = false;
  bool whole_storage = false;
};

/// The specification's `fits`, in unbounded arithmetic. A layout whose
/// extent does not fit int64 cannot fit any storage.
inline bool fits(const FitQuery& q) {
  if (!q.new_span.has_value()) return false;
  const Int128 offset = static_cast<Int128>(q.old_offset) * q.old_itemsize;
  const Int128 span = *q.new_span;
  if (q.whole_storage) {
    return span >= q.new_numel && offset + span * q.new_itemsize <= q.storage_nbytes;
  }
  return q.new_numel > 0 && span == q.new_numel && q.old_span.has_value() &&
         *q.old_span == q.old_numel && q.new_numel * q.new_itemsize <= q.old_numel * q.old_itemsize;
}

/// Whether `_in_own_storage` places new into old's storage (rather than
/// returning new): it fits, on the same device, not already on old's storage,
/// at a byte offset that is a multiple of new's element size.
inline bool places(const FitQuery& q) {
  const Int128 offset = static_cast<Int128>(q.old_offset) * q.old_itemsize;
  return fits(q) && q.same_device && !q.same_data_ptr && offset % q.new_itemsize == 0;
}

}  // namespace model

// ---------------------------------------------------------------------------
// Observing tensors as bytes (CPU only).

/// A data pointer as an integer (RapidCheck prints integers, not void*).
inline uintptr_t address(const void* p) {
  return reinterpret_cast<uintptr_t>(p);
}

/// A storage's identity (its StorageImpl) as an integer.
inline uintptr_t storage_id(const c10::Storage& s) {
  return address(s.unsafeGetStorageImpl());
}

/// A copy of every byte of a CPU storage.
inline std::vector<uint8_t> storage_bytes(const c10::Storage& storage) {
  const auto* p = static_cast<const uint8_t*>(storage.data());
  return p == nullptr ? std::vector<uint8_t>() : std::vector<uint8_t>(p, p + storage.nbytes());
}

/// The sizes and strides of `t` as vectors.
inline std::vector<int64_t> shape_of(const at::Tensor& t) {
  return t.sizes().vec();
}
inline std::vector<int64_t> stride_of(const at::Tensor& t) {
  return t.strides().vec();
}

/// The bytes of every element of a CPU tensor, element after element in
/// row-major index order (itemsize bytes each), read from its storage.
inline std::vector<uint8_t> element_bytes(const at::Tensor& t) {
  const auto isz = static_cast<int64_t>(t.element_size());
  const auto* base = static_cast<const uint8_t*>(t.storage().data()) + t.storage_offset() * isz;
  std::vector<uint8_t> out;
  for (int64_t off : model::element_offsets(shape_of(t), stride_of(t))) {
    out.insert(out.end(), base + off * isz, base + (off + 1) * isz);
  }
  return out;
}

/// Whether two CPU tensors of one shape and dtype hold the same bytes in every
/// element (bit for bit, whatever the dtype).
inline bool same_elements(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         element_bytes(a) == element_bytes(b);
}

/// Marks, in a mask of a storage's bytes, the bytes of every element of a
/// layout placed `byte_offset` bytes into it.
inline void mark_elements(std::vector<bool>& mask, int64_t byte_offset,
                          const std::vector<int64_t>& shape, const std::vector<int64_t>& stride,
                          int64_t itemsize) {
  for (int64_t off : model::element_offsets(shape, stride)) {
    for (int64_t b = 0; b < itemsize; ++b) {
      const int64_t pos = byte_offset + off * itemsize + b;
      if (pos >= 0 && pos < static_cast<int64_t>(mask.size())) mask[pos] = true;
    }
  }
}

/// Whether `after` equals `before` at every byte the mask leaves unmarked.
inline bool same_outside(const std::vector<uint8_t>& before, const std::vector<uint8_t>& after,
                         const std::vector<bool>& written) {
  if (before.size() != after.size()) return false;
  for (size_t i = 0; i < before.size(); ++i) {
    if (!written[i] && before[i] != after[i]) return false;
  }
  return true;
}

/// Makes every element of a CPU bool tensor hold 0 or 1 (copy_ normalises
/// other bytes, so a source must not hold them), writing only its elements.
inline void make_bools_valid(const at::Tensor& t) {
  if (t.scalar_type() != at::kBool || t.is_meta() || t.numel() == 0) return;
  auto* base = static_cast<uint8_t*>(t.storage().mutable_data()) + t.storage_offset();
  for (int64_t off : model::element_offsets(shape_of(t), stride_of(t))) base[off] &= 1;
}

/// A view of `dtype` on `storage` at element `offset`, made with `set_` after
/// checking with the model (not with the utilities) that it fits, so setting
/// up a test never depends on the code under test and never grows a storage.
inline at::Tensor view_on(const c10::Storage& storage, at::ScalarType dtype, int64_t offset,
                          const std::vector<int64_t>& shape, const std::vector<int64_t>& stride) {
  const std::optional<int64_t> span = model::extent(shape, stride);
  const auto isz = static_cast<int64_t>(c10::elementSize(dtype));
  TORCH_CHECK(span.has_value() && (static_cast<model::Int128>(offset) + *span) * isz <=
                                      static_cast<model::Int128>(storage.nbytes()),
              "view_on: the test set-up asked for a view that does not fit its storage");
  at::Tensor t = at::empty({0}, at::TensorOptions().dtype(dtype).device(storage.device()));
  t.set_(storage, offset, shape, stride);
  return t;
}

}  // namespace reloadsafe::fuzz
