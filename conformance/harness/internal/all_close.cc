#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/internal/all_close.h"

#include <cmath>
#include <cstdint>

namespace reloadsafe::harness {
namespace {

template <typename T>
bool elements_close(const T* a, const T* b, int64_t n, T rtol, T atol) {
  for (int64_t i = 0; i < n; ++i) {
    const T x = a[i];
    const T y = b[i];
    if (x == y || (std::isnan(x) && std::isnan(y))) continue;
    const T error = std::abs(x - y);
    if (!(std::isfinite(error) && error <= atol + std::abs(rtol * y))) return false;
  }
  return true;
}

}  // namespace

std::optional<bool> all_close(const at::Tensor& a, const at::Tensor& b, double rtol, double atol) {
  if (!a.defined() || !b.defined()) return std::nullopt;
  const at::ScalarType dtype = a.scalar_type();
  if (dtype != b.scalar_type() || (dtype != at::kFloat && dtype != at::kDouble))
    return std::nullopt;
  if (!a.device().is_cpu() || !b.device().is_cpu() || a.layout() != at::kStrided ||
      b.layout() != at::kStrided || a.sizes() != b.sizes() || a.is_neg() || b.is_neg() ||
      !a.has_storage() || !b.has_storage()) {
    return std::nullopt;
  }
  // A view (an output narrowed from a padded one) is read through a
  // contiguous copy: one allocation, against allclose's dozen.
  const at::Tensor x = a.contiguous();
  const at::Tensor y = b.contiguous();
  if (dtype == at::kFloat) {
    return elements_close(x.const_data_ptr<float>(), y.const_data_ptr<float>(), x.numel(),
                          static_cast<float>(rtol), static_cast<float>(atol));
  }
  return elements_close(x.const_data_ptr<double>(), y.const_data_ptr<double>(), x.numel(), rtol,
                        atol);
}

}  // namespace reloadsafe::harness
