// extent: `_extent` of a shape and strides (case-format.md).

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/case_tensors.h"
#include "conformance/ops/operation.h"
#include "utils/storage_fit.h"

#include <c10/util/Exception.h>

namespace reloadsafe::conformance {

void run_extent(const Json& c, OJson& out) {
  const std::vector<int64_t> shape = as_int_list(required(c, "shape", "the case"), "shape");
  for (size_t d = 0; d < shape.size(); ++d) {
    TORCH_CHECK(shape[d] >= 0, "shape[", d, "] = ", shape[d], " is negative; sizes are >= 0");
  }
  const Json* s = field(c, "stride");
  const std::vector<int64_t> stride =
      s != nullptr ? as_int_list(*s, "stride") : contiguous_strides(shape, "shape");
  const std::optional<int64_t> span = checked_extent(shape, stride);
  TORCH_CHECK(span.has_value(), "the extent of shape ", c10::IntArrayRef(shape), " with strides ",
              c10::IntArrayRef(stride), " overflows int64");
  out["extent"] = *span;
}

}  // namespace reloadsafe::conformance
