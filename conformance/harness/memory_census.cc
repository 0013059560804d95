#include "conformance/harness/memory_census.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace reloadsafe::harness {
namespace {

// Wraps the CPU allocator in place when installed. Only allocations whose
// context is their data pointer (the default allocator's) are counted, so
// that the wrapped pointers stay plain pointers (raw_allocate() and
// raw_deleter() keep working); others pass through uncounted.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    if (data == nullptr || data != inner.get_context()) return inner;
    const c10::DeleterFnPtr deleter = inner.get_deleter();
    const c10::Device device = inner.device();
    inner.release_context();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      live_.emplace(data, Block{n, deleter, ++epoch_});
    }
    bytes_ += static_cast<int64_t>(n);
    return c10::DataPtr(data, data, &CountingCpuAllocator::release, device);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &CountingCpuAllocator::release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    base_->copy_data(dest, src, count);
  }

  int64_t bytes() const { return bytes_.load(); }

  uint64_t epoch() {
    std::lock_guard<std::mutex> lock(mutex_);
    return epoch_;
  }

  std::optional<uint64_t> epoch_of(const void* data) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(const_cast<void*>(data));
    if (it == live_.end()) return std::nullopt;
    return it->second.epoch;
  }

  static CountingCpuAllocator* instance;

 private:
  struct Block {
    size_t n;
    c10::DeleterFnPtr deleter;
    uint64_t epoch;  // the allocation's sequence number
  };

  static void release(void* data) {
    CountingCpuAllocator* self = instance;
    Block block{0, nullptr, 0};
    {
      std::lock_guard<std::mutex> lock(self->mutex_);
      auto it = self->live_.find(data);
      TORCH_INTERNAL_ASSERT(it != self->live_.end(), "freeing a block the census never counted");
      block = it->second;
      self->live_.erase(it);
    }
    self->bytes_ -= static_cast<int64_t>(block.n);
    block.deleter(data);
  }

  c10::Allocator* base_;
  std::atomic<int64_t> bytes_{0};
  std::mutex mutex_;
  uint64_t epoch_ = 0;  // guarded by mutex_
  std::unordered_map<void*, Block> live_;
};

CountingCpuAllocator* CountingCpuAllocator::instance = nullptr;

}  // namespace

void install_cpu_census() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Never destroyed: tensors it allocated may outlive static destruction.
    CountingCpuAllocator::instance = new CountingCpuAllocator(c10::GetCPUAllocator());
    // The highest priority, so that later registrations cannot displace it.
    c10::SetCPUAllocator(CountingCpuAllocator::instance, /*priority=*/255);
  });
}

std::optional<int64_t> live_tensor_bytes(const c10::Device& device) {
  if (device.is_cpu()) {
    if (CountingCpuAllocator::instance == nullptr) return std::nullopt;
    return CountingCpuAllocator::instance->bytes();
  }
  if (device.is_cuda()) {
    try {
      auto* allocator = c10::getDeviceAllocator(c10::DeviceType::CUDA);
      if (!allocator->initialized()) return std::nullopt;
      const auto stats = allocator->getDeviceStats(device.has_index() ? device.index() : 0);
      return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
          .current;
    } catch (const c10::Error&) {
      return std::nullopt;  // no CUDA allocator in this process
    }
  }
  return std::nullopt;
}

std::optional<uint64_t> cpu_allocation_epoch() {
  if (CountingCpuAllocator::instance == nullptr) return std::nullopt;
  return CountingCpuAllocator::instance->epoch();
}

std::optional<uint64_t> cpu_allocation_epoch_of(const void* data) {
  if (CountingCpuAllocator::instance == nullptr || data == nullptr) return std::nullopt;
  return CountingCpuAllocator::instance->epoch_of(data);
}

}  // namespace reloadsafe::harness
