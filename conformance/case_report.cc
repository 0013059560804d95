#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/case_report.h"

#include "conformance/case_json.h"
#include "utils/tensor_attrs.h"

#include <c10/util/Exception.h>

#include <cstdint>

namespace reloadsafe::conformance {
namespace {

std::string hex(const c10::Storage& s) {
  static constexpr char kDigits[] = "0123456789abcdef";
  const auto* bytes = static_cast<const uint8_t*>(s.data());
  std::string out(2 * s.nbytes(), '0');
  for (size_t i = 0; i < s.nbytes(); ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 0xf];
  }
  return out;
}

}  // namespace

bool same_storage(const at::Tensor& t, const c10::Storage& s) {
  return t.defined() && t.storage().unsafeGetStorageImpl() == s.unsafeGetStorageImpl();
}

void put_layout(OJson& out, const at::Tensor& t) {
  out["dtype"] = dtype_name(t.scalar_type());
  out["shape"] = t.sizes().vec();
  out["stride"] = t.strides().vec();
  out["byte_offset"] = t.storage_offset() * static_cast<int64_t>(t.element_size());
}

OJson storage_json(const WatchedStorage& w) {
  OJson out;
  out["nbytes"] = static_cast<int64_t>(w.storage.nbytes());
  out["moved"] = w.storage.data() != w.data;
  if (w.storage.device().is_cpu()) out["hex"] = hex(w.storage);
  return out;
}

OJson attrs_json(const at::Tensor& t) {
  OJson out = OJson::object();
  for (const auto& [key, value] : attrs(t)) out[key] = attr_json(value);
  return out;
}

std::string dump(const OJson& j) {
  return j.dump(-1, ' ', false, OJson::error_handler_t::replace);
}

std::string error_message(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

}  // namespace reloadsafe::conformance
