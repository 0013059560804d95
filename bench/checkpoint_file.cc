#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "bench/checkpoint_file.h"

#include "bench/machine_context.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14; older C libraries lack the name
#endif

namespace reloadsafe::bench {
namespace {

std::string errno_text() {
  return std::strerror(errno);
}

int64_t page_bytes() {
  return sysconf(_SC_PAGESIZE);
}

}  // namespace

CheckpointFile::CheckpointFile(int64_t nbytes, bool safetensors)
    : nbytes_(nbytes), data_offset_(safetensors ? 4096 : 0) {
  TORCH_CHECK(nbytes > 0 && nbytes % 8 == 0, "CheckpointFile: size ", nbytes,
              " must be a positive multiple of 8");
  std::string path = scratch_dir() + "/reloadsafe_bench_XXXXXX";
  fd_ = mkstemp(path.data());
  TORCH_CHECK(fd_ >= 0, "CheckpointFile: cannot create a file in ", scratch_dir(), ": ",
              errno_text(), " (set RELOADSAFE_BENCH_DIR to a writable folder)");
  unlink(path.c_str());
  if (safetensors) {
    // The header, padded with spaces so that the data starts at 4096.
    std::string json = "{\"weight\":{\"dtype\":\"U8\",\"shape\":[" + std::to_string(nbytes) +
                       "],\"data_offsets\":[0," + std::to_string(nbytes) + "]}}";
    json.resize(data_offset_ - 8, ' ');
    std::string header(8, '\0');
    for (int i = 0; i < 8; ++i) header[i] = static_cast<char>((json.size() >> (8 * i)) & 0xFF);
    header += json;
    TORCH_CHECK(pwrite(fd_, header.data(), header.size(), 0) == data_offset_,
                "CheckpointFile: writing the safetensors header failed: ", errno_text());
  }
  write_contents();
}

void CheckpointFile::write_contents() const {
  // Writes of 64 MiB (2 MiB-aligned): the page cache keeps what a writer of
  // large tensors leaves, folios of up to 2 MiB (Note [Page-cache folios]).
  constexpr int64_t kChunkWords = int64_t{8} << 20;
  std::vector<int64_t> chunk(std::min(kChunkWords, nbytes_ / 8));
  for (int64_t done = 0; done < nbytes_;) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(chunk.size()) * 8, nbytes_ - done);
    for (int64_t w = 0; w < n / 8; ++w) chunk[w] = done + 8 * w;
    for (int64_t put = 0; put < n;) {
      const ssize_t wrote = pwrite(fd_, reinterpret_cast<const char*>(chunk.data()) + put, n - put,
                                   data_offset_ + done + put);
      TORCH_CHECK(wrote > 0, "CheckpointFile: writing ", nbytes_, " bytes to ", scratch_dir(),
                  " failed at byte ", done + put, ": ", errno_text());
      put += wrote;
    }
    done += n;
  }
  // Clean pages: POSIX_FADV_DONTNEED does not evict dirty ones.
  TORCH_CHECK(fsync(fd_) == 0, "CheckpointFile: fsync failed: ", errno_text());
  evicted_since_write_ = false;
}

CheckpointFile::~CheckpointFile() {
  close(fd_);
}

const CheckpointFile& CheckpointFile::shared(int64_t nbytes) {
  static std::mutex mutex;
  static std::map<int64_t, std::unique_ptr<CheckpointFile>> files;
  std::lock_guard<std::mutex> lock(mutex);
  auto& file = files[nbytes];
  if (!file) file = std::make_unique<CheckpointFile>(nbytes);
  return *file;
}

const CheckpointFile& CheckpointFile::shared_safetensors(int64_t nbytes) {
  static std::mutex mutex;
  static std::map<int64_t, std::unique_ptr<CheckpointFile>> files;
  std::lock_guard<std::mutex> lock(mutex);
  auto& file = files[nbytes];
  if (!file) file = std::make_unique<CheckpointFile>(nbytes, /*safetensors=*/true);
  return *file;
}

std::string CheckpointFile::path() const {
  return "/proc/self/fd/" + std::to_string(fd_);
}

void CheckpointFile::drop_cached() const {
  const int err = posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
  TORCH_CHECK(err == 0, "posix_fadvise(POSIX_FADV_DONTNEED) failed: ", std::strerror(err));
  evicted_since_write_ = true;
}

void CheckpointFile::make_warm_as_written() const {
  if (!evicted_since_write_ && resident_fraction() == 1.0) return;
  // Pages still cached would keep their folios through a write: evict first.
  drop_cached();
  write_contents();
}

void CheckpointFile::make_warm_reread() const {
  drop_cached();
  std::vector<char> buf(8 << 20);
  for (int64_t off = 0; off < nbytes_; off += static_cast<int64_t>(buf.size())) {
    read(buf.data(), off, std::min<int64_t>(buf.size(), nbytes_ - off));
  }
}

double CheckpointFile::resident_fraction() const {
  void* p = mmap(nullptr, nbytes_, PROT_READ, MAP_PRIVATE, fd_, data_offset_);
  TORCH_CHECK(p != MAP_FAILED, "mmap for mincore failed: ", errno_text());
  const int64_t pages = (nbytes_ + page_bytes() - 1) / page_bytes();
  std::vector<unsigned char> vec(pages);
  const int err = mincore(p, nbytes_, vec.data());
  munmap(p, nbytes_);
  TORCH_CHECK(err == 0, "mincore failed: ", errno_text());
  int64_t resident = 0;
  for (unsigned char v : vec) resident += v & 1;
  return static_cast<double>(resident) / pages;
}

void CheckpointFile::read(void* dst, int64_t offset, int64_t n) const {
  auto* out = static_cast<char*>(dst);
  for (int64_t done = 0; done < n;) {
    const ssize_t got = pread(fd_, out + done, n - done, data_offset_ + offset + done);
    TORCH_CHECK(got > 0, "pread of ", n, " bytes at ", offset, " failed after ", done,
                " bytes: ", got == 0 ? std::string("end of file") : errno_text());
    done += got;
  }
}

bool CheckpointFile::holds_contents(const at::Tensor& t) const {
  if (t.numel() != nbytes_ || t.scalar_type() != at::kByte || !t.is_contiguous()) return false;
  // Word i holds 8 * i; check every 509th word (a prime stride crosses page
  // and chunk boundaries at every phase) and the last one.
  const int64_t words = nbytes_ / 8;
  constexpr int64_t kStride = 509;
  at::Tensor sample = t.view(at::kLong).slice(0, 0, words, kStride).cpu();
  at::Tensor want = at::arange(0, words, kStride, at::kLong) * 8;
  const int64_t last = t.view(at::kLong).slice(0, words - 1, words).cpu().item<int64_t>();
  return at::equal(sample, want) && last == 8 * (words - 1);
}

ReadOnlyMapping::ReadOnlyMapping(const CheckpointFile& file, int extra_flags)
    : nbytes_(file.nbytes()) {
  data_ =
      mmap(nullptr, nbytes_, PROT_READ, MAP_PRIVATE | extra_flags, file.fd(), file.data_offset());
  TORCH_CHECK(data_ != MAP_FAILED, "mmap of ", nbytes_, " bytes failed: ", errno_text());
}

ReadOnlyMapping::~ReadOnlyMapping() {
  munmap(data_, nbytes_);
}

at::Tensor ReadOnlyMapping::bytes() const {
  return at::from_blob(data_, {nbytes_}, at::TensorOptions().dtype(at::kByte));
}

FaultCount FaultCount::now() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return {u.ru_minflt, u.ru_majflt};
}

bool populate_read_supported(std::string* why) {
  const int64_t page = page_bytes();
  void* p = mmap(nullptr, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    *why = "mmap failed: " + errno_text();
    return false;
  }
  const int err = madvise(p, page, MADV_POPULATE_READ);
  const std::string text = errno_text();
  munmap(p, page);
  if (err != 0) *why = "madvise(MADV_POPULATE_READ) failed: " + text + " (needs Linux >= 5.14)";
  return err == 0;
}

}  // namespace reloadsafe::bench
