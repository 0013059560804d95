// Properties of the utilities that put post-processed tensors where kernels
// look (utils/replace_parameter.h, utils/copy_weight.h), over generated
// layers, layouts, attributes and modes:
//  - replace_parameter keeps the parameter object exactly when the
//    specification says (a parameter, not a requantization source, not a meta
//    parameter receiving real data); carries every attribute of the new tensor
//    but weight_loader, _weight_loader and _ckpt; keeps the address whenever
//    the layout fits (in place, or placed by in_own_storage in the mode
//    DirectReloadScope selects); never grows, shrinks or moves a storage; and
//    writes no byte outside the span it places. With and without a quant
//    method that uses the meta device.
//  - refill_derived refills in place exactly when the held tensor has new's
//    shape, dtype and device and owns its storage, and rebinds otherwise.
//  - copy_weight_ (with the integrated-GPU path forced on and off) writes
//    exactly what copy_ writes, into dst's own storage.
// Each property is also run against mutants, which it must catch.
#include "fuzz/expect_failure.h"
#include "fuzz/generators.h"
#include "fuzz/spec_model.h"
#include "utils/copy_weight.h"
#include "utils/layer.h"
#include "utils/reload_context.h"
#include "utils/replace_parameter.h"
#include "utils/tensor_attrs.h"

#include <ATen/core/Tensor.h>
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cstring>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

namespace reloadsafe::fuzz {
namespace {

constexpr const char* kName = "weight";

/// What a layer holds under the name before the call.
enum class Held { kAbsent, kNone, kParameter, kTensor, kBuffer };

const char* held_name(Held h) {
  switch (h) {
    case Held::kAbsent:
      return "absent";
    case Held::kNone:
      return "None";
    case Held::kParameter:
      return "parameter";
    case Held::kTensor:
      return "plain tensor";
    case Held::kBuffer:
      return "buffer";
  }
  return "?";
}

/// Storage facts taken before a call, to compare after it.
struct StorageSnapshot {
  c10::Storage storage;
  uintptr_t data = 0;
  size_t nbytes = 0;
  std::vector<uint8_t> bytes;

  explicit StorageSnapshot(c10::Storage s)
      : storage(std::move(s)),
        data(address(storage.data())),
        nbytes(storage.nbytes()),
        bytes(storage_bytes(storage)) {}

  /// Same allocation, same size: never grown, shrunk or moved.
  void assert_kept() const {
    RC_ASSERT(address(storage.data()) == data);
    RC_ASSERT(storage.nbytes() == nbytes);
  }
  void assert_unchanged() const {
    assert_kept();
    RC_ASSERT(storage_bytes(storage) == bytes);
  }
  /// Unchanged but for the bytes of a layout at `byte_offset`.
  void assert_unchanged_outside(int64_t byte_offset, const Layout& l) const {
    assert_kept();
    std::vector<bool> written(bytes.size(), false);
    mark_elements(written, byte_offset, l.shape, l.stride, l.itemsize());
    RC_ASSERT(same_outside(bytes, storage_bytes(storage), written));
  }
};

bool same_storage(const at::Tensor& t, const c10::Storage& s) {
  return storage_id(t.storage()) == storage_id(s);
}

int64_t byte_offset(const at::Tensor& t) {
  return t.storage_offset() * static_cast<int64_t>(t.element_size());
}

void assert_layout(const at::Tensor& t, const Layout& l) {
  RC_ASSERT(t.sizes() == c10::IntArrayRef(l.shape));
  RC_ASSERT(t.strides() == c10::IntArrayRef(l.stride));
  RC_ASSERT(t.scalar_type() == l.dtype);
}

// ---------------------------------------------------------------------------
// replace_parameter

struct ReplaceCase {
  Held held = Held::kParameter;
  FitCase fit;  // old: what the layer holds; fresh: new_tensor
  AttrSpec old_attrs;
  AttrSpec new_attrs;
  bool new_none = false;
  bool new_is_parameter = false;
  bool new_is_old = false;  // new_tensor is the very object the layer holds
  int quant = 0;            // 0: no quant method; 1: uses_meta_device false; 2: true
  bool direct = false;
};

std::ostream& operator<<(std::ostream& os, const ReplaceCase& c) {
  os << "held=" << held_name(c.held) << " " << c.fit;
  if (c.new_none) os << " (new is None)";
  os << " old_attrs=" << show_attrs(c.old_attrs) << " new_attrs=" << show_attrs(c.new_attrs)
     << (c.new_is_parameter ? " new is a parameter" : "")
     << (c.new_is_old ? " new is the held object itself" : "") << " quant="
     << (c.quant == 0   ? "none"
         : c.quant == 1 ? "plain"
                        : "uses_meta_device")
     << (c.direct ? " direct reload" : "");
  return os;
}

rc::Gen<ReplaceCase> gen_replace_case() {
  return rc::gen::exec([] {
    ReplaceCase c;
    c.held = *rc::gen::weightedElement<Held>({{8, Held::kParameter},
                                              {1, Held::kAbsent},
                                              {1, Held::kNone},
                                              {2, Held::kTensor},
                                              {1, Held::kBuffer}});
    c.fit = *gen_fit_case();
    if (*rc::gen::weightedElement<bool>({{3, false}, {1, true}})) {
      // new with old's exact layout: the in-place branch.
      c.fit.fresh = c.fit.old;
      c.fit.fresh.offset = *rc::gen::inRange<int64_t>(0, 3);
      c.fit.fresh_on_old = false;
      c.fit.fresh_meta = c.fit.old_meta;
    }
    c.old_attrs = *gen_attrs();
    c.new_attrs = *gen_attrs();
    c.new_none = *rc::gen::weightedElement<bool>({{15, false}, {1, true}});
    c.new_is_parameter = *rc::gen::weightedElement<bool>({{3, false}, {1, true}});
    if ((c.held == Held::kParameter || c.held == Held::kTensor) && !c.new_none &&
        *rc::gen::weightedElement<bool>({{12, false}, {1, true}})) {
      // replace_parameter(layer, name, getattr(layer, name)): new is old's
      // object, so its layout is old's, on old's storage, at old's offset.
      c.new_is_old = true;
      c.fit.fresh = c.fit.old;
      c.fit.fresh_on_old = true;
      c.fit.fresh_meta = c.fit.old_meta;
      c.new_attrs = c.old_attrs;
    }
    c.quant = *rc::gen::weightedElement<int>({{4, 0}, {1, 1}, {2, 2}});
    c.direct = *rc::gen::arbitrary<bool>();
    return c;
  });
}

using ReplaceFn = std::function<void(Layer&, const std::string&, const at::Tensor&)>;

/// The specification's rules, with switches for the wrong models the
/// mutation tests use.
struct ReplaceRules {
  bool keeps_requantization_sources = false;  // wrong when true
};

bool is_carried(const std::string& key) {
  return key != "weight_loader" && key != "_weight_loader" && key != "_ckpt";
}

void replace_parameter_property(const ReplaceFn& impl, const ReplaceRules& rules = {}) {
  const ReplaceCase c = *gen_replace_case();
  const FitCase& f = c.fit;
  Layer layer;
  if (c.quant != 0) layer.quant_method = QuantMethod{c.quant == 2};
  FitTensors t = build(f);
  at::Tensor old_obj;
  switch (c.held) {
    case Held::kAbsent:
      break;
    case Held::kNone:
      layer.register_param(kName, at::Tensor());
      break;
    case Held::kParameter:
      old_obj = make_parameter(t.old);
      layer.register_param(kName, old_obj);
      break;
    case Held::kTensor:
      old_obj = t.old;
      layer.set_attribute(kName, old_obj);
      break;
    case Held::kBuffer:
      layer.register_buffer(kName, t.old);
      break;
  }
  if (old_obj.defined()) set_attrs(old_obj, c.old_attrs);
  at::Tensor fresh_obj;
  if (c.new_is_old) {
    fresh_obj = old_obj;
  } else if (!c.new_none) {
    fresh_obj = c.new_is_parameter ? make_parameter(t.fresh) : t.fresh;
    set_attrs(fresh_obj, c.new_attrs);
  }
  const StorageSnapshot old_storage(t.storage);
  const StorageSnapshot fresh_storage(t.fresh.storage());

  // The model.
  const bool old_is_param = c.held == Held::kParameter;
  const bool requant = old_is_param && c.old_attrs.count("requantization_source") != 0 &&
                       c.old_attrs.at("requantization_source") != 0;
  const bool keep = old_is_param && (!requant || rules.keeps_requantization_sources) &&
                    !(f.old_meta && !f.fresh_meta);
  const bool exact = f.old.shape == f.fresh.shape && f.old.stride == f.fresh.stride &&
                     f.old.dtype == f.fresh.dtype && f.old_meta == f.fresh_meta;
  const bool meta_quant = c.quant == 2;
  const bool placed = keep && !exact && !meta_quant && model::places(fit_query(f, c.direct));
  // Whether it must throw, and whether it may (aliasing copies, a known
  // deviation): copy_ refuses expanded destinations with elements, set_data
  // refuses meta <-> real, and a buffer cannot be replaced.
  bool must_throw = false;
  bool may_throw = false;
  if (c.held == Held::kBuffer) {
    must_throw = true;
  } else if (c.new_none || !keep) {
  } else if (exact) {
    // copy_ returns at once when source and destination are the same data
    // (new on old's storage at old's offset); aliasing is judged below.
    must_throw = f.old.expanded() && f.old.numel() > 0 && !f.old_meta && !f.fresh_on_old;
    may_throw = f.old.expanded() && f.old_meta;
  } else if (f.old_meta != f.fresh_meta) {
    must_throw = true;  // a real parameter cannot be rebound to meta data
  } else if (placed) {
    must_throw = f.fresh.expanded() && f.fresh.numel() > 0;
  }
  // new on old's storage: an in-place copy between aliasing views may be refused.
  may_throw = may_throw || (keep && exact && f.fresh_on_old);
  RC_CLASSIFY(keep, "object kept");
  RC_CLASSIFY(keep && exact, "in place");
  RC_CLASSIFY(placed, "placed in own storage");
  RC_CLASSIFY(must_throw, "throws");

  {
    DirectReloadScope scope(c.direct);
    try {
      impl(layer, kName, fresh_obj);
    } catch (const c10::Error& e) {
      RC_LOG() << "threw: " << e.what_without_backtrace() << "\n";
      RC_ASSERT(must_throw || may_throw);
      old_storage.assert_kept();
      fresh_storage.assert_kept();
      if (!(keep && exact && f.fresh_on_old)) old_storage.assert_unchanged();
      return;
    }
  }
  RC_ASSERT(!must_throw);
  RC_ASSERT(!direct_reload_enabled());
  old_storage.assert_kept();
  fresh_storage.assert_kept();
  if (!f.fresh_on_old) fresh_storage.assert_unchanged();
  const at::Tensor held = layer.get(kName);

  if (c.new_none) {
    RC_ASSERT(!held.defined());
    const bool slot = c.held == Held::kParameter || c.held == Held::kNone;
    RC_ASSERT(kind_name(layer.kind(kName)) ==
              kind_name(slot ? SlotKind::kParameter : SlotKind::kAttribute));
    old_storage.assert_unchanged();
    return;
  }
  RC_ASSERT(held.defined());
  RC_ASSERT(is_parameter(held));
  RC_ASSERT(kind_name(layer.kind(kName)) == kind_name(SlotKind::kParameter));

  // Attributes: new's overwrite, but for the three that stay with a parameter.
  std::map<std::string, std::string> expected_attrs;
  if (keep) expected_attrs = described_attrs(c.old_attrs);
  for (const auto& [key, value] : described_attrs(c.new_attrs)) {
    if (is_carried(key)) expected_attrs[key] = value;
  }
  // A new parameter inherits old's loader: `weight_loader`, else, for a
  // parameter, the `_weight_loader` field behind vLLM parameters' property.
  if (!keep && old_obj.defined()) {
    for (const char* key : {"weight_loader", "_weight_loader"}) {
      if (c.old_attrs.count(key) == 0) continue;
      if (std::string(key) == "_weight_loader" && c.held != Held::kParameter) break;
      expected_attrs["weight_loader"] = describe(attr_value(key, c.old_attrs.at(key)));
      break;
    }
  }
  RC_ASSERT(described_attrs(held) == expected_attrs);

  if (!keep) {
    // A new parameter object on new's data.
    RC_ASSERT(!held.is_same(old_obj));
    RC_ASSERT(!held.is_same(fresh_obj));
    RC_ASSERT(same_storage(held, t.fresh.storage()));
    RC_ASSERT(byte_offset(held) == byte_offset(t.fresh));
    assert_layout(held, f.fresh);
    if (!f.fresh_on_old) old_storage.assert_unchanged();
    return;
  }
  RC_ASSERT(held.is_same(old_obj));
  if (exact) {
    // Copied in place: address, storage and layout unchanged.
    RC_ASSERT(same_storage(held, t.storage));
    RC_ASSERT(byte_offset(held) == f.old.offset * f.old.itemsize());
    assert_layout(held, f.old);
    if (f.old_meta || f.fresh_on_old) return;
    if (!f.old.self_overlapping()) RC_ASSERT(same_elements(held, t.fresh));
    old_storage.assert_unchanged_outside(f.old.offset * f.old.itemsize(), f.old);
    return;
  }
  assert_layout(held, f.fresh);
  if (placed) {
    RC_ASSERT(same_storage(held, t.storage));
    RC_ASSERT(byte_offset(held) == f.old.offset * f.old.itemsize());
    if (f.old_meta) return;
    RC_ASSERT(same_elements(held, t.fresh));
    old_storage.assert_unchanged_outside(f.old.offset * f.old.itemsize(), f.fresh);
  } else {
    RC_ASSERT(same_storage(held, t.fresh.storage()));
    RC_ASSERT(byte_offset(held) == byte_offset(t.fresh));
    if (!f.fresh_on_old) old_storage.assert_unchanged();
  }
}

RC_GTEST_PROP(ReplaceParameterProps, KeepsObjectAttributesAndAddressByTheRules, ()) {
  replace_parameter_property(replace_parameter);
}

void expect_caught(const std::function<void()>& property) {
  const Falsified f = check_quietly(property);
  ASSERT_TRUE(f.failed) << "the property did not catch the mutant:\n" << f.counterexample;
  std::cout << "caught after " << f.cases << " cases:\n" << f.counterexample << "\n";
}

TEST(ReplaceParameterMutants, CarryingTheNewWeightLoaderIsCaught) {
  expect_caught([] {
    replace_parameter_property([](Layer& layer, const std::string& name, const at::Tensor& t) {
      replace_parameter(layer, name, t);
      if (const std::optional<AttrValue> loader = find_attr(t, "weight_loader")) {
        set_attr(layer.get(name), "weight_loader", *loader);
      }
    });
  });
}

TEST(ReplaceParameterMutants, RegisteringANewObjectEveryTimeIsCaught) {
  expect_caught([] {
    replace_parameter_property([](Layer& layer, const std::string& name, const at::Tensor& t) {
      if (!t.defined() || layer.kind(name) == SlotKind::kBuffer) {
        replace_parameter(layer, name, t);
        return;
      }
      at::Tensor p = make_parameter(t.detach());
      for (const auto& [key, value] : attrs(t)) {
        if (is_carried(key)) set_attr(p, key, value);
      }
      layer.set(name, p);
    });
  });
}

TEST(ReplaceParameterMutants, IgnoringDirectReloadIsCaught) {
  expect_caught([] {
    replace_parameter_property([](Layer& layer, const std::string& name, const at::Tensor& t) {
      DirectReloadScope off(false);
      replace_parameter(layer, name, t);
    });
  });
}

TEST(ReplaceParameterMutants, AModelThatKeepsRequantizationSourcesIsCaught) {
  expect_caught([] {
    ReplaceRules wrong;
    wrong.keeps_requantization_sources = true;
    replace_parameter_property(replace_parameter, wrong);
  });
}

// ---------------------------------------------------------------------------
// refill_derived

struct RefillCase {
  Held held = Held::kTensor;
  FitCase fit;  // old: the held tensor; fresh: new
  bool new_none = false;
};

std::ostream& operator<<(std::ostream& os, const RefillCase& c) {
  return os << "held=" << held_name(c.held) << " " << c.fit << (c.new_none ? " (new is None)" : "");
}

rc::Gen<RefillCase> gen_refill_case() {
  return rc::gen::exec([] {
    RefillCase c;
    c.held = *rc::gen::weightedElement<Held>({{8, Held::kTensor},
                                              {1, Held::kAbsent},
                                              {1, Held::kNone},
                                              {1, Held::kParameter},
                                              {1, Held::kBuffer}});
    c.fit = *gen_fit_case();
    if (*rc::gen::weightedElement<bool>({{1, false}, {2, true}})) {
      // A held tensor that owns its storage, and a new one of its shape and dtype.
      c.fit.old.offset = 0;
      c.fit.slack = 0;
      c.fit.fresh_on_old = false;
      c.fit.fresh =
          *gen_layout_of(c.fit.old.shape, c.fit.old.dtype, LayoutOptions{/*expanded=*/false});
      c.fit.fresh_meta = c.fit.old_meta;
    }
    c.new_none = *rc::gen::weightedElement<bool>({{10, false}, {1, true}});
    return c;
  });
}

using RefillFn = std::function<at::Tensor(Layer&, const std::string&, const at::Tensor&)>;

void refill_derived_property(const RefillFn& impl) {
  const RefillCase c = *gen_refill_case();
  const FitCase& f = c.fit;
  constexpr const char* kDerived = "derived";
  Layer layer;
  FitTensors t = build(f);
  at::Tensor old_obj;
  switch (c.held) {
    case Held::kAbsent:
      break;
    case Held::kNone:
      layer.set_attribute(kDerived, at::Tensor());
      break;
    case Held::kParameter:
      layer.register_param(kDerived, make_parameter(t.old));
      break;
    case Held::kTensor:
      old_obj = t.old;
      layer.set_attribute(kDerived, old_obj);
      break;
    case Held::kBuffer:
      layer.register_buffer(kDerived, t.old);
      break;
  }
  const at::Tensor fresh = c.new_none ? at::Tensor() : t.fresh;
  const StorageSnapshot old_storage(t.storage);
  const StorageSnapshot fresh_storage(t.fresh.storage());

  const bool refused_kind = c.held == Held::kParameter || c.held == Held::kBuffer;
  const bool same_kind = old_obj.defined() && !c.new_none && f.old.shape == f.fresh.shape &&
                         f.old.dtype == f.fresh.dtype && f.old_meta == f.fresh_meta;
  // An empty held tensor writes nothing, so it counts as owning its storage.
  const bool owns = f.old.numel() == 0 ||
                    (f.old.offset == 0 && f.old.span() * f.old.itemsize() == f.storage_nbytes() &&
                     f.old.span() >= f.old.numel());
  const bool refill = !refused_kind && same_kind && owns;
  const bool must_throw = refused_kind || (same_kind && !owns) ||
                          (refill && f.old.expanded() && f.old.numel() > 0 && !f.old_meta);
  const bool may_throw = refill && (f.fresh_on_old || (f.old_meta && f.old.expanded()));
  RC_CLASSIFY(refill, "refilled in place");
  RC_CLASSIFY(must_throw, "throws");
  RC_CLASSIFY(refill && f.old.self_overlapping(), "self-overlapping held tensor");

  at::Tensor returned;
  try {
    returned = impl(layer, kDerived, fresh);
  } catch (const c10::Error& e) {
    RC_LOG() << "threw: " << e.what_without_backtrace() << "\n";
    RC_ASSERT(must_throw || may_throw);
    old_storage.assert_kept();
    fresh_storage.assert_kept();
    if (!f.fresh_on_old) old_storage.assert_unchanged();
    return;
  }
  RC_ASSERT(!must_throw);
  old_storage.assert_kept();
  fresh_storage.assert_kept();
  if (!f.fresh_on_old) fresh_storage.assert_unchanged();
  const at::Tensor held = layer.get(kDerived);
  RC_ASSERT(kind_name(layer.kind(kDerived)) == kind_name(SlotKind::kAttribute));
  if (!refill) {
    RC_ASSERT(returned.is_same(fresh));
    RC_ASSERT(held.is_same(fresh));
    if (!f.fresh_on_old) old_storage.assert_unchanged();
    return;
  }
  RC_ASSERT(returned.is_same(old_obj));
  RC_ASSERT(held.is_same(old_obj));
  RC_ASSERT(same_storage(held, t.storage));
  RC_ASSERT(held.storage_offset() == f.old.offset);  // 0, or any for an empty held tensor
  assert_layout(held, f.old);
  if (f.old_meta || f.fresh_on_old) return;
  // A held layout that maps two indices to one location cannot hold every
  // value of new; the reference copies into it all the same (fuzz/README.md).
  if (!f.old.self_overlapping()) RC_ASSERT(same_elements(held, t.fresh));
  old_storage.assert_unchanged_outside(0, f.old);
}

RC_GTEST_PROP(RefillDerivedProps, RefillsInPlaceExactlyWhenTheHeldTensorMatchesAndOwnsIt, ()) {
  refill_derived_property(refill_derived);
}

TEST(RefillDerivedMutants, AlwaysRebindingIsCaught) {
  expect_caught([] {
    refill_derived_property([](Layer& layer, const std::string& name, const at::Tensor& t) {
      const SlotKind kind = layer.kind(name);
      TORCH_CHECK(kind != SlotKind::kParameter && kind != SlotKind::kBuffer, "not derived");
      layer.set(name, t);
      return t;
    });
  });
}

TEST(RefillDerivedMutants, RefillingAViewIsCaught) {
  expect_caught([] {
    refill_derived_property([](Layer& layer, const std::string& name, const at::Tensor& t) {
      const SlotKind kind = layer.kind(name);
      TORCH_CHECK(kind != SlotKind::kParameter && kind != SlotKind::kBuffer, "not derived");
      at::Tensor old = layer.get(name);
      if (old.defined() && t.defined() && old.sizes() == t.sizes() && old.dtype() == t.dtype() &&
          old.device() == t.device()) {
        return old.copy_(t);  // without the ownership check
      }
      layer.set(name, t);
      return t;
    });
  });
}

// ---------------------------------------------------------------------------
// copy_weight_

struct CopyCase {
  Layout dst;
  int64_t dst_slack = 0;
  Layout src;
  int64_t src_slack = 0;
  bool integrated = true;
  uint64_t seed = 0;
};

std::ostream& operator<<(std::ostream& os, const CopyCase& c) {
  return os << "dst=" << c.dst << " (slack " << c.dst_slack << ") src=" << c.src << " (slack "
            << c.src_slack << ")" << (c.integrated ? " integrated" : "") << " seed=" << c.seed;
}

rc::Gen<CopyCase> gen_copy_case() {
  return rc::gen::exec([] {
    CopyCase c;
    const bool same_dtype = *rc::gen::arbitrary<bool>();
    LayoutOptions dst_opts;
    dst_opts.overlapping = false;  // a loader's destination: a parameter or a slice of one
    if (!same_dtype) dst_opts.dtypes = convertible_dtypes();
    c.dst = *gen_layout(dst_opts);
    const at::ScalarType src_dtype =
        same_dtype ? c.dst.dtype : *rc::gen::elementOf(convertible_dtypes());
    c.src = *gen_layout_of(c.dst.shape, src_dtype);
    c.dst_slack = *rc::gen::weightedElement<int64_t>({{3, 0}, {1, 9}});
    c.src_slack = *rc::gen::weightedElement<int64_t>({{3, 0}, {1, 9}});
    c.integrated = *rc::gen::weightedElement<bool>({{1, false}, {3, true}});
    c.seed = *rc::gen::arbitrary<uint64_t>();
    return c;
  });
}

using CopyFn = std::function<at::Tensor&(at::Tensor&, const at::Tensor&)>;

void copy_weight_property(const CopyFn& impl) {
  const CopyCase c = *gen_copy_case();
  at::Tensor dst = make_tensor(c.dst, c.dst_slack, c.seed);
  const at::Tensor src = make_tensor(c.src, c.src_slack, c.seed + 1);
  const StorageSnapshot dst_storage(dst.storage());
  const StorageSnapshot src_storage(src.storage());
  // The oracle: copy_ itself, into a twin of dst's storage.
  c10::Storage twin_storage = make_storage(static_cast<int64_t>(dst_storage.nbytes), 0);
  if (!dst_storage.bytes.empty()) {
    std::memcpy(twin_storage.mutable_data(), dst_storage.bytes.data(), dst_storage.bytes.size());
  }
  at::Tensor twin = view_on(twin_storage, c.dst.dtype, c.dst.offset, c.dst.shape, c.dst.stride);
  const bool must_throw = c.dst.expanded() && c.dst.numel() > 0;
  if (!must_throw) twin.copy_(src);
  const bool touches =
      c.integrated && src.numel() > 1 && src.is_contiguous() && c.src.dtype == c.dst.dtype;
  RC_CLASSIFY(touches, "pages touched");
  RC_CLASSIFY(c.src.dtype != c.dst.dtype, "converts");
  RC_CLASSIFY(must_throw, "throws");

  at::Tensor* returned = nullptr;
  {
    ScopedIntegratedGpuOverride force(c.integrated);
    try {
      returned = &impl(dst, src);
    } catch (const c10::Error& e) {
      RC_LOG() << "threw: " << e.what_without_backtrace() << "\n";
      RC_ASSERT(must_throw);
      dst_storage.assert_unchanged();
      src_storage.assert_unchanged();
      return;
    }
  }
  RC_ASSERT(!must_throw);
  RC_ASSERT(returned == &dst);
  RC_ASSERT(storage_id(dst.storage()) == storage_id(dst_storage.storage));
  RC_ASSERT(dst.storage_offset() == c.dst.offset);
  assert_layout(dst, c.dst);
  dst_storage.assert_kept();
  src_storage.assert_unchanged();
  RC_ASSERT(storage_bytes(dst.storage()) == storage_bytes(twin_storage));
  if (c.src.dtype == c.dst.dtype) RC_ASSERT(same_elements(dst, src));
  if (src.is_contiguous() && src.numel() > 0) {
    const int64_t nbytes = src.numel() * static_cast<int64_t>(src.element_size());
    RC_ASSERT(touch_pages(src) == (nbytes + page_size() - 1) / page_size() + 1);
  }
}

RC_GTEST_PROP(CopyWeightProps, WritesExactlyWhatCopyWritesIntoDstsOwnStorage, ()) {
  copy_weight_property(copy_weight_);
}

TEST(CopyWeightMutants, RebindingDstToACopyIsCaught) {
  expect_caught([] {
    copy_weight_property([](at::Tensor& dst, const at::Tensor& src) -> at::Tensor& {
      dst.set_data(src.to(dst.scalar_type()).expand(dst.sizes()).clone());
      return dst;
    });
  });
}

}  // namespace
}  // namespace reloadsafe::fuzz
