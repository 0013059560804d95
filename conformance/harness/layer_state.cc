#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/layer_state.h"

#include "conformance/harness/internal/all_close.h"
#include "conformance/trace/sparse_parts.h"
#include "conformance/trace/tensor_location.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/logical_xor.h>
#include <ATen/ops/view_as_real.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>

namespace reloadsafe::harness {
namespace {

constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

// "float32[8, 16]", as Python writes a dtype and a shape.
std::string layout(const at::Tensor& t) {
  std::string out(c10::getDtypeNames(t.scalar_type()).first);
  out += '[';
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (d > 0) out += ", ";
    out += std::to_string(t.size(d));
  }
  return out + ']';
}

std::string format_g4(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// How `live` differs from `cold` in layout or value; empty when it does not.
std::string tensor_difference(const at::Tensor& live, const at::Tensor& cold) {
  if (live.sizes() != cold.sizes() || live.scalar_type() != cold.scalar_type()) {
    return layout(live);
  }
  at::Tensor a = live.detach().to(at::kCPU);
  at::Tensor b = cold.detach().to(at::kCPU);
  const c10::ScalarType dtype = a.scalar_type();
  if (c10::isBitsType(dtype) || dtype == at::kFloat4_e2m1fn_x2) {
    // Packed or bit dtypes have no element-wise kernels: their bytes.
    a = a.contiguous();
    b = b.contiguous();
    const size_t n = a.numel() * a.element_size();
    return n == 0 || std::memcmp(a.const_data_ptr(), b.const_data_ptr(), n) == 0 ? ""
                                                                                 : "bytes differ";
  }
  if (c10::isFloat8Type(dtype)) {
    // No CPU arithmetic on float8 (allclose, subtraction); each value is
    // exact in float32.
    a = a.to(at::kFloat);
    b = b.to(at::kFloat);
  }
  if (a.is_floating_point() || a.is_complex()) {
    // One pass where all_close answers (float and double, which is what
    // most layers hold): at::allclose dispatches a dozen operators per
    // tensor, and a layer's state is compared after every reload.
    const std::optional<bool> close = all_close(a, b, kRtol, kAtol);
    if (close.value_or(false)) return "";
    if (!close && at::allclose(a, b, kRtol, kAtol, /*equal_nan=*/true)) return "";
    const at::Tensor a64 = a.is_complex() ? at::view_as_real(a).to(at::kDouble) : a.to(at::kDouble);
    const at::Tensor b64 = b.is_complex() ? at::view_as_real(b).to(at::kDouble) : b.to(at::kDouble);
    const at::Tensor nan = at::logical_xor(a64.isnan(), b64.isnan());
    const int64_t nans = nan.sum().item<int64_t>();
    if (nans > 0) return std::to_string(nans) + " NaN where a cold load has numbers";
    // NaN on both sides at the same places is equal; the largest difference
    // is over the other elements.
    const at::Tensor diff = at::where(a64.isnan(), at::zeros_like(a64), (a64 - b64).abs());
    return "max |diff| " + format_g4(diff.max().item<double>());
  }
  if (at::equal(a, b)) return "";
  return std::to_string(a.ne(b).sum().item<int64_t>()) + " of " + std::to_string(a.numel()) +
         " elements differ";
}

bool comparable(const at::Tensor& t) {
  return t.defined() && t.numel() > 0 && !t.is_meta() && trace::has_plain_storage(t);
}

bool same_number(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  if (a == b) return true;  // infinities of one sign
  // Python's math.isclose(a, b, rel_tol, abs_tol).
  return std::fabs(a - b) <= std::max(kRtol * std::max(std::fabs(a), std::fabs(b)), kAtol);
}

}  // namespace

std::string format_number(const NamedNumber& n) {
  const double v = n.value;
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  if (n.integral) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  // The shortest form that reads back as the same double, as Python's repr.
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string out = buf;
  if (out.find_first_of(".e") == std::string::npos) out += ".0";
  return out;
}

std::vector<StateDifference> state_differences(const LayerState& live, const LayerState& cold) {
  std::vector<StateDifference> out;
  // A sparse tensor is compared part by part ("mask._values"), as Python's
  // walk names it.
  std::map<std::string, at::Tensor> cold_tensors;
  for (const NamedTensor& n : cold.tensors) {
    trace::for_each_part(n.name, n.tensor, [&](const std::string& name, const at::Tensor& t) {
      cold_tensors.emplace(name, t);
    });
  }
  for (const NamedTensor& n : live.tensors) {
    trace::for_each_part(n.name, n.tensor, [&](const std::string& name, const at::Tensor& t) {
      const auto it = cold_tensors.find(name);
      if (it == cold_tensors.end() || !comparable(t) || !comparable(it->second)) return;
      std::string diff = tensor_difference(t, it->second);
      if (!diff.empty()) {
        out.push_back(StateDifference{name, "cold load " + layout(it->second), std::move(diff)});
      }
    });
  }
  std::map<std::string, const NamedNumber*> cold_numbers;
  for (const NamedNumber& n : cold.numbers) cold_numbers.emplace(n.name, &n);
  for (const NamedNumber& n : live.numbers) {
    const auto it = cold_numbers.find(n.name);
    if (it == cold_numbers.end() || same_number(n.value, it->second->value)) continue;
    out.push_back(
        StateDifference{n.name, "cold load " + format_number(*it->second), format_number(n)});
  }
  return out;
}

}  // namespace reloadsafe::harness
