#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/trace/internal/call_match.h"

#include "conformance/trace/internal/op_arguments.h"
#include "conformance/trace/internal/op_names.h"

#include <cstring>
#include <functional>
#include <string_view>

namespace reloadsafe::trace {
namespace {

// Note [The other arguments' fingerprint]
// A graph bakes in more than addresses: the numbers, shapes and flags an op
// is launched with. Each top-level op gets a 64-bit fingerprint of every
// argument that is not a tensor read or an opaque object, so that a capture
// and a retrace can tell whether the same op was handed the same values. A
// nested op's follow from its top-level op's and are not computed, except
// for an ATen op whose callees are named, whose values choose the ops it
// calls (is_expected_call's `callees_alike`). Words are folded in FNV-1a's
// way, a 64-bit word at a time: each step is a bijection of the running
// hash for a given word, so two argument lists that differ in a single word
// always differ in their fingerprint. Each value is hashed with a tag of its
// kind, so 1 and 1.0 and true differ; a double by its bits (-0.0 and 0.0
// differ: never equal when unsure). A tensor counts by what is not a read: a
// wrapped number by its dtype and value, a Python subclass tensor by its
// identity (the capture holds that very object), a plain tensor by its
// presence only (its place is compared as a read). A value of a kind not
// listed makes the op's fingerprint unknown.
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

// Whether the argument `t` (at `arg`, `element`) would be recorded as the
// read `expected` is, in every respect same_call() looks at.
bool is_expected_read(const TensorRead& expected, const at::Tensor& t, int arg, int element,
                      const SparsePart* part, ClassifyArgument classify) {
  // A tensor without a plain storage is recorded in full.
  if (expected.arg != arg || expected.element != element ||
      expected.part != (part != nullptr ? part->index : -1) || !expected.has_storage ||
      dispatches_in_python(t) || !t.has_storage()) {
    return false;
  }
  const std::optional<bool> external = classify(t);
  if (!external || *external != expected.external) return false;
  return !expected.external || expected.is_place_of(t);
}

}  // namespace

std::optional<uint64_t> fingerprint_of(const c10::IValue* args, size_t num_args) {
  Fingerprint constants;
  for (size_t i = 0; i < num_args; ++i) {
    if (!constants.add(args[i])) return std::nullopt;
  }
  return constants.value();
}

bool same_op(const OpCall& a, const OpCall& b) {
  return a.name == b.name && a.depth == b.depth && a.reads.size() == b.reads.size() &&
         a.objects.size() == b.objects.size();
}

bool same_object(const ObjectRead& a, const ObjectRead& b) {
  // Made by the forward (Note [An object the forward makes]): a new one on
  // every forward, like a tensor the forward makes.
  if (a.made || b.made) return a.made && b.made;
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
        ra.has_storage != rb.has_storage || ra.arg != rb.arg || ra.element != rb.element ||
        ra.part != rb.part) {
      return false;
    }
    if (ra.external && !ra.same_place(rb)) return false;
  }
  return true;
}

// The skip path of a checking retrace (Note [A checking retrace] in
// capture.cc): the same op name and depth, every opaque object the captured
// one (as match_object tells, with the tensors it reports read like
// arguments), every tensor
// read from the same argument and element, as external as it was (by the
// caller's classifier, which classifies a storage seen for the first time by
// the rule a record uses) and not provisionally, and, if external, at the
// expected place (TensorLocation::is_place_of); for a top-level call, the
// other arguments' fingerprint known and equal. Each condition is one
// same_call() checks on the record, so a true answer is one same_call()
// would give.
bool is_expected_call(const OpCall& expected, int depth, const c10::FunctionSchema& schema,
                      const c10::IValue* args, size_t num_args, ClassifyArgument classify,
                      MatchObject match_object, bool* callees_alike) {
  if (callees_alike != nullptr) *callees_alike = false;
  if (expected.depth != depth || (!expected.objects.empty() && !match_object)) return false;
  if (num_args == 0 && !schema.arguments().empty()) {
    // Arguments unknown: a nested call is recorded without reads.
    return depth > 0 && expected.reads.empty() && is_name_of(expected.name, schema);
  }
  if (!is_name_of(expected.name, schema)) return false;
  bool same = true;
  // An external read's place includes its layout (is_place_of); a made one's
  // layout is compared only for callees_alike.
  bool layouts = callees_alike != nullptr && expected.callees_named;
  size_t j = 0;
  size_t objects = 0;
  auto read = [&](const at::Tensor& t, int arg, int element, const SparsePart* part) {
    same = same && j < expected.reads.size() &&
           is_expected_read(expected.reads[j], t, arg, element, part, classify);
    layouts = layouts && same && (expected.reads[j].external || expected.reads[j].is_layout_of(t));
    ++j;
  };
  for_each_read(args, num_args, read, [&](const c10::IValue& object, int arg) {
    // An object's reads follow its argument's place in the record; without
    // a matcher, the call is recorded in full.
    layouts = false;
    if (!same || !match_object || objects == expected.objects.size()) {
      same = false;
      return;
    }
    if (!match_object(expected.objects[objects++], object, arg,
                      [&](const at::Tensor& t, int index) { read(t, arg, index, nullptr); })) {
      same = false;
    }
  });
  if (!same || j != expected.reads.size() || objects != expected.objects.size()) return false;
  if (depth > 0) {
    if (layouts) {
      const std::optional<uint64_t> constants = fingerprint_of(args, num_args);
      *callees_alike = constants && expected.constants_known && *constants == expected.constants;
    }
    return true;
  }
  const std::optional<uint64_t> constants = fingerprint_of(args, num_args);
  const bool expected_call =
      constants && expected.constants_known && *constants == expected.constants;
  if (layouts) *callees_alike = expected_call;
  return expected_call;
}

bool is_expected_named_call(const OpCall& expected, int depth, std::string_view name) {
  return depth > 0 && expected.depth == depth && expected.reads.empty() &&
         expected.objects.empty() && expected.name == name;
}

}  // namespace reloadsafe::trace
