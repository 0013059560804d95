#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/reload_steps.h"

#include "conformance/trace/sparse_parts.h"
#include "conformance/trace/tensor_location.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>

#include <limits>
#include <set>
#include <utility>

namespace reloadsafe::harness {
namespace {

bool has_bytes(const at::Tensor& t) {
  return t.defined() && t.numel() > 0 && !t.is_meta() && trace::has_plain_storage(t);
}

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
  // A tensor over the whole storage, made without touching `t`: set_ keeps
  // the storage object, so nothing is allocated or moved.
  at::Tensor whole = at::empty({0}, t.options());
  whole.set_(storage, /*storage_offset=*/0, {elements}, {1});
  if (t.is_floating_point() || t.is_complex()) {
    whole.fill_(std::numeric_limits<double>::quiet_NaN());
  } else if (t.scalar_type() == at::kBool) {
    whole.fill_(integer != 0);
  } else {
    whole.fill_(integer);
  }
}

void sleep_and_wake(const std::vector<trace::NamedTensor>& reached,
                    const std::vector<at::Tensor>& restored) {
  c10::NoGradGuard no_grad;
  std::vector<std::pair<at::Tensor, at::Tensor>> host;  // (tensor, its bytes on the host)
  host.reserve(restored.size());
  // A sparse tensor sleeps and wakes by its parts.
  for (const at::Tensor& t : restored) {
    trace::for_each_part("", t, [&](const std::string&, const at::Tensor& part) {
      if (has_bytes(part))
        host.emplace_back(part, part.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true));
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
  for (auto& [t, bytes] : host) t.detach().copy_(bytes);
}

void recreate_parameters(const std::vector<at::Tensor>& parameters) {
  for (const at::Tensor& p : parameters) discard_storage(p, /*integer=*/-1);
}

}  // namespace reloadsafe::harness
