// ColdLoadOutputs (Note [One cold load per checkpoint]): a kept output is
// reused for the same reload number, checkpoint and input, and for nothing
// else, down to a single changed byte anywhere in a tensor; a kept state's
// digest matches the same state only; an offered output answers the next
// forward of its reload on the same input bytes, and nothing else (Note
// [One cold layer per reload]).

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/cold_loads.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace reloadsafe::harness {
namespace {

// A cold forward that counts its calls and returns a new tensor each time.
struct CountingForward {
  int calls = 0;
  at::Tensor operator()() {
    ++calls;
    return at::full({2, 2}, static_cast<double>(calls));
  }
};

// A byte-sized checkpoint whose every byte can be changed on its own:
// 77 bytes, so that it has whole 32-byte blocks, a lone 8-byte word and a
// tail of single bytes.
Checkpoint byte_checkpoint() {
  return {{"w", at::arange(77, at::kByte)}, {"scale", at::ones({3}, at::kFloat)}};
}

// What a checkpoint's cold loads are kept by (CheckpointDigest::whole).
std::optional<uint64_t> digest_of(const Checkpoint& ckpt) {
  return CheckpointDigest(ckpt).whole();
}

TEST(ColdLoadOutputs, TheSameCheckpointAndInputReuseTheKeptOutput) {
  ColdLoadOutputs outputs(/*keep=*/true);
  CountingForward fwd;
  const at::Tensor x = at::ones({2, 2});
  const at::Tensor first = outputs.forward(1, digest_of(byte_checkpoint()), x, std::ref(fwd));
  const at::Tensor again =
      outputs.forward(1, digest_of(byte_checkpoint()), x.clone(), std::ref(fwd));
  EXPECT_EQ(fwd.calls, 1);
  EXPECT_TRUE(at::equal(first, again));
  // Another reload number is computed afresh.
  outputs.forward(2, digest_of(byte_checkpoint()), x, std::ref(fwd));
  EXPECT_EQ(fwd.calls, 2);
}

TEST(ColdLoadOutputs, AnyOneChangedByteIsAnotherCheckpoint) {
  struct Case {
    std::string label;
    int64_t byte;  // which byte of "w" changes
  };
  const std::vector<Case> cases = {
      {"first byte of the first lane", 0}, {"a byte of the second lane", 9},
      {"a byte of the third lane", 20},    {"a byte of the fourth lane", 31},
      {"a lane in the second block", 40},  {"the word after the blocks", 66},
      {"the first byte of the tail", 72},  {"the last byte", 76},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    ColdLoadOutputs outputs(/*keep=*/true);
    CountingForward fwd;
    const at::Tensor x = at::ones({2, 2});
    outputs.forward(1, digest_of(byte_checkpoint()), x, std::ref(fwd));
    Checkpoint changed = byte_checkpoint();
    changed.at("w")[c.byte].add_(1);
    const at::Tensor out = outputs.forward(1, digest_of(changed), x, std::ref(fwd));
    EXPECT_EQ(fwd.calls, 2);
    EXPECT_EQ(out[0][0].item<double>(), 2.0);
  }
}

TEST(ColdLoadOutputs, AnotherInputNameOrShapeIsComputedAfresh) {
  const at::Tensor x = at::ones({2, 2});
  Checkpoint renamed = {{"v", at::arange(77, at::kByte)}, {"scale", at::ones({3}, at::kFloat)}};
  Checkpoint reshaped = byte_checkpoint();
  reshaped.at("scale") = at::ones({1, 3}, at::kFloat);
  at::Tensor other_x = x.clone();
  other_x[1][1].fill_(2);
  const std::vector<std::pair<std::string, std::pair<Checkpoint, at::Tensor>>> cases = {
      {"renamed", {renamed, x}},
      {"reshaped", {reshaped, x}},
      {"other input", {byte_checkpoint(), other_x}}};
  for (const auto& [label, ckpt_and_x] : cases) {
    SCOPED_TRACE(label);
    ColdLoadOutputs outputs(/*keep=*/true);
    CountingForward fwd;
    outputs.forward(1, digest_of(byte_checkpoint()), x, std::ref(fwd));
    outputs.forward(1, digest_of(ckpt_and_x.first), ckpt_and_x.second, std::ref(fwd));
    EXPECT_EQ(fwd.calls, 2);
  }
}

TEST(ColdLoadOutputs, ACheckpointWithoutADigestKeepsNothing) {
  ColdLoadOutputs outputs(/*keep=*/true);
  CountingForward fwd;
  const at::Tensor x = at::ones({2, 2});
  outputs.forward(1, std::nullopt, x, std::ref(fwd));
  outputs.forward(1, std::nullopt, x, std::ref(fwd));
  EXPECT_EQ(fwd.calls, 2);
  EXPECT_EQ(outputs.kept_bytes(), 0);
  EXPECT_FALSE(outputs.has_kept_forward(1, std::nullopt, x));
}

TEST(ColdLoadOutputs, NothingIsKeptWhenKeepingIsOff) {
  ColdLoadOutputs outputs(/*keep=*/false);
  CountingForward fwd;
  const at::Tensor x = at::ones({2, 2});
  outputs.forward(1, digest_of(byte_checkpoint()), x, std::ref(fwd));
  outputs.forward(1, digest_of(byte_checkpoint()), x, std::ref(fwd));
  EXPECT_EQ(fwd.calls, 2);
  EXPECT_EQ(outputs.kept_bytes(), 0);
}

TEST(ColdLoadOutputs, AnOfferAnswersOnlyTheNextForwardOfItsReloadOnTheSameInput) {
  struct Case {
    std::string label;
    int offered_reload;
    std::function<at::Tensor(const at::Tensor&)> forward_input;  // from the offer's input
    bool dropped;  // drop_offer() between the offer and the forward
    bool taken;    // whether the forward returns the offered output
  };
  const auto same = [](const at::Tensor& x) { return x.clone(); };
  const std::vector<Case> cases = {
      {"its reload, the same bytes", 1, same, false, true},
      {"another reload", 2, same, false, false},
      {"one input byte changed", 1,
       [](const at::Tensor& x) {
         at::Tensor y = x.clone();
         y[1][0].fill_(3);
         return y;
       },
       false, false},
      {"another input shape", 1, [](const at::Tensor&) { return at::ones({4}); }, false, false},
      {"dropped", 1, same, true, false},
  };
  for (const bool keep : {true, false}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(c.label + (keep ? ", keeping" : ", not keeping"));
      ColdLoadOutputs outputs(keep);
      CountingForward fwd;
      const at::Tensor x = at::ones({2, 2});
      const at::Tensor offered = at::full({2, 2}, 7.0);
      outputs.offer(c.offered_reload, x.clone(), offered);
      if (c.dropped) outputs.drop_offer();
      const at::Tensor out =
          outputs.forward(1, digest_of(byte_checkpoint()), c.forward_input(x), std::ref(fwd));
      EXPECT_EQ(fwd.calls, c.taken ? 0 : 1);
      EXPECT_EQ(out[0][0].item<double>(), c.taken ? 7.0 : 1.0);
      // The offer answered one forward at most: the next one of the same
      // reload is a kept output or a new cold load, never the offer again.
      fwd.calls = 0;
      outputs.forward(1, digest_of(byte_checkpoint()), c.forward_input(x), std::ref(fwd));
      EXPECT_EQ(fwd.calls, keep ? 0 : 1);
    }
  }
}

TEST(ColdLoadOutputs, AnOfferedViewOfABufferWrittenAgainAnswersWithWhatItHeldWhenOffered) {
  ColdLoadOutputs outputs(/*keep=*/false);
  CountingForward fwd;
  const at::Tensor x = at::ones({2, 2});
  at::Tensor buffer = at::full({4, 2}, 5.0);  // a module-scope output buffer
  outputs.offer(1, x.clone(), buffer.narrow(0, 0, 2));
  buffer.fill_(9.0);  // the live forward writes its output there too
  const at::Tensor out = outputs.forward(1, digest_of(byte_checkpoint()), x, std::ref(fwd));
  EXPECT_EQ(fwd.calls, 0);
  EXPECT_TRUE(at::equal(out, at::full({2, 2}, 5.0)));
}

TEST(ColdLoadOutputs, ATakenOfferIsKeptForTheNextModeAsAComputedOutputIs) {
  ColdLoadOutputs outputs(/*keep=*/true);
  CountingForward fwd;
  const at::Tensor x = at::ones({2, 2});
  EXPECT_FALSE(outputs.has_kept_forward(1, digest_of(byte_checkpoint()), x));
  outputs.offer(1, x.clone(), at::full({2, 2}, 7.0));
  outputs.forward(1, digest_of(byte_checkpoint()), x, std::ref(fwd));
  EXPECT_TRUE(outputs.has_kept_forward(1, digest_of(byte_checkpoint()), x));
  EXPECT_FALSE(outputs.has_kept_forward(2, digest_of(byte_checkpoint()), x));
  EXPECT_FALSE(outputs.has_kept_forward(1, digest_of(byte_checkpoint()), x * 2));
  const at::Tensor again = outputs.forward(1, digest_of(byte_checkpoint()), x, std::ref(fwd));
  EXPECT_EQ(fwd.calls, 0);
  EXPECT_EQ(again[0][0].item<double>(), 7.0);
  EXPECT_EQ(outputs.kept_bytes(), 4 * static_cast<int64_t>(sizeof(float)));

  ColdLoadOutputs off(/*keep=*/false);
  off.forward(1, digest_of(byte_checkpoint()), x, std::ref(fwd));
  EXPECT_FALSE(off.has_kept_forward(1, digest_of(byte_checkpoint()), x));
}

// Note [A cold state kept as its digest]: a state kept in one mode matches a
// later state only when every name, dtype, size, byte and number is the same.
LayerState byte_state() {
  return LayerState{{{"w", at::arange(77, at::kByte), true}, {"scale", at::ones({3}), true}},
                    {{"k_scale", 0.5, false}, {"steps", 3, true}}};
}

TEST(ColdLoadOutputs, AKeptStateMatchesOnlyTheSameState) {
  struct Case {
    std::string label;
    std::function<void(LayerState&)> change;  // empty: the same state
    bool matches;
  };
  const std::vector<Case> cases = {
      {"the same state, other tensors", [](LayerState&) {}, true},
      {"one byte of a tensor", [](LayerState& s) { s.tensors[0].tensor[40] = 0; }, false},
      {"a tensor's name", [](LayerState& s) { s.tensors[1].name = "scale2"; }, false},
      {"a tensor's dtype", [](LayerState& s) { s.tensors[1].tensor = at::ones({3}, at::kDouble); },
       false},
      {"a tensor's sizes",
       [](LayerState& s) {
         s.tensors[1].tensor = at::ones({1, 3});
       },
       false},
      {"a number", [](LayerState& s) { s.numbers[0].value = 0.25; }, false},
      {"a number's name", [](LayerState& s) { s.numbers[1].name = "step"; }, false},
      {"a name less", [](LayerState& s) { s.tensors.pop_back(); }, false},
  };
  const at::Tensor x = at::ones({2, 2});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    ColdLoadOutputs kept(/*keep=*/true);
    kept.keep_state(1, digest_of(byte_checkpoint()), x, byte_state());
    LayerState live = byte_state();
    c.change(live);
    EXPECT_EQ(kept.matches_kept_state(1, digest_of(byte_checkpoint()), x, live), c.matches);
  }
}

TEST(ColdLoadOutputs, AKeptStateIsForItsReloadAndCheckpointOnly) {
  const at::Tensor x = at::ones({2, 2});
  ColdLoadOutputs kept(/*keep=*/true);
  EXPECT_FALSE(
      kept.matches_kept_state(1, digest_of(byte_checkpoint()), x, byte_state()));  // none kept
  kept.keep_state(1, digest_of(byte_checkpoint()), x, byte_state());
  EXPECT_TRUE(kept.matches_kept_state(1, digest_of(byte_checkpoint()), x, byte_state()));
  EXPECT_FALSE(kept.matches_kept_state(2, digest_of(byte_checkpoint()), x, byte_state()));
  Checkpoint other = byte_checkpoint();
  other["scale"][0] = 2;
  EXPECT_FALSE(kept.matches_kept_state(1, digest_of(other), x, byte_state()));
  EXPECT_FALSE(kept.matches_kept_state(1, digest_of(byte_checkpoint()), x * 2, byte_state()));

  ColdLoadOutputs off(/*keep=*/false);
  off.keep_state(1, digest_of(byte_checkpoint()), x, byte_state());
  EXPECT_FALSE(off.matches_kept_state(1, digest_of(byte_checkpoint()), x, byte_state()));
  // A state with a tensor a digest cannot read (here: on the meta device)
  // is not kept, and never matches.
  LayerState meta = byte_state();
  meta.tensors[1].tensor = at::ones({3}, at::TensorOptions().device(at::kMeta));
  kept.keep_state(2, digest_of(byte_checkpoint()), x, meta);
  EXPECT_FALSE(kept.matches_kept_state(2, digest_of(byte_checkpoint()), x, meta));
}

}  // namespace
}  // namespace reloadsafe::harness
