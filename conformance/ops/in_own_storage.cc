// in_own_storage: `_in_own_storage(old, new, whole_storage)` (case-format.md).

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/case_report.h"
#include "conformance/case_tensors.h"
#include "conformance/ops/operation.h"
#include "utils/storage_fit.h"

namespace reloadsafe::conformance {

void run_in_own_storage(const Json& c, OJson& out) {
  const bool whole_storage = opt_bool(c, "whole_storage", false);
  const ObjectSpec old_spec = read_object(required(c, "old", "the case"), "old");
  const ObjectSpec new_spec = read_object(required(c, "new", "the case"), "new");
  CaseTensors::plan({&old_spec.tensor, &new_spec.tensor});
  CaseTensors tensors;
  const at::Tensor old = tensors.own(old_spec.tensor, 0, "old");
  const WatchedStorage old_storage(old.storage());
  const at::Tensor fresh = tensors.second(new_spec.tensor, &old_storage.storage, "old", "new");

  const at::Tensor result = in_own_storage(old, fresh, whole_storage);

  out["placed"] = !result.is_same(fresh);
  OJson r;
  put_layout(r, result);
  r["storage"] = same_storage(result, old_storage.storage) ? "old"
                 : same_storage(result, fresh.storage())   ? "new"
                                                           : "other";
  out["result"] = r;
  out["old_storage"] = storage_json(old_storage);
}

}  // namespace reloadsafe::conformance
