// CheckpointDigest (Note [A digest instead of a copy]): any one written byte
// of any tensor is a change, named; what was not written is not; a tensor
// without a digest is compared with its copy; two digests are the same only
// for the same names holding the same bytes.

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/digest.h"

#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/ones.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace reloadsafe::harness {
namespace {

// Writes -1 into the first element of `t` (of its values, for a sparse one).
void write_first(const at::Tensor& t) {
  at::Tensor first = t.is_sparse() ? t._values() : t;
  while (first.dim() > 0) first = first.select(0, 0);
  first.fill_(-1.0);
}

TEST(CheckpointDigest, NamesEveryTensorSomethingWroteInto) {
  struct Case {
    const char* name;
    at::Tensor t;
    bool write;
  };
  const Case cases[] = {
      {"plain, untouched", at::arange(4, at::kFloat), false},
      {"plain, written", at::arange(4, at::kFloat), true},
      {"strided, untouched", at::arange(8, at::kFloat).reshape({2, 4}).t(), false},
      {"strided, written", at::arange(8, at::kFloat).reshape({2, 4}).t(), true},
      {"sparse (copied), untouched", (at::arange(8, at::kFloat) + 1).reshape({2, 4}).to_sparse(),
       false},
      {"sparse (copied), written", (at::arange(8, at::kFloat) + 1).reshape({2, 4}).to_sparse(),
       true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Checkpoint ckpt{{"w", c.t}, {"b", at::ones({3}, at::kFloat)}};
    CheckpointDigest digest(ckpt);
    const bool readable = !c.t.is_sparse();
    EXPECT_EQ(digest.whole().has_value(), readable);
    if (c.write) write_first(c.t);
    EXPECT_EQ(digest.changed(ckpt),
              c.write ? std::vector<std::string>{"w"} : std::vector<std::string>{});
    // Once a change is found, nothing is keyed by what was digested.
    EXPECT_EQ(digest.whole().has_value(), readable && !c.write);
  }
}

TEST(CheckpointDigest, AnyOneByteOfALongTensorIsAChange) {
  // 77 bytes: whole 32-byte blocks, a lone 8-byte word and a tail.
  for (int64_t byte : {0, 31, 32, 63, 64, 71, 72, 76}) {
    SCOPED_TRACE(byte);
    const Checkpoint ckpt{{"w", at::arange(77, at::kByte)}};
    CheckpointDigest digest(ckpt);
    ckpt.at("w").select(0, byte).fill_(200);
    EXPECT_EQ(digest.changed(ckpt), std::vector<std::string>{"w"});
  }
}

// A tensor longer than one parallel run (8 MiB): a byte changed in any run
// is a change; the digest is the same on one thread as on two.
TEST(CheckpointDigest, ALongTensorIsDigestedInRunsTheSameOnAnyThreads) {
  const int64_t n = (int64_t{8} << 20) * 2 + 77;
  const Checkpoint ckpt{{"w", at::arange(n, at::kByte)}};
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const std::optional<uint64_t> one = CheckpointDigest(ckpt).whole();
  at::set_num_threads(2);
  CheckpointDigest digest(ckpt);
  at::set_num_threads(threads);
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(digest.whole(), one);
  for (int64_t byte : {int64_t{0}, (int64_t{8} << 20) + 5, n - 1}) {
    SCOPED_TRACE(byte);
    CheckpointDigest before(ckpt);
    ckpt.at("w").select(0, byte).add_(1);
    EXPECT_EQ(before.changed(ckpt), std::vector<std::string>{"w"});
  }
}

TEST(CheckpointDigest, AMissingOrReshapedTensorIsAChange) {
  const at::Tensor w = at::arange(6, at::kFloat);
  CheckpointDigest digest({{"w", w}, {"b", at::ones({2})}});
  EXPECT_EQ(digest.changed({{"b", at::ones({2})}}), std::vector<std::string>{"w"});
  CheckpointDigest again({{"w", w}});
  EXPECT_EQ(again.changed({{"w", w.reshape({2, 3})}}), std::vector<std::string>{"w"});
}

TEST(CheckpointDigest, TheSameOnlyForTheSameNamesAndBytes) {
  const auto digest = [](Checkpoint ckpt) { return CheckpointDigest(ckpt); };
  const CheckpointDigest base = digest({{"w", at::arange(6, at::kFloat)}});
  struct Case {
    const char* name;
    Checkpoint other;
    bool same;
  };
  const Case cases[] = {
      {"same bytes, other storage", {{"w", at::arange(6, at::kFloat)}}, true},
      {"one value differs", {{"w", at::arange(6, at::kFloat) * 2}}, false},
      {"another name", {{"v", at::arange(6, at::kFloat)}}, false},
      {"another dtype", {{"w", at::arange(6, at::kDouble)}}, false},
      {"another shape", {{"w", at::arange(6, at::kFloat).reshape({2, 3})}}, false},
      {"one more tensor", {{"w", at::arange(6, at::kFloat)}, {"x", at::ones({1})}}, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const CheckpointDigest other = digest(c.other);
    EXPECT_EQ(base.same_as(other), c.same);
    EXPECT_EQ(base.whole() == other.whole(), c.same);
  }
  // A tensor without a digest is compared by its copy.
  const at::Tensor s = (at::arange(4, at::kFloat) + 1).to_sparse();
  EXPECT_TRUE(digest({{"s", s}}).same_as(digest({{"s", s.clone()}})));
  EXPECT_FALSE(digest({{"s", s}}).same_as(digest({{"s", (s * 2).coalesce()}})));
}

}  // namespace
}  // namespace reloadsafe::harness
