#define TORCH_ASSERT_NO_OPERATORS

#include "conformance/trace/memory_census.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace reloadsafe::trace {
namespace {

// A freed block and how to really free it.
struct FreedBlock {
  void* data;
  size_t n;
  c10::DeleterFnPtr deleter;
};

// Blocks to free once the allocator's mutex is released: usually only the
// one a deleter was called for, so kept inline (a heap vector cost every
// freed tensor a malloc and a free of its own).
using BlocksToFree = c10::SmallVector<FreedBlock, 4>;

// The reuse cache's contents, oldest first; guarded by the allocator's mutex.
struct ReuseState {
  size_t max_bytes = 0;
  size_t bytes = 0;
  size_t reused = 0;
  std::vector<FreedBlock> blocks;
};

// The quarantine's contents; guarded by the allocator's mutex.
struct QuarantineState {
  size_t max_bytes = 0;
  size_t bytes = 0;
  size_t evicted = 0;
  std::deque<FreedBlock> blocks;
};

// Wraps the CPU allocator that was current when a scope installed it. Only
// allocations whose context is their data pointer (the default allocator's)
// are counted, so that the wrapped pointers stay plain pointers
// (raw_allocate() and raw_deleter() keep working); others pass through
// uncounted. The one instance lives for the whole process: tensors it
// allocated outlive every scope, and their deleter is release().
class CountingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (n >= ReuseCache::kMinBlockBytes) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (std::optional<FreedBlock> b = take_cached(n)) {
        register_live(b->data, n, b->deleter);
        return c10::DataPtr(b->data, b->data, &CountingCpuAllocator::release,
                            c10::Device(c10::DeviceType::CPU));
      }
    }
    c10::Allocator* base = base_.load();
    c10::DataPtr inner = base->allocate(n);
    void* data = inner.get();
    if (data == nullptr || data != inner.get_context()) return inner;
    const c10::DeleterFnPtr deleter = inner.get_deleter();
    const c10::Device device = inner.device();
    inner.release_context();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      register_live(data, n, deleter);
    }
    return c10::DataPtr(data, data, &CountingCpuAllocator::release, device);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &CountingCpuAllocator::release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    base_.load()->copy_data(dest, src, count);
  }

  int64_t bytes() const { return bytes_.load(); }

  // The most bytes live at once since the last take_peak() (or since the
  // census was made), then restarts from the bytes live now.
  int64_t take_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t peak = std::max(peak_, bytes_.load());
    peak_ = bytes_.load();
    return peak;
  }

  uint64_t epoch() {
    std::lock_guard<std::mutex> lock(mutex_);
    return epoch_;
  }

  int64_t live_bytes_allocated_in(const std::vector<EpochRange>& ranges,
                                  const std::vector<const void*>& except) {
    std::lock_guard<std::mutex> lock(mutex_);
    int64_t bytes = 0;
    for (const auto& [data, block] : live_) {
      // The first range that ends at or after the block's epoch.
      auto it = std::lower_bound(ranges.begin(), ranges.end(), block.epoch,
                                 [](const EpochRange& r, uint64_t e) { return r.second < e; });
      if (it == ranges.end() || block.epoch <= it->first) continue;
      if (std::find(except.begin(), except.end(), data) != except.end()) continue;
      bytes += static_cast<int64_t>(block.n);
    }
    return bytes;
  }

  std::optional<uint64_t> epoch_of(const void* data) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(const_cast<void*>(data));
    if (it == live_.end()) return std::nullopt;
    return it->second.epoch;
  }

  // The allocator to wrap from now on (never this one).
  void set_base(c10::Allocator* base) {
    TORCH_INTERNAL_ASSERT(base != nullptr && base != this);
    base_.store(base);
    base_raw_deleter_.store(base->raw_deleter());
  }

  // Quarantine control; see Note [Poison quarantine].
  void open_quarantine(size_t max_bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(quarantine_ == nullptr,
                "a reloadsafe Quarantine already exists: one check at a time holds freed blocks; "
                "end the first check before starting another");
    quarantine_ = std::make_unique<QuarantineState>();
    quarantine_->max_bytes = max_bytes;
  }
  // Ends the quarantine; returns the blocks to free (those the reuse cache
  // did not take).
  BlocksToFree close_quarantine() {
    std::lock_guard<std::mutex> lock(mutex_);
    BlocksToFree to_free;
    if (quarantine_ != nullptr) {
      for (const FreedBlock& b : quarantine_->blocks) retire(b, to_free);
    }
    quarantine_.reset();
    return to_free;
  }
  // Reuse cache control; see Note [Reusing freed blocks].
  void open_reuse(size_t max_bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(
        reuse_ == nullptr,
        "a reloadsafe ReuseCache already exists: one check at a time keeps freed blocks for "
        "reuse; end the first check before starting another");
    reuse_ = std::make_unique<ReuseState>();
    reuse_->max_bytes = max_bytes;
  }
  std::vector<FreedBlock> close_reuse() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<FreedBlock> out;
    if (reuse_ != nullptr) out = std::move(reuse_->blocks);
    reuse_.reset();
    return out;
  }
  template <typename F>
  auto with_reuse(F f) {
    std::lock_guard<std::mutex> lock(mutex_);
    return f(reuse_.get());
  }

  void capture(int delta) {
    std::lock_guard<std::mutex> lock(mutex_);
    capturing_ += delta;
  }
  template <typename F>
  auto with_quarantine(F f) {
    std::lock_guard<std::mutex> lock(mutex_);
    return f(quarantine_.get());
  }

  static CountingCpuAllocator& instance() {
    static auto* self = new CountingCpuAllocator();  // never destroyed, see above
    return *self;
  }

 private:
  struct Block {
    size_t n;
    c10::DeleterFnPtr deleter;
    uint64_t epoch;  // the allocation's sequence number
  };

  CountingCpuAllocator() = default;

  // Counts the block at `data` as live, with the next epoch. Needs mutex_.
  void register_live(void* data, size_t n, c10::DeleterFnPtr deleter) {
    // A block freed behind the census's back (through a deleter taken
    // before it was installed) leaves a stale entry at an address the
    // allocator may hand out again: the new block replaces it.
    auto [it, fresh] = live_.try_emplace(data, Block{n, deleter, 0});
    if (!fresh) bytes_ -= static_cast<int64_t>(it->second.n);
    it->second = Block{n, deleter, ++epoch_};
    bytes_ += static_cast<int64_t>(n);
    peak_ = std::max(peak_, bytes_.load());
  }

  // A block nobody holds any more (freed outside a reload, or let go by the
  // quarantine): into the reuse cache if there is one and it fits, else onto
  // `to_free`, with whatever the cache evicts to stay within its limit.
  // Needs mutex_.
  void retire(const FreedBlock& b, BlocksToFree& to_free) {
    ReuseState* c = reuse_.get();
    if (c == nullptr || b.n < ReuseCache::kMinBlockBytes || b.n > c->max_bytes) {
      to_free.push_back(b);
      return;
    }
    c->blocks.push_back(b);
    c->bytes += b.n;
    while (c->bytes > c->max_bytes) {
      to_free.push_back(c->blocks.front());
      c->bytes -= c->blocks.front().n;
      c->blocks.erase(c->blocks.begin());
    }
  }

  // The most recently cached block of exactly `n` bytes, taken out of the
  // reuse cache, or nothing. Needs mutex_.
  std::optional<FreedBlock> take_cached(size_t n) {
    if (reuse_ == nullptr) return std::nullopt;
    std::vector<FreedBlock>& blocks = reuse_->blocks;
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
      if (it->n != n) continue;
      const FreedBlock b = *it;
      blocks.erase(std::next(it).base());
      reuse_->bytes -= n;
      ++reuse_->reused;
      return b;
    }
    return std::nullopt;
  }

  // The deleter of every block the census hands out. Never throws: see the
  // invariants in the header.
  static void release(void* data) {
    CountingCpuAllocator& self = instance();
    BlocksToFree to_free;
    {
      std::lock_guard<std::mutex> lock(self.mutex_);
      auto it = self.live_.find(data);
      if (it == self.live_.end()) {
        // Not counted (raw-allocated before a scope and freed through the
        // census's raw deleter): the wrapped allocator's own deleter frees it.
        const c10::DeleterFnPtr fallback = self.base_raw_deleter_.load();
        if (fallback != nullptr && fallback != &CountingCpuAllocator::release)
          to_free.push_back(FreedBlock{data, 0, fallback});
      } else {
        const Block block = it->second;
        self.live_.erase(it);
        self.bytes_ -= static_cast<int64_t>(block.n);
        QuarantineState* q = self.quarantine_.get();
        if (q != nullptr && self.capturing_ > 0 && block.n <= q->max_bytes) {
          std::memset(data, kPoisonByte, block.n);
          q->blocks.push_back(FreedBlock{data, block.n, block.deleter});
          q->bytes += block.n;
          while (q->bytes > q->max_bytes) {
            self.retire(q->blocks.front(), to_free);
            q->bytes -= q->blocks.front().n;
            q->blocks.pop_front();
            ++q->evicted;
          }
        } else {
          self.retire(FreedBlock{data, block.n, block.deleter}, to_free);
        }
      }
    }
    for (const FreedBlock& b : to_free) b.deleter(b.data);
  }

  std::atomic<c10::Allocator*> base_{nullptr};
  std::atomic<c10::DeleterFnPtr> base_raw_deleter_{nullptr};
  std::atomic<int64_t> bytes_{0};
  std::mutex mutex_;
  uint64_t epoch_ = 0;  // guarded by mutex_
  int64_t peak_ = 0;    // guarded by mutex_: the most bytes_ since take_peak()
  std::unordered_map<void*, Block> live_;
  std::unique_ptr<QuarantineState> quarantine_;  // guarded by mutex_
  std::unique_ptr<ReuseState> reuse_;            // guarded by mutex_
  int capturing_ = 0;                            // guarded by mutex_
};

// Which scopes are alive and what they replaced.
struct InstallState {
  std::mutex mutex;
  int scopes = 0;
  c10::Allocator* previous = nullptr;
  uint8_t priority = 0;
};

InstallState& install_state() {
  static auto* state = new InstallState();
  return *state;
}

}  // namespace

CpuCensusScope::CpuCensusScope() {
  InstallState& s = install_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.scopes++ > 0) return;
  CountingCpuAllocator& census = CountingCpuAllocator::instance();
  c10::Allocator* current = c10::GetCPUAllocator();
  if (current == &census) return;  // someone kept it; nothing to restore then
  census.set_base(current);
  s.previous = current;
  // c10 keeps the allocator of the highest priority so far. Try the lowest
  // first, so that a later registration of higher priority still wins as it
  // would have without us; go to the top only if the current one outranks.
  s.priority = 0;
  c10::SetCPUAllocator(&census, s.priority);
  if (c10::GetCPUAllocator() != &census) {
    s.priority = 255;
    c10::SetCPUAllocator(&census, s.priority);
  }
}

CpuCensusScope::~CpuCensusScope() {
  InstallState& s = install_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (--s.scopes > 0 || s.previous == nullptr) return;
  // Only undo our own installation; a replacement made since is left alone.
  if (c10::GetCPUAllocator() == &CountingCpuAllocator::instance()) {
    c10::SetCPUAllocator(s.previous, s.priority);
  }
  s.previous = nullptr;
}

bool cpu_census_installed() {
  return c10::GetCPUAllocator() == &CountingCpuAllocator::instance();
}

namespace {

// The CUDA caching allocator's count of allocated bytes on `device` (current
// and peak), or nothing where this process has no CUDA allocator. With
// `reset_peak` the peak starts over from what is allocated now.
std::optional<c10::CachingAllocator::Stat> cuda_allocated_bytes(const c10::Device& device,
                                                                bool reset_peak) {
  try {
    auto* allocator = c10::getDeviceAllocator(c10::DeviceType::CUDA);
    if (!allocator->initialized()) return std::nullopt;
    const c10::DeviceIndex index = device.has_index() ? device.index() : 0;
    const c10::CachingAllocator::Stat stat =
        allocator->getDeviceStats(index)
            .allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
    if (reset_peak) allocator->resetPeakStats(index);
    return stat;
  } catch (const c10::Error&) {
    return std::nullopt;  // no CUDA allocator in this process
  }
}

}  // namespace

std::optional<int64_t> live_tensor_bytes(const c10::Device& device) {
  if (device.is_cpu()) {
    if (!cpu_census_installed()) return std::nullopt;
    return CountingCpuAllocator::instance().bytes();
  }
  if (device.is_cuda()) {
    if (auto stat = cuda_allocated_bytes(device, /*reset_peak=*/false)) return stat->current;
  }
  return std::nullopt;
}

std::optional<int64_t> take_peak_tensor_bytes(const c10::Device& device) {
  if (device.is_cpu()) {
    if (!cpu_census_installed()) return std::nullopt;
    return CountingCpuAllocator::instance().take_peak();
  }
  if (device.is_cuda()) {
    if (auto stat = cuda_allocated_bytes(device, /*reset_peak=*/true)) return stat->peak;
  }
  return std::nullopt;
}

std::optional<uint64_t> cpu_allocation_epoch() {
  if (!cpu_census_installed()) return std::nullopt;
  return CountingCpuAllocator::instance().epoch();
}

std::optional<int64_t> live_cpu_bytes_allocated_in(const std::vector<EpochRange>& ranges,
                                                   const std::vector<const void*>& except) {
  if (!cpu_census_installed()) return std::nullopt;
  return CountingCpuAllocator::instance().live_bytes_allocated_in(ranges, except);
}

std::optional<uint64_t> cpu_allocation_epoch_of(const void* data) {
  if (!cpu_census_installed() || data == nullptr) return std::nullopt;
  return CountingCpuAllocator::instance().epoch_of(data);
}

Quarantine::Quarantine(size_t max_bytes) {
  CountingCpuAllocator::instance().open_quarantine(max_bytes);
}

Quarantine::~Quarantine() {
  for (const FreedBlock& b : CountingCpuAllocator::instance().close_quarantine()) b.deleter(b.data);
}

size_t Quarantine::held_bytes() const {
  return CountingCpuAllocator::instance().with_quarantine(
      [](QuarantineState* q) { return q ? q->bytes : size_t{0}; });
}

size_t Quarantine::held_blocks() const {
  return CountingCpuAllocator::instance().with_quarantine(
      [](QuarantineState* q) { return q ? q->blocks.size() : size_t{0}; });
}

size_t Quarantine::evicted_blocks() const {
  return CountingCpuAllocator::instance().with_quarantine(
      [](QuarantineState* q) { return q ? q->evicted : size_t{0}; });
}

ReuseCache::ReuseCache(size_t max_bytes) {
  CountingCpuAllocator::instance().open_reuse(max_bytes);
}

ReuseCache::~ReuseCache() {
  for (const FreedBlock& b : CountingCpuAllocator::instance().close_reuse()) b.deleter(b.data);
}

void ReuseCache::raise_limit(size_t max_bytes) {
  CountingCpuAllocator::instance().with_reuse([&](ReuseState* c) {
    if (c != nullptr) c->max_bytes = std::max(c->max_bytes, max_bytes);
  });
}

size_t ReuseCache::limit() const {
  return CountingCpuAllocator::instance().with_reuse(
      [](ReuseState* c) { return c ? c->max_bytes : size_t{0}; });
}

size_t ReuseCache::held_bytes() const {
  return CountingCpuAllocator::instance().with_reuse(
      [](ReuseState* c) { return c ? c->bytes : size_t{0}; });
}

size_t ReuseCache::held_blocks() const {
  return CountingCpuAllocator::instance().with_reuse(
      [](ReuseState* c) { return c ? c->blocks.size() : size_t{0}; });
}

size_t ReuseCache::reused_blocks() const {
  return CountingCpuAllocator::instance().with_reuse(
      [](ReuseState* c) { return c ? c->reused : size_t{0}; });
}

Quarantine::Capturing::Capturing(Quarantine& /*quarantine*/) {
  CountingCpuAllocator::instance().capture(+1);
}

Quarantine::Capturing::~Capturing() {
  CountingCpuAllocator::instance().capture(-1);
}

}  // namespace reloadsafe::trace
