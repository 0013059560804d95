#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/values.h"

#include "conformance/harness/internal/all_close.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/allclose.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <sstream>

namespace reloadsafe::harness {

// Whether t's bytes can be read in place as one run: a dense, contiguous CPU
// tensor with a storage that does not dispatch in Python.
bool plain_cpu_bytes(const at::Tensor& t) {
  return t.device().is_cpu() && t.layout() == at::kStrided &&
         !t.unsafeGetTensorImpl()->key_set().has(c10::DispatchKey::Python) && t.has_storage() &&
         t.is_contiguous();
}

namespace {

// A sparse (COO or compressed) or mkldnn tensor has no element-wise
// comparison of its own; it is compared by the dense tensor it stands for.
at::Tensor strided(const at::Tensor& t) {
  return t.layout() == at::kStrided ? t : t.to_dense();
}

// Dtypes with no arithmetic kernels on the CPU (allclose, subtraction):
// float8 (every value exact in float32, so compared as float32), and the
// packed and bit dtypes (float4 pairs, bits8..bits16), compared by bytes.
bool float8(const at::Tensor& t) {
  return c10::isFloat8Type(t.scalar_type());
}
bool packed_bits(const at::Tensor& t) {
  return c10::isBitsType(t.scalar_type()) || t.scalar_type() == at::kFloat4_e2m1fn_x2;
}

}  // namespace

// Byte for byte (NaN payloads included, which an element-wise == is not).
bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  if (plain_cpu_bytes(a) && plain_cpu_bytes(b)) {
    const size_t n = a.numel() * a.element_size();  // no dispatch: the common case
    return n == 0 || std::memcmp(a.const_data_ptr(), b.const_data_ptr(), n) == 0;
  }
  if (a.layout() != at::kStrided || b.layout() != at::kStrided) {
    return same_bytes(strided(a), strided(b));
  }
  const at::Tensor ca = a.cpu().contiguous();
  const at::Tensor cb = b.cpu().contiguous();
  const size_t n = ca.numel() * ca.element_size();
  return n == 0 || std::memcmp(ca.const_data_ptr(), cb.const_data_ptr(), n) == 0;
}

std::string max_diff(const at::Tensor& a, const at::Tensor& b) {
  std::ostringstream os;
  if (a.sizes() != b.sizes()) {
    os << "shape " << a.sizes() << " vs " << b.sizes();
  } else if (packed_bits(a) || packed_bits(b)) {
    os << (same_bytes(a, b) ? "same bytes" : "bytes differ");
  } else {
    // As doubles, in one pass over both: a violation's detail, one per
    // listed violation, for outputs a few thousand elements long.
    const at::Tensor a64 = strided(a).cpu().to(at::kDouble).contiguous();
    const at::Tensor b64 = strided(b).cpu().to(at::kDouble).contiguous();
    const double* x = a64.const_data_ptr<double>();
    const double* y = b64.const_data_ptr<double>();
    int64_t nans = 0;
    double max = 0;
    for (int64_t i = 0, n = a64.numel(); i < n; ++i) {
      nans += std::isnan(x[i]) != std::isnan(y[i]);
      const double d = std::abs(x[i] - y[i]);  // NaN where both are, or inf - inf
      if (d > max) max = d;
    }
    // NaN in one and a number in the other (garbage a sleep or a re-created
    // parameter left): how many, rather than a NaN difference.
    if (nans > 0) {
      os << nans << " NaN where the other has numbers";
    } else {
      os << "max |diff| " << max;
    }
  }
  return os.str();
}

// NaN and infinities at the same places in both compare equal: a layer may
// legitimately compute them, and a stale read of poisoned memory (see Note
// [Poison quarantine] in memory_census.h) still differs from a fresh load.
bool close(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes()) return false;
  if (a.layout() != at::kStrided || b.layout() != at::kStrided)
    return close(strided(a), strided(b));
  if (packed_bits(a) || packed_bits(b)) return same_bytes(a, b);
  if (float8(a) || float8(b)) return close(a.to(at::kFloat), b.to(at::kFloat));
  // Dense float outputs in one pass (all_close.h); anything else through allclose.
  if (std::optional<bool> fast = all_close(a, b, kCloseTolerance, kCloseTolerance)) return *fast;
  if (a.scalar_type() == b.scalar_type() && a.device() == b.device()) {
    return at::allclose(a, b, kCloseTolerance, kCloseTolerance, /*equal_nan=*/true);
  }
  return at::allclose(a.cpu().to(at::kDouble), b.cpu().to(at::kDouble), kCloseTolerance,
                      kCloseTolerance, /*equal_nan=*/true);
}

}  // namespace reloadsafe::harness
