// set_weight_attrs: `set_weight_attrs(tensor, weight_attrs)` (golden/FORMAT.md).

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/case_report.h"
#include "conformance/case_tensors.h"
#include "conformance/ops/operation.h"
#include "utils/tensor_attrs.h"

#include <optional>

namespace reloadsafe::conformance {

void run_set_weight_attrs(const Json& c, OJson& out) {
  // Absent: a 0-dim float32 CPU tensor; null: None.
  const Json* given_tensor = field(c, "tensor");
  std::optional<ObjectSpec> spec;
  if (given_tensor == nullptr) {
    Geometry scalar;
    scalar.dtype = at::ScalarType::Float;
    scalar.needed_nbytes = 4;
    spec = ObjectSpec{OwnedTensor{scalar, 4, c10::Device(c10::kCPU)}, std::nullopt, {}};
  } else if (!given_tensor->is_null()) {
    spec = read_object(*given_tensor, "tensor");
  }
  const Json& given = required(c, "weight_attrs", "the case");
  const std::optional<AttrMap> weight_attrs =
      given.is_null() ? std::nullopt : std::optional<AttrMap>(as_attrs(given, "weight_attrs"));
  CaseTensors tensors;
  const at::Tensor weight =
      spec ? make_object(tensors.own(spec->tensor, 0, "tensor"), *spec, ObjectKind::kTensor)
           : at::Tensor();

  set_weight_attrs(weight, weight_attrs);

  out["attrs"] = weight.defined() ? attrs_json(weight) : OJson(nullptr);
}

}  // namespace reloadsafe::conformance
