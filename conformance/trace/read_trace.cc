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

#include "conformance/trace/read_trace.h"

#include "conformance/trace/memory_census.h"
#include "conformance/trace/op_arguments.h"

#include <ATen/core/stack.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <ATen/autocast_mode.h>
#include <ATen/core/function.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <mutex>
#include <string_view>
#include <unordered_set>

namespace reloadsafe::trace {
namespace {

// The trace recording on this thread, if any.
thread_local ReadTrace* tls_active = nullptr;

// > 0 while a trace reads, holds or asks an object on this thread: the ops
// that runs are the trace's own, and the observer of Note [Inside a
// subclass's dispatch] must not record them.
thread_local int tls_bookkeeping = 0;

struct Bookkeeping {
  Bookkeeping() { ++tls_bookkeeping; }
  ~Bookkeeping() { --tls_bookkeeping; }
  Bookkeeping(const Bookkeeping&) = delete;
  Bookkeeping& operator=(const Bookkeeping&) = delete;
};

// The trace's own work around one op (recording its arguments, holding them,
// noting its results), for every trace of the chain at once: the trace key
// off (Note [Holding runs no op]) and the observer told (Bookkeeping).
struct OwnWork {
  c10::impl::ExcludeDispatchKeyGuard off{kTraceKey};
  Bookkeeping bookkeeping;
};

// Note [Op names]
// A call names its op by a view of one string per distinct "ns::op.overload"
// made once for the process and never freed: recording a call copies no
// name. A thread-local table of a few slots, indexed by the schema's
// address, finds that string without a lock; a schema freed with its library
// can leave its address to another, so a hit is confirmed against the
// schema's name and overload before it is used.
bool is_name_of(std::string_view full, const c10::FunctionSchema& schema) {
  const std::string& name = schema.name();
  const std::string& overload = schema.overload_name();
  if (overload.empty()) return full == name;
  return full.size() == name.size() + 1 + overload.size() &&
         full.compare(0, name.size(), name) == 0 && full[name.size()] == '.' &&
         full.compare(name.size() + 1, overload.size(), overload) == 0;
}

std::string_view interned(std::string name) {
  static std::mutex mutex;
  static auto* names = new std::unordered_set<std::string>();  // never freed: views outlive exit
  std::lock_guard<std::mutex> lock(mutex);
  return *names->insert(std::move(name)).first;
}

std::string_view op_name(const c10::FunctionSchema& schema) {
  struct Slot {
    const c10::FunctionSchema* schema = nullptr;
    std::string_view name;
  };
  thread_local std::array<Slot, 64> slots;
  Slot& slot = slots[(reinterpret_cast<uintptr_t>(&schema) >> 4) % slots.size()];
  if (slot.schema != &schema || !is_name_of(slot.name, schema)) {
    const std::string& overload = schema.overload_name();
    slot.schema = &schema;
    slot.name = interned(overload.empty() ? schema.name() : schema.name() + "." + overload);
  }
  return slot.name;
}

// Note [The other arguments' fingerprint]
// A graph bakes in more than addresses: the numbers, shapes and flags an op
// is launched with. Each top-level op gets a 64-bit fingerprint of
// every argument that is not a tensor read or an opaque object (a nested
// op's follow from its top-level op's, and are not computed), so that a
// capture and a retrace can tell whether the same op was handed the same
// values. Words are folded in FNV-1a's way, a 64-bit word at a time: each
// step is a bijection of the running hash for a given word, so two argument
// lists that differ in a single word always differ in their fingerprint.
// Each value is hashed with a tag of its kind, so 1 and 1.0 and
// true differ; a double by its bits (-0.0 and 0.0 differ: never equal when
// unsure). A tensor counts by what is not a read: a wrapped number by its
// dtype and value, a Python subclass tensor by its identity (the capture
// holds that very object), a plain tensor by its presence only (its place
// is compared as a read). A value of a kind not listed makes the op's
// fingerprint unknown.
class Fingerprint {
 public:
  uint64_t value() const { return hash_; }

  /// Adds `v`; false if it is of a kind that has no fingerprint.
  bool add(const c10::IValue& v) {
    if (v.isNone()) return word(1);
    if (v.isBool()) return word(2) && word(v.toBool());
    if (v.isInt()) return word(3) && word(static_cast<uint64_t>(v.toInt()));
    if (v.isDouble()) return word(4) && real(v.toDouble());
    if (v.isComplexDouble()) {
      const c10::complex<double> c = v.toComplexDouble();
      return word(5) && real(c.real()) && real(c.imag());
    }
    if (v.isString()) return word(6) && word(std::hash<std::string_view>{}(v.toStringView()));
    if (v.isDevice()) {
      const c10::Device d = v.toDevice();
      return word(7) && word(static_cast<uint64_t>(d.type())) && word(d.index());
    }
    if (v.isSymInt()) {
      const auto i = v.toSymInt().maybe_as_int();
      return i.has_value() && word(3) && word(static_cast<uint64_t>(*i));
    }
    if (v.isTensor()) return tensor(v.toTensor());
    if (v.isObject()) return word(8);  // compared as an ObjectRead
    if (v.isTuple()) return sequence(9, v.toTupleRef().elements());
    if (v.isList()) return sequence(10, v.toListRef());
    return false;
  }

 private:
  bool word(uint64_t w) {
    hash_ = (hash_ ^ w) * 0x100000001b3ULL;
    return true;
  }
  bool real(double d) {
    uint64_t bits = 0;
    std::memcpy(&bits, &d, sizeof bits);
    return word(bits);
  }
  template <typename Values>
  bool sequence(uint64_t tag, const Values& values) {
    word(tag);
    word(values.size());
    for (const c10::IValue& e : values) {
      if (!add(e)) return false;
    }
    return true;
  }
  bool tensor(const at::Tensor& t) {
    if (!t.defined()) return word(11);
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
      // A 0-dim CPU scalar of a double, an int64, a bool or a complex.
      word(12);
      word(static_cast<uint64_t>(t.scalar_type()));
      const auto* bytes = static_cast<const unsigned char*>(t.const_data_ptr());
      for (int64_t i = 0; i < t.element_size(); ++i) word(bytes[i]);
      return true;
    }
    if (dispatches_in_python(t)) {
      return word(13) && word(reinterpret_cast<uintptr_t>(t.unsafeGetTensorImpl()));
    }
    return word(14);
  }

  uint64_t hash_ = 0xcbf29ce484222325ULL;
};

// The fingerprint of a top-level call's `num_args` arguments, or nothing if
// one has no fingerprint.
std::optional<uint64_t> fingerprint_of(const c10::IValue* args, size_t num_args) {
  Fingerprint constants;
  for (size_t i = 0; i < num_args; ++i) {
    if (!constants.add(args[i])) return std::nullopt;
  }
  return constants.value();
}

// What a call reads, the one rule for recording a call and for telling it
// against an expected one: on_read(tensor, arg, element) for every tensor
// argument that is a memory read (defined, and not a wrapped number such as
// Python's `x * 0.5` makes), on_object(value, arg) for every opaque object,
// in argument order.
template <typename OnRead, typename OnObject>
void for_each_read(const c10::IValue* args, size_t num_args, OnRead&& on_read,
                   OnObject&& on_object) {
  for (size_t i = 0; i < num_args; ++i) {
    const int arg = static_cast<int>(i);
    for_each_in_argument(
        args[i],
        [&](const at::Tensor& t, int element) {
          if (t.defined() && !t.unsafeGetTensorImpl()->is_wrapped_number()) {
            on_read(t, arg, element);
          }
        },
        [&](const c10::IValue& object) { on_object(object, arg); });
  }
}

void trace_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                    torch::jit::Stack* stack) {
  ReadTrace* trace = tls_active;
  if (trace == nullptr) {
    // The key was included by someone else: stay out of the way.
    c10::impl::ExcludeDispatchKeyGuard off(kTraceKey);
    op.redispatchBoxed(ks.remove(kTraceKey), stack);
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

// TorchBind qualifies its classes as "__torch__.torch.classes.<ns>.<Name>".
std::string short_class_name(const c10::ivalue::Object& obj) {
  std::string name = obj.type()->name() ? obj.type()->name()->qualifiedName() : obj.type()->str();
  constexpr const char* kPrefix = "__torch__.torch.classes.";
  if (name.rfind(kPrefix, 0) == 0) name = name.substr(std::strlen(kPrefix));
  return name;
}

struct ObjectTensorRegistry {
  std::mutex mutex;
  std::unordered_map<std::string, ObjectTensors> by_class;
};

ObjectTensorRegistry& object_tensor_registry() {
  static auto* registry = new ObjectTensorRegistry();
  return *registry;
}

// The tensors `object` reports, and the name of the source ("unpack()" or
// "tensors"), or nothing. Runs with the trace key excluded; never throws.
std::pair<std::vector<at::Tensor>, const char*> reported_tensors(const c10::IValue& object) {
  std::vector<at::Tensor> out;
  try {
    c10::impl::ExcludeDispatchKeyGuard off(kTraceKey);
    const c10::ivalue::Object& obj = object.toObjectRef();
    ObjectTensors fn;
    {
      ObjectTensorRegistry& registry = object_tensor_registry();
      std::lock_guard<std::mutex> lock(registry.mutex);
      for (const std::string& key : {obj.type()->str(), short_class_name(obj)}) {
        auto it = registry.by_class.find(key);
        if (it != registry.by_class.end()) fn = it->second;
      }
    }
    if (fn) return {fn(object), "tensors"};
    torch::jit::Function* unpack = obj.type()->findMethod("unpack");
    if (unpack == nullptr || unpack->getSchema().arguments().size() != 1) return {out, nullptr};
    torch::jit::Stack stack{object};
    unpack->run(stack);
    std::function<void(const c10::IValue&)> collect = [&](const c10::IValue& v) {
      if (v.isTensor()) {
        out.push_back(v.toTensor());
      } else if (v.isTuple()) {
        for (const c10::IValue& e : v.toTupleRef().elements()) collect(e);
      } else if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorList().vec()) out.push_back(t);
      }
    };
    for (const c10::IValue& v : stack) collect(v);
    return {out, "unpack()"};
  } catch (const std::exception&) {
    return {{}, nullptr};  // an object that cannot report reports nothing
  }
}

}  // namespace

bool same_op(const OpCall& a, const OpCall& b) {
  return a.name == b.name && a.depth == b.depth && a.reads.size() == b.reads.size() &&
         a.objects.size() == b.objects.size();
}

bool same_object(const ObjectRead& a, const ObjectRead& b) {
  // A TorchBind object handed to its op from C++ (IValue of an intrusive_ptr
  // of a custom class) is wrapped in a new script object on every call: the
  // C++ instance it holds is what the kernel reads, and the object's identity.
  if (a.payload != nullptr || b.payload != nullptr) return a.payload == b.payload;
  return a.identity == b.identity;
}

bool same_call(const OpCall& a, const OpCall& b) {
  if (!same_op(a, b)) return false;
  if (a.depth == 0 && !(a.constants_known && b.constants_known && a.constants == b.constants)) {
    return false;
  }
  for (size_t j = 0; j < a.objects.size(); ++j) {
    if (!same_object(a.objects[j], b.objects[j])) return false;
  }
  for (size_t j = 0; j < a.reads.size(); ++j) {
    const TensorRead& ra = a.reads[j];
    const TensorRead& rb = b.reads[j];
    if (ra.external != rb.external || ra.subclass != rb.subclass ||
        ra.has_storage != rb.has_storage || ra.arg != rb.arg || ra.element != rb.element) {
      return false;
    }
    if (ra.external && !ra.same_place(rb)) return false;
  }
  return true;
}

// Note [A checking retrace]
// A protocol retraces the forward after every reload and asks two questions
// of the retrace against the capture: what changed (compare) and whether the
// retrace is its own replay (replays_as). Both look at a call only to find
// what differs from the captured call at the same position, and a call that
// is the captured one in every respect either looks at (same_call) adds
// nothing to either answer. A trace made with Options::expected therefore
// keeps only the calls that differ, with their positions, and the count of
// all calls; compare and replays_as walk the kept calls by position and give
// the answers a full retrace gives (capture_test runs both on the same
// forward and requires the same answers).
//
// Each call is first told against the expected call from its arguments,
// without a record (is_expected_call): the same op name and depth, no
// opaque object, every tensor read from the same argument and element, as
// external as it was (a storage seen for the first time is classified on
// the spot, by the one rule a record uses too: classify_read) and not
// provisionally, and, if external, at the expected place
// (TensorLocation::is_place_of); for a top-level call, the other arguments'
// fingerprint known and equal. Whatever it cannot tell that way (an object,
// a tensor without a plain storage, a provisional storage, any difference)
// is recorded as any trace records it and then compared with
// same_call, so a call is dropped only if its record would have been the
// expected one. A call is never dropped while it reads a storage whose
// classification is provisional (Note [Inside or before the scope]): the end
// of its top-level call may still change it, and only a kept call can be
// changed. A forward that stayed put then costs a retrace no record for most
// calls, and nothing to walk or free afterwards.

// An external tensor is held as a new tensor object on the same storage with
// the same layout: later rebinding of the caller's object (set_data, a new
// parameter) does not change what the capture reads, as it would not change
// the addresses a CUDA graph baked in. Internal tensors keep their identity,
// which is how a replay maps them to the results it recomputes.
c10::IValue ReadTrace::hold_as_captured(const c10::IValue& v) const {
  auto snapshot = [this](const at::Tensor& t) -> at::Tensor {
    // A Python tensor is held as itself: detaching it would run its
    // subclass's dispatch (see Note [Holding runs no op]).
    if (!has_plain_storage(t)) return t;
    auto it = seen_.find(t.storage().unsafeGetStorageImpl());
    if (it == seen_.end() || !it->second.external) return t;
    return at::Tensor(t.unsafeGetTensorImpl()->shallow_copy_and_detach(
        /*version_counter=*/c10::VariableVersion(0), /*allow_tensor_metadata_change=*/false));
  };
  return map_tensors(v, snapshot);
}

// The trace's observation point: see Note [Why a mode-key fallback and not
// RecordFunction] in the header.
TORCH_LIBRARY_IMPL(_, TESTING_ONLY_GenericMode, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&trace_fallback>());
}

void register_object_tensors(const std::string& class_name, ObjectTensors fn) {
  TORCH_CHECK(!class_name.empty() && fn,
              "register_object_tensors: give a class name and a function");
  ObjectTensorRegistry& registry = object_tensor_registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  registry.by_class[class_name] = std::move(fn);
}

// The where() strings are built by appending: a report names every read, and
// a stream per string cost more than the rest of listing them.
std::string ObjectRead::where(std::string_view op_name) const {
  std::string s(op_name);
  s += " arg " + std::to_string(arg);
  if (!arg_name.empty()) s += " (" + arg_name + ")";
  return s;
}

std::string ObjectRead::describe() const {
  return class_name + "@" + to_hex(identity);
}

std::string TensorRead::where(std::string_view op_name) const {
  std::string s(op_name);
  s += " arg " + std::to_string(arg);
  if (element >= 0) s += "[" + std::to_string(element) + "]";
  if (!arg_name.empty()) s += " (" + arg_name + ")";
  return s;
}

ReadTrace::ReadTrace(Options options) : options_(options) {
  // A layer's forward: a few dozen ops, recorded without regrowing; a checking
  // trace keeps only the calls that differ, usually none.
  if (options_.expected == nullptr) ops_.reserve(32);
  // A forward reads a handful of storages: one table allocation, not a
  // rehash every few inserts while the trace is young.
  seen_.reserve(16);
  start_epoch_ = cpu_allocation_epoch().value_or(0);
  owner_ = std::this_thread::get_id();
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
                          const c10::Argument& schema_arg) {
  r.arg = arg;
  r.element = element;
  r.arg_name = schema_arg.name();
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
  r.external = classify_read(t, t.storage().unsafeGetStorageImpl());
}

bool ReadTrace::classify_read(const at::Tensor& t, c10::StorageImpl* impl) {
  auto it = seen_.find(impl);
  if (it != seen_.end()) return it->second.external;
  const c10::Device device = t.device();
  const bool external = existed_before(device, impl->data());
  seen_.emplace(
      impl,
      Seen{external, c10::weak_intrusive_ptr<c10::StorageImpl>(t.storage().getWeakStorageImpl())});
  if (external && depth_ > 0 && !device.is_cpu()) pending_.push_back(impl);
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
bool ReadTrace::existed_before(const c10::Device& device, const void* storage_data) const {
  if (device.is_cpu() && storage_data != nullptr) {
    const auto epoch = cpu_allocation_epoch_of(storage_data);
    return !(epoch && *epoch > start_epoch_);
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
      impl, Seen{false, c10::weak_intrusive_ptr<c10::StorageImpl>(storage.getWeakStorageImpl())});
}

void ReadTrace::add_object(OpCall& call, const c10::IValue& v, int arg,
                           const c10::Argument& schema_arg) {
  const c10::ivalue::Object& obj = v.toObjectRef();
  ObjectRead o;
  o.arg = arg;
  o.arg_name = schema_arg.name();
  o.class_name = short_class_name(obj);
  o.identity = &obj;
  if (obj.slots().size() > 0 && obj.getSlot(0).isCapsule()) {
    o.payload = obj.getSlot(0).toCapsule().get();
  }
  objects_seen_.push_back(v);
  // Tensors the object reports, where two calls agree on their storages.
  auto [first, source] = reported_tensors(v);
  if (source != nullptr && !first.empty()) {
    auto [second, again] = reported_tensors(v);
    for (size_t k = 0; k < first.size() && k < second.size(); ++k) {
      const at::Tensor& t = first[k];
      if (!has_plain_storage(t) || !has_plain_storage(second[k]) ||
          t.storage().unsafeGetStorageImpl() != second[k].storage().unsafeGetStorageImpl()) {
        continue;
      }
      TensorRead& r = call.reads.emplace_back();
      fill_read(r, t, arg, static_cast<int>(k), schema_arg);
      r.arg_name = o.arg_name + "." + source + "[" + std::to_string(k) + "]";
      r.object = o.identity;
    }
  }
  call.objects.push_back(std::move(o));
}

// Note [Holding runs no op]
// Everything the trace does besides redispatching (reading arguments,
// holding them for a capture, asking an object for its tensors) runs with
// the trace key excluded. Holding a Python subclass tensor by detaching it
// would call the subclass's __torch_dispatch__, whose ops a trace that
// holds arguments (the capture) would record and a trace that does not (a
// retrace) would not: the two op sequences would differ for a layer that
// changed nothing.
void ReadTrace::begin_call(const c10::OperatorHandle& op, const c10::FunctionSchema& schema,
                           c10::ArrayRef<c10::IValue> args, CallInProgress& progress) {
  if (!options_.nested && depth_ > 0) {
    ++depth_;
    return;
  }
  // The fallback always has every argument; an observer may have none (see
  // Note [Inside a subclass's dispatch]): the op is then recorded without reads.
  const size_t num_args = args.size() >= schema.arguments().size() ? schema.arguments().size() : 0;
  const size_t first = args.size() - num_args;

  progress.first_op = ops_.size();
  if (options_.expected != nullptr && !options_.hold_arguments &&
      calls_ < options_.expected->ops().size() &&
      is_expected_call(options_.expected->ops()[calls_], schema, args.data() + first, num_args)) {
    // See Note [A checking retrace]: the expected call, not recorded.
    ++calls_;
    progress.recorded = true;
    ++depth_;
    return;
  }
  // Recorded in place (no OpCall or TensorRead is moved into the list); a
  // call whose recording throws is taken off again.
  ops_.emplace_back();
  try {
    OpCall& call = ops_.back();
    call.name = op_name(schema);
    call.depth = depth_;
    const c10::IValue* call_args = args.data() + first;
    if (depth_ == 0 && (num_args > 0 || schema.arguments().empty())) {
      const std::optional<uint64_t> constants = fingerprint_of(call_args, num_args);
      call.constants_known = constants.has_value();
      call.constants = constants.value_or(0);
    }
    for_each_read(
        call_args, num_args,
        [&](const at::Tensor& t, int arg, int element) {
          fill_read(call.reads.emplace_back(), t, arg, element, schema.arguments()[arg]);
        },
        [&](const c10::IValue& object, int arg) {
          add_object(call, object, arg, schema.arguments()[arg]);
        });
    if (options_.hold_arguments && depth_ == 0) {
      progress.held_inputs.reserve(num_args);
      for (size_t i = first; i < args.size(); ++i)
        progress.held_inputs.push_back(hold_as_captured(args[i]));
    }
  } catch (...) {
    ops_.pop_back();
    throw;
  }
  progress.recorded = true;
  ++records_;
  const size_t position = calls_++;
  if (options_.expected != nullptr) {
    // See Note [A checking retrace].
    const std::vector<OpCall>& expected = options_.expected->ops();
    if (position < expected.size() && same_call(expected[position], ops_.back()) &&
        !reads_pending(ops_.back())) {
      ops_.pop_back();
    } else {
      positions_.push_back(position);
    }
  }
  ++depth_;
}

bool ReadTrace::is_expected_call(const OpCall& expected, const c10::FunctionSchema& schema,
                                 const c10::IValue* args, size_t num_args) {
  if (expected.depth != depth_ || !expected.objects.empty() ||
      (num_args == 0 && !schema.arguments().empty())) {
    return false;
  }
  if (!is_name_of(expected.name, schema)) return false;
  bool same = true;
  size_t j = 0;
  for_each_read(
      args, num_args,
      [&](const at::Tensor& t, int arg, int element) {
        same = same && j < expected.reads.size() &&
               is_expected_read(expected.reads[j], t, arg, element);
        ++j;
      },
      [&](const c10::IValue&, int) { same = false; });  // an object: recorded in full
  if (!same || j != expected.reads.size()) return false;
  if (depth_ > 0) return true;
  const std::optional<uint64_t> constants = fingerprint_of(args, num_args);
  return constants && expected.constants_known && *constants == expected.constants;
}

bool ReadTrace::is_expected_read(const TensorRead& expected, const at::Tensor& t, int arg,
                                 int element) {
  // A tensor without a plain storage is recorded in full.
  if (expected.arg != arg || expected.element != element || !expected.has_storage ||
      dispatches_in_python(t) || !t.has_storage()) {
    return false;
  }
  c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  if (classify_read(t, impl) != expected.external || is_pending(impl)) return false;
  return !expected.external || expected.is_place_of(t);
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
  if (!progress.recorded) return;
  const size_t num_returns = stack.size() >= schema.returns().size() ? schema.returns().size() : 0;
  c10::SmallVector<const c10::StorageImpl*, 4> returned;
  auto result = [&](const at::Tensor& t) {
    note_result(t);
    if (has_plain_storage(t)) returned.push_back(t.storage().unsafeGetStorageImpl());
  };
  for (size_t i = stack.size() - num_returns; i < stack.size(); ++i) {
    for_each_tensor(stack[i], [&](const at::Tensor& t, int) { result(t); });
  }
  if (depth_ == 0 && !pending_.empty()) {
    resolve_pending(progress.first_op,
                    std::vector<const c10::StorageImpl*>(returned.begin(), returned.end()));
  }
  if (options_.hold_arguments && depth_ == 0) {
    held_.push_back(HeldCall{op, std::move(progress.held_inputs),
                             std::vector<c10::IValue>(stack.end() - num_returns, stack.end()),
                             CallState::current()});
  }
}

CallState CallState::current() {
  CallState state;
  state.keys = c10::impl::tls_local_dispatch_key_set();
  // Inside the fallback the trace's key is excluded, and included while a
  // trace runs: neither is the traced code's state.
  state.keys.included_ = state.keys.included_.remove(kTraceKey);
  state.keys.excluded_ = state.keys.excluded_.remove(kTraceKey);
  state.autograd = c10::AutogradState::get_tls_state();
  state.autocast_cpu = at::autocast::get_autocast_dtype(at::kCPU);
  state.autocast_cuda = at::autocast::get_autocast_dtype(at::kCUDA);
  return state;
}

ReplayState::ReplayState(const CallState& state) : previous_(CallState::current()) {
  // The current trace key membership is kept: a replay run while a trace is
  // active stays as visible (or not) to it as before.
  c10::impl::LocalDispatchKeySet keys = state.keys;
  const c10::impl::LocalDispatchKeySet now = c10::impl::tls_local_dispatch_key_set();
  if (now.included_.has(kTraceKey)) keys.included_ = keys.included_.add(kTraceKey);
  if (now.excluded_.has(kTraceKey)) keys.excluded_ = keys.excluded_.add(kTraceKey);
  previous_.keys = now;
  c10::impl::_force_tls_local_dispatch_key_set(keys);
  c10::AutogradState::set_tls_state(state.autograd);
  at::autocast::set_autocast_dtype(at::kCPU, state.autocast_cpu);
  at::autocast::set_autocast_dtype(at::kCUDA, state.autocast_cuda);
}

ReplayState::~ReplayState() {
  c10::impl::_force_tls_local_dispatch_key_set(previous_.keys);
  c10::AutogradState::set_tls_state(previous_.autograd);
  at::autocast::set_autocast_dtype(at::kCPU, previous_.autocast_cpu);
  at::autocast::set_autocast_dtype(at::kCUDA, previous_.autocast_cuda);
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
  if (tls_active == nullptr || tls_bookkeeping > 0) return nullptr;
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
    call->chain[k]->begin_call(call->op, schema, args, call->progress[k]);
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
  bool nested = false;
  {
    OwnWork own;
    for (size_t k = 0; k < count; ++k) {
      traces[k]->begin_call(op, schema, *stack, progress[k]);
      nested = nested || traces[k]->records_nested();
    }
  }
  try {
    if (nested) {
      // See Note [Inside a subclass's dispatch].
      ObserveInsidePython observe(dispatch_goes_to_python(ks));
      op.redispatchBoxed(ks.remove(kTraceKey), stack);
    } else {
      c10::impl::ExcludeDispatchKeyGuard off(kTraceKey);
      op.redispatchBoxed(ks.remove(kTraceKey), stack);
    }
  } catch (...) {
    for (size_t k = 0; k < count; ++k) --traces[k]->depth_;
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
