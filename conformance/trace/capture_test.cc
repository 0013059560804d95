#include "conformance/trace/capture.h"

#include "conformance/trace/internal/call_match.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/TensorOperators.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/alpha_dropout.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/feature_dropout.h>
#include <ATen/ops/flatten.h>
#include <ATen/ops/full.h>
#include <ATen/ops/gt.h>
#include <ATen/ops/index.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/lift_fresh.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/max.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/neg.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
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

// The first dimension flatten_from flattens.
int64_t& flatten_start() {
  static int64_t start = 0;
  return start;
}

// Where stash_ones leaves what it makes.
at::Tensor& stashed() {
  static at::Tensor t;
  return t;
}

// A kernel object holding a packed weight, as fbgemm's packed linear weights
// are held (a TorchBind object handed to the op).
struct Packed : torch::CustomClassHolder {
  explicit Packed(at::Tensor w) : weight(std::move(w)) {}
  at::Tensor weight;
};

// A handle an op opens and a later op closes, as torch.profiler's
// record_function enters and exits its _RecordFunction: closing one twice
// is an error.
struct Block : torch::CustomClassHolder {
  bool closed = false;
};

TORCH_LIBRARY(reloadsafe_capture_test, m) {
  m.class_<Packed>("Packed").def(
      "unpack", [](const c10::intrusive_ptr<Packed>& self) { return self->weight; });
  m.class_<Block>("Block");
  m.def("open_block(Tensor x) -> __torch__.torch.classes.reloadsafe_capture_test.Block",
        [](const at::Tensor&) { return c10::make_intrusive<Block>(); });
  m.def("close_block(Tensor x, __torch__.torch.classes.reloadsafe_capture_test.Block b) -> Tensor",
        [](const at::Tensor& x, const c10::intrusive_ptr<Block>& b) {
          TORCH_CHECK(!b->closed, "a block closed twice");
          b->closed = true;
          return x * 2;
        });
  m.def("packed_mm(Tensor x, __torch__.torch.classes.reloadsafe_capture_test.Packed w) -> Tensor",
        [](const at::Tensor& x, const c10::intrusive_ptr<Packed>& w) {
          return at::mm(x, w->weight.t());
        });
  // Allocates a scratch tensor without an op and hands it to a nested op, as
  // a kernel may: on a device without the allocation census (meta stands in
  // for CUDA here) the trace's classification of the scratch storage is
  // provisional until the op returns.
  m.def("scratch_add(Tensor x) -> Tensor", [](const at::Tensor& x) {
    const at::Tensor scratch = at::detail::empty_meta(x.sizes(), x.scalar_type());
    return at::add(x, scratch);
  });
  // Makes a tensor inside the op and leaves it aside for a later op, as a
  // kernel that keeps a side table may: the later op reads a storage the
  // forward made that no top-level op returned.
  m.def("stash_ones(Tensor x) -> Tensor", [](const at::Tensor& x) {
    stashed() = at::ones_like(x);
    return x.clone();
  });
  // Flattens from a dimension the kernel keeps (flatten_start()), as a kernel
  // that holds its own settings does: the ATen op it calls is handed a
  // number its caller never saw.
  m.def("flatten_from(Tensor x) -> Tensor",
        [](const at::Tensor& x) { return at::flatten(x, flatten_start(), -1); });
}

// Calls the test library's op `name` with `args` through the dispatcher, as
// a backend calls its custom op: the result.
at::Tensor call_test_op(const char* name, torch::jit::Stack args) {
  const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(
      (std::string("reloadsafe_capture_test::") + name).c_str(), "");
  op.callBoxed(args);
  return args.back().toTensor();
}

at::Tensor flatten_from(const at::Tensor& x) {
  return call_test_op("flatten_from", {x});
}

at::Tensor stash_ones(const at::Tensor& x) {
  return call_test_op("stash_ones", {x});
}

at::Tensor scratch_add(const at::Tensor& x) {
  return call_test_op("scratch_add", {x});
}

at::Tensor packed_mm(const at::Tensor& x, const c10::IValue& object) {
  return call_test_op("packed_mm", {x, object});
}

// y = 2 * (x w^T) inside a block the forward opens and closes.
at::Tensor in_a_block(const at::Tensor& x, const at::Tensor& w) {
  const c10::OperatorHandle open =
      c10::Dispatcher::singleton().findSchemaOrThrow("reloadsafe_capture_test::open_block", "");
  torch::jit::Stack stack{x};
  open.callBoxed(stack);
  const c10::IValue block = stack.back();
  return call_test_op("close_block", {at::mm(x, w.t()), block});
}

// Expects of a checking retrace the answers of a full retrace of the same
// forward: the same changes and replays_as(), every call counted, and
// exactly the calls that are not the captured ones kept, at their positions.
// `same_run`: both traced one run of the forward; else two runs, where a
// storage or object the forward makes anew has another address in each, so
// a change's before and after are not compared.
void expect_answers_of_full(const CapturedForward& capture, const TensorNames& names,
                            const ReadTrace& full, const CheckingRetrace& checking, bool same_run) {
  for (bool details : {true, false}) {
    const std::vector<ReadChange> a = capture.compare(full, names, details);
    const std::vector<ReadChange> b = capture.compare(checking, names, details);
    EXPECT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      EXPECT_EQ(std::tie(a[i].tensor, a[i].what, a[i].read),
                std::tie(b[i].tensor, b[i].what, b[i].read));
      if (same_run) {
        EXPECT_EQ(std::tie(a[i].before, a[i].after), std::tie(b[i].before, b[i].after));
      }
    }
  }
  EXPECT_EQ(capture.replays_as(checking), capture.replays_as(full));
  EXPECT_EQ(checking.calls(), full.ops().size());
  size_t k = 0;
  for (size_t i = 0; i < full.ops().size(); ++i) {
    const bool same =
        i < capture.trace().ops().size() && same_call(capture.trace().ops()[i], full.ops()[i]);
    if (same) continue;
    EXPECT_LT(k, checking.kept().size()) << "call " << i << " differs but was dropped";
    if (k >= checking.kept().size()) break;
    EXPECT_EQ(checking.position(k), i);
    EXPECT_EQ(checking.kept()[k].name, full.ops()[i].name);
    ++k;
  }
  EXPECT_EQ(k, checking.kept().size()) << "a call the same as the captured one was kept";
}

// The forward traced again after a change, both ways: in full, and checking
// each call against the capture (CheckingRetrace, Note [A checking retrace]
// in capture.cc), once at the same time (the checking retrace then sees
// every call) and once each alone (the checking retrace then counts the
// callees it knows without seeing them, Note [A retrace that knows an ATen
// op's callees]). Every checking retrace must give the answers of the full
// one; the full retrace's are returned. `forward` runs three times, each
// time as it would after the change.
struct Retraced {
  std::vector<ReadChange> changes;
  bool replays_as = false;
  at::Tensor out;
  /// Whether a RecordFunction observer was installed at the end of the
  /// checking retrace that ran alone (the name observer, where it had to
  /// name some callees).
  bool alone_observed = false;
};

Retraced retrace(const CapturedForward& capture, const TensorNames& names,
                 const std::function<at::Tensor()>& forward) {
  Retraced r;
  {
    ReadTrace full(capture_trace_options());  // recorded as the capture is
    CheckingRetrace checking(capture);
    r.out = forward();
    checking.stop();
    full.stop();
    SCOPED_TRACE("at the same time");
    expect_answers_of_full(capture, names, full, checking, /*same_run=*/true);
    r.changes = capture.compare(full, names);
    r.replays_as = capture.replays_as(full);
  }
  ReadTrace full(capture_trace_options());
  forward();
  full.stop();
  CheckingRetrace checking(capture);
  forward();
  r.alone_observed = at::hasThreadLocalCallbacks();
  checking.stop();
  SCOPED_TRACE("each alone");
  expect_answers_of_full(capture, names, full, checking, /*same_run=*/false);
  EXPECT_EQ(capture.compare(full, names).size(), r.changes.size());
  return r;
}

// The first GPU run of the checking retrace crashed here: a record the trace
// keeps because it reads a provisional storage was kept without its
// position. Meta, like CUDA, has no allocation census.
TEST(CapturedForward, ACheckingRetraceKeepsTheCallsThatReadAProvisionalStorageWithTheirPositions) {
  const at::Tensor x = at::empty({4}, at::TensorOptions().device(at::kMeta));
  CapturedForward capture([&] { return scratch_add(x); });
  TensorNames names({});
  names.add("x", x, true);
  CheckingRetrace checking(capture);
  scratch_add(x);
  checking.stop();
  ASSERT_FALSE(checking.kept().empty()) << "the nested add reads a provisional storage";
  for (size_t k = 0; k < checking.kept().size(); ++k) {
    EXPECT_NO_THROW(checking.position(k)) << "kept record " << k << " has no position";
  }
  // And the answers are a full retrace's.
  const Retraced r = retrace(capture, names, [&] { return scratch_add(x); });
  EXPECT_FALSE(r.replays_as) << "the scratch storage is new on every call";
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
    EXPECT_TRUE(retrace(capture, names, [&] { return packed_mm(x, kernel); }).changes.empty());
  }
  // Re-packed into a new object, as a post-processing that packs again does.
  const c10::IValue repacked(c10::make_intrusive<Packed>(at::randn({8, 4})));
  const auto violations = retrace(capture, names, [&] { return packed_mm(x, repacked); }).changes;
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

// Note [An object the forward makes] (read_trace.cc): an object an op of
// the forward returns and a later op is handed is the forward's own: not a
// read of the capture, not compared by identity with the next forward's,
// and replayed as the object the replay's own call makes.
TEST(CapturedForward, AnObjectTheForwardMakesIsItsOwn) {
  const at::Tensor x = at::randn({2, 4});
  at::Tensor w = at::randn({8, 4});
  CapturedForward capture([&] { return in_a_block(x, w); });
  TensorNames names({{"w", w, true}});
  for (const CapturedRead& r : capture.reads(names)) {
    EXPECT_NE(r.kind, CapturedRead::Kind::kObject) << r.op;
  }
  // A forward after the weight was refilled in place: no change, though its
  // block is another object.
  w.copy_(at::randn({8, 4}));
  const Retraced same = retrace(capture, names, [&] { return in_a_block(x, w); });
  EXPECT_TRUE(same.changes.empty()) << whats(same.changes).size() << " changes";
  // The replay opens and closes a block of its own (the captured one is
  // closed already) and computes from the refilled weight.
  std::string why;
  const std::optional<at::Tensor> replayed = capture.replay(&why);
  ASSERT_TRUE(replayed.has_value()) << why;
  EXPECT_TRUE(at::allclose(*replayed, in_a_block(x, w)));
  // Moved, the weight is still flagged.
  const at::Tensor moved = w.clone();
  const Retraced rebound = retrace(capture, names, [&] { return in_a_block(x, moved); });
  EXPECT_GE(whats(rebound.changes).count("w: storage"), 1u);
}

TEST(CapturedForward, HeldCallsKeepTheCapturedTensorsAliveAsTheCaptureSawThem) {
  std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> weak;
  std::optional<CapturedForward> capture;
  const c10::TensorImpl* original = nullptr;
  {
    at::Tensor w = at::randn({8});
    weak.emplace(w.storage().getWeakStorageImpl());
    original = w.unsafeGetTensorImpl();
    capture.emplace([&] { return at::neg(w); });
    w.set_data(at::zeros({8}));  // rebinding the caller's object later...
  }
  ASSERT_EQ(capture->held_calls().size(), 1u);
  EXPECT_FALSE(weak->expired()) << "the held call keeps w's storage as the capture saw it";
  const at::Tensor held = capture->held_calls()[0].inputs[0].toTensor();
  EXPECT_NE(held.unsafeGetTensorImpl(), original) << "...does not change what the capture holds";
  EXPECT_EQ(held.storage().unsafeGetStorageImpl(), weak->lock().get());
  EXPECT_EQ(capture->held_calls()[0].outputs.size(), 1u);
  // The capture's trace is a plain record: one call, no arguments kept in it.
  EXPECT_EQ(capture->trace().ops().size(), 1u);
}

TEST(CapturedForward, AForwardThatReadsTheSameTensorsComparesClean) {
  Weights m;
  const at::Tensor x = at::randn({2, 4});
  CapturedForward capture([&] { return m.forward(x); });
  TensorNames names(m.named());
  m.w.copy_(at::randn({8, 4}));  // new values in place: what a good reload does
  EXPECT_TRUE(retrace(capture, names, [&] { return m.forward(x); }).changes.empty());
  std::string why;
  auto replayed = capture.replay(&why);
  ASSERT_TRUE(replayed.has_value()) << why;
  EXPECT_TRUE(at::allclose(*replayed, m.forward(x))) << "the replay reads the new values";
}

// The point of a checking retrace: a forward that stayed put is told call
// by call from the arguments, storages seen for the first time included,
// with no record made; a call that moved is recorded.
TEST(CapturedForward, ACheckingRetraceRecordsOnlyTheCallsThatMoved) {
  Weights m;
  const at::Tensor x = at::randn({2, 4});
  CapturedForward capture([&] { return m.forward(x); });
  m.w.copy_(at::randn({8, 4}));
  {
    CheckingRetrace checking(capture);
    m.forward(x);
    checking.stop();
    EXPECT_EQ(checking.calls(), capture.trace().ops().size());
    EXPECT_EQ(checking.records(), 0u);
    EXPECT_TRUE(checking.kept().empty());
  }
  m.scale = at::rand({8}) + 0.5;  // rebuilt: only the op that reads it moved
  CheckingRetrace checking(capture);
  m.forward(x);
  checking.stop();
  ASSERT_EQ(checking.kept().size(), 1u);
  EXPECT_EQ(checking.kept()[0].name, "aten::mul.Tensor");
  EXPECT_EQ(checking.records(), 1u);
  ReadTrace full;
  m.forward(x);
  full.stop();
  EXPECT_EQ(full.records(), full.calls());
}

// A kernel object is told on the skip path too: the captured object (by
// its C++ instance), each tensor it reports at the captured place, with no
// record made; anything else about it is recorded and reported as a full
// retrace reports it (retrace() checks the answers agree).
TEST(CapturedForward, ACheckingRetraceTellsAKernelObjectWithoutARecordOnlyWhereItStayedPut) {
  struct Row {
    const char* what;
    std::function<void(c10::intrusive_ptr<Packed>&)> reload;
    bool clean;
  };
  const std::vector<Row> rows = {
      {"its weight refilled in place",
       [](c10::intrusive_ptr<Packed>& k) {
         k->weight.copy_(at::randn({8, 4}));
       },
       true},
      {"its weight rebound to a new tensor",
       [](c10::intrusive_ptr<Packed>& k) {
         k->weight = at::randn({8, 4});
       },
       false},
      {"its weight a view elsewhere in a larger storage",
       [](c10::intrusive_ptr<Packed>& k) {
         k->weight = at::randn({9, 4}).narrow(0, 1, 8);
       },
       false},
      {"its weight in another layout on the same storage",
       [](c10::intrusive_ptr<Packed>& k) {
         k->weight = k->weight.as_strided({8, 4}, {1, 8});
       },
       false},
      {"a new instance (re-packed)",
       [](c10::intrusive_ptr<Packed>& k) { k = c10::make_intrusive<Packed>(k->weight); }, false},
  };
  const at::Tensor x = at::randn({2, 4});
  for (const Row& row : rows) {
    SCOPED_TRACE(row.what);
    c10::intrusive_ptr<Packed> kernel = c10::make_intrusive<Packed>(at::randn({8, 4}));
    auto forward = [&] { return packed_mm(x, c10::IValue(kernel)); };
    CapturedForward capture(forward);
    TensorNames names({});
    row.reload(kernel);
    EXPECT_EQ(retrace(capture, names, forward).changes.empty(), row.clean);
    CheckingRetrace checking(capture);
    forward();
    checking.stop();
    EXPECT_EQ(checking.records() == 0, row.clean) << "recorded only where it moved";
  }
}

TEST(CapturedForward, ARebuiltTensorIsFlaggedByAddressAndGivesAStaleReplay) {
  Weights m;
  const at::Tensor x = at::randn({2, 4});
  CapturedForward capture([&] { return m.forward(x); });
  TensorNames names(m.named());
  m.scale = at::rand({8}) + 2.0;  // rebuilt: a new tensor
  const Retraced r = retrace(capture, names, [&] { return m.forward(x); });
  const at::Tensor& live = r.out;
  const auto& violations = r.changes;
  EXPECT_EQ(whats(violations),
            (std::set<std::string>{"scale (undeclared): address", "scale (undeclared): storage"}));
  EXPECT_EQ(violations[0].read, "aten::mul.Tensor arg 1 (other)");
  std::string why;
  auto replayed = capture.replay(&why);
  ASSERT_TRUE(replayed.has_value()) << why;
  EXPECT_FALSE(at::allclose(*replayed, live)) << "the capture still holds the old scale";
}

// A sparse weight is read through its parts (sparse_parts.h): refilled in
// place it compares clean; rebuilt, each part is flagged by its name and
// the replay still computes with the old parts.
TEST(CapturedForward, ASparseTensorIsReadThroughItsPartsAndARebuiltOneIsFlagged) {
  at::Tensor dense = at::randn({8, 4}) * (at::rand({8, 4}) > 0.5);
  at::Tensor w = dense.to_sparse();
  const at::Tensor x = at::randn({4, 2});
  auto forward = [&] { return at::mm(w, x); };
  CapturedForward capture(forward);
  TensorNames names({{"w", w, true}});
  const std::vector<CapturedRead> reads = capture.reads(names);
  std::set<std::string> named;
  for (const CapturedRead& r : reads) named.insert(r.name);
  EXPECT_TRUE(named.count("w._indices") == 1 && named.count("w._values") == 1)
      << ::testing::PrintToString(named);
  w._values().mul_(2.0);  // refilled in place
  EXPECT_TRUE(retrace(capture, names, forward).changes.empty());
  w = (dense * 3.0).to_sparse();  // rebuilt: new index and value tensors
  const Retraced r = retrace(capture, names, forward);
  EXPECT_EQ(whats(r.changes).count("w._values: address"), 1u)
      << ::testing::PrintToString(whats(r.changes));
  EXPECT_EQ(whats(r.changes).count("w._indices: address"), 1u);
  EXPECT_FALSE(r.replays_as);
  std::string why;
  const auto replayed = capture.replay(&why);
  ASSERT_TRUE(replayed.has_value()) << why;
  EXPECT_TRUE(at::allclose(*replayed, at::mm(dense * 2.0, x))) << "the capture holds the old parts";
}

TEST(CapturedForward, ARebindingOfTheSameObjectIsStillAStaleRead) {
  Weights m;
  const at::Tensor x = at::randn({2, 4});
  CapturedForward capture([&] { return m.forward(x); });
  TensorNames names(m.named());
  m.w.set_data(at::randn({8, 4}));  // same object, new storage
  const Retraced r = retrace(capture, names, [&] { return m.forward(x); });
  const at::Tensor& live = r.out;
  EXPECT_EQ(whats(r.changes).count("w: address"), 1u);
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
  EXPECT_EQ(whats(retrace(capture, names, [&] { return m.forward(x); }).changes).count("w: layout"),
            1u);
}

TEST(CapturedForward, AChangedOpSequenceIsFlaggedOnce) {
  Weights m;
  const at::Tensor x = at::randn({2, 4});
  CapturedForward capture([&] { return m.forward(x); });
  TensorNames names(m.named());
  const auto violations = retrace(capture, names, [&] { return at::relu(m.forward(x)); }).changes;
  ASSERT_EQ(violations.size(), 1u);
  EXPECT_EQ(violations[0].tensor, "op sequence");
  EXPECT_EQ(violations[0].what, "length changed");
}

TEST(CapturedForward, EachKindOfSequenceChangeIsOneChangeAndNoReplay) {
  struct Row {
    const char* change;
    std::function<at::Tensor(const Weights&, const at::Tensor&)> forward;
    const char* what;
    const char* after;
  };
  const std::vector<Row> rows = {
      {"one op more at the end",
       [](const Weights& m, const at::Tensor& x) { return at::relu(m.forward(x)); },
       "length changed", "ops (first new: aten::relu)"},
      {"the last op left out",
       [](const Weights& m, const at::Tensor& x) { return at::mm(x, m.w.t()); }, "length changed",
       "ops (first new: (none))"},
      {"another op in the middle",
       [](const Weights& m, const at::Tensor& x) { return at::mm(x, m.w.t()).add(m.scale); },
       "changed", "aten::add.Tensor (depth 0)"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.change);
    Weights m;
    const at::Tensor x = at::randn({2, 4});
    CapturedForward capture([&] { return m.forward(x); });
    const Retraced r = retrace(capture, TensorNames(m.named()), [&] { return row.forward(m, x); });
    ASSERT_EQ(r.changes.size(), 1u);
    EXPECT_EQ(r.changes[0].tensor, "op sequence");
    EXPECT_NE(r.changes[0].what.find(row.what), std::string::npos) << r.changes[0].what;
    EXPECT_NE(r.changes[0].after.find(row.after), std::string::npos) << r.changes[0].after;
    EXPECT_FALSE(r.replays_as);
  }
}

// Two weights read through a tensor list, and a number: every way a call
// can move in place of the same op sequence.
struct TwoWeights {
  at::Tensor a = at::randn({8, 4});
  at::Tensor b = at::randn({8, 4});
  double scale = 0.5;
  at::Tensor forward(const at::Tensor& x) const {
    return at::mul(at::mm(x, at::cat({a, b}).t()), scale);
  }
  std::vector<NamedTensor> named() const { return {{"a", a, true}, {"b", b, true}}; }
};

struct CheckingRow {
  const char* change;
  std::function<void(TwoWeights&)> apply;
  bool clean;
};

// The retrace helper above requires a checking retrace to give a full one's
// answers and keep exactly the calls that moved; these rows move each part.
TEST(CapturedForward, ACheckingRetraceGivesTheAnswersOfAFullOne) {
  const std::vector<CheckingRow> rows = {
      {"nothing", [](TwoWeights&) {}, true},
      {"a refilled in place",
       [](TwoWeights& m) {
         m.a.copy_(at::randn({8, 4}));
       },
       true},
      {"a rebuilt",
       [](TwoWeights& m) {
         m.a = at::randn({8, 4});
       },
       false},
      {"b rebuilt (the list's second element)",
       [](TwoWeights& m) {
         m.b = at::randn({8, 4});
       },
       false},
      {"a and b swapped", [](TwoWeights& m) { std::swap(m.a, m.b); }, false},
      {"a's storage reallocated under it",
       [](TwoWeights& m) {
         m.a.resize_({64, 4});
         m.a = m.a.narrow(0, 0, 8);
       },
       false},
      {"a at another offset of its storage",
       [](TwoWeights& m) {
         m.a = at::randn({9, 4}).narrow(0, 1, 8);
       },
       false},
      {"a read with other strides over the same bytes",
       [](TwoWeights& m) {
         m.a = m.a.view({4, 8}).t();
       },
       false},
      {"scale changed", [](TwoWeights& m) { m.scale = 2.0; }, false},
  };
  for (const CheckingRow& row : rows) {
    SCOPED_TRACE(row.change);
    TwoWeights m;
    const at::Tensor x = at::randn({2, 4});
    CapturedForward capture([&] { return m.forward(x); });
    const TensorNames names(m.named());
    row.apply(m);
    const Retraced r = retrace(capture, names, [&] { return m.forward(x); });
    EXPECT_EQ(r.changes.empty() && r.replays_as, row.clean);
  }
}

TEST(CapturedForward, ReadsWithoutDetailsAreTheSameReadsUnformatted) {
  Weights m;
  const at::Tensor x = at::randn({2, 4});
  c10::IValue kernel(c10::make_intrusive<Packed>(at::randn({3, 8})));
  CapturedForward capture([&] { return packed_mm(m.forward(x), kernel); });
  TensorNames names(m.named());
  names.add_object("linear.packed", &kernel.toObjectRef());
  const std::vector<CapturedRead> full = capture.reads(names);
  const std::vector<CapturedRead> bare = capture.reads(names, /*details=*/false);
  ASSERT_EQ(full.size(), bare.size());
  ASSERT_GE(full.size(), 4u) << "w, scale, the object and the tensor it reports";
  for (size_t i = 0; i < full.size(); ++i) {
    SCOPED_TRACE(full[i].name);
    EXPECT_FALSE(full[i].op.empty());
    EXPECT_TRUE(bare[i].op.empty());
    EXPECT_EQ(
        std::tie(full[i].depth, full[i].name, full[i].declared, full[i].storage, full[i].kind),
        std::tie(bare[i].depth, bare[i].name, bare[i].declared, bare[i].storage, bare[i].kind));
    if (full[i].kind == CapturedRead::Kind::kObject) {
      EXPECT_EQ(bare[i].layout, full[i].layout) << "an object's class is not formatted";
    } else {
      EXPECT_FALSE(full[i].layout.empty());
      EXPECT_TRUE(bare[i].layout.empty());
    }
  }
}

TEST(CapturedForward, RandomOpsAreNotReplayedAndSaySo) {
  const at::Tensor w = at::randn({8});
  CapturedForward capture([&] { return at::dropout(w, 0.5, /*train=*/true); });
  std::string why;
  EXPECT_FALSE(capture.replay(&why).has_value());
  EXPECT_NE(why.find("random"), std::string::npos) << why;
}

// Dropout in eval mode draws nothing (every served model, GPT-2's among
// them): the capture replays. Its drawing form is still found, by the
// random op it calls inside (above).
TEST(CapturedForward, DropoutInEvalModeIsReplayed) {
  const at::Tensor w = at::randn({8});
  for (auto* dropout : {&at::dropout, &at::feature_dropout, &at::alpha_dropout}) {
    CapturedForward capture([&] { return at::mul((*dropout)(w.view({2, 4}), 0.5, false), 2.0); });
    std::string why;
    const std::optional<at::Tensor> replayed = capture.replay(&why);
    ASSERT_TRUE(replayed.has_value()) << why;
    EXPECT_TRUE(at::equal(*replayed, w.view({2, 4}) * 2.0));
  }
}

// A replay that cannot run every op gives up before it runs any: the
// forward's in-place write to a layer tensor is not made again by a replay
// that then returns nothing.
TEST(CapturedForward, AReplayThatCannotRunEveryOpWritesNothing) {
  const at::Tensor counter = at::zeros({4});
  const at::Tensor x = at::randn({4});
  CapturedForward capture([&] {
    counter.add_(1);
    return at::mul(stash_ones(x), stashed());
  });
  ASSERT_TRUE(at::equal(counter, at::ones({4})));
  std::string why;
  EXPECT_FALSE(capture.replay(&why).has_value());
  EXPECT_NE(why.find("made without an op"), std::string::npos) << why;
  EXPECT_NE(why.find("aten::mul"), std::string::npos) << why;
  EXPECT_TRUE(at::equal(counter, at::ones({4}))) << "the failed replay wrote " << counter;
  stashed().reset();
}

// Note [A made tensor under another object]: a factory's result handed to
// the next op as a new tensor object over the same storage, as PyTorch's
// Python factories do when the capture holds the op's result. The replay
// runs, over the storage it made in that op's place, and still computes
// with the weights the capture saw.
TEST(CapturedForward, AMadeTensorHandedOnUnderAnotherObjectIsReplayed) {
  at::Tensor w = at::randn({4});
  const at::Tensor x = at::randn({4});
  auto forward = [&] {
    const at::Tensor made = at::zeros({4});
    const at::Tensor other(made.unsafeGetTensorImpl()->shallow_copy_and_detach(
        /*version_counter=*/c10::VariableVersion(0), /*allow_tensor_metadata_change=*/true));
    return at::add(at::add(other, x), w.view({2, 2}).reshape({4}));
  };
  CapturedForward capture(forward);
  std::string why;
  std::optional<at::Tensor> replayed = capture.replay(&why);
  ASSERT_TRUE(replayed.has_value()) << why;
  EXPECT_TRUE(at::equal(*replayed, x + w));
  w.mul_(3.0);  // refilled in place: the replay reads the new values
  replayed = capture.replay(&why);
  ASSERT_TRUE(replayed.has_value()) << why;
  EXPECT_TRUE(at::allclose(*replayed, x + w));
  const at::Tensor old = w.clone();
  w = at::randn({4});  // rebuilt: the replay still reads the old tensor
  replayed = capture.replay(&why);
  ASSERT_TRUE(replayed.has_value()) << why;
  EXPECT_TRUE(at::allclose(*replayed, x + old));
}

// replays_through(): whether a replay is known from the capture alone to
// run every call and return a result. Where it says yes, the replay does;
// where it says no, either the replay gives up or only running it could
// tell (a made tensor handed on under another object).
TEST(CapturedForward, ReplaysThroughTellsFromTheCaptureWhetherAReplayRuns) {
  const at::Tensor w = at::randn({4});
  const at::Tensor x = at::randn({4});
  struct Row {
    const char* forward;
    std::function<at::Tensor()> run;
    bool through;
  };
  const std::vector<Row> rows = {
      {"ops on external and made tensors", [&] { return at::mul(at::add(x, w), w); }, true},
      {"returns an external tensor",
       [&] {
         at::neg(x);
         return w;
       },
       true},
      {"a random draw", [&] { return at::dropout(w, 0.5, /*train=*/true); }, false},
      {"reads a tensor made without an op", [&] { return at::mul(stash_ones(x), stashed()); },
       false},
      {"a made tensor handed on under another object",
       [&] {
         const at::Tensor made = at::zeros({4});
         const at::Tensor other(made.unsafeGetTensorImpl()->shallow_copy_and_detach(
             /*version_counter=*/c10::VariableVersion(0), /*allow_tensor_metadata_change=*/true));
         return at::add(other, x);
       },
       false},
  };
  for (const Row& row : rows) {
    CapturedForward capture(row.run);
    EXPECT_EQ(capture.replays_through(), row.through) << row.forward;
    std::string why;
    const std::optional<at::Tensor> replayed = capture.replay(&why);
    if (row.through) {
      EXPECT_TRUE(replayed.has_value()) << row.forward << ": " << why;
    }
    EXPECT_EQ(capture.replays_through(), row.through) << row.forward << ", after a replay";
    stashed().reset();
  }
}

// A read of a tensor with no elements reads no byte: a compiler's empty
// constant is no read a graph holds, and its place may change freely.
TEST(CapturedForward, AReadOfNoElementsIsNoRead) {
  at::Tensor empty = at::empty({0});
  const at::Tensor w = at::randn({4});
  auto forward = [&] { return at::cat({w, empty}); };
  CapturedForward capture(forward);
  TensorNames names({{"w", w, true}});
  for (const CapturedRead& r : capture.reads(names)) EXPECT_EQ(r.name, "w");
  empty = at::empty({0});
  EXPECT_TRUE(retrace(capture, names, forward).changes.empty());
}

// Note [An op sequence that follows the weights] in protocol.cc: a change
// of ops that another run of the forward repeats, after the capture read a
// value on the host, follows the values; one with no value read before it
// (work a reload moved from its post-processing into the forward) does not,
// even where the other run's post-processing ran the same ops last.
TEST(CapturedForward, AnOpSequenceFollowsValuesOnlyAfterAValueReadOnTheHost) {
  at::Tensor w = at::ones({4, 4});
  const at::Tensor x = at::randn({2, 4});
  auto routed = [&] {
    const at::Tensor y = at::mm(x, w.t());
    return at::sum(w).item<double>() < 0 ? at::relu(y) : y;
  };
  CapturedForward capture(routed);
  w.neg_();  // a new checkpoint's values
  CheckingRetrace retrace(capture);
  routed();
  retrace.stop();
  ReadTrace cold(capture_trace_options());
  at::Tensor loaded = at::neg(at::ones({4, 4}));  // a cold load, then its forward
  routed();
  cold.stop();
  EXPECT_TRUE(capture.follows_values(retrace, cold.ops()));
  ReadTrace other_ops(capture_trace_options());
  at::mm(x, w.t());
  other_ops.stop();
  EXPECT_FALSE(capture.follows_values(retrace, other_ops.ops())) << "another run ran other ops";

  // Work moved from post-processing into the forward: the post-processing
  // of the other run ends with the very ops the forward now runs first.
  at::Tensor cached = w.t().contiguous();
  auto lazy = [&] { return at::mm(x, cached.defined() ? cached : w.t().contiguous()); };
  CapturedForward lazy_capture(lazy);
  cached = at::Tensor();  // dropped by the reload, rebuilt by each forward
  CheckingRetrace lazy_retrace(lazy_capture);
  lazy();
  lazy_retrace.stop();
  ReadTrace lazy_cold(capture_trace_options());
  cached = w.t().contiguous();  // the cold load's post-processing
  lazy();
  lazy_cold.stop();
  EXPECT_FALSE(lazy_capture.follows_values(lazy_retrace, lazy_cold.ops()));
}

// Note [An op sequence that follows the weights] in forward_checks.cc: the
// same ops handed other numbers follow the values where the capture read a
// value on the host before the first such call, and another run hands the
// retrace's numbers; a number with no read before it (one post-processing
// computed, which a graph bakes in) is named but never follows the values.
TEST(CapturedForward, NewNumbersFollowTheValuesOnlyAfterAReadOnTheHost) {
  struct Row {
    const char* what;
    bool read_in_forward;       // the scale read with item() by the forward, or kept by the caller
    bool other_hands_retraces;  // the other run hands the retrace's number
    bool follows;
  };
  for (const Row& row : {
           Row{"read by the forward, another run agrees", true, true, true},
           Row{"read by the forward, another run hands a third number", true, false, false},
           Row{"kept by post-processing (baked)", false, true, false},
       }) {
    at::Tensor w = at::ones({4, 4});
    const at::Tensor x = at::randn({2, 4});
    double kept = 2.0;  // post-processing's number
    auto forward = [&] {
      const at::Tensor y = at::mm(x, w.t());
      const double scale = row.read_in_forward ? at::max(w).item<double>() : kept;
      return at::mul(y, scale);
    };
    CapturedForward capture(forward);
    w.fill_(3.0);  // a correct reload
    kept = 3.0;
    CheckingRetrace retrace(capture);
    forward();
    retrace.stop();
    const std::optional<ReadChange> numbers = capture.new_arguments(retrace);
    ASSERT_TRUE(numbers.has_value()) << row.what;
    EXPECT_NE(numbers->what.find("(aten::mul.Scalar) handed other numbers"), std::string::npos)
        << row.what << ": " << numbers->what;
    EXPECT_EQ(capture.can_follow_values(retrace), row.read_in_forward) << row.what;
    if (!row.other_hands_retraces) {
      w.fill_(5.0);
      kept = 5.0;
    }
    ReadTrace other(capture_trace_options());
    forward();
    other.stop();
    EXPECT_EQ(capture.follows_values(retrace, other.ops()), row.follows) << row.what;
  }
  // The same numbers: nothing to name.
  at::Tensor w = at::ones({4, 4});
  auto forward = [&] { return at::mul(w, at::max(w).item<double>()); };
  CapturedForward capture(forward);
  CheckingRetrace retrace(capture);
  forward();
  retrace.stop();
  EXPECT_FALSE(capture.new_arguments(retrace).has_value());
}

// The same for where in a storage an op reads: an index read on the host
// picks an expert's slice of a fused weight (torch.compile's graph reads it
// through a view the op's arguments do not name). With no read before it,
// the move is named and never follows the values.
TEST(CapturedForward, AReadMovedWithinItsStorageFollowsTheValuesOnlyAfterAReadOnTheHost) {
  struct Row {
    const char* name;
    bool read_in_forward;  // the index comes from a value read on the host
    int64_t other_expert;  // where another run of the forward reads
    bool follows;
  };
  const Row rows[] = {
      {"routed by the forward, repeated by another run", true, 2, true},
      {"kept by post-processing", false, 2, false},
      {"routed by the forward, another run reads a third place", true, 3, false},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    const at::Tensor experts = at::randn({4, 3, 3});
    // Each expert's slice, made before the forward as a compiled graph's
    // views are: no op of the forward is handed the index.
    std::vector<at::Tensor> slices;
    for (int64_t e = 0; e < 4; ++e) slices.push_back(experts[e]);
    const at::Tensor x = at::randn({2, 3});
    at::Tensor gate = at::zeros({4});
    int64_t kept = 1;  // post-processing's index
    auto forward = [&] {
      const int64_t e = row.read_in_forward ? at::argmax(gate).item<int64_t>() : kept;
      return at::mm(x, slices[e]);
    };
    gate[1] = 1.0;
    CapturedForward capture(forward);
    gate[1] = 0.0;  // a correct reload routes to expert 2
    gate[2] = 1.0;
    kept = 2;
    CheckingRetrace retrace(capture);
    forward();
    retrace.stop();
    const std::optional<ReadChange> moved = capture.new_arguments(retrace);
    ASSERT_TRUE(moved.has_value());
    EXPECT_NE(moved->what.find("(aten::mm) reads mat2 at another place of its storage"),
              std::string::npos)
        << moved->what;
    EXPECT_EQ(capture.first_change(retrace), moved->call);
    EXPECT_EQ(capture.can_follow_values(retrace), row.read_in_forward) << moved->what;
    gate[2] = 0.0;
    gate[row.other_expert] = 1.0;
    kept = row.other_expert;
    ReadTrace other(capture_trace_options());
    forward();
    other.stop();
    EXPECT_EQ(capture.follows_values(retrace, other.ops()), row.follows) << moved->what;
  }
}

// Note [A read of values no op makes] in read_trace.h: a forward that reads
// a value through its pointer, as Tensor.tolist() does, and routes by it
// follows the values only where it notes that read; without the note no
// read is seen before the changed op, as for work a reload moved.
TEST(CapturedForward, AReadNoOpMakesCountsOnceItIsNoted) {
  for (const bool noted : {true, false}) {
    at::Tensor w = at::ones({4, 4});
    const at::Tensor x = at::randn({2, 4});
    auto routed = [&] {
      const at::Tensor y = at::mm(x, w.t());
      const at::Tensor total = at::sum(w);
      if (noted) note_host_read(total);
      return *total.const_data_ptr<float>() < 0 ? at::relu(y) : y;
    };
    CapturedForward capture(routed);
    w.neg_();
    CheckingRetrace retrace(capture);
    routed();
    retrace.stop();
    ReadTrace cold(capture_trace_options());
    routed();
    cold.stop();
    EXPECT_EQ(capture.follows_values(retrace, cold.ops()), noted) << "noted: " << noted;
  }
}

// internal/unfilled_memory.h: memory an empty() made that PyTorch filled from
// Python data (torch.tensor(data): the bytes written through the pointer,
// then to(), lift_fresh() and detach_()) is replayed with the bytes the
// capture read, whatever ops write it later; memory an op filled is rebuilt
// by that op; memory code outside the dispatcher wrote, with no lift_fresh()
// to say it is data, cannot be rebuilt, and the replay refuses.
TEST(CapturedForward, MemoryNoOpFilledIsReplayedWhenItHoldsPythonData) {
  enum class Fill { kPythonData, kPythonDataCopied, kOp, kPointerOnly };
  struct Row {
    const char* forward;
    Fill fill;
    bool viewed_first = false;            // filled and read through a view
    bool bumped_before_the_read = false;  // add_(): reads it and writes it
    bool written_after_the_read = false;  // zero_()
    bool shape_taken_first = false;       // new_zeros(): its sizes and dtype, no value
    bool reshaped_in_place = false;       // unsqueeze_(): sizes, not bytes
  };
  for (const Row& row : {
           Row{"Python data", Fill::kPythonData},
           Row{"Python data, read through a view", Fill::kPythonData, true},
           Row{"Python data, bumped by add_ before the read", Fill::kPythonData, false, true},
           Row{"Python data, written by an op after the read", Fill::kPythonData, false, false,
               true},
           Row{"Python data, reshaped in place first", Fill::kPythonData, false, false, false,
               false, true},
           Row{"Python data copied to another dtype before lift_fresh", Fill::kPythonDataCopied},
           Row{"filled by fill_", Fill::kOp},
           Row{"filled by fill_ through a view", Fill::kOp, true},
           Row{"filled by fill_ after new_zeros took its shape", Fill::kOp, false, false, false,
               true},
           Row{"filled through its pointer only", Fill::kPointerOnly},
           Row{"filled through its pointer only, reshaped in place", Fill::kPointerOnly, false,
               false, false, false, true},
       }) {
    const at::Tensor w = at::randn({4, 3});
    auto forward = [&] {
      at::Tensor index = at::empty({2}, row.fill == Fill::kPythonDataCopied ? at::kInt : at::kLong);
      if (row.shape_taken_first) index.new_zeros({2});
      if (row.reshaped_in_place) index.unsqueeze_(0).squeeze_(0);
      if (row.fill == Fill::kOp) {
        (row.viewed_first ? index.view({2}) : index).fill_(1);
      } else if (row.fill == Fill::kPythonDataCopied) {
        index.data_ptr<int32_t>()[0] = 1;  // no op: the trace sees nothing
        index.data_ptr<int32_t>()[1] = 2;
        index = at::lift_fresh(index.to(at::kLong));  // a copy: other memory
        index.detach_();
      } else {
        index.data_ptr<int64_t>()[0] = 1;
        index.data_ptr<int64_t>()[1] = 2;
        if (row.fill == Fill::kPythonData) {
          index = at::lift_fresh(index.to(at::kLong));  // the same tensor
          index.detach_();
        }
      }
      at::Tensor seen = row.viewed_first ? index.view({2}) : index;
      if (row.bumped_before_the_read) seen.add_(1);
      at::Tensor out = at::index_select(w, 0, seen);
      if (row.written_after_the_read) index.zero_();
      return out;
    };
    const at::Tensor expected = forward();
    CapturedForward capture(forward);
    std::string why;
    std::optional<at::Tensor> replayed;
    for (int i = 0; i < 3; ++i) {  // fresh memory each time: not the capture's by chance
      const at::Tensor other = at::full({64}, -7, at::kLong);  // memory in use meanwhile
      replayed = capture.replay(&why);
      if (!replayed) break;
      EXPECT_TRUE(at::equal(*replayed, expected)) << row.forward;
    }
    EXPECT_EQ(replayed.has_value(), row.fill != Fill::kPointerOnly) << row.forward << ": " << why;
    if (!replayed) {
      EXPECT_NE(why.find("aten::index_select reads memory an empty-like op made that no op wrote"),
                std::string::npos)
          << why;
    }
  }
}

// Note [Python data made without an op] (capture.cc): on the CPU PyTorch
// turns a Python number into a tensor straight from the allocator (`x[mask]
// = 0`) and hands it to lift_fresh(). The replay hands a fresh copy of the
// bytes lift_fresh() was handed, whatever ops write it afterwards; the same
// kind of tensor handed to any other op is not known to be data, and the
// replay refuses.
TEST(CapturedForward, APythonNumberMadeWithoutAnOpIsReplayedAsData) {
  // A one-element tensor holding `value`, made and filled with no op.
  auto number = [](float value) {
    at::Tensor t = at::detail::empty_cpu({}, at::kFloat);
    *t.data_ptr<float>() = value;
    return t;
  };
  struct Row {
    const char* forward;
    std::function<at::Tensor(const at::Tensor& w)> run;
    bool replays;
  };
  const std::vector<Row> rows = {
      {"assigned through a mask (index_put_)",
       [&](const at::Tensor& w) {
         at::Tensor out = w.clone();
         out.index_put_(c10::List<std::optional<at::Tensor>>{at::gt(w, 0)},
                        at::lift_fresh(number(0.5f)));
         return at::mul(out, w);
       },
       true},
      {"written in place after lift_fresh",
       [&](const at::Tensor& w) {
         at::Tensor v = at::lift_fresh(number(2.0f));
         v.add_(1);
         return at::mul(w, v);
       },
       true},
      {"handed to an op other than lift_fresh",
       [&](const at::Tensor& w) { return at::mul(w, number(2.0f)); }, false},
  };
  for (const Row& row : rows) {
    const at::Tensor w = at::randn({4, 3});
    const at::Tensor expected = row.run(w);
    CapturedForward capture([&] { return row.run(w); });
    EXPECT_EQ(capture.replays_through(), row.replays) << row.forward;
    std::string why;
    for (int i = 0; i < 3; ++i) {  // each replay from the bytes lift_fresh() was handed
      const std::optional<at::Tensor> replayed = capture.replay(&why);
      ASSERT_EQ(replayed.has_value(), row.replays) << row.forward << ": " << why;
      if (!replayed) {
        EXPECT_NE(why.find("aten::mul reads a tensor the forward made without an op"),
                  std::string::npos)
            << why;
        break;
      }
      EXPECT_TRUE(at::equal(*replayed, expected)) << row.forward << ", replay " << i;
    }
  }
}

// The capture holds its external tensors as copies that require grad where
// the forward's did: matmul folds a batch into one mm only for inputs that
// do not, so a replay on detached copies summed in another order (a last-bit
// difference that Mamba's scan grew past the replay's tolerance).
TEST(CapturedForward, AReplayRunsTheKernelsTheForwardRanOnTensorsThatRequireGrad) {
  at::Generator gen = at::detail::createCPUGenerator(0);
  const at::Tensor w = at::randn({128, 4}, gen).set_requires_grad(true);
  const at::Tensor s = at::randn({1}, gen).set_requires_grad(true);
  const at::Tensor x = at::randn({1, 8, 4}, gen);
  auto forward = [&] { return at::matmul(w, at::mul(x, s).transpose(1, 2)); };
  CapturedForward capture(forward);
  std::string why;
  const std::optional<at::Tensor> replayed = capture.replay(&why);
  ASSERT_TRUE(replayed.has_value()) << why;
  EXPECT_TRUE(replayed->requires_grad());
  EXPECT_TRUE(at::equal(*replayed, capture.output()))
      << "max |diff| " << (*replayed - capture.output()).abs().max().item<double>();
}

TEST(NoteHostRead, IsRecordedAsAReadOfItsTensorAndChangesNothing) {
  const at::Tensor t = at::arange(6, at::kFloat);
  const at::Tensor before = t.clone();
  ReadTrace trace;
  note_host_read(t);
  trace.stop();
  ASSERT_EQ(trace.ops().size(), 1u);
  EXPECT_EQ(trace.ops()[0].name, kHostReadOp);
  ASSERT_EQ(trace.ops()[0].reads.size(), 1u);
  EXPECT_EQ(trace.ops()[0].reads[0].data_ptr, t.const_data_ptr());
  EXPECT_TRUE(at::equal(t, before));
}

// What a retrace alone may take from the capture (Note [A retrace that knows
// an ATen op's callees] in capture.cc): the callees of an ATen op that is
// the captured call and chooses its callees as it did. Each row changes
// one thing that chooses them; the retrace must then name them as the
// capture did (the retrace helper requires the answers of a full retrace:
// the same calls, the same changes) and installs the observer to do it.
TEST(CapturedForward, ARetraceAloneKnowsAnAtenOpsCalleesOnlyWhereTheyAreChosenAsAtCapture) {
  struct Layer {
    at::Tensor w = at::randn({4, 8});
    at::Tensor mask = at::rand({3}) > 0.5;
    std::vector<int64_t> shape = {2, 3, 4};
  };
  struct Row {
    const char* change;
    std::function<at::Tensor(const Layer&, const at::Tensor&)> forward;
    std::function<void(Layer&)> apply;
    bool clean;     // the retrace has nothing to report
    bool observed;  // it had to name some callees
  };
  // The matmul's first argument is made by the forward (a view of the input
  // would be an external read, whose layout is its place).
  const auto matmul = [](const Layer& m, const at::Tensor& x) {
    return at::matmul(at::relu(x).view(m.shape), m.w);
  };
  const auto by_mask = [](const Layer& m, const at::Tensor& x) {
    return x.view({3, 8}).index({m.mask});
  };
  const auto flattened = [](const Layer& m, const at::Tensor& x) {
    return at::mm(flatten_from(x.view({2, 3, 4})).view({-1, 4}), m.w);
  };
  const std::vector<Row> rows = {
      {"nothing: a matmul's callees are the captured ones", matmul, [](Layer&) {}, true, false},
      {"the weight refilled in place", matmul,
       [](Layer& m) {
         m.w.copy_(at::randn({4, 8}));
       },
       true, false},
      {"a made argument in another layout (the matmul is the captured call)", matmul,
       [](Layer& m) {
         m.shape = {6, 4};
       },
       false, true},
      {"nothing, where the callees read a value on the host (an index by a mask)", by_mask,
       [](Layer&) {}, true, true},
      {"the mask's values (the same calls, on more rows)", by_mask,
       [](Layer& m) { m.mask.fill_(true); }, true, true},
      {"nothing: an ATen op inside a custom op", flattened, [](Layer&) {}, true, false},
      {"another number handed to an ATen op inside a custom op", flattened,
       [](Layer&) { flatten_start() = 2; }, false, true},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.change);
    flatten_start() = 0;
    Layer m;
    m.mask[0] = false;
    const at::Tensor x = at::randn({24});
    CapturedForward capture([&] { return row.forward(m, x); });
    const TensorNames names({{"w", m.w, true}, {"mask", m.mask, true}});
    row.apply(m);
    const Retraced r = retrace(capture, names, [&] { return row.forward(m, x); });
    EXPECT_EQ(r.changes.empty(), row.clean) << (r.changes.empty() ? "" : r.changes[0].what);
    EXPECT_EQ(r.alone_observed, row.observed);
  }
  flatten_start() = 0;
}

// A TorchBind object handed to its op from C++, as a backend holding a
// c10::intrusive_ptr of its packed weights does: each call wraps the C++
// instance in a new script object. The instance is the object.
TEST(CapturedForward, AKernelObjectHandedFromCppIsItsCppInstance) {
  const at::Tensor x = at::randn({2, 4});
  c10::intrusive_ptr<Packed> kernel = c10::make_intrusive<Packed>(at::randn({8, 4}));
  auto forward = [&] { return packed_mm(x, c10::IValue(kernel)); };
  CapturedForward capture(forward);
  TensorNames names({});
  kernel->weight.copy_(at::randn({8, 4}));  // refilled in place
  EXPECT_TRUE(retrace(capture, names, forward).changes.empty());
  kernel = c10::make_intrusive<Packed>(at::randn({8, 4}));  // re-packed into a new instance
  int replaced = 0;
  for (const auto& v : retrace(capture, names, forward).changes)
    replaced += v.what == "object replaced";
  EXPECT_EQ(replaced, 1);
}

// Such an object is named by its instance (NamedObject): the name labels the
// object's reads whatever script object wraps the instance on each call.
TEST(TensorNames, AnObjectHandedFromCppIsNamedByItsInstance) {
  const at::Tensor x = at::randn({2, 4});
  c10::intrusive_ptr<Packed> kernel = c10::make_intrusive<Packed>(at::randn({8, 4}));
  auto forward = [&] { return packed_mm(x, c10::IValue(kernel)); };
  CapturedForward capture(forward);
  TensorNames names({});
  names.add_object("kernel", static_cast<const torch::CustomClassHolder*>(kernel.get()));
  int objects = 0;
  for (const CapturedRead& r : capture.reads(names)) {
    if (r.kind != CapturedRead::Kind::kObject) continue;
    ++objects;
    EXPECT_EQ(r.name, "kernel");
    EXPECT_TRUE(r.declared);
  }
  EXPECT_EQ(objects, 1);
  kernel = c10::make_intrusive<Packed>(at::randn({8, 4}));
  EXPECT_EQ(whats(retrace(capture, names, forward).changes).count("kernel: object replaced"), 1u);
}

// A forward that enters autocast (or inference mode) inside: the replay,
// run by a thread outside it, runs each op under the state it ran under.
TEST(CapturedForward, AnOpReplaysUnderTheAutocastItRanUnder) {
  const at::Tensor w = at::randn({8, 4});
  const at::Tensor x = at::randn({2, 4});
  auto forward = [&] {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::Tensor out = at::mm(x, w.t());
    at::autocast::set_autocast_enabled(at::kCPU, false);
    return out;
  };
  CapturedForward capture(forward);
  const at::Tensor live = forward();
  ASSERT_EQ(live.scalar_type(), at::kBFloat16);
  at::autocast::set_autocast_dtype(at::kCPU, at::kHalf);  // the replaying thread's own
  std::string why;
  auto replayed = capture.replay(&why);
  ASSERT_TRUE(replayed.has_value()) << why;
  EXPECT_EQ(replayed->scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(*replayed, live));
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU))
      << "the replay put the thread's state back";
  EXPECT_EQ(at::autocast::get_autocast_dtype(at::kCPU), at::kHalf);
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
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
    const Retraced r = retrace(capture, TensorNames({}), [&] { return layer.forward(x); });
    const at::Tensor& out = r.out;
    EXPECT_EQ(r.replays_as, row.replays_as);
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
    EXPECT_FALSE(
        retrace(capture, TensorNames({}), [&] { return at::relu(at::mm(x, w.t())); }).replays_as)
        << "one op more";
  }
  c10::IValue kernel(c10::make_intrusive<Packed>(w));
  CapturedForward packed([&] { return packed_mm(x, kernel); });
  {
    EXPECT_TRUE(retrace(packed, TensorNames({}), [&] { return packed_mm(x, kernel); }).replays_as)
        << "the same object";
  }
  const c10::IValue repacked(c10::make_intrusive<Packed>(w));
  EXPECT_FALSE(retrace(packed, TensorNames({}), [&] { return packed_mm(x, repacked); }).replays_as)
      << "a new object on the same weight";
}

}  // namespace
}  // namespace reloadsafe::trace
