// ColdLoadOutputs (Note [One cold load per checkpoint]): a kept output is
// reused for the same reload number, checkpoint and input, and for nothing
// else, down to a single changed byte anywhere in a tensor.

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/cold_loads.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <gtest/gtest.h>

#include <cstdint>
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

TEST(ColdLoadOutputs, TheSameCheckpointAndInputReuseTheKeptOutput) {
  ColdLoadOutputs outputs(/*keep=*/true);
  CountingForward fwd;
  const at::Tensor x = at::ones({2, 2});
  const at::Tensor first = outputs.forward(1, byte_checkpoint(), x, std::ref(fwd));
  const at::Tensor again = outputs.forward(1, byte_checkpoint(), x.clone(), std::ref(fwd));
  EXPECT_EQ(fwd.calls, 1);
  EXPECT_TRUE(at::equal(first, again));
  // Another reload number is computed afresh.
  outputs.forward(2, byte_checkpoint(), x, std::ref(fwd));
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
    outputs.forward(1, byte_checkpoint(), x, std::ref(fwd));
    Checkpoint changed = byte_checkpoint();
    changed.at("w")[c.byte].add_(1);
    const at::Tensor out = outputs.forward(1, changed, x, std::ref(fwd));
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
    outputs.forward(1, byte_checkpoint(), x, std::ref(fwd));
    outputs.forward(1, ckpt_and_x.first, ckpt_and_x.second, std::ref(fwd));
    EXPECT_EQ(fwd.calls, 2);
  }
}

TEST(ColdLoadOutputs, NothingIsKeptWhenKeepingIsOff) {
  ColdLoadOutputs outputs(/*keep=*/false);
  CountingForward fwd;
  const at::Tensor x = at::ones({2, 2});
  outputs.forward(1, byte_checkpoint(), x, std::ref(fwd));
  outputs.forward(1, byte_checkpoint(), x, std::ref(fwd));
  EXPECT_EQ(fwd.calls, 2);
  EXPECT_EQ(outputs.kept_bytes(), 0);
}

}  // namespace
}  // namespace reloadsafe::harness
