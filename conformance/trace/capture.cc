#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/trace/capture.h"

#include "conformance/trace/internal/call_match.h"
#include "conformance/trace/internal/call_state.h"
#include "conformance/trace/internal/op_arguments.h"
#include "conformance/trace/internal/unfilled_memory.h"
#include "conformance/trace/sparse_parts.h"

#include <ATen/core/stack.h>
#include <c10/util/Exception.h>
#include <c10/util/flat_hash_map.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

namespace reloadsafe::trace {
namespace {

// Substrings of the names of ops whose results are random draws.
constexpr const char* kRandomOps[] = {"rand",        "normal",   "bernoulli",    "dropout",
                                      "multinomial", "uniform_", "exponential_", "geometric_",
                                      "cauchy_",     "random_"};

// Dropout's front ends take `train` as an argument: in eval mode (every
// model an engine serves, GPT-2's among them) they return their input and
// draw nothing. When they do draw, they call a random op (native_dropout,
// bernoulli_) that the capture records nested inside them, so they are
// judged by that op, not by their name.
constexpr std::string_view kDropoutFrontEnds[] = {
    "aten::dropout", "aten::feature_dropout", "aten::alpha_dropout", "aten::feature_alpha_dropout"};

bool is_random(std::string_view op) {
  const std::string_view base = op.substr(0, op.find('.'));
  const auto front_end = [&](std::string_view f) {
    // The op itself or its in-place form ("aten::dropout_").
    return base.substr(0, f.size()) == f &&
           (base.size() == f.size() || (base.size() == f.size() + 1 && base.back() == '_'));
  };
  if (std::any_of(std::begin(kDropoutFrontEnds), std::end(kDropoutFrontEnds), front_end)) {
    return false;
  }
  return std::any_of(std::begin(kRandomOps), std::end(kRandomOps),
                     [&](const char* s) { return op.find(s) != std::string_view::npos; });
}

// Ops that hand a tensor's values to the host, or make a result whose
// shape depends on them: the only way a forward's later ops can follow the
// values it computed (Note [An op sequence that follows the weights] in
// conformance/harness/forward_checks.cc). Matched as op name prefixes. The
// last stands for a read no op makes (Note [A read of values no op makes]
// in read_trace.h).
constexpr std::string_view kValueReadingOps[] = {"aten::_local_scalar_dense",
                                                 "aten::item",
                                                 "aten::is_nonzero",
                                                 "aten::equal",
                                                 "aten::allclose",
                                                 "aten::nonzero",
                                                 "aten::masked_select",
                                                 "aten::unique",
                                                 "aten::_unique",
                                                 "aten::bincount",
                                                 "aten::repeat_interleave",
                                                 kHostReadOp};

bool reads_values_on_the_host(std::string_view op) {
  return std::any_of(
      std::begin(kValueReadingOps), std::end(kValueReadingOps),
      [&](std::string_view prefix) { return op.substr(0, prefix.size()) == prefix; });
}

// What a capture asks of a recorded op's name, answered once per name and
// thread: the lists above cost a few hundred instructions a name, for every
// op of every capture. A record's name is interned (OpCall::name), so its
// address stands for it.
struct NameKinds {
  bool random;
  bool reads_values;
};

NameKinds kinds_of(std::string_view recorded_name) {
  thread_local ska::flat_hash_map<const char*, NameKinds> known;
  auto it = known.find(recorded_name.data());
  if (it != known.end()) return it->second;
  const NameKinds kinds{is_random(recorded_name), reads_values_on_the_host(recorded_name)};
  known.emplace(recorded_name.data(), kinds);
  return kinds;
}

// The objects of one op, captured (`a`) and retraced (`b`).
void compare_objects(const OpCall& a, const OpCall& b, const TensorNames& names, bool details,
                     std::vector<ReadChange>& out) {
  for (size_t j = 0; j < a.objects.size(); ++j) {
    const ObjectRead& oa = a.objects[j];
    const ObjectRead& ob = b.objects[j];
    if (same_object(oa, ob)) continue;
    // A kernel object re-made (or its C++ instance swapped in place): what
    // it packed at capture is gone, whatever its tensors say.
    out.push_back(ReadChange{
        names.label(oa), oa.identity == ob.identity ? "object re-made in place" : "object replaced",
        details ? oa.describe() : "", details ? ob.describe() : "", oa.where(a.name)});
  }
}

// The tensor reads of one op, captured (`a`) and retraced (`b`).
void compare_reads(const OpCall& a, const OpCall& b, const TensorNames& names, bool details,
                   std::vector<ReadChange>& out) {
  for (size_t j = 0; j < a.reads.size(); ++j) {
    const TensorRead& ra = a.reads[j];
    const TensorRead& rb = b.reads[j];
    if (!ra.external) continue;  // made by the forward: the graph's own memory
    if (ra.no_elements() && rb.no_elements()) continue;  // no byte read, before or after
    if (rb.external && ra.same_place(rb)) continue;      // the common case: no strings built
    const std::string label = names.label(ra);
    const std::string where = ra.where(a.name);
    if (!rb.external) {
      out.push_back(ReadChange{label, "now made inside the forward",
                               details ? to_hex(ra.data_ptr) + " " + ra.layout() : "",
                               details ? to_hex(rb.data_ptr) + " " + rb.layout() : "", where});
      continue;
    }
    for (LocationChange& c : ra.diff(rb, details)) {
      out.push_back(
          ReadChange{label, std::move(c.what), std::move(c.before), std::move(c.after), where});
    }
  }
}

// Note [A made tensor under another object]
// A replay maps each tensor the forward made to what the replay computed in
// its place by the object the captured call returned. Some code hands the
// next op another object over the same storage: torch.zeros, torch.arange,
// torch.zeros_like and the other factories PyTorch's Python front end wraps
// (torch/csrc/autograd/generated/variable_factories.h) return a fresh
// TensorImpl over the op's result when anyone else holds that result (a
// capture does), and a kernel may hand out a shallow copy. Such a tensor is
// the result of the earlier call that made its storage, seen through
// another object: the replay rebuilds it with its own sizes, strides, offset
// and dtype over the storage the replay made in that call's place. It can
// only when the replay's storage is laid out as the captured one (the same
// byte size, the result at the same byte offset), which the same op on the
// same shapes gives; otherwise the replay gives up and says which read.

// A tensor over `storage` with `like`'s sizes, strides, offset and dtype,
// made without an op (no trace sees it, no storage is touched).
at::Tensor alias_on(const c10::Storage& storage, const at::Tensor& like) {
  at::Tensor t =
      at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage), like.key_set(), like.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(),
                                                 like.storage_offset());
  return t;
}

}  // namespace

TensorNames::TensorNames(const std::vector<NamedTensor>& named) {
  for (bool declared : {true, false}) {
    for (const auto& n : named) {
      if (n.declared == declared) add(n.name, n.tensor, n.declared);
    }
  }
}

void TensorNames::add_object(const std::string& name, const void* identity) {
  objects_.emplace(identity, name);
}

const std::string* TensorNames::object_name(const ObjectRead& read) const {
  for (const void* key : {read.identity, read.payload}) {
    auto it = key != nullptr ? objects_.find(key) : objects_.end();
    if (it != objects_.end()) return &it->second;
  }
  return nullptr;
}

bool TensorNames::named(const ObjectRead& read) const {
  return object_name(read) != nullptr;
}

std::string TensorNames::label(const ObjectRead& read) const {
  const std::string* name = object_name(read);
  return name != nullptr ? *name : "undeclared object";
}

void TensorNames::add(const std::string& name, const at::Tensor& t, bool declared) {
  if (sparse_part_count(t) > 0) {
    // A sparse tensor is named through its parts, as the trace reads them.
    for_each_part(name, t, [&](const std::string& part_name, const at::Tensor& part) {
      add(part_name, part, declared);
    });
    return;
  }
  // A Python tensor (a subclass) is named through its inner tensors.
  if (!has_plain_storage(t)) return;
  TensorLocation location = TensorLocation::of(t);
  by_storage_[location.storage].push_back(Entry{name, declared, std::move(location)});
}

std::optional<TensorNames::Found> TensorNames::find(const TensorRead& read) const {
  auto it = by_storage_.find(read.storage);
  if (it == by_storage_.end()) return std::nullopt;
  for (const Entry& e : it->second) {
    if (e.location.data_ptr == read.data_ptr && e.location.sizes == read.sizes &&
        e.location.strides == read.strides) {
      return Found{e.name, e.declared, true};
    }
  }
  const Entry& first = it->second.front();
  return Found{first.name, first.declared, false};
}

std::string TensorNames::label(const TensorRead& read) const {
  auto found = find(read);
  if (!found && read.object != nullptr) {
    // A tensor an object reported: named after the object, if it has a name.
    auto it = objects_.find(read.object);
    const size_t dot = read.arg_name.find('.');
    const std::string tail = dot == std::string::npos ? "" : read.arg_name.substr(dot);
    return it == objects_.end() ? "undeclared object tensor" : it->second + tail;
  }
  if (!found) return "undeclared tensor";
  std::string s = found->name;
  if (!found->whole) s += " (view)";
  if (!found->declared) s += " (undeclared)";
  return s;
}

// The capture's hook: holds every top-level call's arguments before it runs
// and its results after, with the state it ran under.
class CapturedForward::Holder final : public CallHook {
 public:
  void top_level_begin(const ReadTrace& trace, const c10::OperatorHandle& op,
                       c10::ArrayRef<c10::IValue> args) override {
    inputs_.clear();
    inputs_.reserve(args.size());
    for (const c10::IValue& v : args) inputs_.push_back(hold_as_captured(trace, v));
    unfilled_.before(op, args);
    if (op.schema().name() == "aten::lift_fresh") keep_python_values(trace, args);
  }

  void top_level_end(const ReadTrace& /*trace*/, const c10::OperatorHandle& op,
                     c10::ArrayRef<c10::IValue> returns) override {
    unfilled_.after(op, returns);
    held_.push_back(HeldCall{op, std::move(inputs_),
                             std::vector<c10::IValue>(returns.begin(), returns.end()),
                             CallState::current()});
    inputs_ = {};
  }

  const std::vector<HeldCall>& held() const { return held_; }
  const UnfilledMemory& unfilled() const { return unfilled_; }

  /// The bytes of `t`, a tensor no op made that the forward handed to
  /// lift_fresh (Note [Python data made without an op]), as they were then;
  /// null for any other tensor.
  const at::Tensor* python_value(const at::Tensor& t) const {
    auto it = python_values_.find(t.unsafeGetTensorImpl());
    return it == python_values_.end() ? nullptr : &it->second;
  }

 private:
  // Note [Python data made without an op]
  // PyTorch turns a Python number into a tensor without an op where it
  // needs one on the CPU: `x[mask] = 0` (Gemma 3's multimodal forward
  // clears its image tokens so) makes the 0 a one-element tensor straight
  // from the CPU allocator, then hands it to lift_fresh(), which PyTorch
  // calls on a tensor it made from data and on nothing else. The trace sees
  // a storage the forward made that no op returned; a replay, which runs
  // only ops, would have nothing to hand in its place. Its bytes come from
  // the code, as a graph's constant does: the holder keeps a copy of what
  // lift_fresh() was handed, when it was handed, and a replay hands a fresh
  // copy of that in its place. A tensor an op made (torch.tensor(data)'s
  // empty(), unfilled_memory.h) or one from before the forward is not
  // kept: the replay rebuilds or reads it as any other.
  // Rare (lift_fresh), so the calls held so far are searched rather than
  // every call's results indexed as it ends.
  void keep_python_values(const ReadTrace& trace, c10::ArrayRef<c10::IValue> args) {
    for (const c10::IValue& v : args) {
      for_each_tensor(v, [&](const at::Tensor& t, int /*element*/) {
        if (!has_plain_storage(t)) return;
        const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
        if (!trace.classify(storage).value_or(true) && unfilled_.python_data(storage) == nullptr &&
            !returned_earlier(storage)) {
          python_values_.try_emplace(t.unsafeGetTensorImpl(), t.clone());
        }
      });
    }
  }

  // Whether a top-level call held so far returned a tensor on `storage`.
  bool returned_earlier(const c10::StorageImpl* storage) const {
    bool found = false;
    for (const HeldCall& call : held_) {
      for (const c10::IValue& out : call.outputs) {
        for_each_tensor(out, [&](const at::Tensor& t, int /*element*/) {
          found = found || (has_plain_storage(t) && t.storage().unsafeGetStorageImpl() == storage);
        });
      }
      if (found) return true;
    }
    return false;
  }

  // An external tensor is held as a new tensor object on the same storage
  // with the same layout: later rebinding of the caller's object (set_data,
  // a new parameter) does not change what the capture reads, as it would not
  // change the addresses a CUDA graph baked in. Internal tensors keep their
  // identity, which is how a replay maps them to the results it recomputes.
  // A Python tensor is held as itself: detaching it would run its subclass's
  // dispatch (Note [Holding runs no op] in read_trace.cc). The held copy
  // requires grad where the tensor did: some composite ops choose their
  // kernels by it (matmul folds a batch into one mm only for inputs that do
  // not), so a replay on a detached copy sums in another order than the
  // forward did, and a recurrence (Mamba's scan) grows that last bit into a
  // difference no tolerance forgives.
  static c10::IValue hold_as_captured(const ReadTrace& trace, const c10::IValue& v) {
    return map_tensors(v, [&](const at::Tensor& t) -> at::Tensor {
      if (!has_plain_storage(t)) return t;
      if (!trace.classify(t.storage().unsafeGetStorageImpl()).value_or(false)) return t;
      at::Tensor held(t.unsafeGetTensorImpl()->shallow_copy_and_detach(
          /*version_counter=*/c10::VariableVersion(0), /*allow_tensor_metadata_change=*/false));
      if (t.requires_grad()) held.set_requires_grad(true);
      return held;
    });
  }

  std::vector<c10::IValue> inputs_;
  std::vector<HeldCall> held_;
  UnfilledMemory unfilled_;
  // Note [Python data made without an op]: the tensor -> its bytes then.
  std::unordered_map<const c10::TensorImpl*, at::Tensor> python_values_;
};

CapturedForward::CapturedForward(const std::function<at::Tensor()>& forward)
    : holder_(std::make_unique<Holder>()) {
  ReadTrace::Options options = capture_trace_options(holder_.get());
  // Every call of the forward and the calls inside its ATen ops, by name.
  options.expected_records = 128;
  trace_ = std::make_unique<ReadTrace>(options);
  try {
    output_ = forward();
  } catch (...) {
    trace_->stop();
    throw;
  }
  trace_->stop();
  const std::vector<OpCall>& ops = trace_->ops();
  for (const OpCall& op : ops) {
    if (kinds_of(op.name).random) {
      random_op_ = op.name;
      break;
    }
  }
  // See Note [A retrace that knows an ATen op's callees].
  known_callees_.assign(ops.size(), -1);
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!ops[i].callees_named) continue;
    size_t end = i + 1;
    bool plain = true;
    for (; end < ops.size() && ops[end].depth > ops[i].depth; ++end) {
      const OpCall& callee = ops[end];
      const NameKinds kinds = kinds_of(callee.name);
      plain = plain && !kinds.random && !kinds.reads_values && callee.reads.empty() &&
              callee.objects.empty();
    }
    if (plain) known_callees_[i] = static_cast<int32_t>(end - i - 1);
  }
}

// Note [A replay gives up before it runs an op]
// The captured calls may write the layer's tensors in place (a counter, a
// cache), and a replay makes those writes again, as a graph replay would. A
// replay that stopped halfway would leave them made and return nothing, so a
// caller that then compares the layer's state sees writes no forward made.
// Whether every call's arguments can be rebuilt is known from the capture
// alone: an argument whose storage the forward made must be the result of an
// earlier top-level call. That walk runs once, at the first replay, which
// refuses before it runs anything.
//
// Memory an empty-like call made and code outside the dispatcher filled is
// another case (unfilled_memory.h): torch.tensor(data)'s bytes the replay
// fills in right after its empty(), as a graph holds a constant; anything
// else so filled cannot be rebuilt, and the replay refuses.
std::string CapturedForward::find_unmade_read() const {
  std::unordered_set<const c10::TensorImpl*> made;
  // Storages of made tensors: Note [A made tensor under another object].
  std::unordered_set<const c10::StorageImpl*> made_storages;
  for (const HeldCall& call : holder_->held()) {
    std::string unmade;
    for (const c10::IValue& v : call.inputs) {
      map_tensors(v, [&](const at::Tensor& t) -> at::Tensor {
        if (unmade.empty() && has_plain_storage(t) &&
            !trace_->classify(t.storage().unsafeGetStorageImpl()).value_or(true) &&
            made.count(t.unsafeGetTensorImpl()) == 0 &&
            made_storages.count(t.storage().unsafeGetStorageImpl()) == 0 &&
            holder_->python_value(t) == nullptr) {
          const std::string text = t.toString();
          unmade = text.substr(0, text.find('\n'));
        }
        return t;
      });
    }
    if (!unmade.empty()) {
      return call.op.schema().name() + " reads a tensor the forward made without an op (" + unmade +
             "): code outside PyTorch's dispatcher made it (torch.compile's Inductor kernels, a "
             "C++ extension's own allocation), and a replay runs only what the trace saw; the "
             "live forward is still compared with a cold load";
    }
    auto note = [&](const at::Tensor& t) {
      made.insert(t.unsafeGetTensorImpl());
      if (has_plain_storage(t)) made_storages.insert(t.storage().unsafeGetStorageImpl());
    };
    for (const c10::IValue& out : call.outputs) {
      if (out.isTensor()) {
        note(out.toTensor());
      } else if (out.isTensorList()) {
        for (const at::Tensor& t : out.toTensorList().vec()) note(t);
      }
    }
  }
  return holder_->unfilled().written_outside();
}

CapturedForward::~CapturedForward() = default;

const std::vector<HeldCall>& CapturedForward::held_calls() const {
  return holder_->held();
}

std::vector<CapturedRead> CapturedForward::reads(const TensorNames& names, bool details) const {
  std::vector<CapturedRead> out;
  const auto& ops = trace_->ops();
  for (const OpCall& op : ops) {
    for (const TensorRead& r : op.reads) {
      if (!r.external) continue;
      if (r.has_storage && r.no_elements()) continue;  // reads no byte: nothing a graph holds
      auto found = names.find(r);
      CapturedRead c{details ? r.where(op.name) : "",
                     op.name,
                     op.depth,
                     names.label(r),
                     found && found->declared,
                     details ? r.layout() : "",
                     r.storage};
      if (r.subclass) {
        c.kind = CapturedRead::Kind::kSubclass;
      } else if (!r.has_storage) {
        c.kind = CapturedRead::Kind::kNoStorage;
      }
      out.push_back(std::move(c));
    }
    for (const ObjectRead& o : op.objects) {
      if (o.made) continue;  // the forward's own (Note [An object the forward makes])
      CapturedRead c{details ? o.where(op.name) : "",
                     op.name,
                     op.depth,
                     names.label(o),
                     names.named(o),
                     o.class_name,
                     o.identity};
      c.kind = CapturedRead::Kind::kObject;
      out.push_back(std::move(c));
    }
  }
  return out;
}

// Note [A checking retrace]
// A protocol retraces the forward after every reload and asks two questions
// of the retrace against the capture: what changed (compare) and whether the
// retrace is its own replay (replays_as). Both look at a call only to find
// what differs from the captured call at the same position, and a call that
// is the captured one in every respect either looks at (same_call) adds
// nothing to either answer. A CheckingRetrace therefore keeps only the calls
// that differ, with their positions, and the count of all calls; compare and
// replays_as walk the kept calls by position and give the answers a full
// retrace gives (capture_test runs both on the same forward and requires the
// same answers).
//
// Its hook first tells each call against the expected call from the call's
// arguments, without a record (is_expected_call, call_match.h, classifying
// a storage seen for the first time through the trace's own rule, and
// asking a kernel object for its tensors as a record asks it:
// ReadTrace::match_object). Whatever that cannot tell (a tensor without a
// plain storage, a provisional storage, any difference) is recorded as any
// trace records it and then compared with same_call, so a call is dropped
// only if its record would have been the expected one. The trace never lets
// a hook drop a record that reads a storage whose classification is
// provisional (Note [Inside or before the scope] in read_trace.cc). A
// forward that stayed put then costs a retrace no record for most calls,
// and nothing to walk or free afterwards.

// Note [A retrace that knows an ATen op's callees]
// A capture names the ops an ATen op calls through a RecordFunction
// observer (Note [Inside an ATen op] in read_trace.cc), and while that
// observer is installed every op of the thread pays for a RecordFunction:
// about a third of what tracing added to a harness run, in process time
// (harness_bench, 2026-12-06). A retrace need not name them where it knows
// them: an ATen op's callees are chosen by its arguments (their layouts, the
// numbers and flags it was handed) and by the values it reads on the host;
// its kernels hold no state of the traced code (no closure, no kernel
// object). So when a retraced ATen op is the captured call
// (is_expected_call), every tensor argument has the captured layout and its
// other arguments the captured fingerprint (is_expected_call's
// `callees_alike`), and none of its captured callees reads a value on the
// host or draws random numbers, its callees are the captured ones: the
// retrace counts them and does not see them, and runs the op with no
// observer. The observer is
// installed at the first ATen op whose callees it cannot know (a changed
// layout, a value read, another trace active on the thread) and names the
// rest as a capture does. A forward that stayed put is then retraced
// without a RecordFunction. What a known callee could hide is a change of
// the callees that nothing above decides (a global flag an ATen kernel
// branches on, changed between capture and retrace); the retrace then takes
// the captured callees for the ones made, as a graph replays them.

CheckingRetrace::CheckingRetrace(const CapturedForward& capture)
    : expected_(capture.trace().ops()), expected_callees_(capture.known_callees_), trace_([this] {
        ReadTrace::Options options = capture_trace_options(this);
        options.names_on_demand = true;
        options.expected_records = 0;  // it keeps only the calls that differ
        return options;
      }()) {}

bool CheckingRetrace::skip(ReadTrace& trace, size_t position, int depth,
                           const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args) {
  known_at_ = kNone;
  if (position >= expected_.size()) return false;
  // The callees are asked about in the same walk of the arguments, where
  // the capture could know them.
  const bool knowable = expected_callees_[position] >= 0;
  bool alike = false;
  const bool expected = is_expected_call(
      expected_[position], depth, schema, args.data(), args.size(),
      [&](const at::Tensor& t) { return trace.classify_argument(t); }, &ReadTrace::match_object,
      knowable ? &alike : nullptr);
  if (alike) known_at_ = position;
  return expected;
}

bool CheckingRetrace::skip_named(size_t position, int depth, std::string_view name) {
  return position < expected_.size() && is_expected_named_call(expected_[position], depth, name);
}

std::optional<size_t> CheckingRetrace::known_callees(size_t position) {
  // skip() found it out for this very call.
  if (position != known_at_) return std::nullopt;
  return static_cast<size_t>(expected_callees_[position]);
}

bool CheckingRetrace::keep(size_t position, const OpCall& call, bool droppable) {
  if (droppable && position < expected_.size() && same_call(expected_[position], call)) {
    return false;
  }
  // Every kept record has its position, the ones the trace keeps whatever
  // the answer (a provisional read) included.
  positions_.push_back(position);
  return true;
}

std::vector<ReadChange> CapturedForward::compare(const ReadTrace& retrace, const TensorNames& names,
                                                 bool details) const {
  return compare(Kept{retrace.ops(), nullptr, retrace.calls()}, names, details);
}

std::vector<ReadChange> CapturedForward::compare(const CheckingRetrace& retrace,
                                                 const TensorNames& names, bool details) const {
  return compare(Kept{retrace.kept(), &retrace.positions_, retrace.calls()}, names, details);
}

std::vector<ReadChange> CapturedForward::compare(const Kept& retrace, const TensorNames& names,
                                                 bool details) const {
  std::vector<ReadChange> out;
  const auto& before = trace_->ops();
  const auto& kept = retrace.ops;
  const size_t common = std::min(before.size(), retrace.calls);
  size_t k = 0;
  for (; k < kept.size() && retrace.position(k) < common; ++k) {
    const size_t i = retrace.position(k);
    const OpCall& a = before[i];
    const OpCall& b = kept[k];
    if (!same_op(a, b)) {
      // A graph replays the captured sequence: from here on nothing lines up.
      out.push_back(ReadChange{kOpSequence, "op " + std::to_string(i) + " changed",
                               std::string(a.name) + " (depth " + std::to_string(a.depth) + ")",
                               std::string(b.name) + " (depth " + std::to_string(b.depth) + ")", "",
                               i});
      return out;
    }
    const size_t listed = out.size();
    compare_objects(a, b, names, details, out);
    compare_reads(a, b, names, details, out);
    for (size_t c = listed; c < out.size(); ++c) out[c].call = i;
  }
  if (before.size() != retrace.calls) {
    // A call past the captured ones has nothing to be checked against: it is
    // kept, and the first is kept[k].
    const std::string extra = before.size() < retrace.calls ? std::string(kept[k].name) : "(none)";
    out.push_back(ReadChange{kOpSequence, "length changed", std::to_string(before.size()) + " ops",
                             std::to_string(retrace.calls) + " ops (first new: " + extra + ")", "",
                             common});
  }
  return out;
}

namespace {

// A top-level call handed other numbers than the captured one: the same op
// (same_op), both fingerprints known, and they differ.
bool other_numbers(const OpCall& captured, const OpCall& retraced) {
  return captured.depth == 0 && captured.constants_known && retraced.constants_known &&
         captured.constants != retraced.constants;
}

// Whether read `b` is read `a` (both from outside the forward) taken at
// another place of the same storage (same object, data and size).
bool moved_within_storage(const TensorRead& a, const TensorRead& b) {
  return a.external && b.external && a.storage != nullptr && a.storage == b.storage &&
         a.storage_data == b.storage_data && a.storage_nbytes == b.storage_nbytes &&
         !a.same_place(b);
}

// The first read of the same op that the retrace took at another place of
// the same storage: where in a fused weight the op reads, which an index
// can choose. -1 if none.
int read_moved_within_storage(const OpCall& captured, const OpCall& retraced) {
  for (size_t j = 0; j < captured.reads.size() && j < retraced.reads.size(); ++j) {
    if (moved_within_storage(captured.reads[j], retraced.reads[j])) return static_cast<int>(j);
  }
  return -1;
}

// Whether two reads, perhaps of other storages (a cold load's own), take
// the same place within their storage: offset, sizes, strides and dtype.
bool same_place_in_storage(const TensorRead& a, const TensorRead& b) {
  return a.storage_offset == b.storage_offset && a.sizes == b.sizes && a.strides == b.strides &&
         a.dtype == b.dtype;
}

}  // namespace

struct CapturedForward::FirstDifference {
  enum Kind { kNone, kOtherOp, kOtherNumbers, kMovedRead } kind = kNone;
  size_t position = 0;  // among the retrace's calls
  size_t kept = 0;      // index in retrace.kept()
  int read = -1;        // kMovedRead: the read that moved
};

CapturedForward::FirstDifference CapturedForward::first_difference(
    const CheckingRetrace& retrace) const {
  const std::vector<OpCall>& captured = trace_->ops();
  const std::vector<OpCall>& kept = retrace.kept();
  for (size_t k = 0; k < kept.size(); ++k) {
    const size_t i = retrace.position(k);
    if (i >= captured.size() || !same_op(captured[i], kept[k])) {
      return {FirstDifference::kOtherOp, i, k};
    }
    if (other_numbers(captured[i], kept[k])) return {FirstDifference::kOtherNumbers, i, k};
    if (const int j = read_moved_within_storage(captured[i], kept[k]); j >= 0) {
      return {FirstDifference::kMovedRead, i, k, j};
    }
  }
  return {FirstDifference::kNone, retrace.calls(), kept.size()};
}

std::optional<ReadChange> CapturedForward::new_arguments(const CheckingRetrace& retrace) const {
  const FirstDifference first = first_difference(retrace);
  if (first.kind == FirstDifference::kNone || first.kind == FirstDifference::kOtherOp) {
    return std::nullopt;
  }
  const std::string op = "op " + std::to_string(first.position) + " (" +
                         std::string(trace_->ops()[first.position].name) + ")";
  ReadChange change{kOpSequence, "", "", "", "", first.position};
  if (first.kind == FirstDifference::kOtherNumbers) {
    change.what = op + " handed other numbers";
  } else {
    const TensorRead& read = retrace.kept()[first.kept].reads[first.read];
    change.what = op + " reads " +
                  (read.arg_name.empty() ? "arg " + std::to_string(read.arg) : read.arg_name) +
                  " at another place of its storage";
  }
  return change;
}

size_t CapturedForward::first_change(const CheckingRetrace& retrace) const {
  return first_difference(retrace).position;
}

bool CapturedForward::can_follow_values(const CheckingRetrace& retrace) const {
  // Before the first change the capture must have read a value on the
  // host, or nothing it computed could have chosen the ops, the numbers or
  // the places after it.
  const std::vector<OpCall>& captured = trace_->ops();
  const size_t changed = std::min(first_change(retrace), captured.size());
  return std::any_of(captured.begin(), captured.begin() + changed,
                     [](const OpCall& op) { return kinds_of(op.name).reads_values; });
}

bool CapturedForward::follows_values(const CheckingRetrace& retrace,
                                     const std::vector<OpCall>& other) const {
  if (!can_follow_values(retrace)) return false;
  // The top-level calls of each run are compared: a nested call is the
  // work of the call above it, and which callees a call records also
  // follows how its code was compiled (a forward torch.compile recompiled
  // for new sizes runs each op once more through Python's dispatcher).
  const std::vector<OpCall>& captured = trace_->ops();
  const std::vector<OpCall>& kept = retrace.kept();
  struct Call {
    const OpCall* call;
    const OpCall* captured;  // the captured call at its position, if the same op
  };
  std::vector<Call> ours;
  size_t k = 0;
  for (size_t i = 0; i < retrace.calls(); ++i) {
    if (k < kept.size() && retrace.position(k) == i) {
      const OpCall& call = kept[k++];
      if (call.depth != 0) continue;
      const bool as_captured = i < captured.size() && same_op(captured[i], call);
      ours.push_back({&call, as_captured ? &captured[i] : nullptr});
    } else if (i < captured.size()) {
      if (captured[i].depth == 0) ours.push_back({&captured[i], nullptr});  // dropped: as captured
    } else {
      return false;
    }
  }
  std::vector<const OpCall*> theirs;
  for (const OpCall& call : other) {
    if (call.depth == 0) theirs.push_back(&call);
  }
  if (theirs.size() < ours.size()) return false;
  const size_t first = theirs.size() - ours.size();
  for (size_t j = 0; j < ours.size(); ++j) {
    const OpCall& mine = *ours[j].call;
    const OpCall& their = *theirs[first + j];
    if (!same_op(mine, their)) return false;
    if (ours[j].captured == nullptr) continue;
    // New numbers and new places are the forward's only if another run
    // hands the same numbers and reads the same places of its storages.
    if (other_numbers(*ours[j].captured, mine) &&
        !(their.constants_known && their.constants == mine.constants)) {
      return false;
    }
    for (size_t r = 0; r < mine.reads.size(); ++r) {
      if (moved_within_storage(ours[j].captured->reads[r], mine.reads[r]) &&
          !same_place_in_storage(mine.reads[r], their.reads[r])) {
        return false;
      }
    }
  }
  return true;
}

std::optional<at::Tensor> CapturedForward::replay(std::string* why) const {
  if (!random_op_.empty()) {
    *why = std::string(random_op_) + " draws random numbers: a replay cannot match a fresh forward";
    return std::nullopt;
  }
  if (!unmade_read_) unmade_read_ = find_unmade_read();  // once, at the first replay
  if (!unmade_read_->empty()) {  // Note [A replay gives up before it runs an op]
    *why = *unmade_read_;
    return std::nullopt;
  }
  // Result objects of the capture -> what the replay computed in their place.
  std::unordered_map<const c10::TensorImpl*, at::Tensor> made;
  // The storage of a captured result -> that result and the replay's in its
  // place, for the first result on each storage (Note [A made tensor under
  // another object]).
  std::unordered_map<const c10::StorageImpl*, std::pair<at::Tensor, at::Tensor>> made_storages;
  std::string missing;
  // `t` (made by the forward, not a captured result object) over the storage
  // the replay made in its place; nothing where that storage is not laid out
  // as the captured one.
  auto under_another_object = [&](const at::Tensor& t) -> std::optional<at::Tensor> {
    auto it = made_storages.find(t.storage().unsafeGetStorageImpl());
    if (it == made_storages.end()) return std::nullopt;
    const auto& [captured, replayed] = it->second;
    if (!has_plain_storage(replayed) || replayed.storage().nbytes() != t.storage().nbytes() ||
        replayed.storage_offset() * static_cast<int64_t>(replayed.itemsize()) !=
            captured.storage_offset() * static_cast<int64_t>(captured.itemsize())) {
      return std::nullopt;
    }
    return alias_on(replayed.storage(), t);
  };
  auto map = [&](const at::Tensor& t) -> at::Tensor {
    if (t.defined() && !has_plain_storage(t)) {
      // A subclass tensor (or one without storage): the replayed result in
      // its place if an op made it, else the one held.
      auto it = made.find(t.unsafeGetTensorImpl());
      return it == made.end() ? t : it->second;
    }
    if (!has_plain_storage(t)) return t;
    if (trace_->classify(t.storage().unsafeGetStorageImpl()).value_or(true)) return t;
    auto it = made.find(t.unsafeGetTensorImpl());
    if (it != made.end()) return it->second;
    if (std::optional<at::Tensor> alias = under_another_object(t)) return *alias;
    if (const at::Tensor* value = holder_->python_value(t)) {
      at::Tensor fresh = value->clone();  // later ops may write it, as they did the captured one
      made[t.unsafeGetTensorImpl()] = fresh;
      return fresh;
    }
    missing = t.toString();
    return t;
  };
  // Objects a captured call returned -> the replay's in their place (Note
  // [An object the forward makes] in read_trace.cc).
  std::unordered_map<const void*, c10::IValue> made_objects;
  auto map_value = [&](const c10::IValue& v) -> c10::IValue {
    if (v.isObject()) {
      const auto it = made_objects.find(&v.toObjectRef());
      return it == made_objects.end() ? v : it->second;
    }
    return map_tensors(v, map);
  };
  auto made_one = [&](const at::Tensor& captured, const at::Tensor& replayed) {
    made[captured.unsafeGetTensorImpl()] = replayed;
    if (has_plain_storage(captured)) {
      made_storages.try_emplace(captured.storage().unsafeGetStorageImpl(), captured, replayed);
    }
  };
  auto remember = [&](const c10::IValue& captured, const c10::IValue& replayed) {
    if (captured.isObject() && replayed.isObject()) {
      made_objects[&captured.toObjectRef()] = replayed;
    } else if (captured.isTensor() && replayed.isTensor()) {
      made_one(captured.toTensor(), replayed.toTensor());
    } else if (captured.isTensorList() && replayed.isTensorList()) {
      const auto c = captured.toTensorList().vec();
      const auto r = replayed.toTensorList().vec();
      for (size_t k = 0; k < c.size() && k < r.size(); ++k) made_one(c[k], r[k]);
    }
  };

  for (const HeldCall& call : holder_->held()) {
    torch::jit::Stack stack;
    stack.reserve(call.inputs.size());
    for (const c10::IValue& v : call.inputs) stack.push_back(map_value(v));
    if (!missing.empty()) {
      // Made by an earlier call, whose replay laid its storage out otherwise
      // (Note [A made tensor under another object]): the one case Note [A
      // replay gives up before it runs an op] cannot rule out beforehand,
      // since only running that call shows its layout. The calls before it
      // have run; the same op on the same shapes lays its result out the
      // same way, so this is a kernel whose allocation depends on more than
      // its arguments.
      *why = call.op.schema().name() + " reads a tensor made by an earlier op whose replay " +
             "laid its storage out otherwise (" + missing.substr(0, missing.find('\n')) + ")";
      return std::nullopt;
    }
    {
      const ReplayState state(call.state);  // autocast, grad and inference mode as captured
      call.op.callBoxed(stack);
    }
    if (allocates_unfilled(call.op)) {
      // What PyTorch filled from Python data: the bytes the capture read.
      for (size_t k = 0; k < call.outputs.size() && k < stack.size(); ++k) {
        if (!call.outputs[k].isTensor() || !stack[k].isTensor()) continue;
        const at::Tensor& captured = call.outputs[k].toTensor();
        if (!has_plain_storage(captured)) continue;
        if (const at::Tensor* data =
                holder_->unfilled().python_data(captured.storage().unsafeGetStorageImpl())) {
          stack[k].toTensor().copy_(*data);
        }
      }
    }
    for (size_t k = 0; k < call.outputs.size() && k < stack.size(); ++k) {
      remember(call.outputs[k], stack[k]);
    }
  }
  if (!output_.defined()) {
    *why = "the forward returned no tensor";
    return std::nullopt;
  }
  auto it = made.find(output_.unsafeGetTensorImpl());
  if (it != made.end()) return it->second;
  if (has_plain_storage(output_) &&
      trace_->classify(output_.storage().unsafeGetStorageImpl()).value_or(true)) {
    return output_;  // the forward returned a tensor it did not make
  }
  if (has_plain_storage(output_)) {
    if (std::optional<at::Tensor> alias = under_another_object(output_)) return *alias;
  }
  *why = "the forward's result was not returned by a top-level op";
  return std::nullopt;
}

// Note [A retrace that is its own replay]
// replay() re-runs the captured top-level ops on what the capture holds: an
// external tensor as a tensor on the captured storage, in the captured
// layout; a subclass tensor and an opaque object as the captured object;
// every other argument as captured; each intermediate as the replay made
// it. A retrace in which every op is the captured one, with every external
// read at the captured place, every read internal where it was internal,
// the same objects and the same other arguments, ran those very ops on the
// same bytes with the same values: what it computed is what a replay right
// after it computes. (Ops nested in a top-level op are the same code on the
// same inputs; they are compared too, but their other arguments follow from
// the top-level op's.) A harness may then take the retraced forward's
// output as the replay's and skip re-running the ops; anything that differs
// (a moved tensor, a rebuilt Python float handed as a scalar, a replaced
// subclass wrapper whose attributes changed) makes replays_as() false, and
// the replay runs. What the retrace cannot tell is whether a replay would
// run at all: replays_through() answers it from the capture where it can
// (no random draw, every made argument and the output an earlier call's
// result object), and a harness that cannot know runs one replay first.
bool CapturedForward::replays_through() const {
  if (replays_through_) return *replays_through_;
  auto find = [&] {
    if (!random_op_.empty()) return false;
    if (!unmade_read_) unmade_read_ = find_unmade_read();
    if (!unmade_read_->empty()) return false;
    // What replay() looks up: an argument the forward made, by its object.
    auto made_by_forward = [&](const at::Tensor& t) {
      return has_plain_storage(t) &&
             !trace_->classify(t.storage().unsafeGetStorageImpl()).value_or(true);
    };
    std::unordered_set<const c10::TensorImpl*> results;
    bool found = true;
    for (const HeldCall& call : holder_->held()) {
      for (const c10::IValue& v : call.inputs) {
        map_tensors(v, [&](const at::Tensor& t) -> at::Tensor {
          if (made_by_forward(t) && results.count(t.unsafeGetTensorImpl()) == 0 &&
              holder_->python_value(t) == nullptr) {
            found = false;
          }
          return t;
        });
      }
      if (!found) return false;
      for (const c10::IValue& out : call.outputs) {
        if (out.isTensor()) {
          results.insert(out.toTensor().unsafeGetTensorImpl());
        } else if (out.isTensorList()) {
          for (const at::Tensor& t : out.toTensorList().vec())
            results.insert(t.unsafeGetTensorImpl());
        }
      }
    }
    if (!output_.defined()) return false;
    return results.count(output_.unsafeGetTensorImpl()) > 0 ||
           (has_plain_storage(output_) &&
            trace_->classify(output_.storage().unsafeGetStorageImpl()).value_or(true));
  };
  replays_through_ = find();
  return *replays_through_;
}

bool CapturedForward::replays_as(const ReadTrace& retrace) const {
  return replays_as(Kept{retrace.ops(), nullptr, retrace.calls()});
}

bool CapturedForward::replays_as(const CheckingRetrace& retrace) const {
  return replays_as(Kept{retrace.kept(), &retrace.positions_, retrace.calls()});
}

bool CapturedForward::replays_as(const Kept& retrace) const {
  const auto& kept = retrace.ops;
  if (trace_->ops().size() != retrace.calls) return false;
  for (size_t k = 0; k < kept.size(); ++k) {
    if (!same_call(trace_->ops()[retrace.position(k)], kept[k])) return false;
  }
  return true;
}

}  // namespace reloadsafe::trace
