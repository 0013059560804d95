#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/trace/sparse_parts.h"

#include "conformance/trace/tensor_location.h"

#include <ATen/SparseCsrTensorImpl.h>
#include <ATen/SparseTensorImpl.h>
#include <c10/util/Exception.h>

namespace reloadsafe::trace {
namespace {

constexpr SparsePart kCoo[] = {{0, "_indices"}, {1, "_values"}};
constexpr SparsePart kRowCompressed[] = {{0, "crow_indices"}, {1, "col_indices"}, {2, "values"}};
constexpr SparsePart kColumnCompressed[] = {{0, "ccol_indices"}, {1, "row_indices"}, {2, "values"}};

// The parts of t's layout, and how many; null for a tensor that is not sparse.
const SparsePart* parts_of(const at::Tensor& t, size_t* count) {
  *count = 0;
  if (!t.defined() || dispatches_in_python(t)) return nullptr;
  switch (t.layout()) {
    case at::kSparse:
      *count = 2;
      return kCoo;
    case at::kSparseCsr:
    case at::kSparseBsr:
      *count = 3;
      return kRowCompressed;
    case at::kSparseCsc:
    case at::kSparseBsc:
      *count = 3;
      return kColumnCompressed;
    default:
      return nullptr;
  }
}

}  // namespace

size_t sparse_part_count(const at::Tensor& t) {
  size_t count = 0;
  parts_of(t, &count);
  return count;
}

const SparsePart& sparse_part_info(const at::Tensor& t, size_t k) {
  size_t count = 0;
  const SparsePart* parts = parts_of(t, &count);
  TORCH_CHECK(k < count, "sparse_part_info: part ", k, " of a tensor with ", count, " parts");
  return parts[k];
}

at::Tensor sparse_part(const at::Tensor& t, size_t k) {
  const SparsePart& part = sparse_part_info(t, k);
  if (t.layout() == at::kSparse) {
    const auto* impl = static_cast<const at::SparseTensorImpl*>(t.unsafeGetTensorImpl());
    return part.index == 0 ? impl->indices() : impl->values();
  }
  const auto* impl = static_cast<const at::SparseCsrTensorImpl*>(t.unsafeGetTensorImpl());
  switch (part.index) {
    case 0:
      return impl->compressed_indices();
    case 1:
      return impl->plain_indices();
    default:
      return impl->values();
  }
}

}  // namespace reloadsafe::trace
