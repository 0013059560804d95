// module_cache.h: a cache kept at namespace scope in a backend's source file
// (a static map of permutation indices keyed by shape) that post-processing
// reads, named so the protocol's steps treat it as the layer's own: slept
// with the layer, compared by name under compare_state, and emptied for
// every cold load the harness makes aside (so a corrupted cache cannot
// corrupt the reference too). Its tensors are not held to their addresses:
// a cache may rightly be rebuilt, and the forward's reads of it are traced
// anyway.
//
// Invariant: stash() and restore() move tensors between the cache and the
// stash, never copy or write one; restore() leaves the cache exactly as
// stash() found it, dropping whatever was added in between.
#pragma once

#include "conformance/trace/named_tensor.h"

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace reloadsafe::harness {

/// A module-level cache a backend names (Backend::module_caches).
class ModuleCache {
 public:
  virtual ~ModuleCache() = default;
  /// Its tensors as they are now, named "<cache>[<key>]", undeclared.
  virtual std::vector<trace::NamedTensor> tensors() const = 0;
  /// Empties the cache, keeping its contents aside.
  virtual void stash() = 0;
  /// Puts back what stash() kept aside, dropping what the cache got since.
  virtual void restore() = 0;
};

/// A ModuleCache over a map of tensors by string key.
class TensorMapCache : public ModuleCache {
 public:
  /// `map` must outlive this object (a static of the backend's file).
  TensorMapCache(std::string name, std::map<std::string, at::Tensor>& map)
      : name_(std::move(name)), map_(map) {}

  std::vector<trace::NamedTensor> tensors() const override;
  void stash() override;
  void restore() override;

 private:
  std::string name_;
  std::map<std::string, at::Tensor>& map_;
  std::vector<std::map<std::string, at::Tensor>> stashed_;  // nested stashes
};

/// Stashes every cache of `caches` for its lifetime (a cold load made
/// aside), and restores them at its end.
class CachesStashed {
 public:
  explicit CachesStashed(std::vector<ModuleCache*> caches);
  ~CachesStashed();
  CachesStashed(const CachesStashed&) = delete;
  CachesStashed& operator=(const CachesStashed&) = delete;

  /// The caches' tensors now (those the aside load put there).
  std::vector<trace::NamedTensor> tensors() const;

 private:
  std::vector<ModuleCache*> caches_;
};

}  // namespace reloadsafe::harness
