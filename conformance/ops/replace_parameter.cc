// replace_parameter: `replace_parameter(layer, "weight", new)` on a layer
// holding `old` (case-format.md).
#include "utils/replace_parameter.h"
#include "conformance/case_report.h"
#include "conformance/case_tensors.h"
#include "conformance/ops/operation.h"
#include "utils/layer.h"
#include "utils/reload_context.h"

#include <optional>

namespace reloadsafe::conformance {

void run_replace_parameter(const Json& c, OJson& out) {
  constexpr const char* kWeight = "weight";
  const bool direct = opt_bool(c, "direct_reload", false);
  Layer layer;
  if (const Json* u = field(c, "uses_meta_device")) {
    layer.quant_method = QuantMethod{as_bool(*u, "uses_meta_device")};
  }
  const OldAndNew specs = read_old_and_new(c);

  CaseTensors tensors;
  at::Tensor old;
  std::optional<WatchedStorage> old_storage;
  if (specs.old_spec) {
    old = make_object(tensors.own(specs.old_spec->tensor, 0, "old"), *specs.old_spec,
                      ObjectKind::kParameter);
    old_storage.emplace(old.storage());
    if (is_parameter(old)) {
      layer.register_param(kWeight, old);
    } else {
      layer.set_attribute(kWeight, old);
    }
  }
  at::Tensor fresh;
  std::optional<c10::Storage> fresh_storage;
  if (specs.new_spec) {
    fresh = make_object(tensors.second(specs.new_spec->tensor,
                                       old_storage ? &old_storage->storage : nullptr, "old", "new"),
                        *specs.new_spec, ObjectKind::kTensor);
    fresh_storage = fresh.storage();
  }

  {
    DirectReloadScope scope(direct);
    replace_parameter(layer, kWeight, fresh);
  }

  const at::Tensor held = layer.get(kWeight);
  if (!held.defined()) {
    out["param"] = nullptr;
  } else {
    OJson p;
    p["kind"] = kind_name(held);
    p["same_object"] = old.defined() && held.is_same(old);
    put_layout(p, held);
    p["storage"] = old_storage && same_storage(held, old_storage->storage) ? "old"
                   : fresh_storage && same_storage(held, *fresh_storage)   ? "new"
                                                                           : "other";
    p["attrs"] = attrs_json(held);
    out["param"] = p;
  }
  if (old_storage) out["old_storage"] = storage_json(*old_storage);
}

}  // namespace reloadsafe::conformance
