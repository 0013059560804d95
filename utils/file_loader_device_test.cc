// The file loader into device tensors. Written against c10's device-generic
// API, so it builds against LibTorch's CPU library too; it skips, saying why,
// where no CUDA device is visible.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "utils/copy_weight.h"
#include "utils/file_loader.h"
#include "utils/safetensors_test_writer.h"

#include <ATen/Context.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace reloadsafe {
namespace {

using testing::NamedTensor;
using testing::write_safetensors;

class FileLoaderDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!at::hasCUDA()) {
      GTEST_SKIP() << "no CUDA device is visible (at::hasCUDA() is false): the loader's device "
                      "path (staging ring, copy stream, events) runs only where one is";
    }
  }

  static at::TensorOptions on_device(at::ScalarType dtype) {
    return at::TensorOptions().dtype(dtype).device(at::kCUDA, 0);
  }

  // Allocations the device's caching allocator has made so far.
  static int64_t device_allocations() {
    return at::accelerator::getDeviceStats(0).allocation[0].allocated;
  }
};

TEST_F(FileLoaderDevice, LoadsAtTheTensorsAddressesWithoutAllocating) {
  const std::vector<NamedTensor> values = {
      {"a", at::randn({1000, 333})},  // several chunks
      {"b", at::randn({77}).to(at::kHalf)},
      {"c", at::randn({5, 5}).to(at::kBFloat16)},
  };
  const std::string path = write_safetensors("device.safetensors", values);
  LoadTargets targets;
  std::vector<const void*> addresses;
  for (const NamedTensor& v : values) {
    targets[v.name] = {at::zeros(v.value.sizes(), on_device(v.value.scalar_type())), {}};
    addresses.push_back(targets[v.name].tensor.data_ptr());
  }
  FileLoader loader({2, 64 << 10, 3, false});
  const int64_t allocations = device_allocations();
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    for (auto& [name, t] : targets) t.tensor.zero_();
    loader.load_({path}, targets);
    size_t i = 0;
    for (const NamedTensor& v : values) {
      SCOPED_TRACE(v.name);
      EXPECT_EQ(targets[v.name].tensor.data_ptr(), addresses[i++]);
      EXPECT_TRUE(at::equal(targets[v.name].tensor.cpu(), v.value));
    }
  }
  EXPECT_EQ(device_allocations(), allocations) << "the loader allocated device memory";
  const FileLoaderCounters n = loader.counters();
  EXPECT_EQ(n.staging_allocations, 1);
  EXPECT_EQ(n.staging_bytes, 3 * (64 << 10));
  EXPECT_GT(n.staged_copies, 3 * 3);
  EXPECT_EQ(n.mapped_copies, 0);
}

TEST_F(FileLoaderDevice, FusedParameterByOffset) {
  const at::Tensor q = at::randn({64, 32});
  const at::Tensor k = at::randn({16, 32});
  const std::string path = write_safetensors("fused.safetensors", {{"q", q}, {"k", k}});
  at::Tensor qk = at::zeros({80, 32}, on_device(at::kFloat));
  FileLoader loader({2, 4096, 2, false});
  loader.load_({path}, {{"q", {qk, 0}}, {"k", {qk, 64 * 32 * 4}}});
  EXPECT_TRUE(at::equal(qk.narrow(0, 0, 64).cpu(), q));
  EXPECT_TRUE(at::equal(qk.narrow(0, 64, 16).cpu(), k));
}

TEST_F(FileLoaderDevice, IntegratedGpuCopiesOutOfAMappingWithThePageTouch) {
  const at::Tensor w = at::randn({256, 256});
  const std::string path = write_safetensors("integrated.safetensors", {{"w", w}});
  at::Tensor dst = at::zeros({256, 256}, on_device(at::kFloat));
  const void* address = dst.data_ptr();
  ScopedIntegratedGpuOverride integrated(true);
  FileLoader loader;
  loader.load_({path}, {{"w", {dst, {}}}});
  EXPECT_EQ(dst.data_ptr(), address);
  EXPECT_TRUE(at::equal(dst.cpu(), w));
  EXPECT_EQ(loader.counters().mapped_copies, 1);
  EXPECT_EQ(loader.counters().staging_allocations, 0);
}

}  // namespace
}  // namespace reloadsafe
