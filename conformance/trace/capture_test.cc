#include "conformance/trace/capture.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace reloadsafe::trace {
namespace {

std::set<std::string> whats(const std::vector<ReadChange>& vs) {
  std::set<std::string> s;
  for (const auto& v : vs) s.insert(v.tensor + ": " + v.what);
  return s;
}

// A layer reduced to two tensors the forward reads.
struct Weights {
  at::Tensor w = at::randn({8, 4});
  at::Tensor scale = at::rand({8}) + 0.5;
  at::Tensor forward(const at::Tensor& x) const { return at::mm(x, w.t()) * scale; }
  std::vector<NamedTensor> named() const { return {{"w", w, true}, {"scale", scale, false}}; }
};

// A kernel object holding a packed weight, as fbgemm's packed linear weights
// are held (a TorchBind object handed to the op).
struct Packed : torch::CustomClassHolder {
  explicit Packed(at::Tensor w) : weight(std::move(w)) {}
  at::Tensor weight;
};

TORCH_LIBRARY(reloadsafe_capture_test, m) {
  m.class_<Packed>("Packed").def(
      "unpack", [](const c10::intrusive_ptr<Packed>& self) { return self->weight; });
  m.def("packed_mm(Tensor x, __torch__.torch.classes.reloadsafe_capture_test.Packed w) -> Tensor",
        [](const at::Tensor& x, const c10::intrusive_ptr<Packed>& w) {
          return at::mm(x, w->weight.t());
        });
}

at::Tensor packed_mm(const at::Tensor& x, const c10::IValue& object) {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("reloadsafe_capture_test::packed_mm", "");
  torch::jit::Stack stack{x, object};
  op.callBoxed(stack);
  return stack.back().toTensor();
}

TEST(CapturedForward, AReplacedKernelObjectIsAViolationNamingItAndTheOp) {
  const at::Tensor x = at::randn({2, 4});
  c10::IValue kernel(c10::make_intrusive<Packed>(at::randn({8, 4})));
  CapturedForward capture([&] { return packed_mm(x, kernel); });
  TensorNames names({});
  names.add_object("linear.packed", &kernel.toObjectRef());
  {
    // The same object, its weight refilled in place: clean.
    kernel.toCustomClass<Packed>()->weight.copy_(at::randn({8, 4}));
    ReadTrace retrace;
    packed_mm(x, kernel);
    retrace.stop();
    EXPECT_TRUE(capture.compare(retrace, names).empty());
  }
  // Re-packed into a new object, as a post-processing that packs again does.
  const c10::IValue repacked(c10::make_intrusive<Packed>(at::randn({8, 4})));
  ReadTrace retrace;
  packed_mm(x, repacked);
  retrace.stop();
  const auto violations = capture.compare(retrace, names);
  EXPECT_EQ(whats(violations).count("linear.packed: object replaced"), 1u);
  EXPECT_EQ(whats(violations).count("linear.packed.unpack()[0]: storage"), 1u)
      << "the tensor the object reports is checked too";
  bool named_read = false;
  for (const auto& v : violations) {
    named_read |= v.read == "reloadsafe_capture_test::packed_mm arg 1 (w)";
  }
  EXPECT_TRUE(named_read);
  // The replay runs the captured op on the captured object: the old weight.
  std::string why;
  auto replayed = capture.replay(&why);
  ASSERT_TRUE(replayed.has_value()) << why;
  EXPECT_FALSE(at::allclose(*replayed, packed_mm(x, repacked)));
}

TEST(CapturedForward, AForwardThatReadsTheSameTensorsComparesClean) {
  Weights m;
  const at::Tensor x = at::randn({2, 4});
  CapturedForward capture([&] { return m.forward(x); });
  TensorNames names(m.named());
  m.w.copy_(at::randn({8, 4}));  // new values in place: what a good reload does
  ReadTrace retrace;
  m.forward(x);
  retrace.stop();
  EXPECT_TRUE(capture.compare(retrace, names).empty());
  std::string why;
  auto replayed = capture.replay(&why);
  ASSERT_TRUE(replayed.has_value()) << why;
  EXPECT_TRUE(at::allclose(*replayed, m.forward(x))) << "the replay reads the new values";
}

TEST(CapturedForward, ARebuiltTensorIsFlaggedByAddressAndGivesAStaleReplay) {
  Weights m;
  const at::Tensor x = at::randn({2, 4});
  CapturedForward capture([&] { return m.forward(x); });
  TensorNames names(m.named());
  m.scale = at::rand({8}) + 2.0;  // rebuilt: a new tensor
  ReadTrace retrace;
  const at::Tensor live = m.forward(x);
  retrace.stop();
  const auto violations = capture.compare(retrace, names);
  EXPECT_EQ(whats(violations),
            (std::set<std::string>{"scale (undeclared): address", "scale (undeclared): storage"}));
  EXPECT_EQ(violations[0].read, "aten::mul.Tensor arg 1 (other)");
  std::string why;
  auto replayed = capture.replay(&why);
  ASSERT_TRUE(replayed.has_value()) << why;
  EXPECT_FALSE(at::allclose(*replayed, live)) << "the capture still holds the old scale";
}

TEST(CapturedForward, ARebindingOfTheSameObjectIsStillAStaleRead) {
  Weights m;
  const at::Tensor x = at::randn({2, 4});
  CapturedForward capture([&] { return m.forward(x); });
  TensorNames names(m.named());
  m.w.set_data(at::randn({8, 4}));  // same object, new storage
  ReadTrace retrace;
  const at::Tensor live = m.forward(x);
  retrace.stop();
  EXPECT_EQ(whats(capture.compare(retrace, names)).count("w: address"), 1u);
  std::string why;
  auto replayed = capture.replay(&why);
  ASSERT_TRUE(replayed.has_value()) << why;
  EXPECT_FALSE(at::allclose(*replayed, live));
}

TEST(CapturedForward, ALayoutChangeIsFlagged) {
  Weights m;
  m.w = at::randn({4, 8}).t();  // K-major view
  const at::Tensor x = at::randn({2, 4});
  CapturedForward capture([&] { return m.forward(x); });
  TensorNames names(m.named());
  m.w.set_(m.w.storage(), 0, {8, 4}, {4, 1});  // same bytes, other strides
  ReadTrace retrace;
  m.forward(x);
  retrace.stop();
  EXPECT_EQ(whats(capture.compare(retrace, names)).count("w: layout"), 1u);
}

TEST(CapturedForward, AChangedOpSequenceIsFlaggedOnce) {
  Weights m;
  const at::Tensor x = at::randn({2, 4});
  CapturedForward capture([&] { return m.forward(x); });
  TensorNames names(m.named());
  ReadTrace retrace;
  at::relu(m.forward(x));
  retrace.stop();
  const auto violations = capture.compare(retrace, names);
  ASSERT_EQ(violations.size(), 1u);
  EXPECT_EQ(violations[0].tensor, "op sequence");
  EXPECT_EQ(violations[0].what, "length changed");
}

TEST(CapturedForward, RandomOpsAreNotReplayedAndSaySo) {
  const at::Tensor w = at::randn({8});
  CapturedForward capture([&] { return at::dropout(w, 0.5, /*train=*/true); });
  std::string why;
  EXPECT_FALSE(capture.replay(&why).has_value());
  EXPECT_NE(why.find("random"), std::string::npos) << why;
}

TEST(CapturedForward, AForwardThatThrowsLeavesNothingRecording) {
  EXPECT_THROW(CapturedForward([]() -> at::Tensor { throw std::runtime_error("boom"); }),
               std::runtime_error);
  EXPECT_FALSE(c10::impl::tls_is_dispatch_key_included(trace::kTraceKey));
}

TEST(TensorNames, LabelsWholeTensorsViewsUndeclaredAndUnknownReads) {
  const at::Tensor w = at::randn({4, 4});
  const at::Tensor s = at::randn({4});
  const at::Tensor other = at::randn({4});
  TensorNames names({{"w", w, true}, {"s", s, false}});
  ReadTrace trace;
  at::neg(w);
  at::neg(w.t());
  at::neg(s);
  at::neg(other);
  trace.stop();
  std::vector<std::string> labels;
  for (const auto& op : trace.ops()) {
    if (op.depth == 0 && op.name == "aten::neg") labels.push_back(names.label(op.reads[0]));
  }
  EXPECT_EQ(labels,
            (std::vector<std::string>{"w", "w (view)", "s (undeclared)", "undeclared tensor"}));
}

}  // namespace
}  // namespace reloadsafe::trace

namespace reloadsafe::trace {
namespace {

// What a layer may change between a capture and a retrace, and whether the
// retrace then made exactly the captured calls (Note [A retrace that is its
// own replay]). Where it did, the replay computes what the retrace did;
// where it did not, the row says whether the replay shows it.
struct ScaledLinear {
  at::Tensor w = at::randn({8, 4});
  double scale = 0.5;    // handed to the op as a number, as a Python float is
  at::Tensor bias_word;  // a wrapped number, as `y + 0.25` from Python makes
  ScaledLinear() : bias_word(at::scalar_tensor(0.25, at::kDouble)) {
    bias_word.unsafeGetTensorImpl()->set_wrapped_number(true);
  }
  at::Tensor forward(const at::Tensor& x) const {
    return at::add(at::mul(at::mm(x, w.t()), scale), bias_word);
  }
};

struct ReplaysAsRow {
  const char* change;
  std::function<void(ScaledLinear&)> apply;
  bool replays_as;
};

TEST(CapturedForward, ReplaysAsHoldsExactlyWhenTheRetraceMadeTheCapturedCalls) {
  const std::vector<ReplaysAsRow> rows = {
      {"nothing", [](ScaledLinear&) {}, true},
      {"weight refilled in place",
       [](ScaledLinear& l) {
         l.w.copy_(at::randn({8, 4}));
       },
       true},
      {"weight rebuilt",
       [](ScaledLinear& l) {
         l.w = at::randn({8, 4});
       },
       false},
      {"weight transposed in its storage",
       [](ScaledLinear& l) {
         l.w = l.w.view({4, 8}).t();
       },
       false},
      {"scale number changed", [](ScaledLinear& l) { l.scale = 2.0; }, false},
      {"wrapped number changed",
       [](ScaledLinear& l) {
         l.bias_word = at::scalar_tensor(1.0, at::kDouble);
         l.bias_word.unsafeGetTensorImpl()->set_wrapped_number(true);
       },
       false},
  };
  for (const ReplaysAsRow& row : rows) {
    SCOPED_TRACE(row.change);
    ScaledLinear layer;
    const at::Tensor x = at::randn({2, 4});
    CapturedForward capture([&] { return layer.forward(x); });
    row.apply(layer);
    ReadTrace retrace;
    const at::Tensor out = layer.forward(x);
    retrace.stop();
    EXPECT_EQ(capture.replays_as(retrace), row.replays_as);
    std::string why;
    const std::optional<at::Tensor> replayed = capture.replay(&why);
    ASSERT_TRUE(replayed.has_value()) << why;
    if (row.replays_as) {
      EXPECT_TRUE(at::equal(*replayed, out)) << "the replay computes what the retrace did";
    } else {
      // Each change the retrace shows is one a replay computes stale.
      EXPECT_FALSE(at::allclose(*replayed, out));
    }
  }
}

TEST(CapturedForward, ReplaysAsIsFalseForAnotherOpSequenceOrObject) {
  const at::Tensor x = at::randn({2, 4});
  const at::Tensor w = at::randn({8, 4});
  CapturedForward capture([&] { return at::mm(x, w.t()); });
  {
    ReadTrace retrace;
    at::relu(at::mm(x, w.t()));
    retrace.stop();
    EXPECT_FALSE(capture.replays_as(retrace)) << "one op more";
  }
  c10::IValue kernel(c10::make_intrusive<Packed>(w));
  CapturedForward packed([&] { return packed_mm(x, kernel); });
  {
    ReadTrace retrace;
    packed_mm(x, kernel);
    retrace.stop();
    EXPECT_TRUE(packed.replays_as(retrace)) << "the same object";
  }
  const c10::IValue repacked(c10::make_intrusive<Packed>(w));
  ReadTrace retrace;
  packed_mm(x, repacked);
  retrace.stop();
  EXPECT_FALSE(packed.replays_as(retrace)) << "a new object on the same weight";
}

}  // namespace
}  // namespace reloadsafe::trace
