// case_report.h: writing what a case did, as the JSON golden/FORMAT.md
// documents (layouts, storages with their bytes, attributes, error lines).
//
// Invariant: reporting only reads. Nothing here writes a tensor or storage,
// and a storage's bytes are reported exactly as they are (lower-case hex).
//
// Usage:
//   const WatchedStorage old_storage(old.storage());   // before the utility runs
//   ...
//   out["old_storage"] = storage_json(old_storage);    // nbytes, moved, hex
#pragma once

#include "conformance/case_json.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include <exception>
#include <string>

namespace reloadsafe::conformance {

/// A storage and the data pointer it had when the case built it, so that a
/// report can say whether it moved.
struct WatchedStorage {
  c10::Storage storage;
  const void* data;
  explicit WatchedStorage(c10::Storage s) : storage(std::move(s)), data(storage.data()) {}
};

/// Whether `t` is defined and on storage `s`.
bool same_storage(const at::Tensor& t, const c10::Storage& s);

/// Adds `dtype`, `shape`, `stride` and `byte_offset` of `t` to `out`.
void put_layout(OJson& out, const at::Tensor& t);

/// `{nbytes, moved, hex}` of a watched storage (`hex` for CPU storages only).
OJson storage_json(const WatchedStorage& w);

/// All attributes of `t`, keys sorted.
OJson attrs_json(const at::Tensor& t);

/// A result as one line of compact JSON (invalid UTF-8 replaced).
std::string dump(const OJson& j);

/// The message of an exception, without LibTorch's backtrace.
std::string error_message(const std::exception& e);

}  // namespace reloadsafe::conformance
