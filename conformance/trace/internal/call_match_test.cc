#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/trace/internal/call_match.h"

#include "conformance/trace/read_trace.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ScalarOps.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/randn.h>
#include <c10/core/ScalarType.h>
#include <gtest/gtest.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace reloadsafe::trace {
namespace {

std::optional<uint64_t> fingerprint(std::vector<c10::IValue> args) {
  return fingerprint_of(args.data(), args.size());
}

TEST(Fingerprint, EqualValuesAgreeAndEveryDifferenceShows) {
  struct Case {
    const char* what;
    std::vector<c10::IValue> a;
    std::vector<c10::IValue> b;
    bool equal;
  };
  const at::Tensor t = at::randn({2});
  const std::vector<Case> cases = {
      {"the same int", {int64_t{3}}, {int64_t{3}}, true},
      {"another int", {int64_t{3}}, {int64_t{4}}, false},
      {"1 and 1.0", {int64_t{1}}, {1.0}, false},
      {"1 and true", {int64_t{1}}, {true}, false},
      {"-0.0 and 0.0 (never equal when unsure)", {-0.0}, {0.0}, false},
      {"the same shape", {c10::List<int64_t>({2, 3})}, {c10::List<int64_t>({2, 3})}, true},
      {"shapes in another order",
       {c10::List<int64_t>({2, 3})},
       {c10::List<int64_t>({3, 2})},
       false},
      {"a shorter list", {c10::List<int64_t>({2, 3})}, {c10::List<int64_t>({2})}, false},
      {"None and 0", {c10::IValue()}, {int64_t{0}}, false},
      {"the same string", {std::string("sum")}, {std::string("sum")}, true},
      {"another string", {std::string("sum")}, {std::string("mean")}, false},
      {"devices", {c10::Device(c10::kCPU)}, {c10::Device(c10::kCPU)}, true},
      {"a plain tensor counts by its presence only", {t}, {at::randn({5})}, true},
      {"a tensor and None", {t}, {c10::IValue()}, false},
      {"wrapped numbers by value", {at::scalar_to_tensor(2.0)}, {at::scalar_to_tensor(2.0)}, true},
      {"wrapped numbers that differ",
       {at::scalar_to_tensor(2.0)},
       {at::scalar_to_tensor(3.0)},
       false},
      {"argument order", {int64_t{1}, int64_t{2}}, {int64_t{2}, int64_t{1}}, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<c10::IValue> a = c.a;
    std::vector<c10::IValue> b = c.b;
    for (auto* v : {&a, &b}) {
      for (c10::IValue& e : *v) {
        // A wrapped number is what Python's `x * 0.5` hands the op.
        if (e.isTensor() && e.toTensor().dim() == 0)
          e.toTensor().unsafeGetTensorImpl()->set_wrapped_number(true);
      }
    }
    const auto fa = fingerprint(a);
    const auto fb = fingerprint(b);
    ASSERT_TRUE(fa.has_value() && fb.has_value());
    EXPECT_EQ(*fa == *fb, c.equal);
  }
}

TEST(Fingerprint, AValueWithoutOneMakesTheCallsUnknown) {
  EXPECT_FALSE(fingerprint({at::detail::getDefaultCPUGenerator()}).has_value());
  EXPECT_TRUE(fingerprint({}).has_value());
}

TEST(SameObject, TheCppInstanceDecidesWhereThereIsOne) {
  int script_a = 0, script_b = 0, instance_a = 0, instance_b = 0;
  struct Case {
    const char* what;
    ObjectRead a;
    ObjectRead b;
    bool same;
  };
  auto object = [](const void* identity, const void* payload) {
    ObjectRead o;
    o.identity = identity;
    o.payload = payload;
    return o;
  };
  const std::vector<Case> cases = {
      {"the same script object", object(&script_a, nullptr), object(&script_a, nullptr), true},
      {"another script object", object(&script_a, nullptr), object(&script_b, nullptr), false},
      {"a new script object around the same C++ instance (handed from C++)",
       object(&script_a, &instance_a), object(&script_b, &instance_a), true},
      {"the same script object, its instance swapped in place", object(&script_a, &instance_a),
       object(&script_a, &instance_b), false},
      {"an instance on one side only", object(&script_a, &instance_a), object(&script_a, nullptr),
       false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_EQ(same_object(c.a, c.b), c.same);
  }
}

// One recorded call of `fn`, the first top-level op it makes.
OpCall record(const std::function<void()>& fn) {
  ReadTrace trace(ReadTrace::Options{/*nested=*/false});
  fn();
  trace.stop();
  EXPECT_FALSE(trace.ops().empty());
  return trace.ops().empty() ? OpCall{} : trace.ops().front();
}

// The rule in both its forms: same_call between records, and
// is_expected_call from the live arguments, on the same pairs of calls.
TEST(CallMatch, BothFormsOfTheRuleAgreeOnEveryCase) {
  const at::Tensor w = at::randn({4, 4});
  const at::Tensor x = at::randn({2, 4});
  const at::Tensor w_copy = w.clone();
  const at::Tensor w_wide = at::randn({4, 8});
  const c10::OperatorHandle mm = c10::Dispatcher::singleton().findSchemaOrThrow("aten::mm", "");
  const c10::OperatorHandle mul =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::mul", "Scalar");
  struct Case {
    const char* what;
    std::function<void()> captured;
    std::function<void()> retraced;
    c10::OperatorHandle op;         // the retraced call's op
    std::vector<c10::IValue> args;  // and its arguments
    bool same;
  };
  const std::vector<Case> cases = {
      {"the same tensors", [&] { at::mm(x, w); }, [&] { at::mm(x, w); }, mm, {x, w}, true},
      {"a copy of the weight elsewhere",
       [&] { at::mm(x, w); },
       [&] { at::mm(x, w_copy); },
       mm,
       {x, w_copy},
       false},
      {"a view in another layout",
       [&] { at::mm(x, w); },
       [&] { at::mm(x, w.t()); },
       mm,
       {x, w.t()},
       false},
      {"another shape", [&] { at::mm(x, w); }, [&] { at::mm(x, w_wide); }, mm, {x, w_wide}, false},
      {"the same scalar",
       [&] { at::mul(w, 2.0); },
       [&] { at::mul(w, 2.0); },
       mul,
       {w, c10::Scalar(2.0)},
       true},
      {"another scalar baked in",
       [&] { at::mul(w, 2.0); },
       [&] { at::mul(w, 3.0); },
       mul,
       {w, c10::Scalar(3.0)},
       false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const OpCall captured = record(c.captured);
    const OpCall retraced = record(c.retraced);
    EXPECT_EQ(same_call(captured, retraced), c.same);
    // Every tensor here existed before: external, as the trace classifies it.
    auto external = [](const at::Tensor&) -> std::optional<bool> { return true; };
    EXPECT_EQ(is_expected_call(captured, 0, c.op.schema(), c.args.data(), c.args.size(), external),
              c.same);
  }
}

TEST(CallMatch, TheSkipPathSaysNoWhereItCannotTell) {
  const at::Tensor w = at::randn({4, 4});
  const at::Tensor x = at::randn({2, 4});
  const c10::OperatorHandle mm = c10::Dispatcher::singleton().findSchemaOrThrow("aten::mm", "");
  const OpCall captured = record([&] { at::mm(x, w); });
  const std::vector<c10::IValue> args = {x, w};
  auto external = [](const at::Tensor&) -> std::optional<bool> { return true; };
  auto provisional = [](const at::Tensor&) -> std::optional<bool> { return std::nullopt; };
  auto internal = [](const at::Tensor&) -> std::optional<bool> { return false; };
  ASSERT_TRUE(is_expected_call(captured, 0, mm.schema(), args.data(), args.size(), external));
  EXPECT_FALSE(is_expected_call(captured, 1, mm.schema(), args.data(), args.size(), external))
      << "another depth";
  EXPECT_FALSE(is_expected_call(captured, 0, mm.schema(), args.data(), args.size(), provisional))
      << "a provisional classification";
  EXPECT_FALSE(is_expected_call(captured, 0, mm.schema(), args.data(), args.size(), internal))
      << "made by the forward where the capture read it from outside";
  EXPECT_FALSE(is_expected_call(captured, 0, mm.schema(), nullptr, 0, external))
      << "arguments unknown";
  const c10::OperatorHandle addmm =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::addmm", "");
  EXPECT_FALSE(is_expected_call(captured, 0, addmm.schema(), args.data(), args.size(), external))
      << "another op";
}

// A kernel object that reports its weight, handed to its op.
struct Kernel : torch::CustomClassHolder {
  at::Tensor weight = at::randn({4, 4});
};

TORCH_LIBRARY(reloadsafe_call_match_test, m) {
  m.class_<Kernel>("Kernel").def("unpack",
                                 [](const c10::intrusive_ptr<Kernel>& k) { return k->weight; });
  m.def(
      "kernel_mm(Tensor x, __torch__.torch.classes.reloadsafe_call_match_test.Kernel k) -> Tensor",
      [](const at::Tensor& x, const c10::intrusive_ptr<Kernel>& k) {
        return at::mm(x, k->weight);
      });
}

// An object argument is told through the caller's matcher: the call is the
// expected one only where the matcher takes the object and hands over, in
// the record's order, exactly the reads the record has from it.
TEST(CallMatch, AnObjectIsToldThroughTheMatcherAndTheReadsItHandsOver) {
  const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("reloadsafe_call_match_test::kernel_mm", "");
  const c10::intrusive_ptr<Kernel> kernel = c10::make_intrusive<Kernel>();
  const at::Tensor x = at::randn({2, 4});
  const std::vector<c10::IValue> args = {x, c10::IValue(kernel)};
  const OpCall captured = record([&] {
    torch::jit::Stack stack = args;
    op.callBoxed(stack);
  });
  ASSERT_EQ(captured.objects.size(), 1u);
  ASSERT_EQ(captured.reads.size(), 2u) << "x, and the weight the object reports";
  auto external = [](const at::Tensor&) -> std::optional<bool> { return true; };
  struct Case {
    const char* what;
    bool is_the_object;
    std::vector<std::pair<at::Tensor, int>> reads;  // handed over, with their index
    bool expected;
  };
  const at::Tensor w = kernel->weight;
  const std::vector<Case> cases = {
      {"the object, its weight where it was", true, {{w, 0}}, true},
      {"another object", false, {}, false},
      {"the object, its weight elsewhere", true, {{w.clone(), 0}}, false},
      {"the object, reporting nothing", true, {}, false},
      {"the object, reporting one more", true, {{w, 0}, {w, 1}}, false},
      {"the object, its weight at another index", true, {{w, 1}}, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    int asked = 0;
    auto match = [&](const ObjectRead& expected, const c10::IValue& object, int arg,
                     c10::function_ref<void(const at::Tensor&, int)> on_read) {
      ++asked;
      EXPECT_EQ(&expected, &captured.objects[0]);
      EXPECT_EQ(&object.toObjectRef(), &args[1].toObjectRef());
      EXPECT_EQ(arg, 1);
      if (!c.is_the_object) return false;
      for (const auto& [t, index] : c.reads) on_read(t, index);
      return true;
    };
    EXPECT_EQ(is_expected_call(captured, 0, op.schema(), args.data(), args.size(), external, match),
              c.expected);
    EXPECT_EQ(asked, 1);
  }
  EXPECT_FALSE(is_expected_call(captured, 0, op.schema(), args.data(), args.size(), external))
      << "without a matcher, an object is recorded in full";
}

// The last top-level op `fn` makes, recorded as a capture records it: an
// ATen op's callees by name (OpCall::callees_named).
OpCall record_naming_callees(const std::function<void()>& fn) {
  ReadTrace::Options options;
  options.aten_callee_reads = false;
  ReadTrace trace(options);
  fn();
  trace.stop();
  for (auto op = trace.ops().rbegin(); op != trace.ops().rend(); ++op) {
    if (op->depth == 0) return *op;
  }
  ADD_FAILURE() << "no top-level op";
  return OpCall{};
}

// Whether a retraced call chooses its callees as the captured one did
// (Note [A retrace that knows an ATen op's callees] in capture.cc): the
// second answer of is_expected_call.
TEST(CallMatch, CalleesAreAlikeOnlyWhereEverythingThatChoosesThemIs) {
  const at::Tensor w = at::randn({4, 4});
  const at::Tensor x_other = at::randn({2, 4});
  const at::Tensor x_t = at::randn({4, 2}).t();  // x_other's sizes, other strides
  const c10::OperatorHandle mm = c10::Dispatcher::singleton().findSchemaOrThrow("aten::mm", "");
  const c10::OperatorHandle mul =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::mul", "Scalar");
  // The first argument made by the forward, as an activation is.
  const OpCall mm_named = record_naming_callees([&] { at::mm(at::randn({2, 4}), w); });
  const OpCall mul_named = record_naming_callees([&] { at::mul(at::randn({2, 4}), 2.0); });
  ASSERT_TRUE(mm_named.callees_named);
  ASSERT_TRUE(mul_named.constants_known);
  OpCall mm_nested = mm_named;
  mm_nested.depth = 1;
  OpCall mul_nested = mul_named;
  mul_nested.depth = 1;
  ReadTrace::Options unnamed;
  unnamed.nested = false;
  ReadTrace trace(unnamed);
  at::mm(at::randn({2, 4}), w);
  trace.stop();
  ASSERT_EQ(trace.ops().size(), 2u);
  const OpCall mm_unnamed = trace.ops().back();
  // w existed before the trace; the first arguments were made by the forward.
  auto classify = [&](const at::Tensor& t) -> std::optional<bool> { return t.is_same(w); };
  struct Case {
    const char* what;
    const OpCall& captured;
    int depth;
    c10::OperatorHandle op;
    std::vector<c10::IValue> args;
    bool expected;
    bool alike;
  };
  const std::vector<Case> cases = {
      {"another made tensor in the same layout", mm_named, 0, mm, {x_other, w}, true, true},
      {"a made tensor with other strides", mm_named, 0, mm, {x_t, w}, true, false},
      {"nested: the same", mm_nested, 1, mm, {x_other, w}, true, true},
      {"nested: the same number", mul_nested, 1, mul, {x_other, c10::Scalar(2.0)}, true, true},
      {"nested: another number (not compared for the call itself)",
       mul_nested,
       1,
       mul,
       {x_other, c10::Scalar(3.0)},
       true,
       false},
      {"top level: another number", mul_named, 0, mul, {x_other, c10::Scalar(3.0)}, false, false},
      {"callees not named at capture", mm_unnamed, 0, mm, {x_other, w}, true, false},
      {"the weight made by the forward",
       mm_named,
       0,
       mm,
       {x_other, at::randn({4, 4})},
       false,
       false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    bool alike = true;
    EXPECT_EQ(is_expected_call(c.captured, c.depth, c.op.schema(), c.args.data(), c.args.size(),
                               classify, nullptr, &alike),
              c.expected);
    EXPECT_EQ(alike, c.alike);
  }
}

}  // namespace
}  // namespace reloadsafe::trace
