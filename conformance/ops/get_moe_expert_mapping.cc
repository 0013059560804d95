// get_moe_expert_mapping: the mapping of the first module that has one, in a
// model built from module paths (golden/FORMAT.md).
#include "conformance/ops/operation.h"
#include "utils/layer.h"

#include <c10/util/Exception.h>

#include <memory>
#include <set>

namespace reloadsafe::conformance {
namespace {

// Bound that keeps hostile module paths from building absurd models.
constexpr int64_t kMaxModulePathDepth = 64;

// The module at dotted `path` under `root`, created (as a Layer) on the way.
Layer* module_at(Layer* root, const std::string& path, const std::string& what) {
  Layer* node = root;
  if (path.empty()) return node;
  int64_t depth = 0;
  size_t start = 0;
  while (true) {
    TORCH_CHECK(++depth <= kMaxModulePathDepth, what, ".path is deeper than ", kMaxModulePathDepth,
                " modules");
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
    TORCH_CHECK(!part.empty(), what, ".path '", path, "' has an empty module name");
    std::shared_ptr<torch::nn::Module> child;
    for (const auto& item : node->named_children()) {
      if (item.key() == part) child = item.value();
    }
    if (!child) child = node->register_module(part, std::make_shared<Layer>(part));
    node = dynamic_cast<Layer*>(child.get());
    TORCH_INTERNAL_ASSERT(node != nullptr, "every module of a case is a Layer");
    if (dot == std::string::npos) return node;
    start = dot + 1;
  }
}

}  // namespace

void run_get_moe_expert_mapping(const Json& c, OJson& out) {
  const Json& modules = required(c, "modules", "the case");
  TORCH_CHECK(modules.is_array(), "modules must be an array, not ", modules.type_name());
  auto root = std::make_shared<Layer>("Model");
  std::set<Layer*> with_mapping;
  for (size_t i = 0; i < modules.size(); ++i) {
    const std::string what = "modules[" + std::to_string(i) + "]";
    const Json& m = modules[i];
    TORCH_CHECK(m.is_object(), what, " must be an object, not ", m.type_name());
    const std::string path = as_string(required(m, "path", what), what + ".path");
    Layer* node = module_at(root.get(), path, what);
    const Json* mapping = nullable(m, "mapping");
    if (mapping == nullptr) continue;
    TORCH_CHECK(with_mapping.insert(node).second, what, ": module '", path,
                "' already has a mapping");
    TORCH_CHECK(mapping->is_array(), what, ".mapping must be an array, not ", mapping->type_name());
    ExpertMapping entries;
    for (size_t e = 0; e < mapping->size(); ++e) {
      const std::string ew = what + ".mapping[" + std::to_string(e) + "]";
      const Json& entry = (*mapping)[e];
      TORCH_CHECK(entry.is_array() && entry.size() == 4, ew,
                  " must be [param_name, weight_name, expert_id, shard_id]");
      entries.emplace_back(as_string(entry[0], ew + "[0]"), as_string(entry[1], ew + "[1]"),
                           as_int(entry[2], ew + "[2]"), as_string(entry[3], ew + "[3]"));
    }
    node->get_expert_mapping = [entries]() { return entries; };
  }

  const ExpertMapping mapping = get_moe_expert_mapping(*root);

  OJson list = OJson::array();
  for (const auto& [param, weight, expert, shard] : mapping) {
    list.push_back(OJson::array({param, weight, expert, shard}));
  }
  out["mapping"] = list;
}

}  // namespace reloadsafe::conformance
