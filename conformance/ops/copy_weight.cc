// copy_weight: `copy_weight_(dst, src)`, with the integrated-GPU question
// forced either way (golden/FORMAT.md).

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "utils/copy_weight.h"
#include "conformance/case_report.h"
#include "conformance/case_tensors.h"
#include "conformance/ops/operation.h"

namespace reloadsafe::conformance {

void run_copy_weight(const Json& c, OJson& out) {
  const bool integrated = opt_bool(c, "integrated", false);
  const ObjectSpec dst_spec = read_object(required(c, "dst", "the case"), "dst");
  const ObjectSpec src_spec = read_object(required(c, "src", "the case"), "src");
  CaseTensors::plan({&dst_spec.tensor, &src_spec.tensor});
  CaseTensors tensors;
  at::Tensor dst = tensors.own(dst_spec.tensor, 0, "dst");
  const WatchedStorage dst_storage(dst.storage());
  const at::Tensor src = tensors.second(src_spec.tensor, &dst_storage.storage, "dst", "src");
  {
    ScopedIntegratedGpuOverride force(integrated);
    const at::Tensor& returned = copy_weight_(dst, src);
    out["same_object"] = returned.is_same(dst);
  }
  out["dst_storage"] = storage_json(dst_storage);
}

}  // namespace reloadsafe::conformance
