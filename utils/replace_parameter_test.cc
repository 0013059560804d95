#include "utils/replace_parameter.h"

#include "utils/reload_context.h"
#include "utils/storage_fit.h"
#include "utils/tensor_attrs.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <string>

namespace reloadsafe {
namespace {

// What the tests compare before and after: identity of the object, its
// storage, the storage's address and size.
struct Snapshot {
  const c10::TensorImpl* object;
  const c10::StorageImpl* storage;
  const void* storage_ptr;
  size_t storage_nbytes;
  const void* data_ptr;

  explicit Snapshot(const at::Tensor& t)
      : object(t.unsafeGetTensorImpl()),
        storage(t.storage().unsafeGetStorageImpl()),
        storage_ptr(t.storage().data()),
        storage_nbytes(t.storage().nbytes()),
        data_ptr(t.storage().data() == nullptr ? nullptr : t.data_ptr()) {}
};

at::Tensor seq(std::vector<int64_t> shape, at::ScalarType dtype, double start = 0) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return at::arange(start, start + n, at::kDouble).to(dtype).reshape(shape);
}

// A layer with a uint8 [16, 64] checkpoint weight and a loader.
Layer loaded_layer() {
  Layer layer;
  at::Tensor w = make_parameter(seq({16, 64}, at::kByte));
  set_weight_attrs(w, AttrMap{{"weight_loader", WeightLoader{"L", nullptr}}});
  layer.register_param("weight", w);
  return layer;
}

TEST(ReplaceParameter, SameLayoutCopiesIntoTheObject) {
  Layer layer = loaded_layer();
  at::Tensor w = layer.get("weight");
  Snapshot before(w);
  at::Tensor fresh = seq({16, 64}, at::kByte, 5);
  replace_parameter(layer, "weight", fresh);
  at::Tensor after = layer.get("weight");
  EXPECT_TRUE(after.is_same(w));
  EXPECT_EQ(after.data_ptr(), before.data_ptr);
  EXPECT_TRUE(at::equal(after, fresh));
  EXPECT_FALSE(after.storage().is_alias_of(fresh.storage()));
}

TEST(ReplaceParameter, EqualSizeRepackToAnotherDtypeKeepsTheAddress) {
  Layer layer = loaded_layer();
  Snapshot before(layer.get("weight"));
  at::Tensor packed = seq({4, 64}, at::kInt, 100);
  set_attr(packed, "is_shuffled", true);
  replace_parameter(layer, "weight", packed);
  at::Tensor w = layer.get("weight");
  EXPECT_EQ(w.unsafeGetTensorImpl(), before.object);
  EXPECT_EQ(w.storage().unsafeGetStorageImpl(), before.storage);
  EXPECT_EQ(w.storage().data(), before.storage_ptr);
  EXPECT_EQ(w.storage().nbytes(), before.storage_nbytes);
  EXPECT_EQ(w.data_ptr(), before.data_ptr);
  EXPECT_EQ(w.scalar_type(), at::kInt);
  EXPECT_EQ(w.sizes(), packed.sizes());
  EXPECT_TRUE(at::equal(w, packed));
  EXPECT_TRUE(attr_truthy(w, "is_shuffled"));
  EXPECT_EQ(std::get<WeightLoader>(*find_attr(w, "weight_loader")).name, "L");
}

TEST(ReplaceParameter, SmallerIsPlacedAndTheStorageNeverShrinks) {
  Layer layer = loaded_layer();
  Snapshot before(layer.get("weight"));
  at::Tensor smaller = seq({8, 16}, at::kByte, 3);
  replace_parameter(layer, "weight", smaller);
  at::Tensor w = layer.get("weight");
  EXPECT_EQ(w.storage().unsafeGetStorageImpl(), before.storage);
  EXPECT_EQ(w.storage().nbytes(), before.storage_nbytes);
  EXPECT_TRUE(at::equal(w, smaller));
}

TEST(ReplaceParameter, LargerRebindsTheObjectOutsideDirectReload) {
  Layer layer = loaded_layer();
  at::Tensor w0 = layer.get("weight");
  Snapshot before(w0);
  c10::Storage old_storage = w0.storage();  // keep it alive to inspect it
  const at::Tensor old_bytes = w0.clone();
  at::Tensor larger = seq({32, 64}, at::kByte, 1);
  replace_parameter(layer, "weight", larger);
  at::Tensor w = layer.get("weight");
  EXPECT_EQ(w.unsafeGetTensorImpl(), before.object);
  EXPECT_TRUE(w.storage().is_alias_of(larger.storage()));
  // The old storage was neither written nor resized.
  EXPECT_EQ(old_storage.data(), before.storage_ptr);
  EXPECT_EQ(old_storage.nbytes(), before.storage_nbytes);
  EXPECT_TRUE(at::equal(storage_view(old_storage, 0, {16, 64}, {64, 1}, at::kByte), old_bytes));
}

TEST(ReplaceParameter, DirectReloadPlacesAGrownWeightInTheWholeStorage) {
  // Cold start: the weight was loaded into a storage with room, as a view of
  // its first 16 rows (what a previous post-processing left behind).
  Layer layer;
  at::Tensor base = at::zeros({32, 64}, at::kByte);
  at::Tensor w = make_parameter(base.narrow(0, 0, 16));
  layer.register_param("weight", w);
  Snapshot before(w);
  at::Tensor grown = seq({32, 64}, at::kByte, 7);
  {
    DirectReloadScope direct;
    replace_parameter(layer, "weight", grown);
  }
  at::Tensor after = layer.get("weight");
  EXPECT_TRUE(after.is_same(w));
  EXPECT_EQ(after.data_ptr(), before.data_ptr);
  EXPECT_EQ(after.storage().nbytes(), before.storage_nbytes);
  EXPECT_TRUE(at::equal(after, grown));
}

TEST(ReplaceParameter, DirectReloadPlacesAPaddedViewWithGaps) {
  Layer layer;
  at::Tensor w = make_parameter(seq({8, 16}, at::kFloat));
  layer.register_param("weight", w);
  Snapshot before(w);
  // ROCm-style padding: 4 rows of 12 valid columns, row stride 32.
  at::Tensor padded =
      at::zeros({4, 32}, at::kFloat).narrow(1, 0, 12).copy_(seq({4, 12}, at::kFloat, 9));
  {
    DirectReloadScope direct;
    replace_parameter(layer, "weight", padded);
  }
  at::Tensor after = layer.get("weight");
  EXPECT_EQ(after.data_ptr(), before.data_ptr);
  EXPECT_EQ(after.strides(), padded.strides());
  EXPECT_TRUE(at::equal(after, padded));
  // Outside direct reload the same replacement cannot keep the address.
  Layer cold;
  at::Tensor w2 = make_parameter(seq({8, 16}, at::kFloat));
  cold.register_param("weight", w2);
  replace_parameter(cold, "weight", padded);
  EXPECT_TRUE(cold.get("weight").storage().is_alias_of(padded.storage()));
}

TEST(ReplaceParameter, DirectReloadKeepsTheStorageOfAnEmptiedWeight) {
  Layer layer = loaded_layer();
  Snapshot before(layer.get("weight"));
  at::Tensor empty = at::empty({0}, at::kByte);
  {
    DirectReloadScope direct;
    replace_parameter(layer, "weight", empty);
  }
  at::Tensor after = layer.get("weight");
  EXPECT_EQ(after.numel(), 0);
  EXPECT_EQ(after.storage().unsafeGetStorageImpl(), before.storage);
  EXPECT_EQ(after.storage().nbytes(), before.storage_nbytes);
}

TEST(ReplaceParameter, AttributesCarriedExceptLoaderFields) {
  Layer layer = loaded_layer();
  at::Tensor w = layer.get("weight");
  set_attr(w, "_ckpt", std::string("mine"));
  at::Tensor fresh = seq({16, 64}, at::kByte);
  set_attr(fresh, "weight_loader", WeightLoader{"other", nullptr});
  set_attr(fresh, "_weight_loader", WeightLoader{"other", nullptr});
  set_attr(fresh, "_ckpt", std::string("theirs"));
  set_attr(fresh, "is_shuffled", true);
  set_attr(fresh, "tile", int64_t{16});
  replace_parameter(layer, "weight", fresh);
  AttrMap got = attrs(layer.get("weight"));
  EXPECT_EQ(std::get<WeightLoader>(got.at("weight_loader")).name, "L");
  EXPECT_EQ(got.count("_weight_loader"), 0u);
  EXPECT_EQ(std::get<std::string>(got.at("_ckpt")), "mine");
  EXPECT_TRUE(std::get<bool>(got.at("is_shuffled")));
  EXPECT_EQ(std::get<int64_t>(got.at("tile")), 16);
}

TEST(ReplaceParameter, RequantizationSourceIsReplacedByANewObject) {
  Layer layer = loaded_layer();
  at::Tensor src = layer.get("weight");
  set_attr(src, "requantization_source", true);
  set_attr(src, "_weight_loader", WeightLoader{"backing", nullptr});
  at::Tensor q = seq({16, 64}, at::kByte);
  replace_parameter(layer, "weight", q);
  at::Tensor w = layer.get("weight");
  EXPECT_FALSE(w.is_same(src));
  EXPECT_TRUE(is_parameter(w));
  EXPECT_TRUE(w.storage().is_alias_of(q.storage()));
  EXPECT_EQ(std::get<WeightLoader>(*find_attr(w, "weight_loader")).name, "L");
  EXPECT_FALSE(has_attr(w, "_weight_loader"));
  EXPECT_FALSE(has_attr(w, "requantization_source"));
}

// vLLM's parameter classes answer `weight_loader` from their `_weight_loader`
// field, so the reference's `hasattr` sees either: a new parameter inherits
// the loader under `weight_loader`.
TEST(ReplaceParameter, NewParameterInheritsTheLoaderBehindWeightLoader) {
  Layer layer;
  at::Tensor src = make_parameter(seq({16, 64}, at::kByte));
  set_attr(src, "requantization_source", true);
  set_attr(src, "_weight_loader", WeightLoader{"backing", nullptr});
  layer.register_param("weight", src);
  replace_parameter(layer, "weight", seq({16, 64}, at::kByte));
  at::Tensor w = layer.get("weight");
  EXPECT_FALSE(w.is_same(src));
  EXPECT_EQ(std::get<WeightLoader>(*find_attr(w, "weight_loader")).name, "backing");
  EXPECT_FALSE(has_attr(w, "_weight_loader"));
}

// A tensor-valued `requantization_source` is read as Python reads it: a
// one-element tensor is its value, a larger one is an error.
TEST(ReplaceParameter, TensorValuedRequantizationSourceIsItsOneValue) {
  struct Case {
    const char* name;
    at::Tensor flag;
    bool keeps_object;
  } cases[] = {{"zero", at::zeros({1}, at::kLong), true},
               {"one", at::ones({1}, at::kLong), false},
               {"scalar_true", at::scalar_tensor(true, at::kBool), false}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    Layer layer = loaded_layer();
    at::Tensor old = layer.get("weight");
    set_attr(old, "requantization_source", c.flag);
    replace_parameter(layer, "weight", seq({16, 64}, at::kByte, 3));
    EXPECT_EQ(layer.get("weight").is_same(old), c.keeps_object);
  }
  Layer layer = loaded_layer();
  at::Tensor old = layer.get("weight");
  set_attr(old, "requantization_source", at::ones({2}, at::kLong));
  EXPECT_THROW(replace_parameter(layer, "weight", seq({16, 64}, at::kByte, 3)), c10::Error);
  EXPECT_TRUE(layer.get("weight").is_same(old));
  EXPECT_TRUE(at::equal(old, seq({16, 64}, at::kByte)));  // nothing written
}

TEST(ReplaceParameter, MetaParameterReceivingRealDataIsANewObject) {
  Layer layer;
  at::Tensor meta = make_parameter(at::empty({4, 4}, at::TensorOptions().device(at::kMeta)));
  set_attr(meta, "weight_loader", WeightLoader{"L", nullptr});
  layer.register_param("weight", meta);
  at::Tensor real = seq({4, 4}, at::kFloat);
  replace_parameter(layer, "weight", real);
  at::Tensor w = layer.get("weight");
  EXPECT_FALSE(w.is_same(meta));
  EXPECT_FALSE(w.is_meta());
  EXPECT_TRUE(at::equal(w, real));
  EXPECT_TRUE(has_attr(w, "weight_loader"));
}

TEST(ReplaceParameter, OnlineQuantizationRebindsToTheNewData) {
  Layer layer = loaded_layer();
  layer.quant_method = QuantMethod{/*uses_meta_device=*/true};
  at::Tensor w = layer.get("weight");
  at::Tensor small = seq({4, 4}, at::kFloat);
  replace_parameter(layer, "weight", small);
  EXPECT_TRUE(layer.get("weight").is_same(w));
  EXPECT_TRUE(w.storage().is_alias_of(small.storage()));  // source released
}

TEST(ReplaceParameter, NoneSetsTheSlotToNone) {
  Layer layer = loaded_layer();
  replace_parameter(layer, "weight", at::Tensor());
  EXPECT_EQ(layer.kind("weight"), SlotKind::kParameter);
  EXPECT_FALSE(layer.get("weight").defined());
  replace_parameter(layer, "bias", at::Tensor());
  EXPECT_EQ(layer.kind("bias"), SlotKind::kAttribute);
}

TEST(ReplaceParameter, AbsentOrPlainTensorBecomesANewParameter) {
  Layer layer;
  at::Tensor t = seq({4}, at::kFloat);
  replace_parameter(layer, "scale", t);
  EXPECT_EQ(layer.kind("scale"), SlotKind::kParameter);
  EXPECT_TRUE(layer.get("scale").storage().is_alias_of(t.storage()));
  EXPECT_FALSE(layer.get("scale").is_same(t));

  at::Tensor plain = seq({4}, at::kFloat);
  set_attr(plain, "weight_loader", WeightLoader{"P", nullptr});
  layer.set_attribute("zp", plain);
  replace_parameter(layer, "zp", seq({4}, at::kFloat));
  EXPECT_EQ(layer.kind("zp"), SlotKind::kParameter);
  EXPECT_EQ(std::get<WeightLoader>(*find_attr(layer.get("zp"), "weight_loader")).name, "P");
}

TEST(ReplaceParameter, ParameterArgumentContributesItsDataNotItsIdentity) {
  Layer layer;
  at::Tensor p = make_parameter(seq({4}, at::kFloat));
  set_attr(p, "flag", true);
  replace_parameter(layer, "weight", p);
  at::Tensor w = layer.get("weight");
  EXPECT_FALSE(w.is_same(p));
  EXPECT_TRUE(w.storage().is_alias_of(p.storage()));
  EXPECT_TRUE(attr_truthy(w, "flag"));
}

TEST(ReplaceParameter, BufferIsRefused) {
  Layer layer;
  layer.register_buffer("running", at::zeros({4}));
  EXPECT_THROW(replace_parameter(layer, "running", at::ones({4})), c10::Error);
  EXPECT_TRUE(at::equal(layer.get("running"), at::zeros({4})));
}

TEST(ReplaceParameter, ExpandedParameter) {
  Layer layer;
  at::Tensor base = at::zeros({4}, at::kFloat);
  at::Tensor w = make_parameter(base.expand({3, 4}));
  layer.register_param("w", w);
  // Same (expanded) layout: the in-place copy would write one element
  // several times; LibTorch refuses, and nothing is written.
  EXPECT_THROW(replace_parameter(layer, "w", at::ones({4}).expand({3, 4})), c10::Error);
  EXPECT_TRUE(at::equal(base, at::zeros({4})));
  // Another layout: an expanded tensor is not dense, so nothing is placed in
  // its storage; the object is rebound to the new data.
  at::Tensor fresh = at::ones({3, 4});
  replace_parameter(layer, "w", fresh);
  EXPECT_TRUE(layer.get("w").is_same(w));
  EXPECT_TRUE(w.storage().is_alias_of(fresh.storage()));
  EXPECT_TRUE(at::equal(base, at::zeros({4})));
}

TEST(SetKernelParameter, RevivesARetiredParameterAndTakesTheRuntimeName) {
  Layer layer = loaded_layer();
  at::Tensor w = layer.get("weight");
  set_attr(w, "retired", true);
  set_attr(w, "runtime_name", std::string("qweight"));
  set_kernel_parameter(layer, "weight", seq({16, 64}, at::kByte));
  EXPECT_FALSE(has_attr(w, "retired"));
  EXPECT_EQ(std::get<std::string>(*find_attr(w, "runtime_name")), "weight");
}

TEST(SetKernelParameter, WithoutRuntimeNameNoneIsAdded) {
  Layer layer = loaded_layer();
  set_kernel_parameter(layer, "weight", seq({4, 64}, at::kInt));
  EXPECT_FALSE(has_attr(layer.get("weight"), "runtime_name"));
}

TEST(SetKernelParameter, NoneIsRejectedBeforeAnythingChanges) {
  Layer layer = loaded_layer();
  at::Tensor w = layer.get("weight");
  EXPECT_THROW(set_kernel_parameter(layer, "weight", at::Tensor()), c10::Error);
  EXPECT_TRUE(layer.get("weight").is_same(w));
}

TEST(RefillDerived, SameShapeDtypeDeviceRefillsInPlace) {
  Layer layer;
  at::Tensor first = refill_derived(layer, "w_kc", seq({4, 8}, at::kFloat));
  const void* ptr = first.data_ptr();
  at::Tensor next = seq({4, 8}, at::kFloat, 50);
  at::Tensor held = refill_derived(layer, "w_kc", next);
  EXPECT_TRUE(held.is_same(first));
  EXPECT_EQ(held.data_ptr(), ptr);
  EXPECT_TRUE(at::equal(held, next));
  EXPECT_TRUE(layer.get("w_kc").is_same(first));
}

// vLLM #42481: a derived name holding a view of a weight's whole storage is
// an alias of the weight; refilling it (a copy-back of a stale snapshot)
// would revert the freshly loaded weight. Refused, weight untouched, for a
// parameter and a buffer alike.
TEST(RefillDerived, AnAliasOfAParameterOrBufferIsRefusedAndTheWeightKeepsItsBytes) {
  for (const bool buffer : {false, true}) {
    SCOPED_TRACE(buffer ? "buffer" : "parameter");
    Layer layer;
    at::Tensor weight = seq({2, 1, 2}, at::kFloat);
    if (buffer) {
      layer.register_buffer("conv_weight", weight);
    } else {
      layer.register_param("conv_weight", make_parameter(weight));
    }
    layer.set("conv_weights", layer.get("conv_weight").view({2, 2}));
    const at::Tensor loaded = layer.get("conv_weight").clone();
    try {
      refill_derived(layer, "conv_weights", seq({2, 2}, at::kFloat, 50));
      ADD_FAILURE() << "refilled an alias of the weight";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("shares its storage with"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("'conv_weight'"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(at::equal(layer.get("conv_weight"), loaded));
  }
}

TEST(RefillDerived, OtherShapeOrDtypeRebinds) {
  Layer layer;
  at::Tensor first = refill_derived(layer, "w_kc", seq({4, 8}, at::kFloat));
  at::Tensor other = seq({8, 4}, at::kFloat);
  EXPECT_TRUE(refill_derived(layer, "w_kc", other).is_same(other));
  at::Tensor half = seq({8, 4}, at::kHalf);
  EXPECT_TRUE(refill_derived(layer, "w_kc", half).is_same(half));
  EXPECT_FALSE(refill_derived(layer, "w_kc", at::Tensor()).defined());
  EXPECT_EQ(layer.kind("w_kc"), SlotKind::kAttribute);
}

TEST(RefillDerived, RefusesParametersBuffersAndViews) {
  Layer layer = loaded_layer();
  layer.register_buffer("buf", at::zeros({2}));
  EXPECT_THROW(refill_derived(layer, "weight", seq({16, 64}, at::kByte)), c10::Error);
  EXPECT_THROW(refill_derived(layer, "buf", at::ones({2})), c10::Error);
  at::Tensor base = at::zeros({8}, at::kFloat);
  layer.set_attribute("view", base.narrow(0, 2, 4));
  EXPECT_THROW(refill_derived(layer, "view", at::ones({4})), c10::Error);
  EXPECT_TRUE(at::equal(base, at::zeros({8})));
}

// An empty held tensor is refilled (nothing is written) even when it is a
// view that does not own its storage, as in the reference.
TEST(RefillDerived, AnEmptyViewIsRefilledWritingNothing) {
  Layer layer;
  at::Tensor base = at::zeros({8}, at::kFloat);
  at::Tensor empty_view = base.narrow(0, 3, 0);
  layer.set_attribute("d", empty_view);
  at::Tensor returned = refill_derived(layer, "d", at::ones({0}));
  EXPECT_TRUE(returned.is_same(empty_view));
  EXPECT_TRUE(layer.get("d").is_same(empty_view));
  EXPECT_TRUE(at::equal(base, at::zeros({8})));
  EXPECT_EQ(base.storage().nbytes(), 32u);
}

}  // namespace
}  // namespace reloadsafe
