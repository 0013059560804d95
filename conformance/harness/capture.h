// capture.h: a forward as a CUDA graph would capture it, emulated on any
// device.
//
// A CUDA graph records the forward's kernels once, with the addresses of
// everything they read, and replays exactly that sequence afterwards. A
// CapturedForward is the same record made with a ReadTrace: the op sequence,
// every external read (storage, data pointer, layout), and every top-level
// op's arguments held as the capture held them. It answers the two
// questions a replay after a reload asks:
//
//  - compare(): does the forward, traced again after a reload, issue the
//    captured op sequence and read every external tensor at the captured
//    address, on the captured storage, in the captured layout? (The verdict.)
//  - replay(): what do the captured ops compute from the held tensors now?
//    After a reload that moved a tensor, the held copy is the stale one, so
//    the result differs from a fresh load: the evidence a GPU replay gives.
//
// Invariant: a CapturedForward never changes the tensors it holds except
// through the captured ops themselves (in-place ops write where they wrote at
// capture, as a graph would).
//
// Replay limits: ops that draw random numbers (dropout in training mode,
// rand*, normal, bernoulli, multinomial) give different values on every run,
// and a top-level op whose argument was made inside the forward without an
// op (at::from_blob) cannot be rebuilt: replay() then says why and returns
// nothing; the address check stays the verdict.
#pragma once

#include "conformance/harness/protocol.h"
#include "conformance/trace/read_trace.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace reloadsafe::harness {

/// Names for storages: which named tensor, if any, a read's storage belongs
/// to. The first name added for a storage wins, declared names before
/// undeclared ones.
class TensorNames {
 public:
  explicit TensorNames(const std::vector<NamedTensor>& named);
  /// Adds one more name (the forward's input, for example).
  void add(const std::string& name, const at::Tensor& t, bool declared);
  /// Names an opaque object (by ObjectRead::identity).
  void add_object(const std::string& name, const void* identity);

  struct Found {
    std::string name;
    bool declared = false;
    bool whole = true;  ///< the read is the named tensor itself, not a view of it
  };
  /// The name of the tensor `read` belongs to, or nothing.
  std::optional<Found> find(const trace::TensorRead& read) const;
  /// find(), as a label: "weight", "weight (view)", "scale (undeclared)",
  /// "undeclared tensor".
  std::string label(const trace::TensorRead& read) const;
  /// The name of an opaque object, "undeclared object" if none.
  std::string label(const trace::ObjectRead& read) const;
  /// Whether the object has a name.
  bool named(const trace::ObjectRead& read) const;

 private:
  struct Entry {
    std::string name;
    bool declared;
    const void* data_ptr;
    std::vector<int64_t> sizes, strides;
  };
  std::unordered_map<const void*, std::vector<Entry>> by_storage_;
  std::unordered_map<const void*, std::string> objects_;
};

class CapturedForward {
 public:
  /// Runs `forward` once under a ReadTrace that holds every top-level op's
  /// arguments. Exceptions from `forward` propagate (nothing is left
  /// recording).
  explicit CapturedForward(const std::function<at::Tensor()>& forward);

  const trace::ReadTrace& trace() const { return *trace_; }
  const at::Tensor& output() const { return output_; }

  /// The external reads of the capture, named, and its opaque objects, in
  /// op order.
  std::vector<CapturedRead> reads(const TensorNames& names) const;

  /// The differences between the capture and `retrace` (the same forward
  /// traced after a reload), as violations of reload `reload`. Read names
  /// come from `names` (the names at capture).
  std::vector<Violation> compare(const trace::ReadTrace& retrace, const TensorNames& names,
                                 int reload) const;

  /// Replays the captured top-level ops against the held tensors. Returns
  /// the replayed output, or nothing with the reason in `why`.
  std::optional<at::Tensor> replay(std::string* why) const;

 private:
  std::unique_ptr<trace::ReadTrace> trace_;
  at::Tensor output_;
};

}  // namespace reloadsafe::harness
