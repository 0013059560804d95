#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/trace/sparse_parts.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/ones.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace reloadsafe::trace {
namespace {

// A tensor with zeros in it, so that every sparse layout has a pattern.
at::Tensor pattern() {
  return (at::arange(16, at::kFloat).reshape({4, 4}) % 3 == 0).to(at::kFloat) *
         at::arange(16, at::kFloat).reshape({4, 4});
}

bool same_place(const at::Tensor& a, const at::Tensor& b) {
  return a.is_alias_of(b) && a.data_ptr() == b.data_ptr() && a.sizes() == b.sizes();
}

TEST(SparseParts, EachLayoutsPartsAreItsOwnMembersNamedByTheirMethods) {
  struct Case {
    std::string name;
    at::Tensor t;
    std::vector<std::string> names;
    std::function<std::vector<at::Tensor>(const at::Tensor&)> parts;
  };
  const at::Tensor m = pattern();
  const auto row = [](const at::Tensor& t) {
    return std::vector<at::Tensor>{t.crow_indices(), t.col_indices(), t.values()};
  };
  const auto column = [](const at::Tensor& t) {
    return std::vector<at::Tensor>{t.ccol_indices(), t.row_indices(), t.values()};
  };
  const std::vector<Case> cases = {
      {"COO",
       m.to_sparse(),
       {"_indices", "_values"},
       [](const at::Tensor& t) {
         return std::vector<at::Tensor>{t._indices(), t._values()};
       }},
      {"CSR", m.to_sparse_csr(), {"crow_indices", "col_indices", "values"}, row},
      {"BSR", m.to_sparse_bsr({2, 2}), {"crow_indices", "col_indices", "values"}, row},
      {"CSC", m.to_sparse_csc(), {"ccol_indices", "row_indices", "values"}, column},
      {"BSC", m.to_sparse_bsc({2, 2}), {"ccol_indices", "row_indices", "values"}, column},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_EQ(sparse_part_count(c.t), c.names.size());
    const std::vector<at::Tensor> expected = c.parts(c.t);
    for (size_t k = 0; k < c.names.size(); ++k) {
      EXPECT_EQ(sparse_part_info(c.t, k).name, c.names[k]);
      EXPECT_EQ(sparse_part_info(c.t, k).index, static_cast<int>(k));
      const at::Tensor part = sparse_part(c.t, k);
      EXPECT_TRUE(part.has_storage());
      EXPECT_TRUE(same_place(part, expected[k])) << c.names[k];
    }
  }
}

TEST(SparseParts, ATensorThatIsNotSparseHasNone) {
  for (const at::Tensor& t : {at::ones({2, 2}), at::ones({2, 2}).t(), at::Tensor()}) {
    EXPECT_EQ(sparse_part_count(t), 0u);
  }
  try {
    sparse_part(at::ones({2}), 0);
    ADD_FAILURE() << "a dense tensor gave a part";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("part 0 of a tensor with 0 parts"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace reloadsafe::trace
