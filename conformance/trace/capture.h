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
//    address, on the captured storage, in the captured layout? Each
//    difference is a ReadChange, which the harness turns into its verdict.
//  - replay(): what do the captured ops compute from the held tensors now?
//    After a reload that moved a tensor, the held copy is the stale one, so
//    the result differs from a fresh load: the evidence a GPU replay gives.
//    Each op runs under the thread-local state it ran under at capture
//    (CallState in call_state.h: autocast, grad and inference mode), so a
//    forward that enters autocast replays as it ran, whatever the replaying
//    thread's state.
//  - replays_as(): did the retrace make exactly the captured calls, so that
//    a replay would compute what the retraced forward just did?
//
// Both the capture and its checking retrace (CheckingRetrace) are a
// ReadTrace with this file's CallHook: the capture's holds every top-level
// call's arguments, the retrace's skips every call that is the captured one
// (call_match.h). The trace itself only records.
//
// Invariant: a CapturedForward never changes the tensors it holds except
// through the captured ops themselves (in-place ops write where they wrote at
// capture, as a graph would).
//
// Replay limits: ops that draw random numbers (dropout in training mode,
// rand*, normal, bernoulli, multinomial) give different values on every run,
// and a top-level op whose argument was made inside the forward without an
// op (at::from_blob) cannot be rebuilt: replay() then says why and returns
// nothing, before it runs any op (a replay that gives up writes nothing);
// the address check stays the verdict. Memory an empty-like op made that
// PyTorch filled from Python data (torch.tensor(data)) is replayed with the
// bytes the capture read; memory so made that other code outside the
// dispatcher filled is refused likewise (internal/unfilled_memory.h).
#pragma once

#include "conformance/trace/named_tensor.h"
#include "conformance/trace/read_trace.h"
#include "conformance/trace/tensor_location.h"
#include "conformance/trace/trace_records.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace reloadsafe::trace {

/// One external read of a captured forward, named, for reports.
struct CapturedRead {
  std::string op;            ///< "aten::mm arg 1 (mat2)"
  std::string_view op_name;  ///< "aten::mm", also without details
  int depth = 0;             ///< 0: an op the forward called; n: nested inside one
  std::string name;          ///< the tensor's name, "input" or "undeclared tensor"
  bool declared = false;
  std::string layout;             ///< for an object: its class
  const void* storage = nullptr;  ///< identity, for counting distinct tensors
  enum class Kind {
    kTensor,     ///< a tensor with a storage: checked for address and layout
    kSubclass,   ///< a Python subclass tensor: its inner reads are checked
    kNoStorage,  ///< sparse, mkldnn, nested: nothing addressable to check
    kObject,     ///< an opaque object: checked for identity
  };
  Kind kind = Kind::kTensor;
};

/// ReadChange::tensor of a change in the op sequence.
inline constexpr char kOpSequence[] = "op sequence";

/// One way a retraced forward differs from its capture.
struct ReadChange {
  /// The read's name (TensorNames::label), or kOpSequence.
  std::string tensor;
  /// A LocationChange's what ("address", "storage", "storage resized or
  /// moved", "layout"), or "now made inside the forward", "object
  /// replaced", "object re-made in place", "op N changed", "length changed".
  std::string what;
  std::string before;
  std::string after;
  /// "aten::div.Tensor arg 1 (other)"; empty for the op sequence.
  std::string read;
  /// The position of the retrace's call it was seen at (for a changed
  /// length, the first call past the shorter run).
  size_t call = SIZE_MAX;
};

/// Names for storages: which named tensor, if any, a read's storage belongs
/// to. The first name added for a storage wins, declared names before
/// undeclared ones.
class TensorNames {
 public:
  explicit TensorNames(const std::vector<NamedTensor>& named);
  /// Adds one more name (the forward's input, for example).
  void add(const std::string& name, const at::Tensor& t, bool declared);
  /// Names an opaque object (by ObjectRead::identity or ::payload).
  void add_object(const std::string& name, const void* identity);

  struct Found {
    std::string name;
    bool declared = false;
    bool whole = true;  ///< the read is the named tensor itself, not a view of it
  };
  /// The name of the tensor `read` belongs to, or nothing.
  std::optional<Found> find(const TensorRead& read) const;
  /// find(), as a label: "weight", "weight (view)", "scale (undeclared)",
  /// "undeclared tensor".
  std::string label(const TensorRead& read) const;
  /// The name of an opaque object, "undeclared object" if none.
  std::string label(const ObjectRead& read) const;
  /// Whether the object has a name.
  bool named(const ObjectRead& read) const;

 private:
  struct Entry {
    std::string name;
    bool declared;
    TensorLocation location;
  };
  std::unordered_map<const void*, std::vector<Entry>> by_storage_;
  std::unordered_map<const void*, std::string> objects_;
  // The name of `read`, by its identity, else its instance; null if none.
  const std::string* object_name(const ObjectRead& read) const;
};

class CheckingRetrace;

/// How a capture, its retraces and any trace compared with them call by call
/// trace: nested ops recorded, the ops an ATen op calls by name only (Note
/// [Inside an ATen op] in read_trace.cc), with `hook`.
inline ReadTrace::Options capture_trace_options(CallHook* hook = nullptr) {
  ReadTrace::Options options;
  options.hook = hook;
  options.aten_callee_reads = false;
  return options;
}

class CapturedForward {
 public:
  /// Runs `forward` once under a ReadTrace whose hook holds every top-level
  /// op's arguments and results (held_calls()). Exceptions from `forward`
  /// propagate (nothing is left recording).
  explicit CapturedForward(const std::function<at::Tensor()>& forward);
  ~CapturedForward();
  CapturedForward(const CapturedForward&) = delete;
  CapturedForward& operator=(const CapturedForward&) = delete;

  const ReadTrace& trace() const { return *trace_; }
  const at::Tensor& output() const { return output_; }

  /// Every top-level op with its arguments and results, held as HeldCall
  /// says, in call order: what replay() runs.
  const std::vector<HeldCall>& held_calls() const;

  /// The external reads of the capture, named, and its opaque objects, in
  /// op order. With `details` false, each read's op and layout are left
  /// empty (nothing formatted), for a caller that counts and names them.
  std::vector<CapturedRead> reads(const TensorNames& names, bool details = true) const;

  /// The differences between the capture and a retrace of the same forward
  /// after a reload (a full ReadTrace, or a CheckingRetrace of this
  /// capture), in op order. Read names come from `names` (the names at
  /// capture). With `details` false, the before and after of each change
  /// are left empty (nothing formatted), for a caller that only counts and
  /// names them. Both forms of retrace give the same changes.
  std::vector<ReadChange> compare(const ReadTrace& retrace, const TensorNames& names,
                                  bool details = true) const;
  std::vector<ReadChange> compare(const CheckingRetrace& retrace, const TensorNames& names,
                                  bool details = true) const;

  /// The first call the retrace made as the captured op (same_op) but with
  /// other numbers (a top-level call whose other arguments' fingerprints,
  /// both known, differ: a scale, split sizes, a length) or reading an
  /// external tensor at another place of the same storage (another expert's
  /// slice of a fused weight), as "op N (aten::split_with_sizes) handed other
  /// numbers" or "op N (aten::mm.out) reads mat2 at another place of its
  /// storage", with `call` set; nothing if there is none. A graph replays
  /// the captured numbers and places.
  std::optional<ReadChange> new_arguments(const CheckingRetrace& retrace) const;

  /// The position of the first call the retrace made that is not the
  /// captured one in a way a value could have chosen: another op, or the
  /// op handed other numbers or reading at another place of a storage (as
  /// new_arguments()); the number of calls if none.
  size_t first_change(const CheckingRetrace& retrace) const;

  /// Whether the retrace's change can follow the values the forward
  /// computed: before first_change(), the capture handed a tensor's
  /// values to the host (item(), nonzero(), tolist(), a comparison read as a
  /// bool: what Python control flow and Python numbers are made of). Where
  /// it cannot, no other run is worth tracing: the change is not the
  /// forward's choice.
  bool can_follow_values(const CheckingRetrace& retrace) const;

  /// Whether the retrace's change follows the values the forward computed,
  /// and does so in `other` (a full trace of another run of the forward; a
  /// cold load's, whose load and post-processing come before its forward):
  /// can_follow_values(), and the retrace's top-level calls are the last
  /// top-level calls of `other`, in order, each the same op with as many
  /// reads and objects (same_op), a call the retrace did not keep being the
  /// captured call at its position, and where the retrace handed the
  /// captured op other numbers, `other` handed the retrace's, and where it
  /// read at another place of a storage, `other` read the same place of
  /// its own (offset, sizes, strides). Nested calls
  /// are left out: they are the work of the call above them, and which ones
  /// a call records also follows how it was compiled. What tells a forward
  /// whose ops or numbers follow the weights (Note [An op sequence that
  /// follows the weights] in conformance/harness/forward_checks.cc) from
  /// one a reload changed.
  bool follows_values(const CheckingRetrace& retrace, const std::vector<OpCall>& other) const;

  /// Replays the captured top-level ops against the held tensors. Returns
  /// the replayed output, or nothing with the reason in `why`.
  std::optional<at::Tensor> replay(std::string* why) const;

  /// Whether replay() is known from the capture alone to run every captured
  /// call and return a result: no call draws random numbers, every argument
  /// the forward made is the very result of an earlier top-level call, and
  /// so is the output, or the forward did not make it. Found once. Where it
  /// holds, a retrace that replays_as() this capture gives the replay's
  /// output without a replay ever running (Note [A retrace that is its own
  /// replay] in capture.cc).
  bool replays_through() const;

  /// Whether the retrace made exactly the captured calls (Note [A retrace
  /// that is its own replay] in capture.cc): as many, each the captured call
  /// in every respect same_call (call_match.h) looks at: the same ops in the
  /// same order and depth, every tensor argument external where it was and,
  /// if so, at the captured place, the same opaque objects, and every other
  /// argument equal by its fingerprint, known for each top-level op. The
  /// replay then runs the same ops on the same bytes with the same values
  /// as the retraced forward did, so its result is that forward's.
  bool replays_as(const ReadTrace& retrace) const;
  bool replays_as(const CheckingRetrace& retrace) const;

 private:
  friend class CheckingRetrace;  // reads known_callees_
  class Holder;
  // A retrace as compare() and replays_as() walk it: the calls it kept, the
  // position of each among all `calls` calls (null: kept[k] is call k).
  struct Kept {
    const std::vector<OpCall>& ops;
    const std::vector<size_t>* positions;
    size_t calls;
    size_t position(size_t k) const { return positions != nullptr ? positions->at(k) : k; }
  };
  std::vector<ReadChange> compare(const Kept& retrace, const TensorNames& names,
                                  bool details) const;
  bool replays_as(const Kept& retrace) const;
  std::string find_unmade_read() const;
  // The first call the retrace kept that is not the captured one (another
  // op, other numbers, a read moved within its storage): what
  // new_arguments() names and first_change() places.
  struct FirstDifference;
  FirstDifference first_difference(const CheckingRetrace& retrace) const;

  std::unique_ptr<Holder> holder_;  // the capture's hook; outlives trace_
  std::unique_ptr<ReadTrace> trace_;
  at::Tensor output_;
  /// The first captured op that draws random numbers (empty if none): found
  /// once at capture, since it rules out every replay.
  std::string_view random_op_;
  /// For each captured call, how many calls by name it made (an ATen op
  /// whose callees are named), or -1 where a retrace must see them: any
  /// other call, or callees that read values on the host or draw random
  /// numbers (Note [A retrace that knows an ATen op's callees] in
  /// capture.cc). Found once at capture.
  std::vector<int32_t> known_callees_;
  /// Why a replay cannot rebuild some call's arguments (empty if it can):
  /// found once, by the first replay, from the capture alone (Note [A
  /// replay gives up before it runs an op]); a capture never replayed pays
  /// nothing for it.
  mutable std::optional<std::string> unmade_read_;
  mutable std::optional<bool> replays_through_;  // replays_through(), once found
};

/// The forward traced again after a reload, each call checked against the
/// capture as it is made (Note [A checking retrace] in capture.cc): a call
/// that is the captured call at its position (same_call) is counted and not
/// kept; any other is kept with its position. compare() and replays_as()
/// give the answers a full retrace gives, at the cost of a record per call
/// that moved. Traces the calling thread from construction until stop();
/// must not outlive the capture.
class CheckingRetrace final : private CallHook {
 public:
  explicit CheckingRetrace(const CapturedForward& capture);

  /// Stops tracing (idempotent); on the thread that started it.
  void stop() { trace_.stop(); }

  /// The calls that differ from the captured call at their position, in
  /// call order, and those the trace kept because they read a storage whose
  /// classification was provisional (compare() finds nothing in such a call
  /// when it is the captured one).
  const std::vector<OpCall>& kept() const { return trace_.ops(); }
  /// The position of kept()[k] among every call of the retrace.
  size_t position(size_t k) const { return positions_.at(k); }
  /// Every call of the retrace, kept or not.
  size_t calls() const { return trace_.calls(); }
  /// The calls the retrace recorded in full: those it could not tell from
  /// their arguments, kept or dropped after the record.
  size_t records() const { return trace_.records(); }

 private:
  friend class CapturedForward;  // walks kept() with positions_
  bool skip(ReadTrace& trace, size_t position, int depth, const c10::FunctionSchema& schema,
            c10::ArrayRef<c10::IValue> args) override;
  bool skip_named(size_t position, int depth, std::string_view name) override;
  std::optional<size_t> known_callees(size_t position) override;
  bool keep(size_t position, const OpCall& call, bool droppable) override;

  const std::vector<OpCall>& expected_;
  const std::vector<int32_t>& expected_callees_;  // CapturedForward::known_callees_
  static constexpr size_t kNone = static_cast<size_t>(-1);
  // The position of the last call skip() took whose callees are the
  // captured ones (known_callees()); kNone if the last was not such a call.
  size_t known_at_ = kNone;
  std::vector<size_t> positions_;
  ReadTrace trace_;  // last: it starts tracing, with this hook
};

}  // namespace reloadsafe::trace
