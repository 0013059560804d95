// refill_derived: `refill_derived(layer, "derived", new)` on a layer whose
// plain attribute `derived` holds `old` (golden/FORMAT.md).
#include "conformance/case_report.h"
#include "conformance/case_tensors.h"
#include "conformance/ops/operation.h"
#include "utils/layer.h"
#include "utils/replace_parameter.h"

#include <optional>

namespace reloadsafe::conformance {
namespace {

// `old`/`new` of the case, or "other", for an object.
OJson which_object(const at::Tensor& t, const at::Tensor& old, const at::Tensor& fresh) {
  if (!t.defined()) return nullptr;
  if (old.defined() && t.is_same(old)) return "old";
  if (fresh.defined() && t.is_same(fresh)) return "new";
  return "other";
}

}  // namespace

void run_refill_derived(const Json& c, OJson& out) {
  constexpr const char* kDerived = "derived";
  const OldAndNew specs = read_old_and_new(c);
  Layer layer;
  CaseTensors tensors;
  at::Tensor old;
  std::optional<WatchedStorage> old_storage;
  if (specs.old_spec) {
    old = make_object(tensors.own(specs.old_spec->tensor, 0, "old"), *specs.old_spec,
                      ObjectKind::kTensor);
    old_storage.emplace(old.storage());
    layer.set(kDerived, old);
  }
  at::Tensor fresh;
  if (specs.new_spec) {
    fresh = make_object(tensors.second(specs.new_spec->tensor,
                                       old_storage ? &old_storage->storage : nullptr, "old", "new"),
                        *specs.new_spec, ObjectKind::kTensor);
  }

  const at::Tensor returned = refill_derived(layer, kDerived, fresh);

  out["returned"] = which_object(returned, old, fresh);
  const at::Tensor held = layer.get(kDerived);
  if (!held.defined()) {
    out["derived"] = nullptr;
  } else {
    OJson d;
    d["object"] = which_object(held, old, fresh);
    d["kind"] = kind_name(held);
    put_layout(d, held);
    d["storage"] = old_storage && same_storage(held, old_storage->storage)  ? "old"
                   : fresh.defined() && same_storage(held, fresh.storage()) ? "new"
                                                                            : "other";
    out["derived"] = d;
  }
  if (old_storage) out["old_storage"] = storage_json(*old_storage);
}

}  // namespace reloadsafe::conformance
