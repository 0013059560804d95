#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/trace/read_trace.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ScalarOps.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/add.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/div.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/index.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/neg.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/zeros.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <gtest/gtest.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <functional>
#include <optional>
#include <set>
#include <stdexcept>
#include <string_view>
#include <thread>

namespace reloadsafe::trace {
namespace {

const void* storage_of(const at::Tensor& t) {
  return t.storage().unsafeGetStorageImpl();
}

// The reads of every op named `name` (with overload), in order.
std::vector<TensorRead> reads_of(const ReadTrace& trace, const std::string& name) {
  std::vector<TensorRead> out;
  for (const auto& op : trace.ops()) {
    if (op.name == name) out.insert(out.end(), op.reads.begin(), op.reads.end());
  }
  return out;
}

std::set<const void*> external_storages(const ReadTrace& trace) {
  std::set<const void*> s;
  for (const auto& [i, r] : trace.external_reads()) s.insert(r.storage);
  return s;
}

TEST(ReadTrace, ViewsOfAnExternalStorageAreExternalAndResultsAreInternal) {
  const at::Tensor w = at::randn({16, 8});
  const at::Tensor x = at::randn({4, 8});
  ReadTrace trace;
  at::Tensor y = at::mm(x, w.t());
  at::Tensor z = at::relu(y);
  trace.stop();

  const auto t_reads = reads_of(trace, "aten::t");
  ASSERT_EQ(t_reads.size(), 1u);
  EXPECT_TRUE(t_reads[0].external);
  EXPECT_EQ(t_reads[0].storage, storage_of(w));

  const auto mm_reads = reads_of(trace, "aten::mm");
  ASSERT_EQ(mm_reads.size(), 2u);
  EXPECT_TRUE(mm_reads[0].external);
  EXPECT_EQ(mm_reads[0].arg_name, "self");
  EXPECT_TRUE(mm_reads[1].external) << "a view of an external weight is external";
  EXPECT_EQ(mm_reads[1].storage, storage_of(w));
  EXPECT_EQ(mm_reads[1].data_ptr, w.data_ptr());
  EXPECT_EQ(c10::IntArrayRef(mm_reads[1].sizes), c10::IntArrayRef({8, 16}));
  EXPECT_EQ(c10::IntArrayRef(mm_reads[1].strides), c10::IntArrayRef({1, 8}));

  const auto relu_reads = reads_of(trace, "aten::relu");
  ASSERT_EQ(relu_reads.size(), 1u);
  EXPECT_FALSE(relu_reads[0].external) << "y was made inside the scope";
  EXPECT_EQ(external_storages(trace), (std::set<const void*>{storage_of(w), storage_of(x)}));
  EXPECT_EQ(trace.classify(y.storage().unsafeGetStorageImpl()), std::optional<bool>(false));
}

TEST(ReadTrace, InPlaceAndOutOpsMarkTheirWrittenArgument) {
  at::Tensor w = at::zeros({8});
  const at::Tensor a = at::ones({8});
  ReadTrace trace;
  w.add_(a);
  at::Tensor out = at::empty({8});
  at::add_out(out, a, a);
  trace.stop();

  const auto add_ = reads_of(trace, "aten::add_.Tensor");
  ASSERT_EQ(add_.size(), 2u);
  EXPECT_TRUE(add_[0].written);
  EXPECT_TRUE(add_[0].external);
  EXPECT_FALSE(add_[1].written);

  const auto add_out = reads_of(trace, "aten::add.out");
  ASSERT_EQ(add_out.size(), 3u);
  EXPECT_EQ(add_out[2].arg_name, "out");
  EXPECT_TRUE(add_out[2].written);
  EXPECT_FALSE(add_out[2].external) << "`out` came from aten::empty inside the scope";
}

TEST(ReadTrace, SeesOpsNestedInsideCompositeOps) {
  const at::Tensor w = at::randn({16, 8});
  const at::Tensor b = at::randn({16});
  const at::Tensor x = at::randn({4, 8});
  ReadTrace trace;
  at::linear(x, w, b);
  trace.stop();

  ASSERT_FALSE(trace.ops().empty());
  EXPECT_EQ(trace.ops()[0].name, "aten::linear");
  EXPECT_EQ(trace.ops()[0].depth, 0);
  EXPECT_EQ(trace.ops()[0].reads.size(), 3u);
  bool nested_read_of_w = false;
  for (const auto& op : trace.ops()) {
    if (op.depth == 0) continue;
    for (const auto& r : op.reads) nested_read_of_w |= r.external && r.storage == storage_of(w);
  }
  EXPECT_TRUE(nested_read_of_w) << "linear's decomposition reads w one level deeper";

  ReadTrace flat(ReadTrace::Options{/*nested=*/false});
  at::linear(x, w, b);
  flat.stop();
  ASSERT_EQ(flat.ops().size(), 1u);
  EXPECT_EQ(flat.ops()[0].name, "aten::linear");
}

// A custom op whose implementation reads a tensor it holds (a kernel object's
// state): the caller never passes it.
at::Tensor& held_scale() {
  static at::Tensor scale = at::full({8}, 2.0);
  return scale;
}
at::Tensor scale_by_held(const at::Tensor& x) {
  return x * held_scale();
}

TORCH_LIBRARY(reloadsafe_trace_test, m) {
  m.def("scale_by_held(Tensor x) -> Tensor");
}
TORCH_LIBRARY_IMPL(reloadsafe_trace_test, CompositeImplicitAutograd, m) {
  m.impl("scale_by_held", &scale_by_held);
}

TEST(ReadTrace, SeesCustomOpsAndTheTensorsTheirKernelsHold) {
  const at::Tensor x = at::randn({4, 8});
  held_scale();  // the kernel object's state exists before the scope
  auto op = c10::Dispatcher::singleton()
                .findSchemaOrThrow("reloadsafe_trace_test::scale_by_held", "")
                .typed<at::Tensor(const at::Tensor&)>();
  ReadTrace trace;
  op.call(x);
  trace.stop();
  ASSERT_FALSE(trace.ops().empty());
  EXPECT_EQ(trace.ops()[0].name, "reloadsafe_trace_test::scale_by_held");
  EXPECT_EQ(external_storages(trace),
            (std::set<const void*>{storage_of(x), storage_of(held_scale())}));
}

// Note [Inside an ATen op]: the same forward (a custom op whose kernel reads
// a tensor it holds, then a composite ATen op) traced three ways. Each way
// records the same calls at the same depths; a trace that takes an ATen
// op's callees by name records them without reads, whether it saw them
// through the name observer (alone) or through the fallback (under a trace
// that reads them), and still reads every call outside an ATen op.
struct CalleeCase {
  const char* how;
  bool names;       // the checked trace takes an ATen op's callees by name
  bool under_full;  // it runs inside a trace that reads them
};

void PrintTo(const CalleeCase& c, std::ostream* os) {
  *os << c.how;
}

class AtenCallees : public ::testing::TestWithParam<CalleeCase> {};

using NamedCalls = std::vector<std::pair<std::string, int>>;

NamedCalls calls_of(const ReadTrace& trace) {
  NamedCalls out;
  for (const OpCall& op : trace.ops()) out.emplace_back(std::string(op.name), op.depth);
  return out;
}

// Whether ops()[i] was called inside an ATen op: its caller, or a caller
// further up, is one.
bool inside_aten_op(const std::vector<OpCall>& ops, size_t i) {
  int depth = ops[i].depth;
  for (size_t k = i; k-- > 0 && depth > 0;) {
    if (ops[k].depth >= depth) continue;
    if (ops[k].name.substr(0, 6) == "aten::") return true;
    depth = ops[k].depth;
  }
  return false;
}

TEST_P(AtenCallees, AreRecordedAtTheirDepthsAndByNameWhenAsked) {
  const CalleeCase& c = GetParam();
  const at::Tensor x = at::randn({4, 8});
  const at::Tensor w = at::randn({16, 8});
  const at::Tensor b = at::randn({16});
  held_scale();
  auto custom = c10::Dispatcher::singleton()
                    .findSchemaOrThrow("reloadsafe_trace_test::scale_by_held", "")
                    .typed<at::Tensor(const at::Tensor&)>();
  auto forward = [&] { at::linear(custom.call(x), w, b); };
  ReadTrace reference;  // every callee read
  forward();
  reference.stop();

  ReadTrace::Options options;
  options.aten_callee_reads = !c.names;
  std::optional<ReadTrace> outer;
  if (c.under_full) outer.emplace();
  ReadTrace trace(options);
  forward();
  trace.stop();
  if (outer) outer->stop();

  EXPECT_EQ(calls_of(trace), calls_of(reference)) << c.how;
  const std::vector<OpCall>& ops = trace.ops();
  bool held_read = false;
  bool aten_callees = false;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!inside_aten_op(ops, i)) {
      EXPECT_EQ(ops[i].reads.size(), reference.ops()[i].reads.size())
          << c.how << ": " << ops[i].name;
    } else {
      aten_callees = true;
      if (c.names) {
        EXPECT_TRUE(ops[i].reads.empty()) << c.how << ": " << ops[i].name;
      }
    }
    for (const TensorRead& r : ops[i].reads) {
      held_read |= r.external && r.storage == storage_of(held_scale());
    }
  }
  EXPECT_TRUE(aten_callees) << c.how << ": linear's decomposition is recorded";
  EXPECT_TRUE(held_read) << c.how << ": the custom op's callee reads the tensor its kernel holds";
  EXPECT_EQ(external_storages(trace), external_storages(reference)) << c.how;
}

INSTANTIATE_TEST_SUITE_P(ReadTrace, AtenCallees,
                         ::testing::Values(CalleeCase{"every callee read", false, false},
                                           CalleeCase{"by name, alone", true, false},
                                           CalleeCase{"by name, under a trace that reads them",
                                                      true, true}),
                         [](const auto& info) {
                           return std::string(info.param.names ? "ByName" : "Read") +
                                  (info.param.under_full ? "UnderAFullTrace" : "");
                         });

// A packed kernel object as TorchBind sees one (fbgemm's packed weights are
// such objects): it holds a weight, reports it through unpack(), and an op
// takes the object as an argument.
struct PackedWeight : torch::CustomClassHolder {
  explicit PackedWeight(at::Tensor w) : weight(std::move(w)) {}
  at::Tensor weight;
  bool stable = true;  // false: unpack() makes a new tensor every call
};

TORCH_LIBRARY(reloadsafe_object_test, m) {
  m.class_<PackedWeight>("PackedWeight")
      .def("unpack", [](const c10::intrusive_ptr<PackedWeight>& self) {
        return self->stable ? self->weight : self->weight.clone();
      });
  m.def(
      "packed_mm(Tensor x, __torch__.torch.classes.reloadsafe_object_test.PackedWeight w) -> "
      "Tensor",
      [](const at::Tensor& x, const c10::intrusive_ptr<PackedWeight>& w) {
        return at::mm(x, w->weight.t());
      });
}

at::Tensor call_packed_mm(const at::Tensor& x, const c10::IValue& object) {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("reloadsafe_object_test::packed_mm", "");
  torch::jit::Stack stack{x, object};
  op.callBoxed(stack);
  return stack.back().toTensor();
}

TEST(ReadTrace, RecordsOpaqueObjectsAndTheTensorsTheyReport) {
  const at::Tensor x = at::randn({4, 8});
  auto packed = c10::make_intrusive<PackedWeight>(at::randn({16, 8}));
  const c10::IValue object(packed);
  ReadTrace trace;
  call_packed_mm(x, object);
  trace.stop();
  ASSERT_FALSE(trace.ops().empty());
  const OpCall& op = trace.ops()[0];
  EXPECT_EQ(op.name, "reloadsafe_object_test::packed_mm");
  ASSERT_EQ(op.objects.size(), 1u);
  EXPECT_EQ(op.objects[0].class_name, "reloadsafe_object_test.PackedWeight");
  EXPECT_EQ(op.objects[0].identity, &object.toObjectRef());
  EXPECT_NE(op.objects[0].payload, nullptr);
  EXPECT_EQ(op.objects[0].where(op.name), "reloadsafe_object_test::packed_mm arg 1 (w)");
  std::vector<TensorRead> reported;
  for (const TensorRead& r : op.reads) {
    if (r.object != nullptr) reported.push_back(r);
  }
  ASSERT_EQ(reported.size(), 1u) << "the weight unpack() reports is a read of the op";
  EXPECT_EQ(reported[0].object, &object.toObjectRef());
  EXPECT_EQ(reported[0].storage, storage_of(packed->weight));
  EXPECT_TRUE(reported[0].external);
  EXPECT_EQ(reported[0].arg_name, "w.unpack()[0]");
  for (const OpCall& o : trace.ops()) {
    EXPECT_NE(o.name, "aten::clone") << "asking the object for its tensors records no op";
  }
}

TEST(ReadTrace, AnObjectWhoseTensorsChangeOnEveryCallReportsNone) {
  auto packed = c10::make_intrusive<PackedWeight>(at::randn({16, 8}));
  packed->stable = false;
  const c10::IValue object(packed);
  const at::Tensor x = at::randn({4, 8});
  ReadTrace trace;
  call_packed_mm(x, object);
  trace.stop();
  ASSERT_FALSE(trace.ops().empty());
  ASSERT_EQ(trace.ops()[0].name, "reloadsafe_object_test::packed_mm");
  EXPECT_EQ(trace.ops()[0].objects.size(), 1u) << "the object itself is still a read";
  for (const TensorRead& r : trace.ops()[0].reads) EXPECT_EQ(r.object, nullptr);
}

TEST(ReadTrace, ATraceOpenedInsideAnotherLeavesTheOuterOneRecording) {
  const at::Tensor a = at::randn({4, 4});
  ReadTrace outer(ReadTrace::Options{/*nested=*/false});
  at::relu(a);
  {
    ReadTrace inner;
    at::mm(a, a);
    inner.stop();
    EXPECT_EQ(reads_of(inner, "aten::mm").size(), 2u);
    EXPECT_TRUE(reads_of(inner, "aten::relu").empty());
  }
  at::neg(a);
  outer.stop();
  std::vector<std::string> names;
  for (const auto& op : outer.ops()) names.emplace_back(op.name);
  EXPECT_EQ(names, (std::vector<std::string>{"aten::relu", "aten::mm", "aten::neg"}));
}

// Note [Op names]: a call names its op with the overload, by a view of one
// string per name that every trace (and every thread) shares.
TEST(ReadTrace, NamesEachOpWithItsOverloadByOneSharedString) {
  const at::Tensor a = at::randn({3});
  const at::Tensor b = at::randn({3});
  auto names_of = [&] {
    ReadTrace trace(ReadTrace::Options{/*nested=*/false});
    at::add(a, b);
    at::neg(a);
    at::add(a, 2.0);
    trace.stop();
    std::vector<std::string_view> names;
    for (const auto& op : trace.ops()) names.push_back(op.name);
    return names;
  };
  const std::vector<std::string_view> first = names_of();
  ASSERT_EQ(first,
            (std::vector<std::string_view>{"aten::add.Tensor", "aten::neg", "aten::add.Scalar"}));
  std::vector<std::string_view> other_thread;
  std::thread([&] { other_thread = names_of(); }).join();
  for (const std::vector<std::string_view>& again : {names_of(), other_thread}) {
    ASSERT_EQ(again, first);
    for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(again[i].data(), first[i].data());
  }
}

TEST(ReadTrace, SeesTensorListsAndSkipsWrappedNumbers) {
  const at::Tensor a = at::ones({2});
  const at::Tensor b = at::zeros({3});
  ReadTrace trace;
  const at::Tensor m = at::ones({2, 3});
  const at::Tensor idx = at::arange(2);
  at::cat({a, b});
  at::mul(a, at::native::wrapped_scalar_tensor(0.5));
  // A Tensor?[]: m[:, idx] hands index() [None, idx].
  at::index(m, c10::List<std::optional<at::Tensor>>({std::nullopt, idx}));
  trace.stop();
  const auto cat = reads_of(trace, "aten::cat");
  ASSERT_EQ(cat.size(), 2u);
  EXPECT_EQ(cat[0].element, 0);
  EXPECT_EQ(cat[1].element, 1);
  EXPECT_EQ(cat[1].storage, storage_of(b));
  EXPECT_EQ(reads_of(trace, "aten::mul.Tensor").size(), 1u) << "0.5 is not a memory read";
  const auto index = reads_of(trace, "aten::index.Tensor");
  ASSERT_EQ(index.size(), 2u) << "the None element is no read";
  EXPECT_EQ(index[0].storage, storage_of(m));
  EXPECT_EQ(index[1].storage, storage_of(idx));
  EXPECT_EQ(index[1].element, 1);
  EXPECT_EQ(index[1].arg_name, "indices");
}

TEST(ReadTrace, TwoThreadsTracingAtOnceSeeOnlyTheirOwnOps) {
  const at::Tensor wa = at::randn({8});
  const at::Tensor wb = at::randn({8});
  std::set<const void*> seen_a, seen_b;
  size_t ops_a = 0, ops_b = 0;
  auto work = [](const at::Tensor& w, std::set<const void*>& seen, size_t& ops) {
    ReadTrace trace;
    for (int i = 0; i < 200; ++i) at::neg(w);
    trace.stop();
    ops = trace.ops().size();
    seen = external_storages(trace);
  };
  std::thread ta(work, std::cref(wa), std::ref(seen_a), std::ref(ops_a));
  std::thread tb(work, std::cref(wb), std::ref(seen_b), std::ref(ops_b));
  ta.join();
  tb.join();
  EXPECT_EQ(seen_a, std::set<const void*>{storage_of(wa)});
  EXPECT_EQ(seen_b, std::set<const void*>{storage_of(wb)});
  EXPECT_EQ(ops_a, 200u);
  EXPECT_EQ(ops_b, 200u);
}

TEST(ReadTrace, AScopeThatThrowsLeavesNoCallbackBehind) {
  const at::Tensor w = at::randn({8});
  try {
    ReadTrace trace;
    at::neg(w);
    throw std::runtime_error("forward failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(c10::impl::tls_is_dispatch_key_included(kTraceKey));
  // An op that throws inside the dispatcher unwinds the trace's depth too.
  const at::Tensor a = at::ones({2, 3});
  ReadTrace trace;
  EXPECT_THROW(at::mm(a, a), c10::Error);
  at::neg(w);
  trace.stop();
  ASSERT_EQ(trace.ops().size(), 2u);
  EXPECT_EQ(trace.ops()[1].depth, 0);
  EXPECT_FALSE(c10::impl::tls_is_dispatch_key_included(kTraceKey));
  at::neg(w);
  EXPECT_EQ(trace.ops().size(), 2u) << "a stopped trace records nothing";
}

// A hook that skips, drops and watches calls by rule, and says what it saw.
struct ScriptedHook : CallHook {
  std::function<bool(size_t position, int depth)> skip_if = [](size_t, int) { return false; };
  std::function<bool(size_t position)> drop_if = [](size_t) { return false; };
  std::vector<size_t> kept_positions;
  int begun = 0;
  int ended = 0;
  size_t last_args = 0;

  bool skip(ReadTrace&, size_t position, int depth, const c10::FunctionSchema&,
            c10::ArrayRef<c10::IValue>) override {
    return skip_if(position, depth);
  }
  bool keep(size_t position, const OpCall&, bool) override {
    if (drop_if(position)) return false;
    kept_positions.push_back(position);
    return true;
  }
  void top_level_begin(const ReadTrace&, const c10::OperatorHandle&,
                       c10::ArrayRef<c10::IValue> args) override {
    ++begun;
    last_args = args.size();
  }
  void top_level_end(const ReadTrace&, const c10::OperatorHandle&,
                     c10::ArrayRef<c10::IValue> returns) override {
    ++ended;
    EXPECT_EQ(returns.size(), 1u);
  }
};

TEST(ReadTrace, AHookDecidesWhichCallsAreRecordedAndKept) {
  const at::Tensor w = at::randn({8});
  struct Case {
    const char* what;
    std::function<bool(size_t, int)> skip_if;
    std::function<bool(size_t)> drop_if;
    std::vector<std::string_view> ops;  // recorded and kept, in order
    size_t records;
    int top_level_hooked;  // begin and end calls for kept top-level calls
  };
  const std::vector<Case> cases = {
      {"no say",
       [](size_t, int) { return false; },
       [](size_t) { return false; },
       {"aten::neg", "aten::abs", "aten::relu"},
       3,
       3},
      {"skips the second call",
       [](size_t p, int) { return p == 1; },
       [](size_t) { return false; },
       {"aten::neg", "aten::relu"},
       2,
       2},
      {"drops the first record",
       [](size_t, int) { return false; },
       [](size_t p) { return p == 0; },
       {"aten::abs", "aten::relu"},
       3,
       2},
      {"skips everything",
       [](size_t, int) { return true; },
       [](size_t) { return false; },
       {},
       0,
       0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ScriptedHook hook;
    hook.skip_if = c.skip_if;
    hook.drop_if = c.drop_if;
    ReadTrace trace(ReadTrace::Options{/*nested=*/false, &hook});
    at::relu(at::abs(at::neg(w)));
    trace.stop();
    std::vector<std::string_view> names;
    for (const OpCall& op : trace.ops()) names.push_back(op.name);
    EXPECT_EQ(names, c.ops);
    EXPECT_EQ(trace.calls(), 3u) << "every call is counted, skipped or not";
    EXPECT_EQ(trace.records(), c.records);
    EXPECT_EQ(hook.begun, c.top_level_hooked);
    EXPECT_EQ(hook.ended, c.top_level_hooked);
    if (c.top_level_hooked > 0) {
      EXPECT_EQ(hook.last_args, 1u) << "the op's arguments";
    }
  }
}

TEST(ReadTrace, WithoutAHookEveryCallIsRecordedAndCounted) {
  // Without a hook nothing changes: calls() and records() count every call.
  const at::Tensor w = at::randn({8});
  ReadTrace trace;
  at::neg(w);
  trace.stop();
  EXPECT_EQ(trace.calls(), trace.ops().size());
  EXPECT_EQ(trace.records(), trace.ops().size());
}

TEST(ReadTrace, TensorsAllocatedInsideTheScopeWithoutAnOpAreInternal) {
  const at::Tensor before = at::randn({4});
  ReadTrace trace;
  // The CPU allocator, no dispatcher: as structured kernels make outputs.
  at::Tensor inside = at::detail::empty_cpu({4}, at::kFloat, std::nullopt, std::nullopt,
                                            std::nullopt, std::nullopt);
  at::add(inside, before);
  trace.stop();
  const auto reads = reads_of(trace, "aten::add.Tensor");
  ASSERT_EQ(reads.size(), 2u);
  EXPECT_FALSE(reads[0].external);
  EXPECT_TRUE(reads[1].external);
}

// The ops a forward hands its weights to, each seen with its arguments.
TEST(ReadTrace, SeesTheWeightInEveryOpAForwardHandsItTo) {
  at::Tensor w = at::randn({4, 4});
  const at::Tensor x = at::randn({4, 4});
  ReadTrace trace;
  at::Tensor wt = w.t();
  at::Tensor q = at::div(x, w);
  at::Tensor m = at::mm(x, wt);
  at::Tensor r = w.resolve_conj();
  w.fill_(1.0);
  trace.stop();

  for (const char* name : {"aten::t", "aten::div.Tensor", "aten::mm", "aten::fill_.Scalar"}) {
    SCOPED_TRACE(name);
    const auto reads = reads_of(trace, name);
    ASSERT_FALSE(reads.empty()) << "the fallback sees every top-level op";
    EXPECT_EQ(reads.back().storage, storage_of(w));
  }
}

// Note [Code that is not the forward's work]: a compiler running inside the
// scope. Its ops are neither recorded nor counted, and what it allocated and
// the traced code later reads counts as state from before the trace.
TEST(ReadTrace, AnUntracedStretchIsNeitherRecordedNorCountedAndWhatItMadeLivesOn) {
  const at::Tensor w = at::randn({4, 4});
  ReadTrace trace;
  at::Tensor before = at::neg(w);
  at::Tensor constant;
  {
    UntracedScope compiling;
    EXPECT_TRUE(untraced());
    constant = at::mul(w, 2.0);  // an op the compiler runs, and a tensor it keeps
    at::Tensor scratch = at::relu(w);
  }
  EXPECT_FALSE(untraced());
  at::Tensor after = at::add(before, constant);
  trace.stop();

  std::vector<std::string> names;
  for (const auto& op : trace.ops()) names.emplace_back(op.name);
  EXPECT_EQ(names, (std::vector<std::string>{"aten::neg", "aten::add.Tensor"}));
  EXPECT_EQ(trace.calls(), 2u) << "an untraced call is not counted either";
  const auto reads = reads_of(trace, "aten::add.Tensor");
  ASSERT_EQ(reads.size(), 2u);
  EXPECT_FALSE(reads[0].external) << "made by the traced code";
  EXPECT_TRUE(reads[1].external) << "made while untraced: it lives on, as a weight does";
}

// begin_untraced/end_untraced are a scope split in two (a compiler's start
// and end callbacks); an end without a begin changes nothing, so a stretch
// that ended elsewhere cannot leave the thread untraced for good.
TEST(ReadTrace, UntracedStretchesNestAndAnUnmatchedEndIsIgnored) {
  end_untraced();
  EXPECT_FALSE(untraced());
  begin_untraced();
  begin_untraced();
  end_untraced();
  EXPECT_TRUE(untraced());
  end_untraced();
  EXPECT_FALSE(untraced());
  end_untraced();
  EXPECT_FALSE(untraced());

  const at::Tensor w = at::randn({4});
  ReadTrace trace;
  at::neg(w);
  trace.stop();
  EXPECT_EQ(trace.ops().size(), 1u);
}

}  // namespace
}  // namespace reloadsafe::trace
