#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "utils/storage_fit.h"

#include "utils/dense_copy.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <c10/util/safe_numerics.h>

namespace reloadsafe {
namespace {

// Note [Why set_ is guarded]
// `Tensor::set_(storage, offset, sizes, strides)` computes the bytes the view
// needs and, when the storage is smaller and resizable, resizes it: a new
// allocation, the old bytes copied, the data pointer changed. Every tensor and
// every captured CUDA graph that held the old address then reads freed memory.
// Nothing in reloadsafe may ever resize a storage, so the fit is checked here,
// with overflow-checked arithmetic, before every `set_`.

// (offset + extent) * itemsize, or nullopt on overflow.
std::optional<int64_t> end_byte(int64_t offset, int64_t span, int64_t itemsize) {
  int64_t elements = 0;
  int64_t bytes = 0;
  if (c10::add_overflows(offset, span, &elements) ||
      c10::mul_overflows(elements, itemsize, &bytes)) {
    return std::nullopt;
  }
  return bytes;
}

}  // namespace

int64_t extent(const at::Tensor& t) {
  TORCH_CHECK(t.defined(), "extent: the tensor is None");
  if (t.numel() == 0) return 0;
  auto span = checked_extent(t.sizes(), t.strides());
  TORCH_CHECK(span.has_value(), "extent: the layout of the tensor overflows int64");
  return *span;
}

std::optional<int64_t> checked_extent(c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  TORCH_CHECK(sizes.size() == strides.size(), "extent: ", sizes.size(), " sizes but ",
              strides.size(), " strides; give one stride per dimension");
  int64_t numel_zero = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    TORCH_CHECK(sizes[i] >= 0, "extent: size ", sizes[i], " of dimension ", i,
                " is negative; sizes must be >= 0");
    TORCH_CHECK(strides[i] >= 0, "extent: stride ", strides[i], " of dimension ", i,
                " is negative; reloadsafe layouts use non-negative strides");
    if (sizes[i] == 0) numel_zero = 1;
  }
  if (numel_zero) return 0;
  int64_t span = 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    int64_t term = 0;
    if (c10::mul_overflows(sizes[i] - 1, strides[i], &term) ||
        c10::add_overflows(span, term, &span)) {
      return std::nullopt;
    }
  }
  return span;
}

at::Tensor storage_view(const c10::Storage& storage, int64_t offset, c10::IntArrayRef shape,
                        c10::IntArrayRef stride, at::ScalarType dtype) {
  TORCH_CHECK(offset >= 0, "storage_view: offset ", offset, " is negative");
  auto span = checked_extent(shape, stride);
  const int64_t itemsize = static_cast<int64_t>(c10::elementSize(dtype));
  std::optional<int64_t> end = span ? end_byte(offset, *span, itemsize) : std::nullopt;
  const int64_t nbytes = static_cast<int64_t>(storage.nbytes());
  TORCH_CHECK(end.has_value() && *end <= nbytes, "storage_view: a view of shape ", shape,
              ", strides ", stride, " and dtype ", dtype, " at element offset ", offset, " needs ",
              end ? std::to_string(*end) : std::string("more than 2^63"),
              " bytes but the storage has ", nbytes,
              "; views never grow a storage, so choose a layout that fits");
  at::Tensor view = at::empty({0}, at::TensorOptions().dtype(dtype).device(storage.device()));
  view.set_(storage, offset, shape, stride);
  TORCH_INTERNAL_ASSERT(static_cast<int64_t>(storage.nbytes()) == nbytes,
                        "storage_view resized a storage");
  return view;
}

at::Tensor in_own_storage(const at::Tensor& old, const at::Tensor& new_tensor, bool whole_storage) {
  TORCH_CHECK(old.defined() && new_tensor.defined(),
              "in_own_storage: both the old and the new tensor must be defined");
  const c10::Storage& storage = old.storage();
  const int64_t offset = old.storage_offset() * static_cast<int64_t>(old.element_size());
  const int64_t size = static_cast<int64_t>(new_tensor.element_size());
  const int64_t numel = new_tensor.numel();
  const int64_t nbytes = static_cast<int64_t>(storage.nbytes());
  // A layout whose byte count overflows int64 cannot fit any storage; the
  // reference (with Python's unbounded integers) reaches the same answer.
  std::optional<int64_t> span = checked_extent(new_tensor.sizes(), new_tensor.strides());

  bool fits = false;
  if (span.has_value()) {
    if (whole_storage) {
      // offset is already in bytes: the end is offset + span * size.
      std::optional<int64_t> span_bytes = end_byte(0, *span, size);
      int64_t end = 0;
      fits = *span >= numel  // no element shared by two indices
             && span_bytes.has_value() && !c10::add_overflows(offset, *span_bytes, &end) &&
             end <= nbytes;
    } else {
      std::optional<int64_t> old_span = checked_extent(old.sizes(), old.strides());
      int64_t new_bytes = 0;
      int64_t old_bytes = 0;
      fits =
          numel > 0 && *span == numel  // neither shared elements nor gaps
          && old_span == old.numel()   // old's gaps may hold another tensor
          && !c10::mul_overflows(numel, size, &new_bytes) &&
          !c10::mul_overflows(old.numel(), static_cast<int64_t>(old.element_size()), &old_bytes) &&
          new_bytes <= old_bytes;
    }
  }
  // Same storage is asked the way the reference asks it: by data pointer.
  const bool same_storage = new_tensor.storage().data() == storage.data();
  if (!fits || old.device() != new_tensor.device() || same_storage || offset % size != 0) {
    return new_tensor;
  }
  // A layout that passes `span >= numel` can still map two indices to one
  // element when it has a zero stride; copy_ refuses such a destination
  // unless it is empty (nothing to write). Say so before anything is written.
  for (int64_t d = 0; numel > 0 && d < new_tensor.dim(); ++d) {
    TORCH_CHECK(new_tensor.size(d) <= 1 || new_tensor.stride(d) != 0,
                "in_own_storage: the new tensor is expanded (dimension ", d,
                " has stride 0), so several of its elements share one memory location and it "
                "cannot be written into a storage; make it contiguous first");
  }
  at::Tensor view = storage_view(storage, offset / size, new_tensor.sizes(), new_tensor.strides(),
                                 new_tensor.scalar_type());
  dense_copy_(view, new_tensor);
  return view;
}

}  // namespace reloadsafe
