// trace_records.h: what a read trace records of one op call.
//
// A ReadTrace (read_trace.h) turns every op call it sees into an OpCall: the
// op, how deep it was called, each tensor argument as a TensorRead (where the
// tensor was and whether its storage is external to the traced code), each
// opaque object as an ObjectRead, and a fingerprint of the other arguments
// (call_match.h). A capture (capture.h) also holds each top-level call's
// arguments and results as a HeldCall, to replay it.
//
// Invariant: a record holds no tensor and owns no storage. Identities
// (storages, objects) are for comparison only and are never dereferenced;
// what keeps them from being reused while they are compared is the trace's
// business (read_trace.h), and a HeldCall is the one record that holds
// tensors, on purpose.
#pragma once

#include "conformance/trace/internal/call_state.h"
#include "conformance/trace/tensor_location.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace reloadsafe::trace {

/// One tensor argument of one op, as the op received it: where the tensor
/// was (TensorLocation; its storage fields are empty for a tensor without a
/// plain storage) and where the op took it.
struct TensorRead : TensorLocation {
  int arg = 0;       ///< index of the argument in the op's schema
  int element = -1;  ///< index in a Tensor[] argument; -1 for a single tensor
  /// For a part of a sparse argument (sparse_parts.h): its index, and
  /// arg_name ends with its name ("self._values"); -1 for the argument itself.
  int part = -1;
  std::string arg_name;   ///< the schema's name for the argument ("self", "mat2")
  bool written = false;   ///< the schema says the op writes it (in-place, out=)
  bool external = false;  ///< the storage existed before the traced code ran (read_trace.h)
  /// The CPU allocation epoch of an external storage (memory_census.h: the
  /// allocation's sequence number), 0 where the census does not know it
  /// (another device, allocated while no census ran) and for a storage the
  /// traced code made (an op's result). Tells a storage made by the code
  /// around the traced block from one that outlives it.
  uint64_t allocation_epoch = 0;
  bool has_storage = true;  ///< false for tensors without storage (mkldnn, nested)
  /// A tensor that dispatches in Python (a `__torch_dispatch__` subclass):
  /// no storage fields are read; has_storage is false.
  bool subclass = false;
  /// For a tensor an opaque object reported: that object's identity
  /// (ObjectRead::identity); null for an argument of the op itself.
  const void* object = nullptr;

  /// "aten::mm arg 1 (mat2)"-style position of this read, given its op.
  /// Built by appending: a report names every read, and a stream per string
  /// cost more than the rest of listing them.
  std::string where(std::string_view op_name) const {
    std::string s(op_name);
    s += " arg " + std::to_string(arg);
    if (element >= 0) s += "[" + std::to_string(element) + "]";
    if (!arg_name.empty()) s += " (" + arg_name + ")";
    return s;
  }
};

/// One opaque (TorchBind) object handed to an op.
struct ObjectRead {
  int arg = 0;
  std::string arg_name;
  /// "quantized.LinearPackedParamsBase" (TorchBind's namespace prefix cut).
  std::string class_name;
  /// The script object's identity, and of the C++ instance it holds (its
  /// first slot's capsule): either changes when the object is replaced or
  /// re-made in place. For comparison only: never dereferenced.
  const void* identity = nullptr;
  const void* payload = nullptr;
  /// Returned by an earlier op of the traced scope: the forward's own
  /// object, made anew by every forward as a tensor it makes is (Note [An
  /// object the forward makes] in read_trace.cc).
  bool made = false;

  /// "aten::mm arg 1 (mat2)"-style position of this read, given its op.
  std::string where(std::string_view op_name) const {
    std::string s(op_name);
    s += " arg " + std::to_string(arg);
    if (!arg_name.empty()) s += " (" + arg_name + ")";
    return s;
  }
  /// "quantized.LinearPackedParamsBase@0x..." (identity).
  std::string describe() const { return class_name + "@" + to_hex(identity); }
};

/// One op call seen by a trace.
struct OpCall {
  /// "aten::mm", with the overload: "aten::add.Tensor". A view of a string
  /// made once per op name and never freed (op_names.h): valid for the life
  /// of the process.
  std::string_view name;
  int depth = 0;  ///< 0: called by the traced code; n: called inside a depth n-1 op
  /// An ATen op whose callees the trace recorded by name only (Note [Inside
  /// an ATen op] in read_trace.cc): they are the deeper calls after it.
  bool callees_named = false;
  /// Inline up to kInlineReads reads: a forward's ops mostly read one to
  /// three tensors, and a heap vector per op was a trace's most frequent
  /// allocation.
  static constexpr unsigned kInlineReads = 3;
  c10::SmallVector<TensorRead, kInlineReads> reads;
  std::vector<ObjectRead> objects;  ///< opaque objects among the arguments
  /// For a top-level op (depth 0), and an op whose callees are named at any
  /// depth, a fingerprint of its other arguments
  /// (Note [The other arguments' fingerprint] in call_match.cc): numbers,
  /// shapes, flags, strings and devices by value, a wrapped number (`x *
  /// 0.5` from Python) by its value, a Python subclass tensor by its
  /// identity. Two calls whose fingerprints are equal were handed equal
  /// values.
  uint64_t constants = 0;
  /// False for any other nested op, and when an argument has no fingerprint (a
  /// generator, a Python object, an op recorded without its arguments):
  /// then no two calls' other arguments count as equal.
  bool constants_known = false;
};

/// The boxed arguments and results of a top-level op, held as a capture holds
/// them: every tensor kept alive; an external tensor as a new object on the
/// same storage with the same layout (rebinding the caller's object later
/// does not change what the capture reads), an internal one, a subclass
/// tensor and an opaque object as themselves.
struct HeldCall {
  c10::OperatorHandle op;
  std::vector<c10::IValue> inputs;
  std::vector<c10::IValue> outputs;
  CallState state;  ///< what the op ran under (replayed under it)
};

}  // namespace reloadsafe::trace
