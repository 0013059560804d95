// memory_census.h: how many bytes live tensor storages hold.
//
// A reload that keeps old storages alive (a list of previous checkpoints, a
// cache keyed by object identity, a closure holding last load's repack)
// grows memory with every reload until the process dies, and passes every
// address check. The census counts it:
//
//  - CPU: a counting allocator, installed once per process in front of the
//    CPU allocator it replaces, counts the bytes of allocations made through
//    it that are still alive. Allocations made before it was installed, or
//    by code that bypasses the CPU allocator (at::from_blob over foreign
//    memory, the default allocator called directly), are not counted.
//  - CUDA: the caching allocator's allocated bytes (not its reserved bytes:
//    a cache that keeps freed blocks is not a leak).
//
// The CPU census also numbers allocations in order (an epoch), which tells
// the read trace whether a storage was allocated before or inside its scope.
//
// Invariant: the counting allocator hands out exactly what the allocator it
// wraps hands out, at the same addresses; it only adds bookkeeping.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <optional>

namespace reloadsafe::harness {

/// Installs the counting CPU allocator (idempotent, thread-safe). From then
/// on every CPU tensor allocation is counted until it is freed.
void install_cpu_census();

/// Bytes held by live tensor storages on `device` (see above), or nothing
/// where the census cannot count (the CPU before install_cpu_census(), other
/// device types).
std::optional<int64_t> live_tensor_bytes(const c10::Device& device);

/// The number of CPU allocations counted so far, or nothing before
/// install_cpu_census().
std::optional<uint64_t> cpu_allocation_epoch();

/// The epoch at which the live CPU block starting at `data` was allocated,
/// or nothing if the census does not know it (allocated before the census
/// was installed, or not by the CPU allocator).
std::optional<uint64_t> cpu_allocation_epoch_of(const void* data);

}  // namespace reloadsafe::harness
