#include "conformance/trace/capture.h"

#include "conformance/trace/op_arguments.h"

#include <ATen/core/stack.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <string_view>

namespace reloadsafe::trace {
namespace {

// Substrings of the names of ops whose results are random draws.
constexpr const char* kRandomOps[] = {"rand",        "normal",   "bernoulli",    "dropout",
                                      "multinomial", "uniform_", "exponential_", "geometric_",
                                      "cauchy_",     "random_"};

bool is_random(std::string_view op) {
  return std::any_of(std::begin(kRandomOps), std::end(kRandomOps),
                     [&](const char* s) { return op.find(s) != std::string_view::npos; });
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
    if (!ra.external) continue;                      // made by the forward: the graph's own memory
    if (rb.external && ra.same_place(rb)) continue;  // the common case: no strings built
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

bool TensorNames::named(const ObjectRead& read) const {
  return objects_.count(read.identity) > 0;
}

std::string TensorNames::label(const ObjectRead& read) const {
  auto it = objects_.find(read.identity);
  return it == objects_.end() ? "undeclared object" : it->second;
}

void TensorNames::add(const std::string& name, const at::Tensor& t, bool declared) {
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

CapturedForward::CapturedForward(const std::function<at::Tensor()>& forward) {
  trace_ =
      std::make_unique<ReadTrace>(ReadTrace::Options{/*nested=*/true, /*hold_arguments=*/true});
  try {
    output_ = forward();
  } catch (...) {
    trace_->stop();
    throw;
  }
  trace_->stop();
  for (const OpCall& op : trace_->ops()) {
    if (is_random(op.name)) {
      random_op_ = op.name;
      break;
    }
  }
}

std::vector<CapturedRead> CapturedForward::reads(const TensorNames& names, bool details) const {
  std::vector<CapturedRead> out;
  const auto& ops = trace_->ops();
  for (const OpCall& op : ops) {
    for (const TensorRead& r : op.reads) {
      if (!r.external) continue;
      auto found = names.find(r);
      CapturedRead c{
          details ? r.where(op.name) : "", op.depth, names.label(r), found && found->declared,
          details ? r.layout() : "",       r.storage};
      if (r.subclass) {
        c.kind = CapturedRead::Kind::kSubclass;
      } else if (!r.has_storage) {
        c.kind = CapturedRead::Kind::kNoStorage;
      }
      out.push_back(std::move(c));
    }
    for (const ObjectRead& o : op.objects) {
      CapturedRead c{details ? o.where(op.name) : "",
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

ReadTrace::Options CapturedForward::retrace_options() const {
  return ReadTrace::Options{/*nested=*/true, /*hold_arguments=*/false, /*expected=*/trace_.get()};
}

// compare and replays_as walk the retrace's kept calls by position: every
// call of a full retrace, or the calls a checking retrace kept (Note [A
// checking retrace] in read_trace.cc), the others being the captured calls.
std::vector<ReadChange> CapturedForward::compare(const ReadTrace& retrace, const TensorNames& names,
                                                 bool details) const {
  std::vector<ReadChange> out;
  const auto& before = trace_->ops();
  const auto& kept = retrace.ops();
  const size_t common = std::min(before.size(), retrace.calls());
  size_t k = 0;
  for (; k < kept.size() && retrace.position(k) < common; ++k) {
    const size_t i = retrace.position(k);
    const OpCall& a = before[i];
    const OpCall& b = kept[k];
    if (!same_op(a, b)) {
      // A graph replays the captured sequence: from here on nothing lines up.
      out.push_back(ReadChange{"op sequence", "op " + std::to_string(i) + " changed",
                               std::string(a.name) + " (depth " + std::to_string(a.depth) + ")",
                               std::string(b.name) + " (depth " + std::to_string(b.depth) + ")",
                               ""});
      return out;
    }
    compare_objects(a, b, names, details, out);
    compare_reads(a, b, names, details, out);
  }
  if (before.size() != retrace.calls()) {
    // A call past the captured ones has nothing to be checked against: it is
    // kept, and the first is kept[k].
    const std::string extra =
        before.size() < retrace.calls() ? std::string(kept[k].name) : "(none)";
    out.push_back(
        ReadChange{"op sequence", "length changed", std::to_string(before.size()) + " ops",
                   std::to_string(retrace.calls()) + " ops (first new: " + extra + ")", ""});
  }
  return out;
}

std::optional<at::Tensor> CapturedForward::replay(std::string* why) const {
  if (!random_op_.empty()) {
    *why = std::string(random_op_) + " draws random numbers: a replay cannot match a fresh forward";
    return std::nullopt;
  }
  // Result objects of the capture -> what the replay computed in their place.
  std::unordered_map<const c10::TensorImpl*, at::Tensor> made;
  std::string missing;
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
    if (it == made.end()) {
      missing = t.toString();
      return t;
    }
    return it->second;
  };
  auto map_value = [&](const c10::IValue& v) -> c10::IValue { return map_tensors(v, map); };
  auto remember = [&](const c10::IValue& captured, const c10::IValue& replayed) {
    if (captured.isTensor() && replayed.isTensor()) {
      made[captured.toTensor().unsafeGetTensorImpl()] = replayed.toTensor();
    } else if (captured.isTensorList() && replayed.isTensorList()) {
      const auto c = captured.toTensorList().vec();
      const auto r = replayed.toTensorList().vec();
      for (size_t k = 0; k < c.size() && k < r.size(); ++k) made[c[k].unsafeGetTensorImpl()] = r[k];
    }
  };

  for (const HeldCall& call : trace_->held_calls()) {
    torch::jit::Stack stack;
    stack.reserve(call.inputs.size());
    for (const c10::IValue& v : call.inputs) stack.push_back(map_value(v));
    if (!missing.empty()) {
      *why = call.op.schema().name() + " reads a tensor the forward made without an op (" +
             missing.substr(0, missing.find('\n')) + ")";
      return std::nullopt;
    }
    {
      const ReplayState state(call.state);  // autocast, grad and inference mode as captured
      call.op.callBoxed(stack);
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
// the replay runs.
bool CapturedForward::replays_as(const ReadTrace& retrace) const {
  const auto& kept = retrace.ops();
  if (trace_->ops().size() != retrace.calls()) return false;
  for (size_t k = 0; k < kept.size(); ++k) {
    if (!same_call(trace_->ops()[retrace.position(k)], kept[k])) return false;
  }
  return true;
}

}  // namespace reloadsafe::trace
