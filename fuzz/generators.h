// generators.h: RapidCheck generators of tensor layouts, storages and reload
// scenarios, shared by the property tests in fuzz/.
//
// Everything is built from rc::gen primitives inside rc::gen::exec, so a
// failing case shrinks pick by pick towards the simplest one: rank 0 or 1,
// sizes 1, contiguous strides, offset 0, uint8, no slack, no attributes.
// Every scenario prints itself (operator<<), so a counterexample reads as
//   old=Byte[4] stride[1] +0 contiguous storage=4B (slack 0)
//   new=Int[1] stride[1] +0 contiguous own storage=4B seed=0
//
// What the layouts cover:
//  - every dtype of this LibTorch that can be created and copied (float8
//    e4m3fn/e5m2 and their fnuz/e8m0 variants, bool, complex, unsigned, bits);
//  - ranks 0-4, with sizes 0, 1 and larger;
//  - stride families: contiguous, permuted, padded rows (gaps), sliced
//    (steps and a start), expanded (stride 0), size-1 dims with arbitrary
//    strides, and arbitrary small strides (which may self-overlap);
//  - storage offsets aligned and misaligned for the other tensor's dtype,
//    storages with slack after the tensor and neighbour bytes before it, and
//    new tensors that are views of the old tensor's own storage.
//
// Usage (inside a property):
//   const FitCase c = *gen_fit_case();
//   FitTensors t = build(c);
#pragma once

#include "fuzz/spec_model.h"
#include "utils/layer.h"
#include "utils/tensor_attrs.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <rapidcheck.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

namespace reloadsafe::fuzz {

// ---------------------------------------------------------------------------
// Layouts

/// How a layout's strides were made.
enum class Family {
  kContiguous,
  kPermuted,        // contiguous in another dimension order
  kPadded,          // contiguous but one dimension's stride padded: gaps
  kSliced,          // every dimension stepped and started inside a bigger base
  kExpanded,        // some dimensions have stride 0
  kSizeOneStrides,  // contiguous, with arbitrary strides on size-1 dimensions
  kArbitrary,       // small arbitrary strides: gaps, overlaps, anything
};

inline const char* family_name(Family f) {
  switch (f) {
    case Family::kContiguous:
      return "contiguous";
    case Family::kPermuted:
      return "permuted";
    case Family::kPadded:
      return "padded";
    case Family::kSliced:
      return "sliced";
    case Family::kExpanded:
      return "expanded";
    case Family::kSizeOneStrides:
      return "size1-strides";
    case Family::kArbitrary:
      return "arbitrary";
  }
  return "?";
}

/// A tensor layout: dtype, sizes, strides and storage offset (in elements of
/// its dtype).
struct Layout {
  at::ScalarType dtype = at::kByte;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  int64_t offset = 0;
  Family family = Family::kContiguous;

  int64_t itemsize() const { return fuzz::itemsize(dtype); }
  int64_t numel() const { return static_cast<int64_t>(model::numel(shape)); }
  /// Extent in elements (generated layouts never overflow).
  int64_t span() const { return *model::extent(shape, stride); }
  /// Bytes from the storage's start to the end of the layout.
  int64_t end_bytes() const { return (offset + span()) * itemsize(); }
  bool expanded() const { return model::has_expanded_dim(shape, stride); }
  bool self_overlapping() const { return model::self_overlapping(shape, stride); }
};

/// "[2,3]".
inline std::string dims(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out + "]";
}

inline std::ostream& operator<<(std::ostream& os, const Layout& l) {
  return os << c10::toString(l.dtype) << dims(l.shape) << " stride" << dims(l.stride) << " +"
            << l.offset << " " << family_name(l.family);
}

/// What gen_layout may produce.
struct LayoutOptions {
  bool expanded = true;     // stride 0 on dimensions of more than one element
  bool overlapping = true;  // arbitrary strides (may map two indices to one element)
  size_t max_rank = 4;
  int64_t max_offset = 4;  // storage offset, before slicing adds its start
  std::vector<at::ScalarType> dtypes = all_dtypes();
};

/// PyTorch's contiguous strides (a size 0 counts as 1).
inline std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> stride(shape.size());
  int64_t running = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    stride[d] = running;
    running *= std::max<int64_t>(shape[d], 1);
  }
  return stride;
}

/// Sizes of 0-`max_rank` dimensions; mostly 1-4, sometimes 0 or 7.
inline rc::Gen<std::vector<int64_t>> gen_shape(size_t max_rank = 4) {
  return rc::gen::exec([max_rank] {
    const auto rank = *rc::gen::inRange<size_t>(0, max_rank + 1);
    std::vector<int64_t> shape(rank);
    for (auto& s : shape) {
      s = *rc::gen::weightedElement<int64_t>({{4, 1}, {4, 2}, {3, 3}, {1, 0}, {2, 4}, {1, 7}});
    }
    return shape;
  });
}

/// A layout of the given shape and dtype, strides from one of the families
/// `opts` allows.
inline rc::Gen<Layout> gen_layout_of(std::vector<int64_t> shape, at::ScalarType dtype,
                                     const LayoutOptions& opts = {}) {
  return rc::gen::exec([shape, dtype, opts] {
    Layout l;
    l.dtype = dtype;
    l.shape = shape;
    const size_t rank = shape.size();
    std::vector<std::pair<size_t, Family>> families = {{5, Family::kContiguous},
                                                       {2, Family::kPermuted},
                                                       {2, Family::kPadded},
                                                       {2, Family::kSliced},
                                                       {1, Family::kSizeOneStrides}};
    if (opts.expanded) families.push_back({1, Family::kExpanded});
    if (opts.overlapping) families.push_back({1, Family::kArbitrary});
    // weightedElement takes an initializer list; pick by a weighted index.
    size_t total = 0;
    for (const auto& f : families) total += f.first;
    size_t pick = *rc::gen::inRange<size_t>(0, total);
    l.family = families.back().second;
    for (const auto& f : families) {
      if (pick < f.first) {
        l.family = f.second;
        break;
      }
      pick -= f.first;
    }
    l.stride = contiguous_strides(shape);
    l.offset = *rc::gen::inRange<int64_t>(0, opts.max_offset + 1);
    switch (l.family) {
      case Family::kContiguous:
        break;
      case Family::kPermuted: {
        // Memory order `order` (outermost first); shrinks towards identity.
        std::vector<size_t> order(rank);
        std::iota(order.begin(), order.end(), 0);
        for (size_t i = 0; i + 1 < rank; ++i) {
          std::swap(order[i], order[*rc::gen::inRange<size_t>(i, rank)]);
        }
        int64_t running = 1;
        for (size_t k = rank; k-- > 0;) {
          l.stride[order[k]] = running;
          running *= std::max<int64_t>(shape[order[k]], 1);
        }
        break;
      }
      case Family::kPadded: {
        if (rank == 0) break;
        const auto padded = *rc::gen::inRange<size_t>(0, rank);
        const auto pad = *rc::gen::inRange<int64_t>(1, 4);
        int64_t running = 1;
        for (size_t d = rank; d-- > 0;) {
          l.stride[d] = running + (d == padded ? pad : 0);
          running = l.stride[d] * std::max<int64_t>(shape[d], 1);
        }
        break;
      }
      case Family::kSliced: {
        // A slice base[start::step] in every dimension of a contiguous base.
        std::vector<int64_t> base(rank), step(rank), start(rank);
        for (size_t d = 0; d < rank; ++d) {
          step[d] = *rc::gen::inRange<int64_t>(1, 4);
          const auto extra = *rc::gen::inRange<int64_t>(0, 3);
          start[d] = *rc::gen::inRange<int64_t>(0, extra + 1);
          base[d] = std::max<int64_t>(shape[d], 1) * step[d] + extra;
        }
        const std::vector<int64_t> base_stride = contiguous_strides(base);
        for (size_t d = 0; d < rank; ++d) {
          l.stride[d] = base_stride[d] * step[d];
          l.offset += start[d] * base_stride[d];
        }
        break;
      }
      case Family::kExpanded: {
        if (rank == 0) break;
        const auto first = *rc::gen::inRange<size_t>(0, rank);
        l.stride[first] = 0;
        for (size_t d = 0; d < rank; ++d) {
          if (*rc::gen::weightedElement<bool>({{3, false}, {1, true}})) l.stride[d] = 0;
        }
        // Spread the other dimensions out, so that the extent can reach the
        // element count ([2, 2] with strides [0, 3]: extent 4, 4 elements),
        // which the extent-based checks of the fit rule take for dense.
        const auto spread = *rc::gen::inRange<int64_t>(1, 5);
        for (auto& s : l.stride) s *= spread;
        break;
      }
      case Family::kSizeOneStrides:
        for (size_t d = 0; d < rank; ++d) {
          if (shape[d] == 1) l.stride[d] = *rc::gen::inRange<int64_t>(0, 41);
        }
        break;
      case Family::kArbitrary:
        for (auto& s : l.stride) s = *rc::gen::inRange<int64_t>(0, 10);
        break;
    }
    return l;
  });
}

/// A layout: shape, dtype, then strides from a family.
inline rc::Gen<Layout> gen_layout(const LayoutOptions& opts = {}) {
  return rc::gen::exec([opts] {
    const auto dtype = *rc::gen::elementOf(opts.dtypes);
    const auto shape = *gen_shape(opts.max_rank);
    return *gen_layout_of(shape, dtype, opts);
  });
}

// ---------------------------------------------------------------------------
// Storages

/// A storage of `nbytes` random bytes (from `seed`), on CPU or meta.
inline c10::Storage make_storage(int64_t nbytes, uint64_t seed, bool meta = false) {
  at::Tensor bytes =
      at::empty({nbytes}, at::TensorOptions().dtype(at::kByte).device(meta ? at::kMeta : at::kCPU));
  if (!meta && nbytes > 0) {
    std::mt19937_64 rng(seed);
    auto* p = bytes.data_ptr<uint8_t>();
    for (int64_t i = 0; i < nbytes; ++i) p[i] = static_cast<uint8_t>(rng());
  }
  return bytes.storage();
}

/// A CPU or meta tensor of layout `l` on a storage of its own with `slack`
/// random bytes after it.
inline at::Tensor make_tensor(const Layout& l, int64_t slack, uint64_t seed, bool meta = false) {
  c10::Storage s = make_storage(l.end_bytes() + slack, seed, meta);
  at::Tensor t = view_on(s, l.dtype, l.offset, l.shape, l.stride);
  make_bools_valid(t);
  return t;
}

// ---------------------------------------------------------------------------
// Attributes

/// Attributes of a tensor object, as small integers per name (readable when
/// shrunk): weight_loader/_weight_loader -> a loader named "L<v>", _ckpt ->
/// "ckpt<v>", runtime_name -> "rt<v>", requantization_source and tag -> the
/// integer v, is_shuffled and retired -> v != 0.
using AttrSpec = std::map<std::string, int>;

inline const std::vector<std::string>& attr_keys() {
  static const std::vector<std::string> keys = {
      "weight_loader", "_weight_loader", "_ckpt",   "requantization_source",
      "is_shuffled",   "runtime_name",   "retired", "tag"};
  return keys;
}

inline AttrValue attr_value(const std::string& key, int v) {
  if (key == "weight_loader" || key == "_weight_loader") {
    return WeightLoader{"L" + std::to_string(v), nullptr};
  }
  if (key == "_ckpt") return std::string("ckpt") + std::to_string(v);
  if (key == "runtime_name") return std::string("rt") + std::to_string(v);
  if (key == "is_shuffled" || key == "retired") return v != 0;
  return static_cast<int64_t>(v);
}

/// A readable, comparable rendering of an attribute value.
inline std::string describe(const AttrValue& value) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) {
          return v ? "True" : "False";
        } else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, double>) {
          return std::to_string(v);
        } else if constexpr (std::is_same_v<T, std::string>) {
          return "'" + v + "'";
        } else if constexpr (std::is_same_v<T, WeightLoader>) {
          return "<loader " + v.name + ">";
        } else {
          return "<tensor>";
        }
      },
      value);
}

/// An attribute spec with each key present with probability 1/3.
inline rc::Gen<AttrSpec> gen_attrs() {
  return rc::gen::exec([] {
    AttrSpec spec;
    for (const std::string& key : attr_keys()) {
      if (*rc::gen::weightedElement<bool>({{2, false}, {1, true}})) {
        spec[key] = *rc::gen::inRange(0, 3);
      }
    }
    return spec;
  });
}

inline void set_attrs(const at::Tensor& t, const AttrSpec& spec) {
  for (const auto& [key, v] : spec) set_attr(t, key, attr_value(key, v));
}

/// The attributes of `t`, described.
inline std::map<std::string, std::string> described_attrs(const at::Tensor& t) {
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : attrs(t)) out[key] = describe(value);
  return out;
}

inline std::map<std::string, std::string> described_attrs(const AttrSpec& spec) {
  std::map<std::string, std::string> out;
  for (const auto& [key, v] : spec) out[key] = describe(attr_value(key, v));
  return out;
}

/// "{is_shuffled=True, weight_loader=<loader L0>}" (a function, not an
/// operator<<: AttrSpec is a std::map, which ADL would not look for here).
inline std::string show_attrs(const AttrSpec& spec) {
  std::string out = "{";
  for (const auto& [key, v] : spec) {
    out += (out.size() > 1 ? ", " : "") + key + "=" + describe(attr_value(key, v));
  }
  return out + "}";
}

/// "absent", "parameter", ... for a SlotKind.
inline std::string kind_name(SlotKind kind) {
  switch (kind) {
    case SlotKind::kAbsent:
      return "absent";
    case SlotKind::kParameter:
      return "parameter";
    case SlotKind::kBuffer:
      return "buffer";
    case SlotKind::kSubmodule:
      return "submodule";
    case SlotKind::kAttribute:
      return "attribute";
  }
  return "?";
}

// ---------------------------------------------------------------------------
// An old tensor in a storage, and a new one to place there

/// `_in_own_storage(old, new)` inputs: old on a storage with neighbour bytes
/// before it (its offset) and `slack` bytes after it; new on a storage of its
/// own, or a view of old's storage.
struct FitCase {
  Layout old;
  Layout fresh;  // offset: in its own storage, or in old's (on_old)
  bool fresh_on_old = false;
  int64_t slack = 0;        // bytes of old's storage after what it must hold
  int64_t fresh_slack = 0;  // bytes of new's own storage after new
  bool old_meta = false;
  bool fresh_meta = false;
  uint64_t seed = 0;  // storage contents

  int64_t storage_nbytes() const {
    return std::max(old.end_bytes(), fresh_on_old ? fresh.end_bytes() : int64_t{0}) + slack;
  }
  int64_t fresh_storage_nbytes() const {
    return fresh_on_old ? storage_nbytes() : fresh.end_bytes() + fresh_slack;
  }
};

inline std::ostream& operator<<(std::ostream& os, const FitCase& c) {
  os << "old=" << c.old << (c.old_meta ? " meta" : "") << " storage=" << c.storage_nbytes()
     << "B (slack " << c.slack << ") new=" << c.fresh << (c.fresh_meta ? " meta" : "");
  if (c.fresh_on_old) {
    os << " on old's storage";
  } else {
    os << " own storage=" << c.fresh_storage_nbytes() << "B";
  }
  return os << " seed=" << c.seed;
}

/// How the new layout relates to the old one.
enum class Relation { kIndependent, kSameShape, kRepack, kOnOld };

/// A FitCase. New layouts are often related to old (same shape, a repack to
/// the same byte count, a bit smaller or larger) so that every branch of the
/// fit rule is reached; old's offset is snapped to new's alignment half of
/// the time.
inline rc::Gen<FitCase> gen_fit_case(const LayoutOptions& opts = {}, bool meta = true) {
  return rc::gen::exec([opts, meta] {
    FitCase c;
    c.old = *gen_layout(opts);
    const auto relation = *rc::gen::weightedElement<Relation>({{3, Relation::kIndependent},
                                                               {2, Relation::kSameShape},
                                                               {3, Relation::kRepack},
                                                               {1, Relation::kOnOld}});
    switch (relation) {
      case Relation::kIndependent:
        c.fresh = *gen_layout(opts);
        break;
      case Relation::kSameShape:
        c.fresh = *gen_layout_of(c.old.shape, *rc::gen::elementOf(opts.dtypes), opts);
        break;
      case Relation::kRepack: {
        const auto dtype = *rc::gen::elementOf(opts.dtypes);
        const int64_t delta = *rc::gen::weightedElement<int64_t>({{4, 0}, {1, -1}, {2, 1}, {1, 3}});
        const int64_t bytes = c.old.numel() * c.old.itemsize();
        const int64_t n = std::max<int64_t>(bytes / itemsize(dtype) + delta, 0);
        std::vector<int64_t> shape = {n};
        if (n % 2 == 0 && n > 0 && *rc::gen::arbitrary<bool>()) shape = {2, n / 2};
        c.fresh = *gen_layout_of(shape, dtype, opts);
        break;
      }
      case Relation::kOnOld:
        c.fresh = *gen_layout(opts);
        c.fresh_on_old = true;
        break;
    }
    if (*rc::gen::arbitrary<bool>()) {
      // Aligned for new: old's byte offset a multiple of new's itemsize.
      const int64_t a = c.old.itemsize();
      const int64_t b = c.fresh.itemsize();
      const int64_t k = b / std::gcd(a, b);
      c.old.offset = (c.old.offset / k) * k;
    }
    c.slack = *rc::gen::weightedElement<int64_t>({{3, 0}, {2, 1}, {2, 7}, {2, 64}});
    c.fresh_slack = *rc::gen::weightedElement<int64_t>({{3, 0}, {1, 5}});
    if (meta) {
      c.old_meta = *rc::gen::weightedElement<bool>({{12, false}, {1, true}});
      c.fresh_meta =
          c.fresh_on_old ? c.old_meta : *rc::gen::weightedElement<bool>({{12, false}, {1, true}});
    }
    c.seed = *rc::gen::arbitrary<uint64_t>();
    return c;
  });
}

/// The tensors of a FitCase.
struct FitTensors {
  c10::Storage storage;  // old's
  at::Tensor old;
  at::Tensor fresh;
};

inline FitTensors build(const FitCase& c) {
  FitTensors t;
  t.storage = make_storage(c.storage_nbytes(), c.seed, c.old_meta);
  t.old = view_on(t.storage, c.old.dtype, c.old.offset, c.old.shape, c.old.stride);
  if (c.fresh_on_old) {
    t.fresh = view_on(t.storage, c.fresh.dtype, c.fresh.offset, c.fresh.shape, c.fresh.stride);
    make_bools_valid(t.fresh);
  } else {
    t.fresh = make_tensor(c.fresh, c.fresh_slack, c.seed ^ 0x9e3779b97f4a7c15ULL, c.fresh_meta);
  }
  return t;
}

/// The model's question for a FitCase and a mode.
inline model::FitQuery fit_query(const FitCase& c, bool whole_storage) {
  model::FitQuery q;
  q.old_itemsize = c.old.itemsize();
  q.old_numel = model::numel(c.old.shape);
  q.old_span = model::extent(c.old.shape, c.old.stride);
  q.old_offset = c.old.offset;
  q.storage_nbytes = c.storage_nbytes();
  q.new_itemsize = c.fresh.itemsize();
  q.new_numel = model::numel(c.fresh.shape);
  q.new_span = model::extent(c.fresh.shape, c.fresh.stride);
  q.same_device = c.old_meta == c.fresh_meta;
  // Data pointers: a view shares old's; meta storages and storages without
  // bytes all have a null one.
  const bool old_null = c.old_meta || c.storage_nbytes() == 0;
  const bool fresh_null = c.fresh_meta || c.fresh_storage_nbytes() == 0;
  q.same_data_ptr = c.fresh_on_old || (old_null && fresh_null);
  q.whole_storage = whole_storage;
  return q;
}

}  // namespace reloadsafe::fuzz
