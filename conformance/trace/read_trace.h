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
// The key is DispatchKey::TESTING_ONLY_GenericMode: it sits above autograd,
// functionalization and the Python key, so ops are seen as the caller issued
// them, and nothing in PyTorch itself registers a kernel for it. The price is
// that a process can hold one fallback for it: another library registering
// one for the same key fails at load time. The trace redispatches with the
// key removed, and (by default) leaves it included while the op runs, so ops
// that an op calls internally (a composite's decomposition, a custom op's
// implementation) are recorded too, one level deeper.
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
//    reports (a registered ObjectTensors function for its class, else its
//    `unpack()` method) are recorded as reads of that op too, when two
//    calls report the same storages (a method that builds new tensors on
//    every call reports nothing stable to check).
//
// A trace opened while another is active on the same thread records the
// same calls as the outer one; neither misses any.
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
#include "conformance/trace/tensor_location.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/AutogradState.h>
#include <c10/core/ScalarType.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>
#include <c10/util/flat_hash_map.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

namespace reloadsafe::trace {

/// The dispatch key the trace owns (see Note [Why a mode-key fallback and not
/// RecordFunction]).
constexpr c10::DispatchKey kTraceKey = c10::DispatchKey::TESTING_ONLY_GenericMode;

/// One tensor argument of one op, as the op received it: where the tensor
/// was (TensorLocation; its storage fields are empty for a tensor without a
/// plain storage) and where the op took it.
struct TensorRead : TensorLocation {
  int arg = 0;              ///< index of the argument in the op's schema
  int element = -1;         ///< index in a Tensor[] argument; -1 for a single tensor
  std::string arg_name;     ///< the schema's name for the argument ("self", "mat2")
  bool written = false;     ///< the schema says the op writes it (in-place, out=)
  bool external = false;    ///< see the invariant at the top of this file
  bool has_storage = true;  ///< false for tensors without storage (sparse, nested)
  /// A tensor that dispatches in Python (a `__torch_dispatch__` subclass):
  /// no storage fields are read; has_storage is false.
  bool subclass = false;
  /// For a tensor an opaque object reported: that object's identity
  /// (ObjectRead::identity); null for an argument of the op itself.
  const void* object = nullptr;

  /// "aten::mm arg 1 (mat2)"-style position of this read, given its op.
  std::string where(std::string_view op_name) const;
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

  /// "aten::mm arg 1 (mat2)"-style position of this read, given its op.
  std::string where(std::string_view op_name) const;
  /// "quantized.LinearPackedParamsBase@0x..." (identity).
  std::string describe() const;
};

/// The tensors an opaque object of one class holds, for the trace to check
/// like any read. Must not run ops that matter (it runs with the trace off)
/// and must return the same tensors on every call.
using ObjectTensors = std::function<std::vector<at::Tensor>(const c10::IValue& object)>;

/// Registers `fn` for objects whose class is `class_name` (the qualified
/// name, e.g. "__torch__.torch.classes.quantized.LinearPackedParamsBase",
/// or the short form ObjectRead::class_name gives). Thread-safe.
void register_object_tensors(const std::string& class_name, ObjectTensors fn);

/// One op call seen by the trace.
struct OpCall {
  /// "aten::mm", with the overload: "aten::add.Tensor". A view of a string
  /// the trace makes once per op name and never frees (Note [Op names] in
  /// read_trace.cc): valid for the life of the process.
  std::string_view name;
  int depth = 0;  ///< 0: called by the traced code; n: called inside a depth n-1 op
  /// Inline up to kInlineReads reads: a forward's ops mostly read one to
  /// three tensors, and a heap vector per op was a trace's most frequent
  /// allocation.
  static constexpr unsigned kInlineReads = 3;
  c10::SmallVector<TensorRead, kInlineReads> reads;
  std::vector<ObjectRead> objects;  ///< opaque objects among the arguments
  /// For a top-level op (depth 0), a fingerprint of its other arguments
  /// (Note [The other arguments' fingerprint] in read_trace.cc): numbers,
  /// shapes, flags, strings and devices by value, a wrapped number (`x *
  /// 0.5` from Python) by its value, a Python subclass tensor by its
  /// identity. Two calls whose fingerprints are equal were handed equal
  /// values.
  uint64_t constants = 0;
  /// False for a nested op, and when an argument has no fingerprint (a
  /// generator, a Python object, an op recorded without its arguments):
  /// then no two calls' other arguments count as equal.
  bool constants_known = false;
};

/// Whether `retraced` is the op `captured` is in shape: the same op at the
/// same depth, with as many reads and objects.
bool same_op(const OpCall& captured, const OpCall& retraced);

/// The same object: the same C++ instance where the objects hold one (a
/// TorchBind object handed from C++ gets a new script object on every call),
/// else the same script object.
bool same_object(const ObjectRead& captured, const ObjectRead& retraced);

/// Whether the retraced call `retraced` is the captured call `captured` in
/// every respect a retrace is judged by: the same op at the same depth with
/// as many reads and objects; the same objects; every read taken from the
/// same argument and element, external, subclass and storage-less alike,
/// and an external one at the same place (TensorLocation::same_place); for
/// a top-level call, other arguments known and equal. A retrace made of
/// such calls has nothing to report (CapturedForward::compare) and is its
/// own replay (CapturedForward::replays_as).
bool same_call(const OpCall& captured, const OpCall& retraced);

/// The thread-local state a top-level op ran under, as far as it changes
/// what the op computes: the local dispatch key set (what autocast,
/// inference mode and other guards include or exclude; the trace's own key
/// taken out), the autograd state (grad and inference mode) and the autocast
/// dtypes. A replay runs each op under its own (ReplayState), so a forward
/// that enters autocast replays under autocast, whatever the replaying
/// thread's state is.
struct CallState {
  c10::impl::LocalDispatchKeySet keys{c10::impl::PODLocalDispatchKeySet{}};
  c10::AutogradState autograd{/*grad_mode=*/false, /*inference_mode=*/false,
                              /*fw_grad_mode=*/false, /*multithreading_enabled=*/true};
  c10::ScalarType autocast_cpu = c10::ScalarType::BFloat16;
  c10::ScalarType autocast_cuda = c10::ScalarType::Half;

  /// The calling thread's state now, the trace's key taken out.
  static CallState current();
};

/// Sets the thread's state to `state` for its lifetime, then puts the
/// previous one back.
class ReplayState {
 public:
  explicit ReplayState(const CallState& state);
  ~ReplayState();
  ReplayState(const ReplayState&) = delete;
  ReplayState& operator=(const ReplayState&) = delete;

 private:
  CallState previous_;
};

/// The boxed arguments and results of a depth-0 op, held as a capture holds
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

/// Records op calls on the current thread from construction until stop() or
/// destruction. Not copyable or movable; stop it on the thread that made it.
/// Traces on different threads are independent; a trace started while
/// another is active on the same thread takes over until it stops.
class ReadTrace {
 public:
  struct Options {
    /// Record ops called inside other ops (depth > 0).
    bool nested = true;
    /// Keep every depth-0 op's arguments and results (held_calls()), which
    /// keeps their tensors alive until the trace is destroyed.
    bool hold_arguments = false;
    /// Check each call against the call `expected` (a stopped trace, which
    /// must outlive this one) recorded at the same position, instead of
    /// keeping every call: a call that is the expected one in every respect
    /// a retrace is judged by (same_call) is counted and dropped; any other
    /// is kept in ops(), with its position in position(). A retrace then
    /// makes no record for most calls that stayed put (Note [A checking
    /// retrace] in read_trace.cc).
    const ReadTrace* expected = nullptr;
  };

  ReadTrace() : ReadTrace(Options{}) {}
  explicit ReadTrace(Options options);
  ~ReadTrace();
  ReadTrace(const ReadTrace&) = delete;
  ReadTrace& operator=(const ReadTrace&) = delete;

  /// Stops recording (idempotent). Must run on the thread that started it.
  void stop();

  bool active() const { return active_; }

  /// Every op seen, in call order; with Options::expected, only the calls
  /// that were not the expected one (see position()).
  const std::vector<OpCall>& ops() const { return ops_; }

  /// How many calls the trace saw, dropped ones included.
  size_t calls() const { return calls_; }

  /// How many calls the trace recorded in full: every call, unless it
  /// checks against Options::expected; then only those it could not tell
  /// from their arguments (Note [A checking retrace] in read_trace.cc), kept
  /// or dropped after the record.
  size_t records() const { return records_; }

  /// The position of ops()[k] among all the calls seen: k, unless the trace
  /// checks against Options::expected.
  size_t position(size_t k) const { return options_.expected != nullptr ? positions_[k] : k; }

  /// With Options::hold_arguments: every depth-0 op with its arguments.
  const std::vector<HeldCall>& held_calls() const { return held_; }

  /// Every external read, in call order, with the index of its op.
  std::vector<std::pair<size_t, TensorRead>> external_reads() const;

  /// Whether the trace saw storage `storage` and, if so, whether external.
  std::optional<bool> classify(const c10::StorageImpl* storage) const;

  /// Called by the dispatcher fallback for `tls_innermost`; not for users.
  static void dispatch(ReadTrace* innermost, const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                       torch::jit::Stack* stack);

  /// An op seen by the observer of Note [Inside a subclass's dispatch]
  /// (read_trace.cc), from its start to its end; not for users.
  struct ObservedCall;
  static std::unique_ptr<ObservedCall> observed_begin(const c10::OperatorHandle& op,
                                                      c10::ArrayRef<c10::IValue> args);
  static void observed_end(ObservedCall& call, c10::ArrayRef<c10::IValue> returns);

 private:
  struct CallInProgress {
    bool recorded = false;
    size_t first_op = 0;  // ops_.size() when the call began
    std::vector<c10::IValue> held_inputs;
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
  void begin_call(const c10::OperatorHandle& op, const c10::FunctionSchema& schema,
                  c10::ArrayRef<c10::IValue> args, CallInProgress& call);
  void end_call(const c10::OperatorHandle& op, const c10::FunctionSchema& schema,
                c10::ArrayRef<c10::IValue> returns, CallInProgress& call);
  bool records_nested() const { return options_.nested; }
  void add_object(OpCall& call, const c10::IValue& v, int arg, const c10::Argument& schema_arg);
  // Records `t` as the read `r` (a new element of an op's reads).
  void fill_read(TensorRead& r, const at::Tensor& t, int arg, int element,
                 const c10::Argument& schema_arg);
  void note_result(const at::Tensor& t);
  c10::IValue hold_as_captured(const c10::IValue& v) const;
  // Whether the storage at `storage_data` on `device` existed before the
  // trace began (Note [Inside or before the scope]).
  bool existed_before(const c10::Device& device, const void* storage_data) const;
  // Whether the plain storage `impl` of `t`, an argument of the current
  // call, is external: its classification, made at its first sight and
  // kept (pending_ if provisional). Both a record and a check without one
  // classify through here, so the two cannot disagree.
  bool classify_read(const at::Tensor& t, c10::StorageImpl* impl);
  void resolve_pending(size_t first_op, const std::vector<const c10::StorageImpl*>& returned);
  // Whether `storage`'s classification is still provisional (pending_), and
  // whether `call` reads such a storage.
  bool is_pending(const void* storage) const;
  bool reads_pending(const OpCall& call) const;
  // Whether a call of `schema` with `args` (its num_args arguments) would be
  // recorded as a call same_call() to `expected`, told without recording it;
  // false also where that cannot be told cheaply (Note [A checking retrace]).
  // Not const: a storage seen for the first time is classified on the way.
  bool is_expected_call(const OpCall& expected, const c10::FunctionSchema& schema,
                        const c10::IValue* args, size_t num_args);
  bool is_expected_read(const TensorRead& expected, const at::Tensor& t, int arg, int element);

  CpuCensusScope census_;  // see Note [Inside or before the scope]
  Options options_;
  bool active_ = false;
  int depth_ = 0;
  std::thread::id owner_;
  ReadTrace* previous_ = nullptr;
  std::optional<c10::impl::IncludeDispatchKeyGuard> include_;
  std::vector<OpCall> ops_;
  size_t calls_ = 0;
  size_t records_ = 0;
  std::vector<size_t> positions_;  // with Options::expected: ops_[k]'s position
  std::vector<HeldCall> held_;
  // Storage identity -> external?; the weak reference keeps the identity
  // from being reused by a new storage while the trace lives.
  struct Seen {
    bool external;
    c10::weak_intrusive_ptr<c10::StorageImpl> keep;
  };
  // Open addressing: one table instead of a node per storage.
  ska::flat_hash_map<const c10::StorageImpl*, Seen> seen_;
  // First seen inside a nested op on a device without the census; see Note
  // [Inside or before the scope] in read_trace.cc.
  std::vector<const c10::StorageImpl*> pending_;
  uint64_t start_epoch_ = 0;
  // Opaque objects seen, kept alive so that no identity is reused.
  std::vector<c10::IValue> objects_seen_;
};

}  // namespace reloadsafe::trace
