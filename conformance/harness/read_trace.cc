#include "conformance/harness/read_trace.h"

#include "conformance/harness/memory_census.h"

#include <ATen/core/stack.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <sstream>

namespace reloadsafe::trace {
namespace {

// The trace recording on this thread, if any.
thread_local ReadTrace* tls_active = nullptr;

// "aten::add.Tensor", built once per schema and thread. A schema freed with
// its library can leave its address to another, so a hit is checked.
const std::string& op_name(const c10::FunctionSchema& schema) {
  thread_local std::unordered_map<const c10::FunctionSchema*, std::string> names;
  const std::string& name = schema.name();
  const std::string& overload = schema.overload_name();
  std::string& cached = names[&schema];
  const size_t size = name.size() + (overload.empty() ? 0 : overload.size() + 1);
  if (cached.size() != size || cached.compare(0, name.size(), name) != 0 ||
      (!overload.empty() && cached.compare(name.size() + 1, overload.size(), overload) != 0)) {
    cached = overload.empty() ? name : name + "." + overload;
  }
  return cached;
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
  trace->on_call(op, ks, stack);
}

}  // namespace

// An external tensor is held as a new tensor object on the same storage with
// the same layout: later rebinding of the caller's object (set_data, a new
// parameter) does not change what the capture reads, as it would not change
// the addresses a CUDA graph baked in. Internal tensors keep their identity,
// which is how a replay maps them to the results it recomputes.
c10::IValue ReadTrace::hold_as_captured(const c10::IValue& v) const {
  auto snapshot = [this](const at::Tensor& t) -> at::Tensor {
    if (!t.defined() || !t.has_storage()) return t;
    auto it = seen_.find(t.storage().unsafeGetStorageImpl());
    if (it == seen_.end() || !it->second.external) return t;
    return at::Tensor(t.unsafeGetTensorImpl()->shallow_copy_and_detach(
        /*version_counter=*/c10::VariableVersion(0), /*allow_tensor_metadata_change=*/false));
  };
  if (v.isTensor()) return snapshot(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> held;
    for (const at::Tensor& t : v.toTensorList().vec()) held.push_back(snapshot(t));
    return held;
  }
  if (v.isList() && v.toListRef().size() > 0) {
    // Tensor?[]: the same, element by element.
    c10::impl::GenericList held(v.toList().elementType());
    for (const c10::IValue& e : v.toListRef())
      held.push_back(e.isTensor() ? c10::IValue(snapshot(e.toTensor())) : e);
    return held;
  }
  return v;
}

// The trace's observation point: see Note [Why a mode-key fallback and not
// RecordFunction] in the header.
TORCH_LIBRARY_IMPL(_, TESTING_ONLY_GenericMode, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&trace_fallback>());
}

std::string to_hex(const void* p) {
  std::ostringstream os;
  os << p;
  return os.str();
}

std::string TensorRead::layout() const {
  std::ostringstream os;
  os << c10::toString(dtype) << c10::IntArrayRef(sizes) << " stride " << c10::IntArrayRef(strides)
     << " offset " << storage_offset << " on " << device;
  return os.str();
}

std::string TensorRead::where(const std::string& op_name) const {
  std::ostringstream os;
  os << op_name << " arg " << arg;
  if (element >= 0) os << "[" << element << "]";
  if (!arg_name.empty()) os << " (" << arg_name << ")";
  return os.str();
}

ReadTrace::ReadTrace(Options options) : options_(options) {
  harness::install_cpu_census();
  start_epoch_ = harness::cpu_allocation_epoch().value_or(0);
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

TensorRead ReadTrace::read_of(const at::Tensor& t, int arg, int element,
                              const c10::Argument& schema_arg) {
  TensorRead r;
  r.arg = arg;
  r.element = element;
  r.arg_name = schema_arg.name();
  r.written = schema_arg.alias_info() != nullptr && schema_arg.alias_info()->isWrite();
  r.sizes = t.sizes().vec();
  r.strides = t.layout() == c10::kStrided ? t.strides().vec() : std::vector<int64_t>{};
  r.dtype = t.scalar_type();
  r.device = t.device();
  r.has_storage = t.has_storage();
  if (!r.has_storage) {
    // Nothing addressable to compare; treated as external so that it is
    // reported rather than silently ignored.
    r.external = true;
    return r;
  }
  const c10::Storage& storage = t.storage();
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  r.storage = impl;
  r.storage_data = storage.data();
  r.storage_nbytes = storage.nbytes();
  r.storage_offset = t.storage_offset();
  if (r.storage_data != nullptr) {
    r.data_ptr = static_cast<const char*>(r.storage_data) +
                 r.storage_offset * static_cast<int64_t>(t.element_size());
  }
  auto it = seen_.find(impl);
  if (it == seen_.end()) {
    it = seen_
             .emplace(impl, Seen{existed_before(r), c10::weak_intrusive_ptr<c10::StorageImpl>(
                                                        storage.getWeakStorageImpl())})
             .first;
    if (it->second.external && depth_ > 0 && !r.device.is_cpu()) pending_.push_back(impl);
  }
  r.external = it->second.external;
  return r;
}

// Note [Inside or before the scope]
// A storage first seen as an argument is usually one that existed before the
// scope, but kernels also make tensors without an op (structured kernels
// allocate their outputs directly) and hand them to the ops they call. On
// the CPU the trace asks the allocation census (memory_census.h, installed
// by the trace): a block allocated after the trace started is internal,
// whoever allocated it. Elsewhere a storage first seen inside a nested op is
// provisional: it becomes internal if the enclosing top-level op returns it.
bool ReadTrace::existed_before(const TensorRead& r) const {
  if (r.device.is_cpu() && r.storage_data != nullptr) {
    const auto epoch = harness::cpu_allocation_epoch_of(r.storage_data);
    return !(epoch && *epoch > start_epoch_);
  }
  return true;
}

void ReadTrace::note_result(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return;
  const c10::Storage& storage = t.storage();
  // First seen as a result: made inside the scope.
  seen_.emplace(
      storage.unsafeGetStorageImpl(),
      Seen{false, c10::weak_intrusive_ptr<c10::StorageImpl>(storage.getWeakStorageImpl())});
}

void ReadTrace::on_call(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                        torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  TORCH_INTERNAL_ASSERT(stack->size() >= num_args);
  const size_t first = stack->size() - num_args;

  OpCall call;
  call.name = op_name(schema);
  call.depth = depth_;
  call.reads.reserve(num_args);
  for (size_t i = 0; i < num_args; ++i) {
    const c10::IValue& v = (*stack)[first + i];
    const c10::Argument& a = schema.arguments()[i];
    auto add = [&](const at::Tensor& t, int element) {
      if (!t.defined() || t.unsafeGetTensorImpl()->is_wrapped_number()) return;
      call.reads.push_back(read_of(t, static_cast<int>(i), element, a));
    };
    if (v.isTensor()) {
      add(v.toTensor(), -1);
    } else if (v.isTensorList()) {
      const auto list = v.toTensorList();
      for (size_t e = 0; e < list.size(); ++e) add(list.get(e), static_cast<int>(e));
    } else if (v.isList()) {
      // Tensor?[] (optional tensors, as index() takes) arrive as generic lists.
      const auto list = v.toListRef();
      for (size_t e = 0; e < list.size(); ++e) {
        if (list[e].isTensor()) add(list[e].toTensor(), static_cast<int>(e));
      }
    }
  }
  const bool hold = options_.hold_arguments && depth_ == 0;
  std::vector<c10::IValue> held_inputs;
  if (hold) {
    held_inputs.reserve(num_args);
    for (size_t i = first; i < stack->size(); ++i)
      held_inputs.push_back(hold_as_captured((*stack)[i]));
  }
  const size_t first_op = ops_.size();
  ops_.push_back(std::move(call));

  {
    struct DepthGuard {
      int& depth;
      explicit DepthGuard(int& d) : depth(d) { ++depth; }
      ~DepthGuard() { --depth; }
    } deeper(depth_);
    if (options_.nested) {
      op.redispatchBoxed(ks.remove(kTraceKey), stack);
    } else {
      c10::impl::ExcludeDispatchKeyGuard off(kTraceKey);
      op.redispatchBoxed(ks.remove(kTraceKey), stack);
    }
  }

  const size_t num_returns = schema.returns().size();
  TORCH_INTERNAL_ASSERT(stack->size() >= num_returns);
  std::vector<const c10::StorageImpl*> returned;
  for (size_t i = stack->size() - num_returns; i < stack->size(); ++i) {
    const c10::IValue& v = (*stack)[i];
    std::vector<at::Tensor> results;
    if (v.isTensor()) {
      results.push_back(v.toTensor());
    } else if (v.isTensorList()) {
      results = v.toTensorList().vec();
    }
    for (const at::Tensor& t : results) {
      note_result(t);
      if (t.defined() && t.has_storage()) returned.push_back(t.storage().unsafeGetStorageImpl());
    }
  }
  if (depth_ == 0 && !pending_.empty()) resolve_pending(first_op, returned);
  if (hold) {
    held_.push_back(HeldCall{op, std::move(held_inputs),
                             std::vector<c10::IValue>(stack->end() - num_returns, stack->end())});
  }
}

}  // namespace reloadsafe::trace
