// Properties of in_own_storage over generated layouts: it places exactly when
// an independent model of the specification says the new layout fits, and
// whether or not it places, no storage moves or changes size and no byte
// outside the placed span changes.
#include "utils/storage_fit.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <vector>

namespace reloadsafe {
namespace {

struct Layout {
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  int64_t offset;  // elements
  at::ScalarType dtype;
};

std::ostream& operator<<(std::ostream& os, const Layout& l) {
  os << "{shape=" << c10::IntArrayRef(l.shape) << " stride=" << c10::IntArrayRef(l.stride)
     << " offset=" << l.offset << " dtype=" << l.dtype << "}";
  return os;
}

const at::ScalarType kDtypes[] = {at::kByte,  at::kShort, at::kInt,    at::kLong,
                                  at::kFloat, at::kHalf,  at::kDouble, at::kFloat8_e4m3fn};

// 0-3 dimensions, sizes 0-5, strides from a family: contiguous, permuted,
// padded (gaps), expanded (zero), or arbitrary small.
rc::Gen<Layout> gen_layout() {
  return rc::gen::exec([] {
    Layout l;
    const auto rank = *rc::gen::inRange<size_t>(0, 4);
    l.shape = *rc::gen::container<std::vector<int64_t>>(rank, rc::gen::inRange<int64_t>(0, 6));
    l.stride.assign(rank, 1);
    int64_t running = 1;
    for (size_t d = rank; d-- > 0;) {
      l.stride[d] = running;
      running *= std::max<int64_t>(l.shape[d], 1);
    }
    switch (*rc::gen::inRange(0, 5)) {
      case 0:
        break;  // contiguous
      case 1:
        std::reverse(l.stride.begin(), l.stride.end());
        break;  // permuted-ish
      case 2:
        for (auto& s : l.stride) s *= 2;
        break;  // gaps
      case 3:
        if (rank) l.stride[*rc::gen::inRange<size_t>(0, rank)] = 0;
        break;  // expanded
      default:
        for (auto& s : l.stride) s = *rc::gen::inRange<int64_t>(0, 9);
    }
    l.offset = *rc::gen::inRange<int64_t>(0, 9);
    l.dtype =
        *rc::gen::elementOf(std::vector<at::ScalarType>(std::begin(kDtypes), std::end(kDtypes)));
    return l;
  });
}

int64_t span_of(const Layout& l) {
  return *checked_extent(l.shape, l.stride);
}
int64_t numel_of(const Layout& l) {
  int64_t n = 1;
  for (int64_t s : l.shape) n *= s;
  return n;
}

// The specification's fit rule, written from the text, independent of the
// implementation's arithmetic.
bool model_fits(const Layout& old, int64_t storage_nbytes, const Layout& fresh, bool whole) {
  const int64_t isz_old = c10::elementSize(old.dtype), isz = c10::elementSize(fresh.dtype);
  const int64_t byte_offset = old.offset * isz_old;
  bool fits;
  if (whole) {
    fits =
        span_of(fresh) >= numel_of(fresh) && byte_offset + span_of(fresh) * isz <= storage_nbytes;
  } else {
    fits = numel_of(fresh) > 0 && span_of(fresh) == numel_of(fresh) &&
           span_of(old) == numel_of(old) && numel_of(fresh) * isz <= numel_of(old) * isz_old;
  }
  return fits && byte_offset % isz == 0;
}

bool has_expanded_dim(const Layout& l) {
  for (size_t d = 0; d < l.shape.size(); ++d) {
    if (l.shape[d] > 1 && l.stride[d] == 0) return true;
  }
  return false;
}

void check_in_own_storage(bool whole) {
  const Layout old = *gen_layout();
  const Layout fresh = *gen_layout();
  const int64_t isz_old = c10::elementSize(old.dtype);
  const int64_t slack = *rc::gen::inRange<int64_t>(0, 64);
  const int64_t storage_nbytes = (old.offset + span_of(old)) * isz_old + slack;
  RC_LOG() << "old=" << old << " fresh=" << fresh << " storage=" << storage_nbytes;

  at::Tensor bytes = at::randint(0, 256, {storage_nbytes}, at::kByte);
  c10::Storage storage = bytes.storage();
  at::Tensor old_t = storage_view(storage, old.offset, old.shape, old.stride, old.dtype);
  const int64_t fresh_span = span_of(fresh);
  at::Tensor fresh_base = at::randint(0, 100, {fresh_span + 1}, at::kDouble).to(fresh.dtype);
  at::Tensor fresh_t = fresh_base.as_strided(fresh.shape, fresh.stride);
  const at::Tensor before = bytes.clone();
  const auto ptr = reinterpret_cast<uintptr_t>(storage.data());

  const bool expect = model_fits(old, storage_nbytes, fresh, whole);
  RC_CLASSIFY(expect, "placed");
  if (expect && has_expanded_dim(fresh)) {
    RC_ASSERT_THROWS_AS(in_own_storage(old_t, fresh_t, whole), c10::Error);
    RC_ASSERT(at::equal(bytes, before));
    return;
  }
  at::Tensor result = in_own_storage(old_t, fresh_t, whole);
  RC_ASSERT(reinterpret_cast<uintptr_t>(storage.data()) == ptr);
  RC_ASSERT(static_cast<int64_t>(storage.nbytes()) == storage_nbytes);
  if (!expect) {
    RC_ASSERT(result.is_same(fresh_t));
    RC_ASSERT(at::equal(bytes, before));
    return;
  }
  RC_ASSERT(result.storage().is_alias_of(storage));
  RC_ASSERT(result.storage_offset() * static_cast<int64_t>(result.element_size()) ==
            old.offset * isz_old);
  RC_ASSERT(result.sizes() == fresh_t.sizes());
  RC_ASSERT(result.strides() == fresh_t.strides());
  RC_ASSERT(result.scalar_type() == fresh.dtype);
  RC_ASSERT(at::equal(result.to(at::kDouble), fresh_t.to(at::kDouble)));
  // Every byte outside the placed span is unchanged.
  const int64_t lo = old.offset * isz_old;
  const int64_t hi = lo + fresh_span * static_cast<int64_t>(c10::elementSize(fresh.dtype));
  RC_ASSERT(at::equal(bytes.narrow(0, 0, lo), before.narrow(0, 0, lo)));
  RC_ASSERT(at::equal(bytes.narrow(0, hi, storage_nbytes - hi),
                      before.narrow(0, hi, storage_nbytes - hi)));
}

RC_GTEST_PROP(InOwnStorageProps, DefaultModePlacesExactlyWhenTheModelFits, ()) {
  check_in_own_storage(false);
}

RC_GTEST_PROP(InOwnStorageProps, WholeStorageModePlacesExactlyWhenTheModelFits, ()) {
  check_in_own_storage(true);
}

}  // namespace
}  // namespace reloadsafe
