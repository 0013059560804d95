#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/trace/tensor_location.h"

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>

namespace reloadsafe::trace {

// Formatted by hand rather than through a stream: reports format every
// address and layout they list, and a stream's set-up cost more than the
// formatting itself. The output is what a stream prints.
std::string to_hex(const void* p) {
  if (p == nullptr) return "0";
  char buf[2 + 2 * sizeof(uintptr_t) + 1];
  std::snprintf(buf, sizeof buf, "0x%" PRIxPTR, reinterpret_cast<uintptr_t>(p));
  return buf;
}

namespace {
// "[16, 64]", as c10 prints an IntArrayRef.
void append_list(std::string& s, c10::IntArrayRef values) {
  s += '[';
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(values[i]);
  }
  s += ']';
}

// The address of element `offset`, of `t`'s dtype, in a storage whose data
// is at `storage_data` (null for an empty storage).
const void* data_at(const void* storage_data, int64_t offset, const at::Tensor& t) {
  if (storage_data == nullptr) return nullptr;
  return static_cast<const char*>(storage_data) + offset * static_cast<int64_t>(t.element_size());
}
}  // namespace

TensorLocation TensorLocation::of(const at::Tensor& t) {
  TensorLocation l;
  l.reset_to(t);
  return l;
}

void TensorLocation::reset_to(const at::Tensor& t) {
  sizes.assign(t.sizes().begin(), t.sizes().end());
  if (t.layout() == c10::kStrided) {
    strides.assign(t.strides().begin(), t.strides().end());
  } else {
    strides.clear();
  }
  dtype = t.scalar_type();
  device = t.device();
  storage = nullptr;
  storage_data = nullptr;
  storage_nbytes = 0;
  data_ptr = nullptr;
  storage_offset = 0;
  if (!has_plain_storage(t)) return;
  const c10::Storage& s = t.storage();
  storage = s.unsafeGetStorageImpl();
  storage_data = s.data();
  storage_nbytes = s.nbytes();
  storage_offset = t.storage_offset();
  data_ptr = data_at(storage_data, storage_offset, t);
}

// What reset_to() would fill, compared field by field: the layout of `t`,
// whose storage offset is `offset`.
bool TensorLocation::has_layout(const at::Tensor& t, int64_t offset) const {
  if (storage_offset != offset || dtype != t.scalar_type() || device != t.device() ||
      !std::equal(sizes.begin(), sizes.end(), t.sizes().begin(), t.sizes().end())) {
    return false;
  }
  if (t.layout() != c10::kStrided) return strides.empty();
  return std::equal(strides.begin(), strides.end(), t.strides().begin(), t.strides().end());
}

bool TensorLocation::is_place_of(const at::Tensor& t) const {
  const c10::Storage& s = t.storage();
  if (storage != s.unsafeGetStorageImpl() || storage_data != s.data() ||
      storage_nbytes != s.nbytes()) {
    return false;
  }
  const int64_t offset = t.storage_offset();
  return data_ptr == data_at(storage_data, offset, t) && has_layout(t, offset);
}

bool TensorLocation::is_layout_of(const at::Tensor& t) const {
  return has_layout(t, has_plain_storage(t) ? t.storage_offset() : 0);
}

bool TensorLocation::same_layout(const TensorLocation& other) const {
  return storage_offset == other.storage_offset && sizes == other.sizes &&
         strides == other.strides && dtype == other.dtype && device == other.device;
}

bool TensorLocation::same_place(const TensorLocation& after) const {
  return data_ptr == after.data_ptr && storage == after.storage &&
         storage_data == after.storage_data && storage_nbytes == after.storage_nbytes &&
         same_layout(after);
}

std::string TensorLocation::layout() const {
  std::string s = c10::toString(dtype);
  append_list(s, sizes);
  s += " stride ";
  append_list(s, strides);
  s += " offset " + std::to_string(storage_offset) + " on " + device.str();
  return s;
}

std::vector<LocationChange> TensorLocation::diff(const TensorLocation& after, bool details) const {
  std::vector<LocationChange> changes;
  if (same_place(after)) return changes;  // the common case: no strings built
  const auto hex = [&](const void* p) { return details ? to_hex(p) : std::string(); };
  if (data_ptr != after.data_ptr)
    changes.push_back({"address", hex(data_ptr), hex(after.data_ptr)});
  if (storage != after.storage) {
    changes.push_back({"storage", hex(storage), hex(after.storage)});
  } else if (storage_data != after.storage_data || storage_nbytes != after.storage_nbytes) {
    // The same storage object, reallocated or resized under the tensor.
    const auto bytes = [&](const void* p, size_t n) {
      return details ? to_hex(p) + " " + std::to_string(n) + " B" : std::string();
    };
    changes.push_back({"storage resized or moved", bytes(storage_data, storage_nbytes),
                       bytes(after.storage_data, after.storage_nbytes)});
  }
  if (!same_layout(after)) {
    changes.push_back({"layout", details ? layout() : "", details ? after.layout() : ""});
  }
  return changes;
}

}  // namespace reloadsafe::trace
