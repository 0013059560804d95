// file_loader.h: loading safetensors files into tensors that already exist,
// at their addresses.
//
// Invariant: FileLoader::load_ writes the file's bytes into the destination
// tensors' existing memory and nothing else of theirs: no storage is
// allocated, resized or moved, no data pointer changes, and no device memory
// is allocated. Everything that could make a write wrong is checked before
// the first byte is written: every file's header (utils/safetensors_header.h),
// every name (present in exactly one file), every destination (defined,
// strided, contiguous, of the file's dtype and shape, or of the file's dtype
// with a byte range inside it, inside its storage, no two ranges
// overlapping). A refused load leaves every destination as it was. A
// captured CUDA graph that reads the destinations reads the new bytes at its
// next replay.
//
// How it reads:
//  - CPU destinations: a read-only mapping of the file, its pages faulted in
//    with MADV_POPULATE_READ over each tensor's range, then dense_copy_
//    (utils/dense_copy.h: memcpy or streaming stores, split over LibTorch's
//    intra-op threads) into the destination's bytes; pread into them where
//    the kernel lacks MADV_POPULATE_READ. No staging. (Note [Which read]
//    has the measurements that chose this.)
//  - Device destinations on a discrete GPU: the staging ring. Reader threads
//    pread chunks into the ring's slots (pinned host memory, allocated once
//    per loader on its first staged load and reused by every later load);
//    the calling thread issues each slot's host-to-device copy on a copy
//    stream of its own and records the slot's event; a reader refills a
//    slot only after that event completed. The load returns after the copy
//    stream finished, and the copy stream first waits for the device's
//    current stream, so work queued before the load that reads the
//    destinations sees the old bytes.
//  - Device destinations on an integrated GPU (is_integrated_gpu): the
//    mapping and copy_weight_ per tensor, the page touch of
//    utils/copy_weight.h: host and device share memory there, and the
//    staging copy would be a second pass over the same memory.
//
// The device side uses c10's device-generic API (VirtualGuardImpl, Stream,
// Event, copy_ under a stream guard), so this file builds against a CPU-only
// LibTorch and runs against a CUDA one.
//
// Layouts that differ between file and model (a checkpoint tensor that fills
// a part of a fused parameter, a shard of one) are the caller's to state,
// through a byte offset per name; nothing is guessed. Names in the files
// that no destination asks for are not read.
//
// Note [Which read]
// Three ways of getting a resident file's bytes into a CPU tensor, measured
// on the 2-vCPU VM this was written on (Intel Xeon family 6 model 167, ext4,
// Linux 6.18, file resident as written; copy_bench, one run, medians of 5,
// GB/s, one thread; the limit is the faster of memcpy and streaming stores
// between resident buffers):
//
//   size                                 16 MiB   64 MiB   256 MiB
//   pread into the destination            13.1      7.0      5.9
//   MADV_POPULATE_READ + dense_copy_      12.2     12.3     11.2
//   MAP_POPULATE + dense_copy_            12.0     12.0     11.1
//   copy limit                            12.8     11.9     11.3
//
// O_DIRECT (8 MiB requests into an aligned buffer; a separate run, median of
// 7) read 1.4 GB/s at 64 MiB and 1.7 at 256 MiB where pread read 5.1 and 6.6
// in the same run: it reads the disk whatever the page cache holds, and needs
// block-aligned buffers, offsets and lengths that a tensor's bytes are not.
// pread's copy in the kernel falls to about half the limit from 64 MiB on,
// and on both cores it stayed there (7.0 and 5.8); a populated mapping
// costs the page-table work and then copies at the limit. So CPU
// destinations are copied out of a populated mapping; the staging ring,
// whose slots are small and reused, is filled with pread.
//
// Usage:
//   reloadsafe::FileLoader loader;  // keep it: its ring is reused
//   loader.load_({"model-00001.safetensors", "model-00002.safetensors"},
//                {{"lm_head.weight", {lm_head}},
//                 {"q_proj.weight", {qkv, 0}},                 // part of a fused
//                 {"k_proj.weight", {qkv, q_bytes}}});         // parameter
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace reloadsafe {

/// Where a file's tensor goes: the whole of `tensor` (`byte_offset` unset:
/// dtype and shape must equal the file's), or the file tensor's bytes at
/// `byte_offset` bytes into `tensor` (dtype must equal the file's; the range
/// must lie inside `tensor`; the offset a multiple of the element size).
struct LoadTarget {
  at::Tensor tensor;
  std::optional<int64_t> byte_offset;
};

/// File tensor name -> destination.
using LoadTargets = std::map<std::string, LoadTarget>;

/// How a FileLoader reads. The defaults suit a checkpoint load.
struct FileLoaderOptions {
  /// Reader threads of the staging ring; 0: the CPUs this process may use,
  /// at most 8. (CPU destinations are copied on LibTorch's intra-op threads,
  /// as dense_copy_ does.)
  int threads = 0;
  /// The size of one read, and of one staging slot.
  int64_t chunk_bytes = int64_t{8} << 20;
  /// Staging slots in the ring (device destinations); at least 2.
  int ring_slots = 4;
  /// Loads CPU destinations through the staging ring too (read into a slot,
  /// then copied out), instead of reading into them. Slower; for tests of
  /// the ring's ordering on machines without a device.
  bool stage_host_destinations = false;
};

/// What a FileLoader has done since it was made.
struct FileLoaderCounters {
  int64_t calls = 0;                // load_ calls, refused ones included
  int64_t tensors_loaded = 0;       // file tensors written into destinations
  int64_t bytes_read = 0;           // bytes read from files (headers excluded)
  int64_t staging_allocations = 0;  // ring allocations: 0, or 1 for the loader's life
  int64_t staging_bytes = 0;        // the ring's size
  int64_t staged_copies = 0;        // copies out of a ring slot
  int64_t mapped_copies = 0;        // integrated-GPU copies out of a mapping
};

/// Loads safetensors files into existing tensors (see the invariant above).
/// One loader may be used from several threads at once: loads through the
/// ring take turns, direct CPU loads run side by side.
class FileLoader {
 public:
  explicit FileLoader(FileLoaderOptions options = {});
  ~FileLoader();
  FileLoader(const FileLoader&) = delete;
  FileLoader& operator=(const FileLoader&) = delete;

  /// Fills each destination of `targets` with its tensor's bytes from
  /// `paths` (a file, or the shards of one checkpoint: each name must be in
  /// exactly one of them). Checks everything first and throws
  /// (TORCH_CHECK, naming the tensor and the fix) before writing anything
  /// when a file or a destination is wrong. Returns the bytes written. An
  /// I/O error during the reads (a file shrunk since its header was read)
  /// throws too, after some destinations may have been written.
  int64_t load_(const std::vector<std::string>& paths, const LoadTargets& targets);

  FileLoaderCounters counters() const;
  const FileLoaderOptions& options() const { return options_; }

 private:
  struct Ring;
  struct Plan;
  void load_direct_(const Plan& plan);
  void load_staged_(const Plan& plan, c10::Device device);
  void load_mapped_(const Plan& plan);
  Ring& ring_locked_(bool pinned);

  FileLoaderOptions options_;
  std::mutex ring_mutex_;  // one staged load at a time; guards ring_
  std::unique_ptr<Ring> ring_;

  std::atomic<int64_t> calls_{0};
  std::atomic<int64_t> tensors_loaded_{0};
  std::atomic<int64_t> bytes_read_{0};
  std::atomic<int64_t> staging_allocations_{0};
  std::atomic<int64_t> staging_bytes_{0};
  std::atomic<int64_t> staged_copies_{0};
  std::atomic<int64_t> mapped_copies_{0};
};

/// A load with a loader of its own (default options): no ring is kept, so a
/// device load allocates pinned staging memory on every call. Reloads
/// should keep a FileLoader instead.
int64_t load_safetensors_(const std::vector<std::string>& paths, const LoadTargets& targets);

}  // namespace reloadsafe
