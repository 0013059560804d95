// Property of the read trace: for a random chain of ops over a random set of
// weights (read whole, as views, in-place, in tensor lists, through
// composites), the external reads are exactly the weights the chain read.

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/trace/read_trace.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/neg.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/where.h>
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cstdint>
#include <ostream>
#include <set>
#include <vector>

namespace reloadsafe::trace {
namespace {

// One step of a chain: an op applied to the accumulator and weight `w`.
enum class Step {
  kAdd,           // acc + w
  kMulView,       // acc * w.t().t()      (a view of w)
  kInPlace,       // acc.add_(w)
  kCat,           // cat({acc, w}).narrow(0, 0, rows)  (tensor list)
  kLinear,        // linear(acc, w_square) as a composite over a square view
  kNarrowSum,     // acc + w.narrow(1, 0, 1)  (broadcast view at an offset)
  kWhere,         // where(w > 0, acc, w)
  kWriteWeight,   // w.mul_(1.0): the chain writes into a weight
  kInternalOnly,  // acc = acc.relu(): no weight read
};
constexpr int kSteps = 9;

const char* name(Step s) {
  static const char* names[] = {"add",        "mul_view", "in_place",     "cat",          "linear",
                                "narrow_sum", "where",    "write_weight", "internal_only"};
  return names[static_cast<int>(s)];
}

struct Chain {
  int64_t rows = 1, cols = 1;
  int weights = 1;
  std::vector<std::pair<Step, int>> steps;  // (op, weight index)
};

std::ostream& operator<<(std::ostream& os, const Chain& c) {
  os << "weights=" << c.weights << " shape=[" << c.rows << "," << c.cols << "] steps:";
  for (const auto& [s, w] : c.steps) os << " " << name(s) << "(w" << w << ")";
  return os;
}

uintptr_t id(const void* storage) {
  return reinterpret_cast<uintptr_t>(storage);
}
uintptr_t id(const at::Tensor& t) {
  return id(t.storage().unsafeGetStorageImpl());
}

rc::Gen<Chain> gen_chain() {
  return rc::gen::exec([] {
    Chain c;
    c.rows = *rc::gen::inRange<int64_t>(1, 6);
    c.cols = *rc::gen::inRange<int64_t>(1, 6);
    c.weights = *rc::gen::inRange(1, 6);
    const int n = *rc::gen::inRange(0, 12);
    for (int i = 0; i < n; ++i) {
      const auto step = static_cast<Step>(*rc::gen::inRange(0, kSteps));
      c.steps.emplace_back(step, *rc::gen::inRange(0, c.weights));
    }
    return c;
  });
}

RC_GTEST_PROP(ReadTraceProps, ExternalReadsAreExactlyTheWeightsTheChainReads, ()) {
  const Chain c = *gen_chain();
  RC_LOG() << c;
  std::vector<at::Tensor> weights;
  for (int i = 0; i < c.weights; ++i) weights.push_back(at::randn({c.rows, c.cols}));
  // A square weight per chain for the composite (linear), as its own storage.
  const at::Tensor square = at::randn({c.cols, c.cols});
  const at::Tensor input = at::randn({c.rows, c.cols});

  std::set<uintptr_t> read;  // the model: storages the chain reads from outside
  read.insert(id(input));
  ReadTrace trace;
  at::Tensor acc = input.clone();
  for (const auto& [step, i] : c.steps) {
    at::Tensor& w = weights[static_cast<size_t>(i)];
    const uintptr_t ws = id(w);
    switch (step) {
      case Step::kAdd:
        acc = acc + w;
        read.insert(ws);
        break;
      case Step::kMulView:
        acc = acc * w.t().t();
        read.insert(ws);
        break;
      case Step::kInPlace:
        acc.add_(w);
        read.insert(ws);
        break;
      case Step::kCat:
        acc = at::cat({acc, w}).narrow(0, 0, c.rows);
        read.insert(ws);
        break;
      case Step::kLinear:
        acc = at::linear(acc, square);
        read.insert(id(square));
        break;
      case Step::kNarrowSum:
        acc = acc + w.narrow(1, c.cols - 1, 1);
        read.insert(ws);
        break;
      case Step::kWhere:
        acc = at::where(w > 0, acc, w);
        read.insert(ws);
        break;
      case Step::kWriteWeight:
        w.mul_(1.0);
        read.insert(ws);
        break;
      case Step::kInternalOnly:
        acc = acc.relu();
        break;
    }
  }
  trace.stop();

  std::set<uintptr_t> external;
  for (const auto& [op, r] : trace.external_reads()) external.insert(id(r.storage));
  RC_ASSERT(external == read);
  // Everything else the chain touched was made inside the scope.
  for (const auto& op : trace.ops()) {
    for (const auto& r : op.reads) {
      if (!r.external) RC_ASSERT(read.count(id(r.storage)) == 0u);
    }
  }
}

// The property can fail: a weight made inside the scope is not external, so
// a model that counts it as read from outside disagrees with the trace.
TEST(ReadTraceProps, AWeightMadeInsideTheScopeIsNotExternal) {
  ReadTrace trace;
  const at::Tensor w = at::randn({2, 2});
  at::neg(w);
  trace.stop();
  EXPECT_TRUE(trace.external_reads().empty());
}

}  // namespace
}  // namespace reloadsafe::trace
