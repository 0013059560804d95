#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/module_cache.h"

#include <c10/util/Exception.h>

#include <utility>

namespace reloadsafe::harness {

std::vector<trace::NamedTensor> TensorMapCache::tensors() const {
  std::vector<trace::NamedTensor> out;
  for (const auto& [key, t] : map_) {
    out.push_back({name_ + "[" + key + "]", t, /*declared=*/false});
  }
  return out;
}

void TensorMapCache::stash() {
  stashed_.push_back(std::move(map_));
  map_.clear();
}

void TensorMapCache::restore() {
  TORCH_CHECK(!stashed_.empty(), "module cache '", name_, "': restore() without a stash()");
  map_ = std::move(stashed_.back());
  stashed_.pop_back();
}

CachesStashed::CachesStashed(std::vector<ModuleCache*> caches) : caches_(std::move(caches)) {
  for (ModuleCache* c : caches_) c->stash();
}

CachesStashed::~CachesStashed() {
  for (ModuleCache* c : caches_) c->restore();
}

std::vector<trace::NamedTensor> CachesStashed::tensors() const {
  std::vector<trace::NamedTensor> out;
  for (const ModuleCache* c : caches_) {
    for (trace::NamedTensor& t : c->tensors()) out.push_back(std::move(t));
  }
  return out;
}

}  // namespace reloadsafe::harness
