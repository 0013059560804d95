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
#include <ATen/ops/randint.h>
#include <gtest/gtest.h>

#include <algorithm>
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

// The fast and the portable implementations agree, at every length around
// a block (128 bytes), and a single changed byte changes the digest.
TEST(DigestBytes, TheFastAndThePortableAgree) {
  const at::Tensor data = at::randint(0, 256, {5000}, at::kByte);
  const auto* p = static_cast<const unsigned char*>(data.const_data_ptr());
  for (const size_t n : {size_t{0}, size_t{1}, size_t{31}, size_t{127}, size_t{128}, size_t{129},
                         size_t{1000}, size_t{5000}}) {
    SCOPED_TRACE(n);
    EXPECT_EQ(digest_bytes(7, p, n), digest_bytes(7, p, n, /*portable=*/true));
    EXPECT_NE(digest_bytes(7, p, n), digest_bytes(8, p, n)) << "the seed counts";
    if (n == 0) continue;
    at::Tensor changed = data.clone();
    changed[static_cast<int64_t>(n) / 2].add_(1);
    EXPECT_NE(digest_bytes(7, changed.const_data_ptr(), n), digest_bytes(7, p, n));
  }
}

// TensorDigest taken run by run is the digest a CheckpointDigest takes of
// the same bytes, for one run and for several.
TEST(TensorDigest, RunByRunIsTheCheckpointsDigest) {
  for (const int64_t n : {int64_t{0}, int64_t{77}, static_cast<int64_t>(kDigestRun),
                          2 * static_cast<int64_t>(kDigestRun) + 5}) {
    SCOPED_TRACE(n);
    const at::Tensor t = at::arange(n, at::kByte);
    TensorDigest digest(t.scalar_type(), t.sizes(), static_cast<size_t>(n));
    for (int64_t k = digest.runs() - 1; k >= 0; --k) {  // any order
      digest.run(k, static_cast<const char*>(t.const_data_ptr()) + k * kDigestRun);
    }
    EXPECT_EQ(digest.runs(), std::max<int64_t>(1, (n + kDigestRun - 1) / kDigestRun));
    const CheckpointDigest whole({{"w", t}});
    const at::Tensor u = t.clone();
    note_digest(u, digest.value());
    EXPECT_EQ(noted_digest(u), digest.value());
    EXPECT_EQ(CheckpointDigest({{"w", u}}).whole(), whole.whole());
  }
}

// A noted digest stands for its tensor only while nothing wrote into it by
// an op, and only for the very tensor noted.
TEST(TensorDigest, ANotedDigestIsTakenUntilAnOpWritesTheTensor) {
  const at::Tensor t = at::arange(16, at::kFloat);
  const std::optional<uint64_t> real = CheckpointDigest({{"w", t.clone()}}).whole();
  note_digest(t, 12345);  // not t's: shows where it is taken
  EXPECT_EQ(noted_digest(t), 12345u);
  EXPECT_NE(CheckpointDigest({{"w", t}}).whole(), real);
  EXPECT_FALSE(noted_digest(t.clone()).has_value()) << "another tensor";
  t.add_(0);  // an in-place op: the version counter moves
  EXPECT_FALSE(noted_digest(t).has_value());
  EXPECT_EQ(CheckpointDigest({{"w", t}}).whole(), real);
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
