#include "conformance/trace/tensor_location.h"

#include <sstream>

namespace reloadsafe::trace {

std::string to_hex(const void* p) {
  std::ostringstream os;
  os << p;
  return os.str();
}

TensorLocation TensorLocation::of(const at::Tensor& t) {
  TensorLocation l;
  l.sizes = t.sizes().vec();
  l.strides = t.layout() == c10::kStrided ? t.strides().vec() : std::vector<int64_t>{};
  l.dtype = t.scalar_type();
  l.device = t.device();
  if (!has_plain_storage(t)) return l;
  const c10::Storage& storage = t.storage();
  l.storage = storage.unsafeGetStorageImpl();
  l.storage_data = storage.data();
  l.storage_nbytes = storage.nbytes();
  l.storage_offset = t.storage_offset();
  if (l.storage_data != nullptr) {
    l.data_ptr = static_cast<const char*>(l.storage_data) +
                 l.storage_offset * static_cast<int64_t>(t.element_size());
  }
  return l;
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
  std::ostringstream os;
  os << c10::toString(dtype) << c10::IntArrayRef(sizes) << " stride " << c10::IntArrayRef(strides)
     << " offset " << storage_offset << " on " << device;
  return os.str();
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
