// memory_census.h: how many bytes live tensor storages hold, and a
// quarantine that keeps storages freed by a reload poisoned and in place.
//
// A reload that keeps old storages alive (a list of previous checkpoints, a
// cache keyed by object identity, a closure holding last load's repack)
// grows memory with every reload until the process dies, and passes every
// address check. The census counts it:
//
//  - CPU: a counting allocator, in front of the CPU allocator while a
//    CpuCensusScope is alive, counts the bytes of allocations made through
//    it that are still alive. Allocations made while no scope was alive, or
//    by code that bypasses the CPU allocator (at::from_blob over foreign
//    memory, the default allocator called directly), are not counted.
//  - CUDA: the caching allocator's allocated bytes (not its reserved bytes:
//    a cache that keeps freed blocks is not a leak).
//
// The CPU census also numbers allocations in order (an epoch), which tells
// the read trace whether a storage was allocated before or inside its scope.
//
// Invariants:
//  - the counting allocator hands out blocks of the allocator it wraps, at
//    the addresses that allocator chose: a new one, or, while a ReuseCache
//    is alive, one of the same size freed earlier outside any reload (Note
//    [Reusing freed blocks]); it never resizes or moves a block;
//  - when the last CpuCensusScope ends, the CPU allocator is again the one
//    that was installed before the first began (unless someone else replaced
//    it in between, which is then left alone);
//  - no free ever fails: a block the census did not count (allocated before
//    a scope, or through another path) is handed to the wrapped allocator's
//    deleter, never reported by an exception from a deleter.
//
// Note [Poison quarantine]
// A kernel that reads a weight through a pointer it kept (a kernel object
// holding a raw pointer, a ctypes or Triton launch, a packed handle) is
// invisible to the dispatcher, so the read trace cannot see it. After a
// reload moved that weight, such a kernel reads freed memory, and whether its
// result differs from a fresh load depends on whether the allocator reused
// the bytes. While a QuarantineScope is capturing, every CPU block freed
// through the census is instead filled with kPoisonByte and kept until the
// scope's Quarantine ends: the address cannot be reused, and a stale read
// computes from the poison, deterministically. 0xFF in every byte is a NaN
// for every floating dtype (float64/32/16, bfloat16, float8 e4m3fn and
// e5m2) and -1 (or the maximum, unsigned) for integers. Quarantined bytes do
// not count as live tensor bytes. CUDA has its own quarantine, on the caching
// allocator's pools, for the protocol's graph step (Note [Device quarantine]
// in conformance/harness/device_graph.h).
//
// Note [Reusing freed blocks]
// A check runs the layer's post-processing and forward dozens of times with
// the same shapes. glibc maps every block of 32 MiB or more fresh and unmaps
// it when freed, so each of those runs pays a page fault for every 4 KiB it
// touches, which at 4096 x 4096 costs about as much as the arithmetic. While
// a ReuseCache is alive, a block of at least kMinBlockBytes that nobody holds
// any more is kept as it is and handed back for the next allocation of
// exactly its size, instead of going back to the wrapped allocator. "Nobody
// holds": freed outside every Quarantine::Capturing, or let go by the
// quarantine (beyond its limit, or when it ends). A block freed inside a
// reload is therefore never reused while the quarantine holds it: a kernel
// that kept a pointer into it still reads poison, and a reload that moved a
// tensor cannot be handed the old address back; once the quarantine lets go
// of it, the cache may reuse it, as the wrapped allocator would have. A fresh
// tensor over a reused block holds its old bytes, as a reused heap block
// does, not zeros. The cache holds at most its limit, the oldest blocks
// freed first beyond it; a check raises the limit to a checkpoint's bytes
// (raise_limit), what one reload frees and the next allocates again: at a
// real model's size, a first touch of memory costs more than the rest of a
// reload (on the 2-core KVM hosts, 2.1 GB fresh took 5 s, the same bytes
// again 1 s), and a limit below that made each reload fault in most of a
// model again; above it, blocks the next reload does not take add to its
// peak.
#pragma once

#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace reloadsafe::trace {

/// While alive, the counting CPU allocator is the CPU allocator (the first
/// scope installs it, the end of the last one restores the previous one).
/// Scopes nest and may be entered on any thread.
class CpuCensusScope {
 public:
  CpuCensusScope();
  ~CpuCensusScope();
  CpuCensusScope(const CpuCensusScope&) = delete;
  CpuCensusScope& operator=(const CpuCensusScope&) = delete;
};

/// Whether the counting allocator is the CPU allocator now.
bool cpu_census_installed();

/// Bytes held by live tensor storages on `device` (see above), or nothing
/// where the census cannot count (the CPU outside any CpuCensusScope, other
/// device types).
std::optional<int64_t> live_tensor_bytes(const c10::Device& device);

/// The most bytes live tensor storages on `device` held at once since the
/// previous call (or since the census began), then starts over from the
/// bytes live now: a step's peak is the call after it, with one call before
/// it. Nothing where live_tensor_bytes has nothing.
std::optional<int64_t> take_peak_tensor_bytes(const c10::Device& device);

/// The number of CPU allocations counted so far, or nothing outside any
/// CpuCensusScope.
std::optional<uint64_t> cpu_allocation_epoch();

/// The epoch at which the live CPU block starting at `data` was allocated,
/// or nothing if the census does not know it (allocated outside any scope,
/// or not by the CPU allocator).
std::optional<uint64_t> cpu_allocation_epoch_of(const void* data);

/// A stretch of CPU allocations: the epochs (first, last], as
/// cpu_allocation_epoch() read before and after it.
using EpochRange = std::pair<uint64_t, uint64_t>;

/// Bytes held now by live CPU blocks the census counted that were allocated
/// in one of `ranges` (sorted, disjoint), the blocks starting at an address
/// in `except` left out; nothing outside any CpuCensusScope. What a stretch
/// of work left alive, whenever it is asked: a block freed since, by a
/// garbage collection or a cache that let go, is no longer counted.
std::optional<int64_t> live_cpu_bytes_allocated_in(const std::vector<EpochRange>& ranges,
                                                   const std::vector<const void*>& except = {});

/// The byte freed CPU blocks are filled with in quarantine (see Note [Poison
/// quarantine]).
constexpr unsigned char kPoisonByte = 0xFF;

/// Holds poisoned freed CPU blocks until it is destroyed (see Note [Poison
/// quarantine]). At most one Quarantine exists at a time; creating a second
/// is a caller's error. Blocks beyond `max_bytes` are released oldest first.
class Quarantine {
 public:
  static constexpr size_t kDefaultMaxBytes = size_t{2} << 30;  // 2 GiB

  explicit Quarantine(size_t max_bytes = kDefaultMaxBytes);
  /// Frees every held block.
  ~Quarantine();
  Quarantine(const Quarantine&) = delete;
  Quarantine& operator=(const Quarantine&) = delete;

  /// Bytes and blocks held now, and blocks released early to stay within
  /// max_bytes.
  size_t held_bytes() const;
  size_t held_blocks() const;
  size_t evicted_blocks() const;

  /// While alive (on any thread), CPU blocks freed through the census are
  /// poisoned and held by `quarantine` instead of being freed.
  class Capturing {
   public:
    explicit Capturing(Quarantine& quarantine);
    ~Capturing();
    Capturing(const Capturing&) = delete;
    Capturing& operator=(const Capturing&) = delete;
  };
};

/// Keeps CPU blocks freed outside a reload for reuse by allocations of the
/// same size (see Note [Reusing freed blocks]) while alive; frees them when
/// destroyed. At most one ReuseCache exists at a time; creating a second is a
/// caller's error. Beyond `max_bytes`, the oldest cached blocks are freed.
class ReuseCache {
 public:
  /// Smaller blocks are left to the wrapped allocator, whose heap reuses
  /// them already.
  static constexpr size_t kMinBlockBytes = size_t{1} << 20;    // 1 MiB
  static constexpr size_t kDefaultMaxBytes = size_t{1} << 30;  // 1 GiB

  explicit ReuseCache(size_t max_bytes = kDefaultMaxBytes);
  /// Frees every cached block.
  ~ReuseCache();
  ReuseCache(const ReuseCache&) = delete;
  ReuseCache& operator=(const ReuseCache&) = delete;

  /// Raises the limit to `max_bytes` where it is lower; never lowers it.
  void raise_limit(size_t max_bytes);
  /// The limit now.
  size_t limit() const;

  /// Bytes and blocks cached now, and allocations served from the cache so
  /// far.
  size_t held_bytes() const;
  size_t held_blocks() const;
  size_t reused_blocks() const;
};

}  // namespace reloadsafe::trace
