// checkpoint_file.h: a scratch file standing in for a checkpoint, read-only
// mappings of it, and the page-cache controls the copy benchmarks need.
//
// Invariant: a CheckpointFile's bytes never change after construction (the
// 8-byte word at byte offset i of its data holds i, so a copy that lands at
// the wrong offset is caught), and every mapping of it is read-only. Its
// data is the whole file, or, for shared_safetensors(), the data section of
// a safetensors file of one U8 tensor named "weight" (a header padded to
// 4096 bytes, then the data): offsets, reads and mappings below are all
// relative to the data's first byte. So warm and cold
// runs read identical bytes, and no benchmark can dirty the file's pages:
// dirty pages would survive POSIX_FADV_DONTNEED and turn a "cold" run warm.
// (make_warm_as_written() writes the same bytes again, and syncs them.)
//
// Note [Page-cache folios]
// How fast a fresh mapping of a resident file can be read depends on the
// size of the page-cache folios holding it, not only on residency: a folio
// of 2 MiB is mapped with one page-table entry at its first fault, 4 KiB
// folios take an entry each (faulted 16 at a time, and torn down one by one
// at munmap). On the 2-vCPU VMs this project runs on (Linux 6.18, ext4) a
// fresh mapping of 16 MiB in 4 KiB folios costs about as much as copying
// the 16 MiB. The folio sizes come from how the pages got there: a large
// write (a checkpoint writer writes a tensor with one call) leaves folios of
// up to 2 MiB; reading the file back from disk leaves what readahead chose,
// small at the file's start and larger further in. So the benchmarks name
// the state they start from: warm as written, warm after a re-read, cold.
//
// Usage:
//   const CheckpointFile& file = CheckpointFile::shared(64 << 20);
//   file.make_warm_as_written();              // or make_warm_reread(), or
//   file.drop_cached();                       // cold: outside the timed region
//   ReadOnlyMapping map(file);                // fresh mapping: faults are timed
//   dst.copy_(map.bytes());
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace reloadsafe::bench {

class CheckpointFile {
 public:
  /// Creates a file of `nbytes` (a multiple of 8) in scratch_dir(), writes
  /// the pattern (in writes of up to 64 MiB) and fsyncs it. The file is
  /// unlinked at once: it disappears with the process, even if it is killed.
  explicit CheckpointFile(int64_t nbytes, bool safetensors = false);
  ~CheckpointFile();
  CheckpointFile(const CheckpointFile&) = delete;
  CheckpointFile& operator=(const CheckpointFile&) = delete;

  /// The file of `nbytes` that every benchmark of that size shares (created
  /// on first use, kept until exit), so strategies of one size read the same
  /// file and the disk holds one file per size.
  static const CheckpointFile& shared(int64_t nbytes);

  /// The same as a safetensors file (one U8 tensor "weight" of `nbytes`),
  /// for loaders that read the format.
  static const CheckpointFile& shared_safetensors(int64_t nbytes);

  /// A path that opens this (unlinked) file: /proc/self/fd/<fd> (Linux).
  std::string path() const;
  /// Where the data starts in the file: 0, or 4096 for a safetensors file.
  int64_t data_offset() const { return data_offset_; }

  int fd() const { return fd_; }
  int64_t nbytes() const { return nbytes_; }

  /// Evicts the file from the page cache (POSIX_FADV_DONTNEED). Only pages
  /// that no mapping holds are evicted: unmap before calling.
  void drop_cached() const;

  /// Makes the file resident in the folios a writer's large writes leave
  /// (Note [Page-cache folios]): if it was evicted since it was last
  /// written, evicts it all and writes the same bytes again in 64 MiB writes
  /// (synced): slow only then, a no-op when already so.
  void make_warm_as_written() const;

  /// Evicts the file and reads it back once in 8 MiB preads, so that it is
  /// resident in the folios readahead chose: how a checkpoint looks after an
  /// earlier load from disk.
  void make_warm_reread() const;

  /// The fraction of the file's pages resident in the page cache (mincore on
  /// a mapping that is not touched).
  double resident_fraction() const;

  /// pread of `n` bytes at `offset` into `dst`; throws on error or EOF.
  void read(void* dst, int64_t offset, int64_t n) const;

  /// Whether `t` (a byte tensor of nbytes() bytes, on any device) holds the
  /// file's bytes, checked on a sample of words spread over it and its last.
  bool holds_contents(const at::Tensor& t) const;

 private:
  // Writes the pattern over the whole file and syncs it.
  void write_contents() const;

  int64_t nbytes_;
  int64_t data_offset_ = 0;
  int fd_;
  // Whether the page cache may no longer hold the file as written (it was
  // evicted since). Benchmarks of one process run one at a time.
  mutable bool evicted_since_write_ = false;
};

/// A read-only private mapping of a whole CheckpointFile, unmapped on
/// destruction. `extra_flags` is ORed into the mmap flags (MAP_POPULATE).
class ReadOnlyMapping {
 public:
  explicit ReadOnlyMapping(const CheckpointFile& file, int extra_flags = 0);
  ~ReadOnlyMapping();
  ReadOnlyMapping(const ReadOnlyMapping&) = delete;
  ReadOnlyMapping& operator=(const ReadOnlyMapping&) = delete;

  /// The mapping as a CPU uint8 tensor that does not own its memory: it must
  /// not outlive the mapping.
  at::Tensor bytes() const;
  void* data() const { return data_; }
  int64_t nbytes() const { return nbytes_; }

 private:
  void* data_;
  int64_t nbytes_;
};

/// Page faults this process has taken so far (getrusage).
struct FaultCount {
  int64_t minor = 0;
  int64_t major = 0;
  static FaultCount now();
};

/// Whether madvise(MADV_POPULATE_READ) works here (Linux >= 5.14); if not,
/// `why` says what failed.
bool populate_read_supported(std::string* why);

}  // namespace reloadsafe::bench
