// What a capture reads from outside the forward, counted by distinct
// tensor: declared, undeclared, and constants of compiled code (Note [A
// compiled graph's constants] in forward_capture.cc).

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/forward_capture.h"

#include "conformance/trace/capture.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/lift_fresh_copy.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/scalar_tensor.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace reloadsafe::harness {
namespace {

using trace::CapturedRead;

struct Read {
  const char* op;
  int depth;
  int tensor;  // which storage: 1, 2, ...
  bool declared;
};

struct Row {
  const char* name;
  std::vector<Read> reads;
  size_t declared, undeclared, constants;
};

TEST(DistinctReads, ATensorOnlyCopiedAsAConstantIsNoUndeclaredRead) {
  const Row rows[] = {
      {"copied by lift_fresh_copy only (a compiled graph's constant)",
       {{"aten::lift_fresh_copy", 0, 1, false}, {"aten::copy_", 1, 1, false}},
       0,
       0,
       1},
      {"also read by an op of the forward",
       {{"aten::lift_fresh_copy", 0, 1, false}, {"aten::mul.Tensor", 0, 1, false}},
       0,
       1,
       0},
      {"read by the forward first, then copied",
       {{"aten::mul.Tensor", 0, 1, false}, {"aten::lift_fresh_copy", 0, 1, false}},
       0,
       1,
       0},
      {"read only inside another op, never copied as a constant",
       {{"aten::copy_", 1, 1, false}},
       0,
       1,
       0},
      {"declared, copied by lift_fresh_copy", {{"aten::lift_fresh_copy", 0, 1, true}}, 1, 0, 0},
      {"a constant beside a weight and an undeclared tensor",
       {{"aten::mm", 0, 1, true},
        {"aten::lift_fresh_copy", 0, 2, false},
        {"aten::mul.Tensor", 0, 3, false}},
       1,
       1,
       1},
  };
  int storages[4] = {};
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    std::vector<CapturedRead> reads;
    for (const Read& r : row.reads) {
      CapturedRead c;
      c.op_name = r.op;
      c.depth = r.depth;
      c.name = r.declared ? "w" : "undeclared tensor";
      c.declared = r.declared;
      c.storage = &storages[r.tensor];
      reads.push_back(c);
    }
    const DistinctReads distinct = distinct_reads(reads);
    EXPECT_EQ(distinct.declared.size(), row.declared);
    EXPECT_EQ(distinct.undeclared.size(), row.undeclared);
    EXPECT_EQ(distinct.constants.size(), row.constants);
  }
}

// The same, from a capture: a forward that copies a tensor it holds with
// lift_fresh_copy, as an AOTAutograd graph copies its constants.
TEST(DistinctReads, ACapturedConstantCopyIsCountedApart) {
  for (const bool also_read : {false, true}) {
    SCOPED_TRACE(also_read ? "also read by mul" : "copied only");
    const at::Tensor w = at::randn({3, 3});
    const at::Tensor constant = at::scalar_tensor(2.0);
    const at::Tensor x = at::randn({2, 3});
    trace::TensorNames names({});
    names.add("w", w, /*declared=*/true);
    names.add("input", x, /*declared=*/true);
    trace::CapturedForward capture([&] {
      const at::Tensor y = at::mul(at::mm(x, w), at::lift_fresh_copy(constant));
      return also_read ? at::mul(y, constant) : y;
    });
    const std::vector<CapturedRead> reads = capture.reads(names, /*details=*/false);
    const DistinctReads distinct = distinct_reads(reads);
    EXPECT_EQ(distinct.declared.size(), 1u);
    EXPECT_EQ(distinct.undeclared.size(), also_read ? 1u : 0u);
    EXPECT_EQ(distinct.constants.size(), also_read ? 0u : 1u);
  }
}

}  // namespace
}  // namespace reloadsafe::harness
