#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/reload_steps.h"

#include "conformance/trace/sparse_parts.h"
#include "conformance/trace/tensor_location.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <utility>

namespace reloadsafe::harness {
namespace {

bool has_bytes(const at::Tensor& t) {
  return t.defined() && t.numel() > 0 && !t.is_meta() && trace::has_plain_storage(t);
}

// A dense CPU tensor whose elements are one run of bytes from its data
// pointer: its bytes can be kept and put back with memcpy, no tensor op.
bool contiguous_cpu_bytes(const at::Tensor& t) {
  return t.device().is_cpu() && t.layout() == at::kStrided && t.is_contiguous() && !t.is_conj() &&
         !t.is_neg();
}

// Fills `n` elements of `item` bytes each at `data` with the bytes of
// `element`: the first is written, then the filled run doubles by copying
// itself (a handful of memcpy calls for any n).
void fill_elements(void* data, int64_t n, const void* element, size_t item) {
  auto* out = static_cast<unsigned char*>(data);
  const size_t total = static_cast<size_t>(n) * item;
  std::memcpy(out, element, item);
  for (size_t done = item; done < total;) {
    const size_t chunk = std::min(done, total - done);
    std::memcpy(out + done, out, chunk);
    done += chunk;
  }
}

// The sentinel discard_storage() writes, as one element of `dtype` in `out`
// (at least 16 bytes): NaN for the floating dtypes ATen's fill_ converts a
// double to by a plain cast, `integer` for the integer dtypes, integer != 0
// for bool. False for any other dtype (float8, complex, ...).
template <typename T>
void put(unsigned char* out, T value) {
  std::memcpy(out, &value, sizeof(T));
}
bool sentinel_element(at::ScalarType dtype, int64_t integer, unsigned char* out) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  switch (dtype) {
    case at::kFloat:
      put(out, static_cast<float>(kNaN));
      return true;
    case at::kDouble:
      put(out, kNaN);
      return true;
    case at::kHalf:
      put(out, static_cast<at::Half>(static_cast<float>(kNaN)));
      return true;
    case at::kBFloat16:
      put(out, static_cast<at::BFloat16>(static_cast<float>(kNaN)));
      return true;
    case at::kBool:
      put(out, integer != 0);
      return true;
    case at::kByte:
      put(out, static_cast<uint8_t>(integer));
      return true;
    case at::kChar:
      put(out, static_cast<int8_t>(integer));
      return true;
    case at::kShort:
      put(out, static_cast<int16_t>(integer));
      return true;
    case at::kInt:
      put(out, static_cast<int32_t>(integer));
      return true;
    case at::kLong:
      put(out, integer);
      return true;
    default:
      return false;
  }
}

// A part's bytes, kept on the host across a sleep.
struct HostCopy {
  at::Tensor part;
  std::vector<unsigned char> bytes;  // a contiguous CPU part: its bytes
  at::Tensor copy;                   // any other: a copy on the host
};

}  // namespace

void discard_storage(const at::Tensor& t, int64_t integer) {
  if (trace::sparse_part_count(t) > 0) {
    trace::for_each_part(
        "", t, [&](const std::string&, const at::Tensor& part) { discard_storage(part, integer); });
    return;
  }
  if (!has_bytes(t)) return;
  const c10::Storage& storage = t.storage();
  const int64_t elements = static_cast<int64_t>(storage.nbytes()) / t.element_size();
  if (elements == 0) return;
  c10::NoGradGuard no_grad;
  const auto fill = [&](at::Tensor& whole) -> at::Tensor& {
    if (t.is_floating_point() || t.is_complex()) {
      return whole.fill_(std::numeric_limits<double>::quiet_NaN());
    }
    return t.scalar_type() == at::kBool ? whole.fill_(integer != 0) : whole.fill_(integer);
  };
  if (t.device().is_cpu() && t.layout() == at::kStrided && storage.mutable_data() != nullptr) {
    // On the host: one element of the sentinel copied over the storage, with
    // no tensor over it; for a small storage a few memcpy calls instead of
    // three dispatched ops. The element is converted here for the common
    // dtypes, by fill_ on a one-element tensor for the others.
    unsigned char element[16];  // the largest element: a complex double
    TORCH_INTERNAL_ASSERT(static_cast<size_t>(t.element_size()) <= sizeof element);
    if (!sentinel_element(t.scalar_type(), integer, element)) {
      at::Tensor one = at::empty({1}, t.options());
      fill(one);
      std::memcpy(element, one.const_data_ptr(), t.element_size());
    }
    fill_elements(storage.mutable_data(), elements, element, t.element_size());
    return;
  }
  // A tensor over the whole storage, made without touching `t`: set_ keeps
  // the storage object, so nothing is allocated or moved.
  at::Tensor whole = at::empty({0}, t.options());
  whole.set_(storage, /*storage_offset=*/0, {elements}, {1});
  fill(whole);
}

void sleep_and_wake(const std::vector<trace::NamedTensor>& reached,
                    const std::vector<at::Tensor>& restored) {
  c10::NoGradGuard no_grad;
  std::vector<HostCopy> host;
  host.reserve(restored.size());
  // A sparse tensor sleeps and wakes by its parts.
  for (const at::Tensor& t : restored) {
    trace::for_each_part("", t, [&](const std::string&, const at::Tensor& part) {
      if (!has_bytes(part)) return;
      HostCopy kept{part, {}, {}};
      if (contiguous_cpu_bytes(part)) {
        const auto* p = static_cast<const unsigned char*>(part.const_data_ptr());
        kept.bytes.assign(p, p + part.numel() * part.element_size());
      } else {
        kept.copy = part.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
      }
      host.push_back(std::move(kept));
    });
  }
  std::set<const void*> slept;
  for (const trace::NamedTensor& n : reached) {
    trace::for_each_part("", n.tensor, [&](const std::string&, const at::Tensor& part) {
      if (has_bytes(part) && slept.insert(part.storage().unsafeGetStorageImpl()).second) {
        discard_storage(part, /*integer=*/0);
      }
    });
  }
  for (HostCopy& kept : host) {
    if (kept.copy.defined()) {
      kept.part.detach().copy_(kept.copy);
    } else {
      std::memcpy(kept.part.mutable_data_ptr(), kept.bytes.data(), kept.bytes.size());
    }
  }
}

void recreate_parameters(const std::vector<at::Tensor>& parameters) {
  for (const at::Tensor& p : parameters) discard_storage(p, /*integer=*/-1);
}

}  // namespace reloadsafe::harness
