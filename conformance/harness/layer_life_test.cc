// The rules of a layer's life (layer_life.h) on a hand-written subject: how
// many loads a layer built aside gets, the module caches around it however
// it ends, what a layer's state holds, and when the layers made aside are
// the subject's copies.

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/layer_life.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace reloadsafe::harness {
namespace {

// A cache the subject's layers share: post-processing puts its weight's
// copy there.
struct Cache {
  std::vector<NamedTensor> entries;
};

class Subject;

// y = x * w; post-processing adds 1 to `passes` and caches a copy of w.
class Layer : public SubjectLayer {
 public:
  explicit Layer(Subject& s) : s_(s) {}
  void load(const Checkpoint& ckpt) override;
  void process() override;
  at::Tensor forward(const at::Tensor& x) override;
  std::vector<NamedTensor> named_tensors() override {
    return {{"w", w, true}, {"workspace", workspace, false}};
  }
  std::vector<NamedNumber> named_numbers() override {
    return {{"passes", static_cast<double>(passes), true}, {"clock", 42.0, false}};
  }

  at::Tensor w = at::zeros({4});
  at::Tensor workspace = at::zeros({2});
  int loads = 0;
  int passes = 0;
  int forwards = 0;

 private:
  Subject& s_;
};

class Subject : public ReloadSubject {
 public:
  SubjectInfo info() const override { return SubjectInfo{}; }
  Checkpoint draw_checkpoint(uint64_t seed) override {
    return {{"w", at::full({4}, static_cast<double>(seed))}};
  }
  at::Tensor draw_input(uint64_t /*seed*/) override { return at::full({4}, 2.0); }
  std::shared_ptr<SubjectLayer> new_layer() override {
    auto layer = std::make_shared<Layer>(*this);
    built.push_back(layer);
    return layer;
  }
  // A copy of a layer as built, as `copies` says (CopyKind).
  std::shared_ptr<SubjectLayer> copy_of_new_layer(const Checkpoint* on) override;
  std::vector<NamedTensor> cache_tensors() override { return cache.entries; }
  void empty_caches() override {
    stashed.push_back(cache);
    cache = Cache{};
  }
  void restore_caches() override {
    cache = stashed.back();
    stashed.pop_back();
  }

  Cache cache;
  std::vector<Cache> stashed;
  std::vector<std::shared_ptr<Layer>> built;
  int copies_made = 0;
  int copies_on_a_checkpoint = 0;
  bool fail_load = false;
  bool fail_forward = false;
  // What copy_of_new_layer() gives.
  enum class CopyKind {
    kNone,         // none: the subject has no cheaper way
    kFaithful,     // a layer that loads and runs as a built one
    kLoadsOther,   // its load leaves another value in w
    kRunsOther,    // its forward gives another output
    kOtherNumber,  // another host number
    kRaises,       // its post-processing raises
  };
  CopyKind copies = CopyKind::kNone;
};

// A copy, as Subject::copies says.
class CopyLayer : public Layer {
 public:
  CopyLayer(Subject& s, Subject::CopyKind kind) : Layer(s), kind_(kind) {}
  void load(const Checkpoint& ckpt) override {
    Layer::load(ckpt);
    if (kind_ == Subject::CopyKind::kLoadsOther) w.add_(1);
  }
  void process() override {
    if (kind_ == Subject::CopyKind::kRaises) throw std::runtime_error("copy failed");
    Layer::process();
  }
  at::Tensor forward(const at::Tensor& x) override {
    const at::Tensor y = Layer::forward(x);
    return kind_ == Subject::CopyKind::kRunsOther ? y + 1 : y;
  }
  std::vector<NamedNumber> named_numbers() override {
    std::vector<NamedNumber> out = Layer::named_numbers();
    if (kind_ == Subject::CopyKind::kOtherNumber) out[0].value += 1;
    return out;
  }

 private:
  Subject::CopyKind kind_;
};

std::shared_ptr<SubjectLayer> Subject::copy_of_new_layer(const Checkpoint* on) {
  if (copies == CopyKind::kNone) return nullptr;
  ++copies_made;
  if (on != nullptr) ++copies_on_a_checkpoint;
  return std::make_shared<CopyLayer>(*this, copies);
}

void Layer::load(const Checkpoint& ckpt) {
  if (s_.fail_load) throw std::runtime_error("load failed");
  ++loads;
  w.copy_(ckpt.at("w"));
}

at::Tensor Layer::forward(const at::Tensor& x) {
  ++forwards;
  if (s_.fail_forward) throw std::runtime_error("forward failed");
  return x * w;
}

void Layer::process() {
  ++passes;
  s_.cache.entries.push_back({"cache[w]", w.clone(), false});
}

TEST(LayerLife, AColdLoadIsLoadThenProcessAsManyTimesAsAsked) {
  for (int loads : {1, 2, 3}) {
    SCOPED_TRACE(loads);
    Subject subject;
    std::shared_ptr<SubjectLayer> layer = cold_loaded(subject, subject.draw_checkpoint(3), loads);
    const Layer& built = *subject.built.at(0);
    EXPECT_EQ(built.loads, loads);
    EXPECT_EQ(built.passes, loads);
    EXPECT_TRUE(at::equal(built.w, at::full({4}, 3.0)));
  }
}

TEST(LayerLife, AsideTheCachesAreEmptiedAndPutBackHoweverTheStepEnds) {
  Subject subject;
  subject.cache.entries.push_back({"cache[live]", at::zeros({1}), false});
  // The forward of a layer built aside, and its state, with what its own
  // post-processing cached; the live entry is back after each.
  AsideLayers aside(subject);
  const at::Tensor y = cold_forward(aside, subject.draw_checkpoint(5), subject.draw_input(0));
  EXPECT_TRUE(at::equal(y, at::full({4}, 10.0)));
  ASSERT_EQ(subject.cache.entries.size(), 1u);
  EXPECT_EQ(subject.cache.entries[0].name, "cache[live]");

  const LayerState state = cold_state(aside, SubjectInfo{}, subject.draw_checkpoint(5), 2, {});
  std::vector<std::string> names;
  for (const NamedTensor& t : state.tensors) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"w", "workspace", "cache[w]", "cache[w]"}))
      << "the aside layer's own two passes, not the live entry";
  EXPECT_EQ(subject.cache.entries.size(), 1u);
  EXPECT_TRUE(subject.stashed.empty());

  subject.fail_load = true;
  EXPECT_THROW(cold_forward(aside, subject.draw_checkpoint(5), subject.draw_input(0)),
               std::runtime_error);
  ASSERT_EQ(subject.cache.entries.size(), 1u) << "restored while the error unwinds";
  EXPECT_TRUE(subject.stashed.empty());
}

// Note [One cold layer per reload]: one layer built aside serves a state
// read before any forward, then that forward; the caches stay emptied for
// both and come back after, whether the forward returns or raises.
TEST(LayerLife, AColdStateThenForwardReadsTheStateBeforeTheForwardRuns) {
  struct Case {
    std::string label;
    bool input;          // a forward input is handed over
    bool forward_fails;  // the layer's forward raises
    bool output;         // an output comes back
  };
  const std::vector<Case> cases = {
      {"a state and a forward", true, false, true},
      {"a state only", false, false, false},
      {"a forward that raises: the state, no output", true, true, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    Subject subject;
    subject.cache.entries.push_back({"cache[live]", at::zeros({1}), false});
    subject.fail_forward = c.forward_fails;
    AsideLayers aside(subject);
    std::vector<std::string> names;
    int forwards_before_state = -1;
    const std::optional<at::Tensor> out = cold_state_then_forward(
        aside, SubjectInfo{}, subject.draw_checkpoint(5),
        [&](const LayerState& state) {
          for (const NamedTensor& t : state.tensors) names.push_back(t.name);
          forwards_before_state = subject.built.at(0)->forwards;
        },
        c.input ? subject.draw_input(0) : at::Tensor());
    EXPECT_EQ(names, (std::vector<std::string>{"w", "workspace", "cache[w]"}))
        << "the aside layer's own cache entry, not the live one";
    EXPECT_EQ(forwards_before_state, 0);
    EXPECT_EQ(subject.built.at(0)->forwards, c.input ? 1 : 0);
    ASSERT_EQ(out.has_value(), c.output);
    if (out) {
      EXPECT_TRUE(
          at::equal(*out, cold_forward(aside, subject.draw_checkpoint(5), subject.draw_input(0))));
    }
    ASSERT_EQ(subject.cache.entries.size(), 1u);
    EXPECT_EQ(subject.cache.entries[0].name, "cache[live]");
    EXPECT_TRUE(subject.stashed.empty());
  }
}

TEST(LayerLife, AStateLeavesOutTheNamesTheSubjectSaysAreFree) {
  struct Row {
    const char* name;
    std::vector<std::string> free_names;
    std::vector<std::string> tensors;
    std::vector<std::string> numbers;
  };
  const Row rows[] = {
      {"none free", {}, {"w", "workspace", "cache[w]"}, {"passes", "clock"}},
      {"a tensor and a number", {"workspace", "clock"}, {"w", "cache[w]"}, {"passes"}},
      {"a cache entry", {"cache[w]"}, {"w", "workspace"}, {"passes", "clock"}},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    Subject subject;
    SubjectInfo info;
    info.free_names = row.free_names;
    std::shared_ptr<SubjectLayer> layer = cold_loaded(subject, subject.draw_checkpoint(1));
    const LayerState state = layer_state(*layer, subject.cache_tensors(), info);
    std::vector<std::string> tensors, numbers;
    for (const NamedTensor& t : state.tensors) tensors.push_back(t.name);
    for (const NamedNumber& n : state.numbers) numbers.push_back(n.name);
    EXPECT_EQ(tensors, row.tensors);
    EXPECT_EQ(numbers, row.numbers);
    std::vector<std::string> checked;
    for (const NamedNumber& n : checked_numbers(*layer, info)) checked.push_back(n.name);
    EXPECT_EQ(checked, row.numbers);
  }
}

// Note [Layers made aside by copying]: the layers made aside are copies only
// once one, loaded with the live layer's checkpoint, held the live layer's
// state (its numbers too, where asked) and gave its forward's output; any
// other copy, or none, leaves them built. Note [A copy on its checkpoint]:
// copies are made on their checkpoint only where the tried one was and left
// the checkpoint as it was. The caches are emptied for the copy tried and
// put back, and the live layer is left alone.
TEST(LayerLife, LayersMadeAsideAreCopiesOnceOneLoadsAsABuiltLayerDoes) {
  using Kind = Subject::CopyKind;
  struct Row {
    const char* name;
    Kind copies;
    bool numbers;        // the run compares host numbers
    bool on_checkpoint;  // the copy tried is made on its checkpoint
    bool unchanged;      // and left it as it was
    bool tried;          // try_copy() returned a forward
    bool copies_used;    // what the layers made aside then are
    bool on_used;        // and whether they are made on their checkpoint
  };
  const Row rows[] = {
      {"no copies", Kind::kNone, false, true, true, false, false, false},
      {"a faithful copy", Kind::kFaithful, false, false, true, true, true, false},
      {"a faithful copy on its checkpoint", Kind::kFaithful, false, true, true, true, true, true},
      {"on a checkpoint it changed", Kind::kFaithful, false, true, false, true, true, false},
      {"a faithful copy, numbers compared", Kind::kFaithful, true, false, true, true, true, false},
      {"a copy that loads another value", Kind::kLoadsOther, false, true, true, false, false,
       false},
      {"a copy whose forward differs", Kind::kRunsOther, false, true, true, true, false, false},
      {"another number, numbers compared", Kind::kOtherNumber, true, false, true, false, false,
       false},
      {"another number, numbers not compared", Kind::kOtherNumber, false, false, true, true, true,
       false},
      {"a copy that raises", Kind::kRaises, false, true, true, false, false, false},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    Subject subject;
    subject.copies = row.copies;
    subject.cache.entries.push_back({"cache[outside]", at::zeros({1}), false});
    CachesEmptied mode(subject);  // as a mode starts
    const Checkpoint ckpt = subject.draw_checkpoint(5);
    const at::Tensor x = subject.draw_input(0);
    std::shared_ptr<SubjectLayer> live = cold_loaded(subject, ckpt);
    AsideLayers aside(subject);
    ASSERT_TRUE(aside.untried());
    const std::optional<at::Tensor> copied =
        aside.try_copy(*live, ckpt, x, SubjectInfo{}, row.numbers, row.on_checkpoint);
    EXPECT_FALSE(aside.untried());
    EXPECT_EQ(copied.has_value(), row.tried);
    EXPECT_EQ(subject.copies_on_a_checkpoint, row.copies != Kind::kNone && row.on_checkpoint);
    // The caches hold what the live layer's cold load put there; the live
    // layer was not run.
    ASSERT_EQ(subject.cache.entries.size(), 1u);
    EXPECT_EQ(subject.stashed.size(), 1u);
    EXPECT_EQ(subject.built.at(0)->forwards, 0);
    const at::Tensor out = live->forward(x);
    aside.settle(copied && at::equal(*copied, out), row.unchanged);
    EXPECT_EQ(aside.proven(), row.copies_used);
    EXPECT_EQ(aside.on_checkpoint(), row.on_used);
    const int built = static_cast<int>(subject.built.size());
    const int made = subject.copies_made;
    const int on = subject.copies_on_a_checkpoint;
    const at::Tensor y = cold_forward(aside, subject.draw_checkpoint(6), x);
    EXPECT_TRUE(at::equal(y, at::full({4}, 12.0)));
    EXPECT_EQ(subject.copies_made - made, row.copies_used ? 1 : 0);
    EXPECT_EQ(subject.copies_on_a_checkpoint - on, row.on_used ? 1 : 0);
    EXPECT_EQ(static_cast<int>(subject.built.size()) - built, row.copies_used ? 0 : 1);
    // A live layer is never made on a checkpoint.
    const int on_before_live = subject.copies_on_a_checkpoint;
    aside.new_copy();
    EXPECT_EQ(subject.copies_on_a_checkpoint, on_before_live);
    // A forward whose calls are compared asks for a built layer, copies or not.
    const int copies_before = subject.copies_made;
    cold_forward(aside, subject.draw_checkpoint(6), x, /*built=*/true);
    EXPECT_EQ(subject.copies_made, copies_before);
    // A second try changes nothing.
    EXPECT_FALSE(
        aside.try_copy(*live, ckpt, x, SubjectInfo{}, row.numbers, row.on_checkpoint).has_value());
  }
}

TEST(LayerLife, CachesEmptiedNestAndRestoreOnce) {
  Subject subject;
  subject.cache.entries.push_back({"outer", at::zeros({1}), false});
  {
    CachesEmptied outer(subject);
    subject.cache.entries.push_back({"mode", at::zeros({1}), false});
    {
      CachesEmptied inner(subject);
      EXPECT_TRUE(subject.cache.entries.empty());
      inner.restore();
      ASSERT_EQ(subject.cache.entries.size(), 1u);
      EXPECT_EQ(subject.cache.entries[0].name, "mode");
    }  // restored already: the destructor does nothing
    EXPECT_EQ(subject.stashed.size(), 1u);
  }
  ASSERT_EQ(subject.cache.entries.size(), 1u);
  EXPECT_EQ(subject.cache.entries[0].name, "outer");
  EXPECT_TRUE(subject.stashed.empty());
}

}  // namespace
}  // namespace reloadsafe::harness
