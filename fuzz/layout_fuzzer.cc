// layout_fuzzer.cc: a coverage-guided (libFuzzer) target over the layout
// arithmetic of utils/storage_fit.h, checked against the model of
// fuzz/spec_model.h. The input's first byte picks what is fuzzed:
//  0  checked_extent on sizes and strides over the whole int64 range (and
//     mismatched ranks): the extent, overflow and rejection must agree with
//     unbounded arithmetic;
//  1  storage_view on a small storage with arbitrary offset, sizes and
//     strides: a view exactly when the model says it fits, and the storage
//     never grows, moves or changes;
//  2  in_own_storage (default mode) and 3 (whole-storage mode) on small
//     tensors: placed exactly when the model says, new's values at old's
//     byte offset, no other byte written.
// A violated property aborts, which libFuzzer reports with the input.
//
//   bazel build //fuzz:layout_fuzzer
//   bazel-bin/fuzz/layout_fuzzer -max_total_time=600 /tmp/layout_corpus fuzz/corpus/layout_fuzzer

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "fuzz/spec_model.h"
#include "utils/storage_fit.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace reloadsafe::fuzz {
namespace {

// What the current input asks, printed when a property fails.
std::string context;

#define FUZZ_CHECK(cond)                                                                  \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "property violated: %s (%s:%d)\ninput: %s\n", #cond, __FILE__, \
                   __LINE__, context.c_str());                                            \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)

std::string show(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out + "]";
}

at::ScalarType take_dtype(FuzzedDataProvider& in) {
  const auto& dtypes = all_dtypes();
  return dtypes[in.ConsumeIntegralInRange<size_t>(0, dtypes.size() - 1)];
}

// An int64 over the whole range, or a small one (most layouts are small).
int64_t take_wide(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      return in.ConsumeIntegralInRange<int64_t>(0, 9);
    case 1:
      return in.ConsumeIntegralInRange<int64_t>(0, 1 << 16);
    default:
      return in.ConsumeIntegral<int64_t>();
  }
}

std::vector<int64_t> take_wide_dims(FuzzedDataProvider& in, size_t rank) {
  std::vector<int64_t> v(rank);
  for (auto& x : v) x = take_wide(in);
  return v;
}

bool any_negative(const std::vector<int64_t>& v) {
  for (int64_t x : v) {
    if (x < 0) return true;
  }
  return false;
}

void fuzz_checked_extent(FuzzedDataProvider& in) {
  const auto rank = in.ConsumeIntegralInRange<size_t>(0, 8);
  const std::vector<int64_t> sizes = take_wide_dims(in, rank);
  const std::vector<int64_t> strides =
      take_wide_dims(in, in.ConsumeBool() ? rank : in.ConsumeIntegralInRange<size_t>(0, 8));
  context = "checked_extent(" + show(sizes) + ", " + show(strides) + ")";
  const bool valid =
      sizes.size() == strides.size() && !any_negative(sizes) && !any_negative(strides);
  std::optional<int64_t> got;
  bool threw = false;
  try {
    got = checked_extent(sizes, strides);
  } catch (const c10::Error&) {
    threw = true;
  }
  FUZZ_CHECK(threw == !valid);
  if (valid) FUZZ_CHECK(got == model::extent(sizes, strides));
}

// Whether LibTorch accepts `shape` for a tensor: it multiplies the sizes in
// order, as unsigned 64-bit numbers, and refuses any overflow on the way (even
// one that a later size 0 would cancel) or a product above INT64_MAX.
bool libtorch_can_hold(const std::vector<int64_t>& shape) {
  uint64_t product = 1;
  for (int64_t size : shape) {
    if (__builtin_mul_overflow(product, static_cast<uint64_t>(size), &product)) return false;
  }
  return product <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
}

void fuzz_storage_view(FuzzedDataProvider& in) {
  const at::ScalarType dtype = take_dtype(in);
  const auto nbytes = in.ConsumeIntegralInRange<int64_t>(0, 256);
  const int64_t offset = take_wide(in);
  const auto rank = in.ConsumeIntegralInRange<size_t>(0, 5);
  std::vector<int64_t> shape = take_wide_dims(in, rank);
  std::vector<int64_t> stride = take_wide_dims(in, rank);
  context = "storage_view(" + std::to_string(nbytes) + " bytes, offset " + std::to_string(offset) +
            ", " + show(shape) + ", " + show(stride) + ", " + c10::toString(dtype) + ")";
  bool fits = offset >= 0 && !any_negative(shape) && !any_negative(stride);
  if (fits) {
    const std::optional<int64_t> span = model::extent(shape, stride);
    fits = span.has_value() &&
           (static_cast<model::Int128>(offset) + *span) * itemsize(dtype) <= nbytes;
  }
  // A layout that fits but whose sizes LibTorch cannot multiply (zero
  // strides allow any size) cannot be a tensor at all: set_ refuses it, and
  // so may the view.
  const bool representable = !fits || libtorch_can_hold(shape);

  at::Tensor bytes = at::empty({nbytes}, at::kByte);
  for (int64_t i = 0; i < nbytes; ++i) bytes.data_ptr<uint8_t>()[i] = static_cast<uint8_t>(i * 7);
  const c10::Storage storage = bytes.storage();
  const uintptr_t data = address(storage.data());
  const std::vector<uint8_t> before = storage_bytes(storage);
  std::optional<at::Tensor> view;
  try {
    view = storage_view(storage, offset, shape, stride, dtype);
  } catch (const c10::Error&) {
  }
  FUZZ_CHECK(address(storage.data()) == data);
  FUZZ_CHECK(static_cast<int64_t>(storage.nbytes()) == nbytes);
  FUZZ_CHECK(storage_bytes(storage) == before);
  if (!representable) return;
  FUZZ_CHECK(view.has_value() == fits);
  if (!fits) return;
  FUZZ_CHECK(storage_id(view->storage()) == storage_id(storage));
  FUZZ_CHECK(view->storage_offset() == offset);
  FUZZ_CHECK(view->sizes() == c10::IntArrayRef(shape));
  FUZZ_CHECK(view->strides() == c10::IntArrayRef(stride));
  FUZZ_CHECK(view->scalar_type() == dtype);
}

// A small layout: rank <= 4, sizes <= 5, strides <= 9, offset <= 8.
struct Small {
  at::ScalarType dtype;
  std::vector<int64_t> shape, stride;
  int64_t offset;
  int64_t end_bytes() const { return (offset + *model::extent(shape, stride)) * itemsize(dtype); }
};

Small take_small(FuzzedDataProvider& in) {
  Small s;
  s.dtype = take_dtype(in);
  const auto rank = in.ConsumeIntegralInRange<size_t>(0, 4);
  for (size_t d = 0; d < rank; ++d) {
    s.shape.push_back(in.ConsumeIntegralInRange<int64_t>(0, 5));
    s.stride.push_back(in.ConsumeIntegralInRange<int64_t>(0, 9));
  }
  s.offset = in.ConsumeIntegralInRange<int64_t>(0, 8);
  return s;
}

c10::Storage storage_from(FuzzedDataProvider& in, int64_t nbytes) {
  at::Tensor bytes = at::empty({nbytes}, at::kByte);
  for (int64_t i = 0; i < nbytes; ++i) bytes.data_ptr<uint8_t>()[i] = in.ConsumeIntegral<uint8_t>();
  return bytes.storage();
}

void fuzz_in_own_storage(FuzzedDataProvider& in, bool whole) {
  const Small old = take_small(in);
  const Small fresh = take_small(in);
  const bool on_old = in.ConsumeIntegralInRange<int>(0, 7) == 0;
  const int64_t slack = in.ConsumeIntegralInRange<int64_t>(0, 32);
  const int64_t nbytes = std::max(old.end_bytes(), on_old ? fresh.end_bytes() : int64_t{0}) + slack;
  const c10::Storage storage = storage_from(in, nbytes);
  context = std::string(whole ? "whole-storage" : "default") + " in_own_storage: old " +
            c10::toString(old.dtype) + show(old.shape) + show(old.stride) + "+" +
            std::to_string(old.offset) + " on " + std::to_string(nbytes) + " bytes, new " +
            c10::toString(fresh.dtype) + show(fresh.shape) + show(fresh.stride) + "+" +
            std::to_string(fresh.offset) + (on_old ? " on old's storage" : "");
  const at::Tensor old_t = view_on(storage, old.dtype, old.offset, old.shape, old.stride);
  const c10::Storage fresh_storage = on_old ? storage : storage_from(in, fresh.end_bytes());
  const at::Tensor fresh_t =
      view_on(fresh_storage, fresh.dtype, fresh.offset, fresh.shape, fresh.stride);
  make_bools_valid(fresh_t);

  model::FitQuery q;
  q.old_itemsize = itemsize(old.dtype);
  q.old_numel = model::numel(old.shape);
  q.old_span = model::extent(old.shape, old.stride);
  q.old_offset = old.offset;
  q.storage_nbytes = nbytes;
  q.new_itemsize = itemsize(fresh.dtype);
  q.new_numel = model::numel(fresh.shape);
  q.new_span = model::extent(fresh.shape, fresh.stride);
  q.same_data_ptr = on_old || (nbytes == 0 && fresh_storage.nbytes() == 0);
  q.whole_storage = whole;
  const bool placed = model::places(q);
  const bool expanded = model::has_expanded_dim(fresh.shape, fresh.stride);

  const uintptr_t data = address(storage.data());
  const std::vector<uint8_t> before = storage_bytes(storage);
  const std::vector<uint8_t> fresh_before = storage_bytes(fresh_storage);
  at::Tensor result;
  try {
    result = in_own_storage(old_t, fresh_t, whole);
  } catch (const c10::Error&) {
    // Only a placed expanded layout is refused (copy_ would refuse it); see
    // fuzz/README.md for the empty one.
    FUZZ_CHECK(placed && expanded);
    FUZZ_CHECK(storage_bytes(storage) == before);
    return;
  }
  FUZZ_CHECK(!(placed && expanded && q.new_numel > 0));
  FUZZ_CHECK(address(storage.data()) == data);
  FUZZ_CHECK(static_cast<int64_t>(storage.nbytes()) == nbytes);
  if (!on_old) FUZZ_CHECK(storage_bytes(fresh_storage) == fresh_before);
  if (!placed) {
    FUZZ_CHECK(result.is_same(fresh_t));
    FUZZ_CHECK(storage_bytes(storage) == before);
    return;
  }
  const int64_t at_byte = old.offset * itemsize(old.dtype);
  FUZZ_CHECK(storage_id(result.storage()) == storage_id(storage));
  FUZZ_CHECK(result.storage_offset() * itemsize(fresh.dtype) == at_byte);
  FUZZ_CHECK(result.sizes() == fresh_t.sizes());
  FUZZ_CHECK(result.strides() == fresh_t.strides());
  FUZZ_CHECK(same_elements(result, fresh_t));
  std::vector<bool> written(before.size(), false);
  mark_elements(written, at_byte, fresh.shape, fresh.stride, itemsize(fresh.dtype));
  FUZZ_CHECK(same_outside(before, storage_bytes(storage), written));
}

}  // namespace
}  // namespace reloadsafe::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      reloadsafe::fuzz::fuzz_checked_extent(in);
      break;
    case 1:
      reloadsafe::fuzz::fuzz_storage_view(in);
      break;
    case 2:
      reloadsafe::fuzz::fuzz_in_own_storage(in, /*whole=*/false);
      break;
    default:
      reloadsafe::fuzz::fuzz_in_own_storage(in, /*whole=*/true);
      break;
  }
  return 0;
}
