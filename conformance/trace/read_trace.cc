// Note [A release LibTorch's debug-only members]
// ATen/record_function.h gives RecordFunction a member and a check that
// exist only without NDEBUG (inputs_valid_, asserted by inputs()). The
// LibTorch this links is a release build, which never sets that member: a
// translation unit built without NDEBUG reads a byte of padding there and
// its inputs() fails at random. This file reads RecordFunction inputs (Note
// [Inside a subclass's dispatch]), so it sees LibTorch's headers as the
// library was built, and no other file of the project calls inputs().
#ifndef NDEBUG
#define NDEBUG
#endif

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/trace/read_trace.h"

#include "conformance/trace/internal/call_match.h"
#include "conformance/trace/internal/object_tensors.h"
#include "conformance/trace/internal/op_arguments.h"
#include "conformance/trace/internal/op_names.h"
#include "conformance/trace/memory_census.h"

#include <ATen/core/stack.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <c10/util/SmallVector.h>

#include <algorithm>

namespace reloadsafe::trace {
namespace {

// The trace recording on this thread, if any.
thread_local ReadTrace* tls_active = nullptr;

// > 0 while a trace reads, holds or asks an object on this thread: the ops
// that runs are the trace's own, and the observer of Note [Inside a
// subclass's dispatch] must not record them.
thread_local int tls_bookkeeping = 0;

// > 0 inside an untraced stretch (Note [Code that is not the forward's
// work] in read_trace.h), and the CPU allocation epoch at its start.
thread_local int tls_untraced = 0;
thread_local uint64_t tls_untraced_from = 0;

// > 0 while an ATen op runs with the trace key off and the ops it calls are
// recorded by name (Note [Inside an ATen op]).
thread_local int tls_inside_aten = 0;

// > 0 while an ATen op runs whose callees the trace counts without seeing
// them (Note [A retrace that knows an ATen op's callees] in capture.cc): no
// observer records them.
thread_local int tls_callees_known = 0;

struct Bookkeeping {
  Bookkeeping() { ++tls_bookkeeping; }
  ~Bookkeeping() { --tls_bookkeeping; }
  Bookkeeping(const Bookkeeping&) = delete;
  Bookkeeping& operator=(const Bookkeeping&) = delete;
};

// The trace's own work around one op (recording its arguments, running its
// hook, noting its results), for every trace of the chain at once: the trace key
// off (Note [Holding runs no op]) and the observer told (Bookkeeping).
struct OwnWork {
  c10::impl::ExcludeDispatchKeyGuard off{kTraceKey};
  Bookkeeping bookkeeping;
};

// The keys an op dispatched to the trace's key goes on with: the ones below
// it, as PyTorch's own mode keys redispatch (PythonTLSSnapshot, PreDispatch).
// Keys above the trace's (the Python dispatcher's, which torch.compile
// switches on while it traces) ran before it; a set that still holds one
// must not send the op back there.
c10::DispatchKeySet below_trace_key(c10::DispatchKeySet ks) {
  return ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kTraceKey);
}

void trace_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                    torch::jit::Stack* stack) {
  ReadTrace* trace = tls_active;
  if (trace == nullptr || tls_untraced > 0) {
    // The key was included by someone else, or the call is not the traced
    // code's work: stay out of the way.
    c10::impl::ExcludeDispatchKeyGuard off(kTraceKey);
    op.redispatchBoxed(below_trace_key(ks), stack);
    return;
  }
  ReadTrace::dispatch(trace, op, ks, stack);
}

// Whether an op dispatched with the key set `ks` goes on to a
// __torch_dispatch__: the dispatcher computed `ks` from the Python key of
// every tensor argument (lists included) and the thread's included keys (a
// Python dispatch mode includes the Python key), and it is the set the
// redispatch below the trace uses, so the Python key in it is what sends
// the op to Python.
bool dispatch_goes_to_python(c10::DispatchKeySet ks) {
  return ks.has(c10::DispatchKey::Python);
}

bool is_aten_op(const c10::FunctionSchema& schema) {
  const std::string& name = schema.name();
  return name.size() > 6 && name.compare(0, 6, "aten::") == 0;
}

// Note [Inside an ATen op]
// An ATen op's kernels read what the op was handed and what they make: the
// ops they call get views of its arguments or tensors made inside it, never
// a tensor the traced code holds and did not hand the op (no closure, no
// kernel object: those are a custom op's). Their reads add nothing to the
// op's own reads, and each costs a boxed call: PyTorch boxes every argument
// for the fallback and unboxes it again below, which for a forward of many
// small composite ops (a matmul's expand, reshape and bmm, a chunk's split
// and slices) was most of what tracing added. Their names still matter: a
// random draw (a dropout front end draws through the op it calls), a value
// read on the host (an index by a mask calls nonzero), and the op sequence.
// A trace with Options::aten_callee_reads false therefore records the ops
// an ATen op calls by name and depth only. When every trace of the thread
// takes them so (or not at all), the ATen op runs with the trace key off,
// and a RecordFunction observer that takes no inputs reports each call's
// name, so no call below it is boxed for the trace; otherwise the fallback
// sees them and the trace drops their arguments itself, and the record is
// the same. An ATen op whose dispatch goes on to Python (a subclass argument,
// a Python mode) is not such an op: what the subclass's dispatch reads is
// the point of Note [Inside a subclass's dispatch]. Nor is an op the
// observer of that note sees. A kernel registered for an ATen op from
// outside PyTorch (torch.library on an aten:: name) is taken as ATen's.
// RecordFunction skips a few ops PyTorch marks unobserved (aten::size,
// aten::_version...); a capture and its retraces take the same path, and
// so see the same calls. A checking retrace knows most callees from its
// capture and installs the observer only for one it does not (Note [A
// retrace that knows an ATen op's callees] in capture.cc).
//
// Whether an op the name observer hears is a call inside such an ATen op,
// made by the traced code. The answer at an op's end is the one given at
// its start: each condition is scoped, and ops nest.
bool names_inside_aten() {
  return tls_inside_aten > 0 && tls_callees_known == 0 && tls_bookkeeping == 0 && tls_untraced == 0;
}

std::unique_ptr<at::ObserverContext> name_start(const at::RecordFunction& fn) {
  if (names_inside_aten()) ReadTrace::named_begin(op_name(fn.name(), fn.overload_name()));
  return nullptr;
}

void name_end(const at::RecordFunction& /*fn*/, at::ObserverContext* /*context*/) {
  if (names_inside_aten()) ReadTrace::named_end();
}

// The name observer, installed for the thread while a trace that takes
// names lives. Installed around each ATen op instead, it would make PyTorch
// rebuild its callback lists twice per op; installed for the trace, every op
// of the traced code pays one RecordFunction that returns at once.
thread_local int name_observer_users = 0;
thread_local at::CallbackHandle name_observer = 0;

void acquire_name_observer() {
  if (name_observer_users == 0) {
    name_observer = at::addThreadLocalCallback(at::RecordFunctionCallback(&name_start, &name_end)
                                                   .needsInputs(false)
                                                   .needsOutputs(false)
                                                   .scopes({at::RecordScope::FUNCTION}));
  }
  ++name_observer_users;
}

void release_name_observer() {
  if (--name_observer_users == 0) at::removeCallback(name_observer);
}

// Runs an ATen op with the trace key off and the thread's `count` raised:
// tls_inside_aten keeps its callees on the name observer; tls_callees_known
// keeps them from every observer, the trace knowing them already.
class AtenOpRun {
 public:
  explicit AtenOpRun(int& count) : count_(count) { ++count_; }
  ~AtenOpRun() { --count_; }
  AtenOpRun(const AtenOpRun&) = delete;
  AtenOpRun& operator=(const AtenOpRun&) = delete;

 private:
  int& count_;
  c10::impl::ExcludeDispatchKeyGuard off_{kTraceKey};
};

}  // namespace

void begin_untraced() {
  if (tls_untraced++ == 0) tls_untraced_from = cpu_allocation_epoch().value_or(0);
}

void end_untraced() {
  if (tls_untraced == 0 || --tls_untraced > 0) return;
  const uint64_t to = cpu_allocation_epoch().value_or(0);
  if (to == tls_untraced_from) return;  // nothing allocated meanwhile
  for (ReadTrace* t = tls_active; t != nullptr; t = t->previous_) {
    if (t->active_) t->untraced_epochs_.emplace_back(tls_untraced_from, to);
  }
}

bool untraced() {
  return tls_untraced > 0;
}

UntracedScope::UntracedScope() {
  begin_untraced();
}

UntracedScope::~UntracedScope() {
  end_untraced();
}

// The trace's observation point: see Note [Why a mode-key fallback and not
// RecordFunction] in the header.
TORCH_LIBRARY_IMPL(_, TESTING_ONLY_GenericMode, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&trace_fallback>());
}

// Note [A read of values no op makes] in the header. A fragment: the Python
// module defines the library's other ops.
TORCH_LIBRARY_FRAGMENT(reloadsafe, m) {
  m.def("host_read(Tensor self) -> ()", [](const at::Tensor& /*self*/) {});
}

void note_host_read(const at::Tensor& t) {
  static const c10::TypedOperatorHandle<void(const at::Tensor&)> op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow(kHostReadOp.data(), "")
          .typed<void(const at::Tensor&)>();
  op.call(t);
}

ReadTrace::ReadTrace(Options options) : options_(options) {
  ops_.reserve(options_.expected_records);
  // A forward reads a handful of storages: one table allocation, not a
  // rehash every few inserts while the trace is young.
  seen_.reserve(16);
  start_epoch_ = cpu_allocation_epoch().value_or(0);
  owner_ = std::this_thread::get_id();
  if (options_.nested && !options_.aten_callee_reads && !options_.names_on_demand) {
    observe_names();  // first: nothing else to undo if it throws
  }
  previous_ = tls_active;
  tls_active = this;
  include_.emplace(kTraceKey);
  active_ = true;
}

ReadTrace::~ReadTrace() {
  if (active_ && std::this_thread::get_id() != owner_) {
    // Destructors must not throw; the thread-local state of the owner cannot
    // be repaired from here.
    TORCH_WARN(
        "reloadsafe::trace::ReadTrace destroyed on another thread than the one that "
        "started it; call stop() on the owning thread");
    return;
  }
  stop();
}

void ReadTrace::stop() {
  if (!active_) return;
  TORCH_CHECK(std::this_thread::get_id() == owner_,
              "ReadTrace::stop() must run on the thread that started the trace");
  include_.reset();
  tls_active = previous_;
  active_ = false;
  if (observes_names_) {
    observes_names_ = false;
    release_name_observer();
  }
}

void ReadTrace::observe_names() {
  if (observes_names_) return;
  acquire_name_observer();
  observes_names_ = true;
}

// See Note [Inside or before the scope].
void ReadTrace::resolve_pending(size_t first_op,
                                const std::vector<const c10::StorageImpl*>& returned) {
  for (const c10::StorageImpl* impl : pending_) {
    if (std::find(returned.begin(), returned.end(), impl) == returned.end()) continue;
    seen_.at(impl).external = false;
    for (size_t i = first_op; i < ops_.size(); ++i) {
      for (TensorRead& r : ops_[i].reads) {
        if (r.storage == impl) r.external = false;
      }
    }
  }
  pending_.clear();
}

std::vector<std::pair<size_t, TensorRead>> ReadTrace::external_reads() const {
  std::vector<std::pair<size_t, TensorRead>> out;
  for (size_t i = 0; i < ops_.size(); ++i) {
    for (const auto& r : ops_[i].reads) {
      if (r.external) out.emplace_back(i, r);
    }
  }
  return out;
}

std::optional<bool> ReadTrace::classify(const c10::StorageImpl* storage) const {
  auto it = seen_.find(storage);
  if (it == seen_.end()) return std::nullopt;
  return it->second.external;
}

void ReadTrace::fill_read(TensorRead& r, const at::Tensor& t, int arg, int element,
                          const SparsePart* part, const c10::Argument& schema_arg) {
  r.arg = arg;
  r.element = element;
  r.arg_name = schema_arg.name();
  if (part != nullptr) {
    r.part = part->index;
    r.arg_name += std::string(".") + part->name;
  }
  r.written = schema_arg.alias_info() != nullptr && schema_arg.alias_info()->isWrite();
  r.subclass = dispatches_in_python(t);
  r.has_storage = !r.subclass && t.has_storage();
  r.reset_to(t);
  if (!r.has_storage) {
    // Nothing addressable to compare; treated as external so that it is
    // reported rather than silently ignored.
    r.external = true;
    return;
  }
  r.external = classify_read(t, t.storage().unsafeGetStorageImpl(), &r.allocation_epoch);
}

bool ReadTrace::classify_read(const at::Tensor& t, c10::StorageImpl* impl,
                              uint64_t* allocation_epoch) {
  auto it = seen_.find(impl);
  if (it != seen_.end()) {
    if (allocation_epoch != nullptr) *allocation_epoch = it->second.allocation_epoch;
    return it->second.external;
  }
  const c10::Device device = t.device();
  const std::optional<uint64_t> epoch = device.is_cpu() && impl->data() != nullptr
                                            ? cpu_allocation_epoch_of(impl->data())
                                            : std::nullopt;
  const bool external = existed_before(device, epoch);
  seen_.emplace(impl,
                Seen{external, epoch.value_or(0),
                     c10::weak_intrusive_ptr<c10::StorageImpl>(t.storage().getWeakStorageImpl())});
  if (external && depth_ > 0 && !device.is_cpu()) pending_.push_back(impl);
  if (allocation_epoch != nullptr) *allocation_epoch = epoch.value_or(0);
  return external;
}

// Note [Inside or before the scope]
// A storage first seen as an argument is usually one that existed before the
// scope, but kernels also make tensors without an op (structured kernels
// allocate their outputs directly) and hand them to the ops they call. On
// the CPU the trace asks the allocation census (memory_census.h, installed
// by the trace): a block allocated after the trace started is internal,
// whoever allocated it. Elsewhere a storage first seen inside a nested op is
// provisional: it becomes internal if the enclosing top-level op returns it.
bool ReadTrace::existed_before(const c10::Device& device, std::optional<uint64_t> epoch) const {
  if (device.is_cpu()) {
    if (!epoch || *epoch <= start_epoch_) return true;
    // Made by code that was not the traced code's work: it lives on.
    return std::any_of(untraced_epochs_.begin(), untraced_epochs_.end(), [&](const auto& range) {
      return *epoch > range.first && *epoch <= range.second;
    });
  }
  return true;
}

void ReadTrace::note_result(const at::Tensor& t) {
  if (!has_plain_storage(t)) return;
  const c10::Storage& storage = t.storage();
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  // Seen already (an in-place op's result, a view of an argument): nothing
  // to make, not even the weak reference.
  if (seen_.find(impl) != seen_.end()) return;
  // First seen as a result: made inside the scope.
  seen_.emplace(
      impl,
      Seen{false, 0, c10::weak_intrusive_ptr<c10::StorageImpl>(storage.getWeakStorageImpl())});
}

namespace {

// The object `v` (a TorchBind script object) handed as argument `arg`, by its
// identities only.
ObjectRead object_at(const c10::IValue& v, int arg) {
  const c10::ivalue::Object& obj = v.toObjectRef();
  ObjectRead o;
  o.arg = arg;
  o.identity = &obj;
  const std::vector<c10::IValue>& slots = obj.slots();
  if (!slots.empty() && slots[0].isCapsule()) o.payload = slots[0].internalToPointer();
  return o;
}

// The tensors a record reads from the object `v`: `on_read(tensor, index)`
// for each it reports on two calls in a row on the same plain storage, with
// its index among the reported ones. Returns where they came from (null if
// the object cannot report).
template <typename OnRead>
const char* for_each_object_read(const c10::IValue& v, OnRead&& on_read) {
  const ReportedTensors first = reported_tensors(v);
  if (first.source == nullptr || first.tensors.empty()) return first.source;
  const std::vector<at::Tensor> second = reported_tensors(v).tensors;
  for (size_t k = 0; k < first.tensors.size() && k < second.size(); ++k) {
    const at::Tensor& t = first.tensors[k];
    if (has_plain_storage(t) && has_plain_storage(second[k]) &&
        t.storage().unsafeGetStorageImpl() == second[k].storage().unsafeGetStorageImpl()) {
      on_read(t, static_cast<int>(k));
    }
  }
  return first.source;
}

}  // namespace

void ReadTrace::add_object(OpCall& call, const c10::IValue& v, int arg,
                           const c10::Argument& schema_arg) {
  ObjectRead o = object_at(v, arg);
  o.made = made_objects_.count(o.identity) > 0;
  o.arg_name = schema_arg.name();
  o.class_name = short_class_name(v.toObjectRef());
  objects_seen_.push_back(v);
  const size_t first_read = call.reads.size();
  const char* source = for_each_object_read(v, [&](const at::Tensor& t, int k) {
    TensorRead& r = call.reads.emplace_back();
    fill_read(r, t, arg, k, /*part=*/nullptr, schema_arg);
    r.object = o.identity;
  });
  for (size_t j = first_read; j < call.reads.size(); ++j) {
    TensorRead& r = call.reads[j];
    r.arg_name = o.arg_name + "." + source + "[" + std::to_string(r.element) + "]";
  }
  call.objects.push_back(std::move(o));
}

bool ReadTrace::match_object(const ObjectRead& expected, const c10::IValue& object, int arg,
                             c10::function_ref<void(const at::Tensor&, int)> on_read) {
  const ObjectRead o = object_at(object, arg);
  if (o.arg != expected.arg || !same_object(expected, o)) return false;
  for_each_object_read(object, on_read);
  return true;
}

// Note [Holding runs no op]
// Everything the trace does besides redispatching (reading arguments,
// asking an object for its tensors, running its hook: a capture holding the
// arguments) runs with the trace key excluded. Holding a Python subclass
// tensor by detaching it would call the subclass's __torch_dispatch__, whose
// ops a trace whose hook holds arguments (the capture) would record and a
// trace without (a retrace) would not: the two op sequences would differ for
// a layer that changed nothing.
void ReadTrace::begin_call(const c10::OperatorHandle& op, const c10::FunctionSchema& schema,
                           c10::ArrayRef<c10::IValue> args, CallInProgress& progress, bool aten_op,
                           bool alone) {
  if (!options_.nested && depth_ > 0) {
    ++depth_;
    return;
  }
  // The fallback always has every argument; an observer may have none (see
  // Note [Inside a subclass's dispatch]): the op is then recorded without reads.
  size_t num_args = args.size() >= schema.arguments().size() ? schema.arguments().size() : 0;
  if (aten_depth_ >= 0) {
    num_args = 0;  // Note [Inside an ATen op]: by name only
    progress.named = true;
  } else if (aten_op && !options_.aten_callee_reads) {
    aten_depth_ = depth_;
    progress.opens_aten = true;
  }
  const c10::IValue* call_args = args.data() + (args.size() - num_args);
  const size_t position = calls_++;
  progress.first_op = ops_.size();
  progress.recorded = true;
  CallHook* hook = options_.hook;
  if (hook != nullptr && hook->skip(*this, position, depth_, schema,
                                    c10::ArrayRef<c10::IValue>(call_args, num_args))) {
    if (progress.opens_aten && alone) {
      // Note [A retrace that knows an ATen op's callees] in capture.cc.
      if (const std::optional<size_t> known = hook->known_callees(position)) {
        calls_ += *known;
        progress.callees_known = true;
      }
    }
    ++depth_;
    return;
  }
  try {
    record(schema, call_args, num_args, progress.opens_aten);
  } catch (...) {
    --calls_;
    progress.recorded = false;
    throw;
  }
  ++records_;
  if (hook != nullptr) {
    const bool droppable = !reads_pending(ops_.back());
    if (!hook->keep(position, ops_.back(), droppable) && droppable) {
      ops_.pop_back();
    } else if (depth_ == 0) {
      hook->top_level_begin(*this, op, c10::ArrayRef<c10::IValue>(call_args, num_args));
      progress.hooked = true;
    }
  }
  ++depth_;
}

// Recorded in place (no OpCall or TensorRead is moved into the list); a call
// whose recording throws is taken off again.
void ReadTrace::record(const c10::FunctionSchema& schema, const c10::IValue* args, size_t num_args,
                       bool opens_aten) {
  ops_.emplace_back();
  try {
    OpCall& call = ops_.back();
    call.name = op_name(schema);
    call.depth = depth_;
    call.callees_named = opens_aten;
    if ((depth_ == 0 || opens_aten) && (num_args > 0 || schema.arguments().empty())) {
      const std::optional<uint64_t> constants = fingerprint_of(args, num_args);
      call.constants_known = constants.has_value();
      call.constants = constants.value_or(0);
    }
    for_each_read(
        args, num_args,
        [&](const at::Tensor& t, int arg, int element, const SparsePart* part) {
          fill_read(call.reads.emplace_back(), t, arg, element, part, schema.arguments()[arg]);
        },
        [&](const c10::IValue& object, int arg) {
          add_object(call, object, arg, schema.arguments()[arg]);
        });
  } catch (...) {
    ops_.pop_back();
    throw;
  }
}

std::optional<bool> ReadTrace::classify_first_sight(const at::Tensor& t, c10::StorageImpl* impl) {
  const bool external = classify_read(t, impl);
  if (is_pending(impl)) return std::nullopt;
  return external;
}

bool ReadTrace::is_pending(const void* storage) const {
  return !pending_.empty() &&
         std::find(pending_.begin(), pending_.end(), storage) != pending_.end();
}

bool ReadTrace::reads_pending(const OpCall& call) const {
  return std::any_of(call.reads.begin(), call.reads.end(),
                     [&](const TensorRead& r) { return is_pending(r.storage); });
}

void ReadTrace::end_call(const c10::OperatorHandle& op, const c10::FunctionSchema& schema,
                         c10::ArrayRef<c10::IValue> stack, CallInProgress& progress) {
  --depth_;
  if (progress.opens_aten) aten_depth_ = -1;
  if (!progress.recorded || progress.named) return;  // a named call's results are not noted
  const size_t num_returns = stack.size() >= schema.returns().size() ? schema.returns().size() : 0;
  c10::SmallVector<const c10::StorageImpl*, 4> returned;
  auto result = [&](const at::Tensor& t) {
    note_result(t);
    if (has_plain_storage(t)) returned.push_back(t.storage().unsafeGetStorageImpl());
  };
  for (size_t i = stack.size() - num_returns; i < stack.size(); ++i) {
    for_each_tensor(stack[i], [&](const at::Tensor& t, int) { result(t); });
    // Note [An object the forward makes]
    // An op may return an opaque object that a later op of the same forward
    // is handed: torch.profiler.record_function's handle (which FSDP2's
    // forward opens), entered by one op and exited by another. Such an
    // object is the forward's own, as a tensor the forward makes is: every
    // forward makes a new one, and no captured graph could hold one across
    // replays. A later read of it is marked made (ObjectRead::made): not an
    // undeclared read, not compared by identity with the capture's, and
    // replayed as what the replay's own call made in its place.
    if (stack[i].isObject()) {
      made_objects_.insert(&stack[i].toObjectRef());
      objects_seen_.push_back(stack[i]);
    }
  }
  if (depth_ == 0 && !pending_.empty()) {
    resolve_pending(progress.first_op,
                    std::vector<const c10::StorageImpl*>(returned.begin(), returned.end()));
  }
  if (progress.hooked) {
    options_.hook->top_level_end(
        *this, op, c10::ArrayRef<c10::IValue>(stack.end() - num_returns, num_returns));
  }
}

void ReadTrace::abandon_call(const CallInProgress& progress) {
  --depth_;
  if (progress.opens_aten) aten_depth_ = -1;
}

void ReadTrace::named_begin(std::string_view name) {
  for (ReadTrace* t = tls_active; t != nullptr; t = t->previous_) {
    if (t->active_) t->begin_named(name);
  }
}

void ReadTrace::named_end() {
  for (ReadTrace* t = tls_active; t != nullptr; t = t->previous_) {
    if (t->active_) t->end_named();
  }
}

void ReadTrace::begin_named(std::string_view name) {
  if (!options_.nested) {  // only inside an op: depth_ > 0
    ++depth_;
    return;
  }
  const size_t position = calls_++;
  CallHook* hook = options_.hook;
  if (hook == nullptr || !hook->skip_named(position, depth_, name)) {
    OpCall& call = ops_.emplace_back();
    call.name = name;
    call.depth = depth_;
    ++records_;
    if (hook != nullptr && !hook->keep(position, call, /*droppable=*/true)) ops_.pop_back();
  }
  ++depth_;
}

c10::SmallVector<ReadTrace*, 4> ReadTrace::active_chain(ReadTrace* innermost) {
  c10::SmallVector<ReadTrace*, 4> chain;
  for (ReadTrace* t = innermost; t != nullptr; t = t->previous_) {
    if (t->active_) chain.push_back(t);
  }
  return chain;
}

// Note [Inside a subclass's dispatch]
// While a __torch_dispatch__ runs (a wrapper subclass's, or a Python mode's),
// PyTorch excludes every dispatch key above Python for the thread, this
// trace's key included: the ops the subclass calls on its inner tensors never
// reach the fallback. For exactly that stretch (the redispatch of an op that
// goes on to Python) the trace adds a thread-local RecordFunction observer,
// which the dispatcher calls at the entry of every op whatever the dispatch
// keys. Ops called from Python arrive boxed, with every argument; an op that
// arrives with fewer inputs than its schema has is recorded without reads
// (begin_call). The observer records an
// op only while the trace key is excluded (else the fallback sees it: a
// subclass that restores the dispatch state it was called with), and never
// the ops the trace itself runs (Bookkeeping). Outside such a stretch no
// observer is installed, so a forward of plain tensors pays nothing for it.
struct ReadTrace::ObservedCall final : at::ObserverContext {
  explicit ObservedCall(c10::OperatorHandle handle) : op(std::move(handle)) {}
  c10::OperatorHandle op;
  c10::SmallVector<ReadTrace*, 4> chain;
  c10::SmallVector<CallInProgress, 4> progress;
};

namespace {

std::unique_ptr<at::ObserverContext> observe_op_start(const at::RecordFunction& fn) {
  if (tls_active == nullptr || tls_bookkeeping > 0 || tls_untraced > 0) return nullptr;
  if (tls_inside_aten > 0) return nullptr;    // the name observer's (Note [Inside an ATen op])
  if (tls_callees_known > 0) return nullptr;  // counted already
  if (!c10::impl::tls_is_dispatch_key_excluded(kTraceKey)) return nullptr;  // the fallback's
  const std::optional<c10::OperatorName> name = fn.operator_name();
  if (!name) return nullptr;
  std::optional<c10::OperatorHandle> op = c10::Dispatcher::singleton().findOp(*name);
  if (!op) return nullptr;
  const c10::ArrayRef<const c10::IValue> inputs = fn.inputs();
  return ReadTrace::observed_begin(*op, c10::ArrayRef<c10::IValue>(inputs.data(), inputs.size()));
}

void observe_op_end(const at::RecordFunction& fn, at::ObserverContext* context) {
  if (context == nullptr) return;
  ReadTrace::observed_end(static_cast<ReadTrace::ObservedCall&>(*context), fn.outputs());
}

// Installs the observer for the thread while at least one of these lives.
class ObserveInsidePython {
 public:
  explicit ObserveInsidePython(bool on) : on_(on) {
    if (!on_ || users_++ > 0) return;
    handle_ =
        at::addThreadLocalCallback(at::RecordFunctionCallback(&observe_op_start, &observe_op_end)
                                       .needsInputs(true)
                                       .needsOutputs(true)
                                       .scopes({at::RecordScope::FUNCTION}));
  }
  ~ObserveInsidePython() {
    if (on_ && --users_ == 0) at::removeCallback(handle_);
  }
  ObserveInsidePython(const ObserveInsidePython&) = delete;
  ObserveInsidePython& operator=(const ObserveInsidePython&) = delete;

 private:
  bool on_;
  static thread_local int users_;
  static thread_local at::CallbackHandle handle_;
};
thread_local int ObserveInsidePython::users_ = 0;
thread_local at::CallbackHandle ObserveInsidePython::handle_ = 0;

}  // namespace

std::unique_ptr<ReadTrace::ObservedCall> ReadTrace::observed_begin(
    const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  auto call = std::make_unique<ObservedCall>(op);
  call->chain = active_chain(tls_active);
  call->progress.resize(call->chain.size());
  OwnWork own;
  const c10::FunctionSchema& schema = call->op.schema();
  for (size_t k = 0; k < call->chain.size(); ++k)
    call->chain[k]->begin_call(call->op, schema, args, call->progress[k], /*aten_op=*/false,
                               /*alone=*/false);
  return call;
}

void ReadTrace::observed_end(ObservedCall& call, c10::ArrayRef<c10::IValue> returns) {
  OwnWork own;
  const c10::FunctionSchema& schema = call.op.schema();
  for (size_t k = 0; k < call.chain.size(); ++k)
    call.chain[k]->end_call(call.op, schema, returns, call.progress[k]);
}

// Note [One trace or a chain]
// Almost always one trace is active on the thread: the fallback then runs
// that trace's begin_call and end_call around the op with one progress
// record on the stack. Only when traces nest does it gather the active ones
// into a chain (innermost first) and run each of them around the op; the
// two paths share run_around, inlined into each so that the one-trace path
// loops over a count it knows is 1.
C10_ALWAYS_INLINE void ReadTrace::run_around(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                                             torch::jit::Stack* stack, ReadTrace* const* traces,
                                             CallInProgress* progress, size_t count) {
  const c10::FunctionSchema& schema = op.schema();
  const bool to_python = dispatch_goes_to_python(ks);
  const bool aten_op = !to_python && is_aten_op(schema);
  bool read = false;   // some trace records the arguments of the ops this one calls
  bool named = false;  // some trace records them by name (Note [Inside an ATen op])
  bool known = false;  // the one trace knows them (CallHook::known_callees)
  {
    OwnWork own;
    for (size_t k = 0; k < count; ++k) {
      traces[k]->begin_call(op, schema, *stack, progress[k], aten_op, count == 1);
      if (progress[k].callees_known) {
        known = true;
        continue;
      }
      if (!traces[k]->callees_unread()) {
        read = true;
      } else if (traces[k]->records_nested()) {
        named = true;
        traces[k]->observe_names();
      }
    }
  }
  try {
    if (read || (named && !at::isRecordFunctionEnabled())) {
      // See Note [Inside a subclass's dispatch].
      ObserveInsidePython observe(to_python);
      op.redispatchBoxed(below_trace_key(ks), stack);
    } else if (named || known) {
      AtenOpRun run(named ? tls_inside_aten : tls_callees_known);
      op.redispatchBoxed(below_trace_key(ks), stack);
    } else {
      c10::impl::ExcludeDispatchKeyGuard off(kTraceKey);
      op.redispatchBoxed(below_trace_key(ks), stack);
    }
  } catch (...) {
    for (size_t k = 0; k < count; ++k) traces[k]->abandon_call(progress[k]);
    throw;
  }
  OwnWork own;
  for (size_t k = 0; k < count; ++k) traces[k]->end_call(op, schema, *stack, progress[k]);
}

void ReadTrace::dispatch(ReadTrace* innermost, const c10::OperatorHandle& op,
                         c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  // See Note [One trace or a chain].
  if (innermost->active_ && innermost->previous_ == nullptr) {
    CallInProgress progress;
    run_around(op, ks, stack, &innermost, &progress, 1);
    return;
  }
  // Every trace active on this thread records the call, innermost first.
  const c10::SmallVector<ReadTrace*, 4> chain = active_chain(innermost);
  c10::SmallVector<CallInProgress, 4> progress(chain.size());
  run_around(op, ks, stack, chain.data(), progress.data(), chain.size());
}

}  // namespace reloadsafe::trace
