// storage_view: a view on a storage, checked to fit (golden/FORMAT.md).

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/case_report.h"
#include "conformance/case_tensors.h"
#include "conformance/ops/operation.h"
#include "utils/storage_fit.h"

namespace reloadsafe::conformance {

void run_storage_view(const Json& c, OJson& out) {
  const OwnedTensor spec = read_storage_view_layout(c);
  const Geometry& g = spec.geometry;
  CaseTensors tensors;
  const WatchedStorage storage(
      tensors.storage(spec.storage_nbytes, spec.device, 0, g.dtype == at::ScalarType::Bool));

  const at::Tensor view = storage_view(storage.storage, g.offset, g.shape, g.stride, g.dtype);

  OJson v;
  put_layout(v, view);
  v["storage"] = same_storage(view, storage.storage) ? "same" : "other";
  out["view"] = v;
  out["storage"] = storage_json(storage);
}

}  // namespace reloadsafe::conformance
