// read_trace.h: which tensors a piece of code hands to operators.
//
// A captured CUDA graph bakes in the address of every tensor its kernels
// read. A reload is safe for the graph only if each of those tensors is still
// where the capture saw it. Backends name the tensors they think their
// forward reads; real reload bugs hide in the tensors nobody named (a scale
// rebuilt as an undeclared attribute, a permuted weight held by a kernel
// object or a closure, a workspace allocated by the first forward). A
// ReadTrace finds them by watching the forward itself: for every operator
// call made on the current thread inside its scope it records the operator
// and, for every tensor argument, the storage it lives on, the data pointer,
// the layout, dtype and device, and whether that storage is *external*.
//
// Invariant: a read is external exactly when its storage existed before the
// scope and was not made by an op inside it. Views share their base's
// storage, so a view of an external tensor is external; a tensor made inside
// the scope (and every view of it) is internal. How "existed before" is
// decided: see Note [Inside or before the scope] in read_trace.cc (on the
// CPU the trace installs the allocation census of memory_census.h). Storage identity is kept alive
// (weakly) for the trace's lifetime, so two storages seen by one trace never share an identity.
//
// Note [Why a mode-key fallback and not RecordFunction]
// LibTorch offers two observation points. A RecordFunction callback is called
// at the entry of every dispatcher call; with needsInputs() it makes every
// unboxed call box its arguments first, on every op of the forward, and it
// only listens: it hears an op's start and end, but cannot run anything
// around the call itself. A boxed fallback on a dispatch key that no tensor
// carries, switched on for the scope with a thread-local
// IncludeDispatchKeyGuard, sees each op's full argument stack (tensor lists
// and optional tensors included) once, for ATen ops and custom ops
// registered with TORCH_LIBRARY alike, and wraps the call itself: the
// arguments and results a capture holds are taken around one redispatch. The
// trace uses the fallback, and RecordFunction only where the fallback's key
// is switched off by PyTorch (Note [Inside a subclass's dispatch] in
// read_trace.cc).
//
// The key is kTraceKey (trace_key.h), DispatchKey::TESTING_ONLY_GenericMode: it sits above
// autograd, functionalization and the Python key, so ops are seen as the caller issued them, and
// nothing in PyTorch itself registers a kernel for it. The price is that a process can hold one
// fallback for it: another library registering one for the same key fails at load time. The trace
// redispatches with the key removed, and (by default) leaves it included while the op runs, so ops
// that an op calls internally (a composite's decomposition, a custom op's
// implementation) are recorded too, one level deeper. A trace may take the
// ops an ATen op calls by name only, which spares each of them a boxed call
// (Options::aten_callee_reads, Note [Inside an ATen op] in read_trace.cc).
//
// Tensor subclasses and kernel objects:
//  - a tensor that dispatches in Python (a `__torch_dispatch__` wrapper
//    subclass, as torchao and many quantizers hold a weight) has no storage
//    of its own that a kernel reads: it is recorded as a read marked
//    `subclass`, whose storage is never touched. A subclass that works
//    through `__torch_function__` (torchao's) calls its ops on the inner
//    tensors from Python, and the trace sees those reads at depth 0. A
//    subclass that works through `__torch_dispatch__` runs its ops with
//    every dispatch key above Python excluded, this trace's key included;
//    for that stretch the trace observes through RecordFunction instead
//    (Note [Inside a subclass's dispatch] in read_trace.cc), so the reads
//    its dispatch makes on the inner tensors are recorded one level deeper
//    than the op on the wrapper (nested subclasses deeper still), under the
//    names the Python walker gives them (`weight.qdata`). The capture holds
//    the wrapper as it was for the replay;
//  - a TorchBind object handed to an op (a packed weight such as fbgemm's
//    LinearPackedParamsBase, a oneDNN handle) is an ObjectRead: its class and
//    identity (the object and the C++ instance it holds). The tensors it
//    reports (object_tensors.h) are recorded as reads of that op too, when
//    two calls report the same storages (a method that builds new tensors on
//    every call reports nothing stable to check).
//
// A trace opened while another is active on the same thread records the
// same calls as the outer one; neither misses any.
//
// Note [Code that is not the forward's work]
// A compiler that runs inside the traced scope (torch.compile tracing the
// forward the first time it sees the trace's dispatch key, on fake tensors
// with symbolic sizes) calls ops that are not the forward's: a captured graph
// holds what the compiled code runs, not what compiling it ran. An
// UntracedScope on the thread marks such a stretch: every trace of the
// thread lets its calls pass unrecorded and uncounted (and reads nothing of
// their arguments), and a CPU storage allocated during it counts as one that
// existed before the trace (a constant the compiler made lives on, as a
// weight does). The stretch is the caller's to mark: reloadsafe's Python
// package marks torch.compile's compilations through Dynamo's compile
// callbacks, which run on the thread that holds Dynamo's compile lock.
//
// The trace records, and only that: what it records is in trace_records.h,
// when a retraced call is a captured one in call_match.h. Its owner may
// extend it around each call through one CallHook (a capture holds every
// top-level call's arguments; a checking retrace skips the calls that are
// the captured ones): capture.h owns both.
//
// What the trace cannot see:
//  - kernels launched without the dispatcher: a raw Triton launch, a cuBLAS or
//    custom CUDA kernel called directly from C++, a pointer handed to a
//    library. Their reads do not appear; on a GPU, replaying a captured graph
//    still catches what they read stale.
//  - work done on other threads (each thread needs its own trace), and ops
//    run while dispatch is below the key (inside another fallback that
//    excludes all functionality keys).
//  - storages made inside the scope without an op and without the CPU
//    allocator (at::from_blob on fresh memory; on CUDA, a buffer a kernel
//    allocates directly and hands to a nested op without returning it): they
//    are classified as external. Wrapped Python/C++ numbers (`x * 0.5`) are
//    not memory reads and are skipped.
//
// Usage:
//   reloadsafe::trace::ReadTrace trace;
//   at::Tensor y = forward(x);
//   trace.stop();
//   for (const auto& op : trace.ops())
//     for (const auto& r : op.reads)
//       if (r.external) ...;
#pragma once

#include "conformance/trace/memory_census.h"
#include "conformance/trace/sparse_parts.h"
#include "conformance/trace/tensor_location.h"
#include "conformance/trace/trace_key.h"
#include "conformance/trace/trace_records.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/FunctionRef.h>
#include <c10/util/SmallVector.h>
#include <c10/util/flat_hash_map.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

namespace reloadsafe::trace {

class ReadTrace;

/// What the owner of a trace may do around each call it sees: the one
/// extension point of a ReadTrace. CapturedForward (capture.h) is its user:
/// its capture holds every top-level call's arguments and results, its
/// checking retrace skips the calls that are the captured ones. Called on
/// the tracing thread, with the trace's own work going on (nothing a hook
/// runs is recorded), and only for the calls the trace records (with
/// Options::nested false, not for nested ones).
class CallHook {
 public:
  virtual ~CallHook() = default;

  /// Before the call at `position` (its index among every call the trace
  /// sees) is recorded: true if it needs no record. The trace then counts it
  /// (ReadTrace::calls()) and records nothing. `args` are the call's
  /// arguments, empty when the trace has none (an op seen by the observer
  /// without them). The skip path of a trace, run for every call: keep it
  /// cheap. A hook that classifies an argument does it through
  /// ReadTrace::classify_argument.
  virtual bool skip(ReadTrace& /*trace*/, size_t /*position*/, int /*depth*/,
                    const c10::FunctionSchema& /*schema*/, c10::ArrayRef<c10::IValue> /*args*/) {
    return false;
  }

  /// skip() for a nested call the trace knows by name only (Note [Inside an
  /// ATen op] in read_trace.cc), which it records without reads or objects.
  virtual bool skip_named(size_t /*position*/, int /*depth*/, std::string_view /*name*/) {
    return false;
  }
  /// For a call skip() took as needing no record, an ATen op whose callees
  /// the trace would record by name (Note [Inside an ATen op] in
  /// read_trace.cc): how many calls the hook knows the op makes, or nothing
  /// to have them named as usual. Known callees are counted (calls()) and
  /// not seen: the op runs with no observer naming them. Asked right after
  /// skip() of the same call (which has its arguments), only of the one
  /// trace active on its thread.
  virtual std::optional<size_t> known_callees(size_t /*position*/) { return std::nullopt; }

  /// After the call at `position` was recorded as `call` (the last of
  /// ReadTrace::ops()), for every record: false to take it out again. A
  /// record that reads a storage whose classification is still provisional
  /// (Note [Inside or before the scope] in read_trace.cc) is kept whatever
  /// the answer, since the end of its top-level call may still change it:
  /// `droppable` is false for it, and a hook that keeps its own account of
  /// the kept records (CheckingRetrace's positions) must count it.
  virtual bool keep(size_t /*position*/, const OpCall& /*call*/, bool /*droppable*/) {
    return true;
  }

  /// Around a top-level call that was recorded and kept: its arguments
  /// before it runs and its results after it ran (end is not called if the
  /// op throws).
  virtual void top_level_begin(const ReadTrace& /*trace*/, const c10::OperatorHandle& /*op*/,
                               c10::ArrayRef<c10::IValue> /*args*/) {}
  virtual void top_level_end(const ReadTrace& /*trace*/, const c10::OperatorHandle& /*op*/,
                             c10::ArrayRef<c10::IValue> /*returns*/) {}
};

/// Marks, while alive, a stretch of the current thread whose ops are not
/// the traced code's own (Note [Code that is not the forward's work]).
/// Scopes nest. begin_untraced() and end_untraced() are the same as two
/// calls, for callers that hear of the stretch's start and end separately
/// (a compiler's callbacks); an end without a begin on the thread is
/// ignored.
class UntracedScope {
 public:
  UntracedScope();
  ~UntracedScope();
  UntracedScope(const UntracedScope&) = delete;
  UntracedScope& operator=(const UntracedScope&) = delete;
};
void begin_untraced();
void end_untraced();

/// Whether the current thread is inside an untraced stretch.
bool untraced();

// Note [A read of values no op makes]
// Code can read a tensor's values on the host without calling an op:
// Python's Tensor.tolist() and Tensor.numpy() copy the bytes out in
// PyTorch's C++ without the dispatcher, as a C++ kernel reading
// const_data_ptr() does. A trace sees no op there, so a capture cannot tell
// that the ops after such a read were chosen by values (Hugging Face's
// JetMoE sizes its experts' splits with tolist()). kHostReadOp is an op that
// computes nothing and stands for such a read: code that reads values
// without an op calls note_host_read() first, a trace records the op with
// its tensor as a read like any other, and a capture counts it among the
// ops that read values. check_reload calls it for tolist() and numpy()
// while it runs (python/reloadsafe/host_reads.py).

/// The name of the op that stands for a read of values on the host made
/// without an op.
inline constexpr std::string_view kHostReadOp = "reloadsafe::host_read";

/// Calls kHostReadOp on `t` (through the dispatcher, so a trace records it);
/// it reads, writes and allocates nothing.
void note_host_read(const at::Tensor& t);

/// Records op calls on the current thread from construction until stop() or
/// destruction. Not copyable or movable; stop it on the thread that made it.
/// Traces on different threads are independent; a trace started while
/// another is active on the same thread takes over until it stops.
class ReadTrace {
 public:
  struct Options {
    /// Record ops called inside other ops (depth > 0).
    bool nested = true;
    /// The owner's hook around each call (CallHook); must outlive the trace.
    CallHook* hook = nullptr;
    /// Record the arguments of the ops an ATen op calls. When false, those
    /// are recorded by name and depth only, without reads, objects or
    /// results, and are not boxed for the trace (Note [Inside an ATen op] in
    /// read_trace.cc). Two traces compared call by call take the same value.
    bool aten_callee_reads = true;
    /// With aten_callee_reads false: install the thread's name observer at
    /// the first call whose callees must be named, not for the whole trace,
    /// for a trace whose hook knows most callees (known_callees): until then
    /// no op of the thread pays for the observer.
    bool names_on_demand = false;
    /// Records to make room for up front. A record moved when the list grows
    /// copies its reads: a trace that keeps every call of a forward (a
    /// capture) makes room for a forward's worth; one whose hook drops most
    /// records (a checking retrace) for none.
    size_t expected_records = 32;
  };

  ReadTrace() : ReadTrace(Options{}) {}
  explicit ReadTrace(Options options);
  ~ReadTrace();
  ReadTrace(const ReadTrace&) = delete;
  ReadTrace& operator=(const ReadTrace&) = delete;

  /// Stops recording (idempotent). Must run on the thread that started it.
  void stop();

  bool active() const { return active_; }

  /// The calls recorded, in call order: every call seen, unless a hook
  /// skipped or dropped some (CallHook).
  const std::vector<OpCall>& ops() const { return ops_; }

  /// How many calls the trace saw, those a hook skipped or dropped included.
  size_t calls() const { return calls_; }

  /// How many calls the trace recorded, those a hook dropped after the
  /// record included.
  size_t records() const { return records_; }

  /// Every external read, in call order, with the index of its op.
  std::vector<std::pair<size_t, TensorRead>> external_reads() const;

  /// Whether the trace saw storage `storage` and, if so, whether external.
  std::optional<bool> classify(const c10::StorageImpl* storage) const;

  /// For a hook's skip(): whether `t`, an argument of the call being decided
  /// with a plain storage (has_plain_storage), is external, by the rule a
  /// record uses (a storage seen for the first time is classified now, and
  /// that classification is kept); nothing while it is provisional.
  std::optional<bool> classify_argument(const at::Tensor& t) {
    // The skip path's common case, inline: a storage seen before, while no
    // classification is provisional.
    c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    if (pending_.empty()) {
      auto it = seen_.find(impl);
      if (it != seen_.end()) return it->second.external;
    }
    return classify_first_sight(t, impl);
  }

  /// For a hook's skip(): whether the opaque object `object`, handed as
  /// argument `arg` of the call being decided, is the object `expected`
  /// (same arg, same_object) and, if so, `on_read(tensor, index)` for every
  /// tensor a record would read from it, in the record's order (the ones it
  /// reports alike on two calls, with their index among those it reports).
  /// Asks the object as a record does (object_tensors.h); keeps nothing,
  /// so any trace's hook may pass it to is_expected_call as it is.
  static bool match_object(const ObjectRead& expected, const c10::IValue& object, int arg,
                           c10::function_ref<void(const at::Tensor&, int)> on_read);

  /// Called by the dispatcher fallback for `tls_innermost`; not for users.
  static void dispatch(ReadTrace* innermost, const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                       torch::jit::Stack* stack);

  /// An op seen by the observer of Note [Inside a subclass's dispatch]
  /// (read_trace.cc), from its start to its end; not for users.
  struct ObservedCall;
  static std::unique_ptr<ObservedCall> observed_begin(const c10::OperatorHandle& op,
                                                      c10::ArrayRef<c10::IValue> args);
  static void observed_end(ObservedCall& call, c10::ArrayRef<c10::IValue> returns);

  /// A call inside an ATen op, known by its name only, from its start to its
  /// end (Note [Inside an ATen op] in read_trace.cc); not for users.
  static void named_begin(std::string_view name);
  static void named_end();

 private:
  struct CallInProgress {
    bool recorded = false;       // recorded, or skipped by the hook: its results are noted
    bool hooked = false;         // the hook's top_level_begin ran
    size_t first_op = 0;         // ops_.size() when the call began
    bool named = false;          // recorded by name only (inside an ATen op)
    bool opens_aten = false;     // an ATen op whose callees are recorded by name
    bool callees_known = false;  // its callees counted from the hook's answer, not seen
  };
  // The traces active on this thread, `innermost` first.
  static c10::SmallVector<ReadTrace*, 4> active_chain(ReadTrace* innermost);
  // Runs the op of `stack` below the trace key, with begin_call and end_call
  // of traces[k] (recording into progress[k]) around it, k < count (Note
  // [One trace or a chain] in read_trace.cc).
  static void run_around(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                         torch::jit::Stack* stack, ReadTrace* const* traces,
                         CallInProgress* progress, size_t count);
  // `args`: the op's arguments (the last ones are used, or none if fewer
  // than the schema has); `returns` likewise its results. `schema`:
  // op.schema(). Called with the trace key excluded and the observer told
  // (OwnWork in read_trace.cc), once per trace of the chain.
  // `aten_op`: the op is an ATen op that does not go on to Python (Note
  // [Inside an ATen op]). `alone`: this is the one trace active on the
  // thread, which alone may take its hook's known_callees().
  void begin_call(const c10::OperatorHandle& op, const c10::FunctionSchema& schema,
                  c10::ArrayRef<c10::IValue> args, CallInProgress& call, bool aten_op, bool alone);
  void end_call(const c10::OperatorHandle& op, const c10::FunctionSchema& schema,
                c10::ArrayRef<c10::IValue> returns, CallInProgress& call);
  // A call that threw: the depth and the ATen op it opened given back.
  void abandon_call(const CallInProgress& call);
  // begin_call and end_call for a call known by name only.
  void begin_named(std::string_view name);
  void end_named() { --depth_; }
  // Whether the ops the current call makes are recorded without their
  // arguments (by name, or not at all), so that they need not be boxed.
  bool callees_unread() const { return !options_.nested || aten_depth_ >= 0; }
  // Records the call as ops_.back(); on a throw nothing is left recorded.
  // `opens_aten`: the call is an ATen op whose callees are recorded by name
  // (OpCall::callees_named).
  void record(const c10::FunctionSchema& schema, const c10::IValue* args, size_t num_args,
              bool opens_aten);
  bool records_nested() const { return options_.nested; }
  // Installs the thread's name observer for this trace if it has not yet
  // (Options::names_on_demand); released by stop().
  void observe_names();
  void add_object(OpCall& call, const c10::IValue& v, int arg, const c10::Argument& schema_arg);
  // Records `t` as the read `r` (a new element of an op's reads).
  void fill_read(TensorRead& r, const at::Tensor& t, int arg, int element, const SparsePart* part,
                 const c10::Argument& schema_arg);
  void note_result(const at::Tensor& t);
  // Whether a storage on `device`, allocated at `epoch` by the CPU census
  // (nothing where it does not know), existed before the trace began (Note
  // [Inside or before the scope]).
  bool existed_before(const c10::Device& device, std::optional<uint64_t> epoch) const;
  // Whether the plain storage `impl` of `t`, an argument of the current
  // call, is external: its classification, made at its first sight and
  // kept (pending_ if provisional). A record and a hook's skip both classify
  // through here, so the two cannot disagree. `allocation_epoch`, where
  // given, gets the storage's CPU allocation epoch (TensorRead's).
  bool classify_read(const at::Tensor& t, c10::StorageImpl* impl,
                     uint64_t* allocation_epoch = nullptr);
  // classify_argument() past its inline common case.
  std::optional<bool> classify_first_sight(const at::Tensor& t, c10::StorageImpl* impl);
  void resolve_pending(size_t first_op, const std::vector<const c10::StorageImpl*>& returned);
  // Whether `storage`'s classification is still provisional (pending_), and
  // whether `call` reads such a storage.
  bool is_pending(const void* storage) const;
  bool reads_pending(const OpCall& call) const;

  CpuCensusScope census_;  // see Note [Inside or before the scope]
  Options options_;
  bool active_ = false;
  int depth_ = 0;
  // The depth of the ATen op whose callees are recorded by name only; -1
  // outside one (Note [Inside an ATen op]).
  int aten_depth_ = -1;
  // This trace installed the thread's name observer (Note [Inside an ATen op]).
  bool observes_names_ = false;
  std::thread::id owner_;
  ReadTrace* previous_ = nullptr;
  std::optional<c10::impl::IncludeDispatchKeyGuard> include_;
  std::vector<OpCall> ops_;
  size_t calls_ = 0;
  size_t records_ = 0;
  // Storage identity -> external?; the weak reference keeps the identity
  // from being reused by a new storage while the trace lives.
  struct Seen {
    bool external;
    uint64_t allocation_epoch;
    c10::weak_intrusive_ptr<c10::StorageImpl> keep;
  };
  // Open addressing: one table instead of a node per storage.
  ska::flat_hash_map<const c10::StorageImpl*, Seen> seen_;
  // First seen inside a nested op on a device without the census; see Note
  // [Inside or before the scope] in read_trace.cc.
  std::vector<const c10::StorageImpl*> pending_;
  uint64_t start_epoch_ = 0;
  // CPU allocation epochs (first, last] of the untraced stretches that ended
  // while the trace was active (Note [Code that is not the forward's work]).
  std::vector<std::pair<uint64_t, uint64_t>> untraced_epochs_;
  friend void end_untraced();
  // Opaque objects seen, kept alive so that no identity is reused.
  std::vector<c10::IValue> objects_seen_;
  // The identities of the opaque objects ops of the scope returned (Note
  // [An object the forward makes]); each kept alive in objects_seen_.
  std::unordered_set<const void*> made_objects_;
};

}  // namespace reloadsafe::trace
