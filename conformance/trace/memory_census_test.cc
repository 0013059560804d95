#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/trace/memory_census.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace reloadsafe::trace {
namespace {

TEST(MemoryCensus, CountsLiveCpuStoragesAndForgetsFreedOnes) {
  CpuCensusScope census;
  CpuCensusScope nested;  // scopes nest
  const int64_t before = live_tensor_bytes(c10::kCPU).value();
  std::optional<at::Tensor> t = at::empty({1024}, at::kFloat);
  EXPECT_EQ(live_tensor_bytes(c10::kCPU).value() - before, 4096);
  const void* data = t->data_ptr();
  t.reset();
  EXPECT_EQ(live_tensor_bytes(c10::kCPU).value(), before);
  EXPECT_FALSE(cpu_allocation_epoch_of(data).has_value()) << "a freed block is forgotten";
}

TEST(MemoryCensus, ThePeakIsTheMostLiveAtOnceSinceTheLastTake) {
  CpuCensusScope scope;
  const c10::Device cpu(c10::kCPU);
  const at::Tensor kept = at::empty({1024}, at::kByte);
  take_peak_tensor_bytes(cpu);
  const int64_t before = *live_tensor_bytes(cpu);
  { const at::Tensor staged = at::empty({4096}, at::kByte); }  // held for a moment
  EXPECT_GE(*take_peak_tensor_bytes(cpu) - before, 4096);
  EXPECT_EQ(*take_peak_tensor_bytes(cpu), *live_tensor_bytes(cpu))
      << "starts over from what is live";
  EXPECT_FALSE(take_peak_tensor_bytes(c10::Device(c10::kMeta)).has_value());
}

TEST(MemoryCensus, NumbersAllocationsInOrder) {
  CpuCensusScope census;
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
  CpuCensusScope census;
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

TEST(MemoryCensus, TheLastScopeRestoresTheAllocatorItFound) {
  c10::Allocator* original = c10::GetCPUAllocator();
  {
    CpuCensusScope outer;
    EXPECT_NE(c10::GetCPUAllocator(), original);
    EXPECT_TRUE(cpu_census_installed());
    {
      CpuCensusScope inner;
      EXPECT_TRUE(cpu_census_installed());
    }
    EXPECT_TRUE(cpu_census_installed()) << "an inner scope's end leaves the outer one counting";
  }
  EXPECT_EQ(c10::GetCPUAllocator(), original);
  EXPECT_FALSE(cpu_census_installed());
  EXPECT_FALSE(live_tensor_bytes(c10::kCPU).has_value()) << "nothing is counted outside a scope";
}

// Blocks that cross a scope's boundary, in either direction and through
// either path, are freed exactly once and never make a deleter throw (the
// census used to abort on a raw block allocated before it, as oneDNN's are).
TEST(MemoryCensus, BlocksCrossingAScopeBoundaryAreFreedQuietly) {
  c10::Allocator* cpu = c10::GetCPUAllocator();
  void* before_scope = cpu->raw_allocate(512);
  std::optional<at::Tensor> outlives;
  void* raw_inside = nullptr;
  {
    CpuCensusScope census;
    EXPECT_NO_THROW(c10::GetCPUAllocator()->raw_deallocate(before_scope));
    outlives = at::ones({64});
    raw_inside = c10::GetCPUAllocator()->raw_allocate(128);
  }
  EXPECT_EQ(outlives->sum().item<float>(), 64.0f);
  EXPECT_NO_THROW(outlives.reset());
  // Freed through the restored allocator, behind the census's back.
  EXPECT_NO_THROW(c10::GetCPUAllocator()->raw_deallocate(raw_inside));
  CpuCensusScope again;
  const int64_t base = live_tensor_bytes(c10::kCPU).value();
  std::vector<at::Tensor> reuse;
  for (int i = 0; i < 32; ++i) reuse.push_back(at::empty({32}));  // may reuse raw_inside
  EXPECT_EQ(live_tensor_bytes(c10::kCPU).value() - base, 32 * 128);
  reuse.clear();
  EXPECT_EQ(live_tensor_bytes(c10::kCPU).value(), base);
}

TEST(MemoryCensus, SaysWhenItCannotCount) {
  EXPECT_FALSE(live_tensor_bytes(c10::Device(c10::kMeta)).has_value());
}

TEST(Quarantine, HoldsPoisonedBlocksFreedWhileCapturing) {
  CpuCensusScope census;
  Quarantine quarantine;
  std::optional<at::Tensor> weight = at::ones({256}, at::kFloat);
  std::optional<at::Tensor> other = at::ones({256}, at::kInt);
  const float* stale = weight->data_ptr<float>();
  const int32_t* stale_int = other->data_ptr<int32_t>();
  const int64_t live = live_tensor_bytes(c10::kCPU).value();
  {
    Quarantine::Capturing capturing(quarantine);
    weight.reset();
    other.reset();
  }
  EXPECT_EQ(quarantine.held_blocks(), 2u);
  EXPECT_EQ(quarantine.held_bytes(), 2u * 1024u);
  EXPECT_EQ(live_tensor_bytes(c10::kCPU).value(), live - 2048) << "held blocks are not live";
  // What a kernel holding the old pointer reads now (the block is still
  // mapped and owned by the quarantine, so this read is defined).
  for (int i = 0; i < 256; ++i) {
    ASSERT_TRUE(std::isnan(stale[i])) << "element " << i;
    ASSERT_EQ(stale_int[i], -1) << "element " << i;
  }
  std::vector<at::Tensor> fresh;
  for (int i = 0; i < 16; ++i) {
    fresh.push_back(at::empty({256}, at::kFloat));
    EXPECT_NE(fresh.back().data_ptr(), static_cast<const void*>(stale))
        << "a held block is not reused";
  }
  std::optional<at::Tensor> outside = at::ones({16});
  outside.reset();  // not capturing: freed at once
  EXPECT_EQ(quarantine.held_blocks(), 2u);
}

TEST(Quarantine, ReleasesTheOldestBeyondItsLimit) {
  CpuCensusScope census;
  Quarantine quarantine(/*max_bytes=*/3 * 4096);
  Quarantine::Capturing capturing(quarantine);
  for (int i = 0; i < 5; ++i) {
    at::Tensor t = at::empty({1024}, at::kFloat);  // 4096 bytes, freed at once
  }
  EXPECT_EQ(quarantine.held_blocks(), 3u);
  EXPECT_EQ(quarantine.held_bytes(), 3u * 4096u);
  EXPECT_EQ(quarantine.evicted_blocks(), 2u);
}

TEST(Quarantine, OneAtATime) {
  CpuCensusScope census;
  Quarantine first;
  EXPECT_THROW(Quarantine second, c10::Error);
}

constexpr int64_t kMiB = int64_t{1} << 20;

// Frees a tensor of `bytes` bytes in one of several ways, then allocates
// `next_bytes` and says whether the new tensor got the freed block back.
struct ReuseRow {
  const char* what;
  int64_t bytes;
  bool freed_inside_a_reload;  // under Quarantine::Capturing
  int64_t next_bytes;
  bool reused;
};

void PrintTo(const ReuseRow& row, std::ostream* os) {
  *os << row.what;
}

class ReuseCacheTable : public ::testing::TestWithParam<ReuseRow> {};

TEST_P(ReuseCacheTable, HandsBackOnlyWhatNobodyHolds) {
  const ReuseRow& row = GetParam();
  CpuCensusScope census;
  Quarantine quarantine;
  ReuseCache cache;
  std::optional<at::Tensor> old = at::full({row.bytes}, 7, at::kByte);
  const void* address = old->data_ptr();
  {
    std::optional<Quarantine::Capturing> capturing;
    if (row.freed_inside_a_reload) capturing.emplace(quarantine);
    old.reset();
  }
  const at::Tensor next = at::empty({row.next_bytes}, at::kByte);
  const std::optional<uint64_t> epoch_now = cpu_allocation_epoch();
  EXPECT_EQ(next.data_ptr() == address, row.reused) << row.what;
  EXPECT_EQ(cache.reused_blocks(), row.reused ? 1u : 0u) << row.what;
  EXPECT_GE(live_tensor_bytes(c10::kCPU).value(), row.next_bytes) << "counted as live";
  if (row.reused) {
    // Handed back as it was: the old bytes, not zeros and not poison.
    EXPECT_EQ(next.min().item<uint8_t>(), 7) << row.what;
    EXPECT_EQ(next.max().item<uint8_t>(), 7) << row.what;
    EXPECT_EQ(cpu_allocation_epoch_of(next.data_ptr()), epoch_now)
        << "a reused block is a new allocation for the census";
  }
}

INSTANTIATE_TEST_SUITE_P(
    MemoryCensus, ReuseCacheTable,
    ::testing::Values(ReuseRow{"a large block freed outside a reload, same size", 4 * kMiB, false,
                               4 * kMiB, true},
                      ReuseRow{"the smallest block the cache keeps", kMiB, false, kMiB, true},
                      ReuseRow{"a block below the cache's minimum", kMiB - 64, false, kMiB - 64,
                               false},
                      ReuseRow{"a large block freed outside a reload, another size", 4 * kMiB,
                               false, 4 * kMiB + 64, false},
                      ReuseRow{"a block freed inside a reload (held poisoned by the quarantine)",
                               4 * kMiB, true, 4 * kMiB, false}),
    [](const auto& info) { return "row" + std::to_string(info.index); });

TEST(ReuseCache, TakesWhatTheQuarantineLetsGoAndKeepsItsLimit) {
  CpuCensusScope census;
  ReuseCache cache(/*max_bytes=*/3 * kMiB);
  {
    Quarantine quarantine(/*max_bytes=*/2 * kMiB);
    Quarantine::Capturing capturing(quarantine);
    for (int i = 0; i < 3; ++i) at::Tensor t = at::empty({kMiB}, at::kByte);
    EXPECT_EQ(quarantine.held_blocks(), 2u);
    EXPECT_EQ(quarantine.evicted_blocks(), 1u);
    EXPECT_EQ(cache.held_blocks(), 1u) << "evicted from the quarantine into the cache";
  }
  EXPECT_EQ(cache.held_blocks(), 3u) << "the quarantine's end hands its blocks to the cache";
  EXPECT_EQ(cache.held_bytes(), size_t{3} * kMiB);
  { at::Tensor t = at::empty({kMiB}, at::kByte); }
  EXPECT_EQ(cache.held_bytes(), size_t{3} * kMiB) << "freed outside a reload: cached again";
  {
    const at::Tensor big = at::empty({2 * kMiB}, at::kByte);  // not cached: another size
    EXPECT_EQ(cache.reused_blocks(), 1u);
  }
  EXPECT_EQ(cache.held_blocks(), 2u) << "the oldest two went to make room for the new one";
  EXPECT_EQ(cache.held_bytes(), size_t{3} * kMiB);
  { const at::Tensor too_big = at::empty({4 * kMiB}, at::kByte); }
  EXPECT_EQ(cache.held_bytes(), size_t{3} * kMiB) << "larger than the whole cache: freed at once";
}

TEST(ReuseCache, ALimitRaisedKeepsMoreAndIsNeverLowered) {
  CpuCensusScope census;
  ReuseCache cache(/*max_bytes=*/2 * kMiB);
  cache.raise_limit(kMiB);
  EXPECT_EQ(cache.limit(), size_t{2} * kMiB) << "never lowered";
  { const at::Tensor t = at::empty({4 * kMiB}, at::kByte); }
  EXPECT_EQ(cache.held_bytes(), 0u) << "larger than the limit: freed at once";
  cache.raise_limit(6 * kMiB);
  EXPECT_EQ(cache.limit(), size_t{6} * kMiB);
  { const at::Tensor t = at::empty({4 * kMiB}, at::kByte); }
  EXPECT_EQ(cache.held_bytes(), size_t{4} * kMiB) << "within the raised limit: kept";
  const at::Tensor again = at::empty({4 * kMiB}, at::kByte);
  EXPECT_EQ(cache.reused_blocks(), 1u);
}

TEST(ReuseCache, OneAtATime) {
  CpuCensusScope census;
  ReuseCache first;
  EXPECT_THROW(ReuseCache second, c10::Error);
}

// What a stretch of work left alive, asked whenever: a block freed since is
// not counted, nor one outside the stretch or in the exceptions.
TEST(MemoryCensus, LiveBytesAllocatedInAStretchAreWhatItLeftAlive) {
  CpuCensusScope census;
  const at::Tensor before = at::empty({256}, at::kByte);
  const uint64_t from = cpu_allocation_epoch().value();
  at::Tensor kept = at::empty({1024}, at::kByte);
  at::Tensor freed = at::empty({2048}, at::kByte);
  at::Tensor excepted = at::empty({4096}, at::kByte);
  const uint64_t to = cpu_allocation_epoch().value();
  const at::Tensor after = at::empty({512}, at::kByte);
  const std::vector<EpochRange> stretch = {{from, to}};
  EXPECT_EQ(live_cpu_bytes_allocated_in(stretch), 1024 + 2048 + 4096);
  freed.reset();
  EXPECT_EQ(live_cpu_bytes_allocated_in(stretch, {excepted.storage().data()}), 1024);
  EXPECT_EQ(live_cpu_bytes_allocated_in({}), 0);
}

}  // namespace
}  // namespace reloadsafe::trace
