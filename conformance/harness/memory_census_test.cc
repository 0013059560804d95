#include "conformance/harness/memory_census.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <optional>

namespace reloadsafe::harness {
namespace {

TEST(MemoryCensus, CountsLiveCpuStoragesAndForgetsFreedOnes) {
  install_cpu_census();
  install_cpu_census();  // idempotent
  const int64_t before = live_tensor_bytes(c10::kCPU).value();
  std::optional<at::Tensor> t = at::empty({1024}, at::kFloat);
  EXPECT_EQ(live_tensor_bytes(c10::kCPU).value() - before, 4096);
  const void* data = t->data_ptr();
  t.reset();
  EXPECT_EQ(live_tensor_bytes(c10::kCPU).value(), before);
  EXPECT_FALSE(cpu_allocation_epoch_of(data).has_value()) << "a freed block is forgotten";
}

TEST(MemoryCensus, NumbersAllocationsInOrder) {
  install_cpu_census();
  const uint64_t start = cpu_allocation_epoch().value();
  const at::Tensor a = at::empty({16});
  const at::Tensor b = at::empty({16});
  const auto ea = cpu_allocation_epoch_of(a.data_ptr());
  const auto eb = cpu_allocation_epoch_of(b.data_ptr());
  ASSERT_TRUE(ea && eb);
  EXPECT_GT(*ea, start);
  EXPECT_GT(*eb, *ea);
  EXPECT_FALSE(cpu_allocation_epoch_of(nullptr).has_value());
}

TEST(MemoryCensus, HandsOutUsableMemoryThroughEveryPath) {
  install_cpu_census();
  // raw_allocate / raw_deallocate go through the counting allocator too.
  c10::Allocator* cpu = c10::GetCPUAllocator();
  const int64_t before = live_tensor_bytes(c10::kCPU).value();
  void* p = cpu->raw_allocate(256);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(live_tensor_bytes(c10::kCPU).value() - before, 256);
  cpu->raw_deallocate(p);
  EXPECT_EQ(live_tensor_bytes(c10::kCPU).value(), before);
  at::Tensor t = at::arange(1000, at::kFloat);
  EXPECT_EQ(t.sum().item<float>(), 499500.0f);
}

TEST(MemoryCensus, SaysWhenItCannotCount) {
  EXPECT_FALSE(live_tensor_bytes(c10::Device(c10::kMeta)).has_value());
}

}  // namespace
}  // namespace reloadsafe::harness
