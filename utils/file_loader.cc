#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "utils/file_loader.h"

#include "utils/copy_weight.h"
#include "utils/dense_copy.h"
#include "utils/safetensors_header.h"

#include <ATen/DeviceAccelerator.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <thread>
#include <unordered_map>

namespace reloadsafe {
namespace {

// An open file and its checked header; closes the file.
struct OpenFile {
  std::string path;
  int fd = -1;
  SafetensorsHeader header;

  explicit OpenFile(std::string p) : path(std::move(p)) {
    do {
      fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    TORCH_CHECK(fd >= 0, "cannot open safetensors file ", path, ": ", std::strerror(errno));
  }
  ~OpenFile() {
    if (fd >= 0) close(fd);
  }
  OpenFile(const OpenFile&) = delete;
  OpenFile& operator=(const OpenFile&) = delete;
};

// A read-only private mapping of a whole file; unmapped on destruction.
class FileMapping {
 public:
  explicit FileMapping(const OpenFile& f) : nbytes_(static_cast<size_t>(f.header.file_size)) {
    data_ = mmap(nullptr, nbytes_, PROT_READ, MAP_PRIVATE, f.fd, 0);
    TORCH_CHECK(data_ != MAP_FAILED, "load_: mapping ", f.path, " failed: ", std::strerror(errno));
  }
  ~FileMapping() { munmap(data_, nbytes_); }
  FileMapping(const FileMapping&) = delete;
  FileMapping& operator=(const FileMapping&) = delete;

  const uint8_t* bytes() const { return static_cast<const uint8_t*>(data_); }

  // Faults in the pages of [offset, offset + n) (MADV_POPULATE_READ): false
  // where the kernel lacks it (before Linux 5.14); throws on other errors
  // (the file shrank since its header was read).
  bool populate(int64_t offset, int64_t n, const std::string& path) const {
    static const int64_t page = sysconf(_SC_PAGESIZE);
    const int64_t first = offset / page * page;
    if (madvise(static_cast<char*>(data_) + first, static_cast<size_t>(offset + n - first),
                kPopulateRead) == 0) {
      return true;
    }
    TORCH_CHECK(errno == EINVAL, "load_: reading ", path, " at byte ", offset,
                " failed: ", std::strerror(errno),
                " (did the file shrink after its header was read?)");
    return false;
  }

 private:
  static constexpr int kPopulateRead = 22;  // MADV_POPULATE_READ, Linux 5.14
  void* data_;
  size_t nbytes_;
};

// Reads exactly `n` bytes at `offset`; throws on an error or an early end.
void pread_fully(const OpenFile& f, void* dst, int64_t offset, int64_t n) {
  auto* out = static_cast<uint8_t*>(dst);
  while (n > 0) {
    const ssize_t got = pread(f.fd, out, static_cast<size_t>(n), static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    TORCH_CHECK(got > 0, "reading ", f.path, " at byte ", offset, " failed: ",
                got == 0 ? "the file ended early (did it shrink after its header was read?)"
                         : std::strerror(errno));
    out += got;
    offset += got;
    n -= got;
  }
}

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// The first exception of several threads, and a flag that stops the others.
class FirstError {
 public:
  void set(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) error_ = std::move(e);
    failed_.store(true, std::memory_order_release);
  }
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  void rethrow() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::mutex mutex_;
  std::exception_ptr error_;
  std::atomic<bool> failed_{false};
};

}  // namespace

// One destination: where its bytes come from and go.
struct LoadItem {
  const std::string* name;
  const OpenFile* file;
  int64_t file_offset;  // absolute
  int64_t nbytes;
  at::Tensor dst;      // detached alias of the destination tensor
  int64_t dst_offset;  // bytes from dst's first element
};

// What a load reads, checked (see the invariant in the header).
struct FileLoader::Plan {
  std::vector<std::unique_ptr<OpenFile>> files;
  std::vector<LoadItem> host;    // CPU destinations
  std::vector<LoadItem> device;  // destinations on `device_`
  std::optional<c10::Device> device_;
};

// The staging ring: `slots` buffers of `chunk` bytes in one allocation, and
// an event per slot on `event_device`.
struct FileLoader::Ring {
  at::Tensor buffer;
  bool pinned = false;
  std::optional<c10::Device> event_device;
  std::vector<std::unique_ptr<c10::Event>> events;
};

namespace {

// A chunk of one item.
struct Chunk {
  const LoadItem* item;
  int64_t offset;  // within the item
  int64_t nbytes;
};

std::vector<Chunk> chunks_of(const std::vector<LoadItem>& items, int64_t chunk_bytes) {
  std::vector<Chunk> out;
  for (const LoadItem& item : items) {
    for (int64_t off = 0; off < item.nbytes; off += chunk_bytes) {
      out.push_back({&item, off, std::min(chunk_bytes, item.nbytes - off)});
    }
  }
  return out;
}

uint8_t* host_bytes(const LoadItem& item) {
  return static_cast<uint8_t*>(item.dst.data_ptr()) + item.dst_offset;
}

// Checks one destination against its file tensor; throws before any write.
void check_target(const std::string& name, const LoadTarget& target, const SafetensorsTensor& src,
                  const std::string& path) {
  const at::Tensor& t = target.tensor;
  TORCH_CHECK(t.defined(), "load_: the destination of '", name,
              "' is an undefined tensor; pass the tensor to fill");
  TORCH_CHECK(t.layout() == at::kStrided && t.has_storage() && !t.is_meta(),
              "load_: the destination of '", name, "' is not a strided tensor with memory (layout ",
              t.layout(), ", device ", t.device(),
              "); load into a dense tensor on the CPU or a device");
  TORCH_CHECK(t.is_contiguous(), "load_: the destination of '", name,
              "' is not contiguous (strides ", t.strides(),
              "); the loader writes the file's bytes in order: load into a contiguous tensor "
              "and copy from it, or pass the contiguous parameter this view is part of with a "
              "byte offset");
  TORCH_CHECK(!t.is_conj() && !t.is_neg(), "load_: the destination of '", name,
              "' has its conjugate or negative bit set; resolve it first (resolve_conj, "
              "resolve_neg)");
  TORCH_CHECK(t.scalar_type() == src.dtype, "load_: tensor '", name, "' is ", src.dtype_name, " (",
              src.dtype, ") in ", path, " but its destination is ", t.scalar_type(),
              "; the loader copies bytes and does not convert: pass a destination of dtype ",
              src.dtype, " and convert after the load");
  const int64_t elem = static_cast<int64_t>(t.element_size());
  const int64_t dst_nbytes = t.numel() * elem;
  if (!target.byte_offset.has_value()) {
    TORCH_CHECK(t.sizes() == c10::IntArrayRef(src.shape), "load_: tensor '", name, "' has shape ",
                c10::IntArrayRef(src.shape), " in ", path, " but its destination has shape ",
                t.sizes(),
                "; a destination of another layout (a part of a fused parameter) needs a byte "
                "offset: (tensor, byte_offset)");
  } else {
    const int64_t off = *target.byte_offset;
    TORCH_CHECK(off >= 0 && off % elem == 0, "load_: the byte offset ", off, " for '", name,
                "' must be non-negative and a multiple of the element size ", elem);
    TORCH_CHECK(off <= dst_nbytes && src.nbytes() <= dst_nbytes - off, "load_: tensor '", name,
                "' (", src.nbytes(), " bytes in ", path, ") does not fit at byte offset ", off,
                " of its destination of ", dst_nbytes, " bytes (shape ", t.sizes(),
                "); pass a larger destination or a smaller offset");
  }
  const int64_t first = t.storage_offset() * elem;
  TORCH_CHECK(first <= static_cast<int64_t>(t.storage().nbytes()) &&
                  dst_nbytes <= static_cast<int64_t>(t.storage().nbytes()) - first,
              "load_: the destination of '", name, "' spans bytes [", first, ", ",
              first + dst_nbytes, ") of a storage of ", t.storage().nbytes(),
              " bytes; the loader never grows a storage: pass a tensor inside its storage");
}

}  // namespace

FileLoader::FileLoader(FileLoaderOptions options) : options_(options) {
  TORCH_CHECK(options_.threads >= 0, "FileLoader: threads must be >= 0 (0: the CPUs)");
  TORCH_CHECK(options_.chunk_bytes > 0, "FileLoader: chunk_bytes must be positive");
  TORCH_CHECK(options_.ring_slots >= 2, "FileLoader: ring_slots must be at least 2");
  if (options_.threads == 0) options_.threads = std::min(8, usable_cpus());
}

FileLoader::~FileLoader() = default;

FileLoaderCounters FileLoader::counters() const {
  FileLoaderCounters c;
  c.calls = calls_.load();
  c.tensors_loaded = tensors_loaded_.load();
  c.bytes_read = bytes_read_.load();
  c.staging_allocations = staging_allocations_.load();
  c.staging_bytes = staging_bytes_.load();
  c.staged_copies = staged_copies_.load();
  c.mapped_copies = mapped_copies_.load();
  return c;
}

int64_t FileLoader::load_(const std::vector<std::string>& paths, const LoadTargets& targets) {
  calls_.fetch_add(1);
  Plan plan;
  // Every header first: a malformed shard refuses the whole load.
  std::unordered_map<std::string_view, std::pair<const OpenFile*, const SafetensorsTensor*>>
      by_name;
  for (const std::string& path : paths) {
    auto file = std::make_unique<OpenFile>(path);
    file->header = read_safetensors_header(file->fd, path);
    for (const SafetensorsTensor& t : file->header.tensors) {
      auto [it, fresh] = by_name.try_emplace(t.name, file.get(), &t);
      TORCH_CHECK(fresh, "load_: tensor '", t.name, "' is in both ", it->second.first->path,
                  " and ", path, "; pass the shards of one checkpoint, each file once");
    }
    plan.files.push_back(std::move(file));
  }

  // Every destination, and where each range of bytes lands.
  struct Range {
    c10::Device device;
    uintptr_t begin;
    uintptr_t end;
    const std::string* name;
  };
  std::vector<Range> ranges;
  for (const auto& [name, target] : targets) {
    auto found = by_name.find(name);
    TORCH_CHECK(found != by_name.end(), "load_: tensor '", name, "' is in none of the ",
                paths.size(), " file(s) given; add the shard that holds it, or leave '", name,
                "' out of the destinations");
    const auto [file, src] = found->second;
    check_target(name, target, *src, file->path);
    LoadItem item{&name,
                  file,
                  file->header.data_start + src->begin,
                  src->nbytes(),
                  target.tensor.detach(),
                  target.byte_offset.value_or(0)};
    if (item.nbytes > 0) {
      const auto begin = reinterpret_cast<uintptr_t>(item.dst.data_ptr()) +
                         static_cast<uintptr_t>(item.dst_offset);
      ranges.push_back(
          {item.dst.device(), begin, begin + static_cast<uintptr_t>(item.nbytes), &name});
    }
    const c10::Device device = item.dst.device();
    if (device.is_cpu()) {
      plan.host.push_back(std::move(item));
    } else {
      TORCH_CHECK(!plan.device_.has_value() || *plan.device_ == device, "load_: destination '",
                  name, "' is on ", device, " and another on ", *plan.device_,
                  "; load the destinations of each device in a call of their own");
      plan.device_ = device;
      plan.device.push_back(std::move(item));
    }
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    if (a.device != b.device) {
      return a.device.type() != b.device.type() ? a.device.type() < b.device.type()
                                                : a.device.index() < b.device.index();
    }
    return a.begin < b.begin;
  });
  for (size_t i = 1; i < ranges.size(); ++i) {
    const Range& a = ranges[i - 1];
    const Range& b = ranges[i];
    TORCH_CHECK(a.device != b.device || b.begin >= a.end, "load_: the destinations of '", *a.name,
                "' and '", *b.name,
                "' overlap in memory; give each file tensor bytes of its own (check the byte "
                "offsets)");
  }

  // Checked: now the writes.
  if (!plan.host.empty()) {
    if (options_.stage_host_destinations) {
      load_staged_(plan, c10::Device(c10::kCPU));
    } else {
      load_direct_(plan);
    }
  }
  if (!plan.device.empty()) {
    if (is_integrated_gpu(*plan.device_)) {
      load_mapped_(plan);
    } else {
      load_staged_(plan, *plan.device_);
    }
  }
  int64_t total = 0;
  for (const LoadItem& i : plan.host) total += i.nbytes;
  for (const LoadItem& i : plan.device) total += i.nbytes;
  tensors_loaded_.fetch_add(static_cast<int64_t>(plan.host.size() + plan.device.size()));
  return total;
}

// See Note [Which read] in the header: a populated mapping and dense_copy_
// (split over LibTorch's threads) into the destination's bytes.
void FileLoader::load_direct_(const Plan& plan) {
  for (const auto& file : plan.files) {
    std::optional<FileMapping> map;
    for (const LoadItem& item : plan.host) {
      if (item.file != file.get() || item.nbytes == 0) continue;
      if (!map) map.emplace(*file);
      uint8_t* dst = host_bytes(item);
      if (map->populate(item.file_offset, item.nbytes, file->path)) {
        const at::TensorOptions bytes = at::TensorOptions().dtype(at::kByte);
        dense_copy_(at::from_blob(dst, {item.nbytes}, bytes),
                    at::from_blob(const_cast<uint8_t*>(map->bytes()) + item.file_offset,
                                  {item.nbytes}, bytes));
      } else {
        pread_fully(*file, dst, item.file_offset, item.nbytes);
      }
      bytes_read_.fetch_add(item.nbytes, std::memory_order_relaxed);
    }
  }
}

FileLoader::Ring& FileLoader::ring_locked_(bool pinned) {
  if (!ring_ || (pinned && !ring_->pinned)) {
    auto ring = std::make_unique<Ring>();
    ring->pinned = pinned;
    ring->buffer = at::empty({options_.chunk_bytes * options_.ring_slots},
                             at::TensorOptions().dtype(at::kByte).pinned_memory(pinned));
    staging_allocations_.fetch_add(1);
    staging_bytes_.store(ring->buffer.numel());
    ring_ = std::move(ring);
  }
  return *ring_;
}

// Note [The ring's order]
// Chunk k goes through slot k % S. Readers take chunks in increasing order;
// the reader of chunk k waits until the calling thread has issued the copy
// of chunk k - S out of the same slot (`issued[slot]`), then for that copy's
// event, and only then reads into the slot. The calling thread issues the
// copies in chunk order, each once its chunk is read (`read_done`), and
// records the slot's event after each. So a slot is refilled only after the
// copy out of it finished, and a chunk is copied only after it was read.
// No deadlock: the chunk a reader waits for was taken by an earlier reader,
// which waits only for chunks before it. Host destinations (a test mode)
// copy synchronously: a slot is free once its copy was issued.
void FileLoader::load_staged_(const Plan& plan, c10::Device device) {
  const std::vector<LoadItem>& items = device.is_cpu() ? plan.host : plan.device;
  const std::vector<Chunk> chunks = chunks_of(items, options_.chunk_bytes);
  if (chunks.empty()) return;
  std::lock_guard<std::mutex> ring_lock(ring_mutex_);
  const bool on_device = !device.is_cpu();
  const bool accelerator = at::getAccelerator(false).has_value();
  Ring& ring = ring_locked_(on_device || accelerator);
  const int slots = options_.ring_slots;
  const int64_t chunk = options_.chunk_bytes;
  auto* base = static_cast<uint8_t*>(ring.buffer.data_ptr());

  std::optional<c10::impl::VirtualGuardImpl> impl;
  std::optional<c10::Stream> copy_stream;
  if (on_device) {
    impl.emplace(device.type());
    if (ring.event_device != device) {
      ring.events.clear();
      for (int s = 0; s < slots; ++s)
        ring.events.push_back(std::make_unique<c10::Event>(device.type()));
      ring.event_device = device;
    }
    copy_stream = impl->getStreamFromGlobalPool(device, /*isHighPriority=*/false);
    // Work queued on the current stream before the load sees the old bytes.
    c10::Event before(device.type());
    before.record(impl->getStream(device));
    before.block(*copy_stream);
  }

  std::mutex mutex;
  std::condition_variable changed;
  std::vector<int64_t> issued(static_cast<size_t>(slots), -1);  // last chunk issued per slot
  std::vector<char> read_done(chunks.size(), 0);
  std::atomic<size_t> next{0};
  FirstError error;
  const int readers =
      static_cast<int>(std::min<size_t>(static_cast<size_t>(options_.threads), chunks.size()));

  auto reader = [&] {
    try {
      for (size_t k = next.fetch_add(1); k < chunks.size(); k = next.fetch_add(1)) {
        const size_t slot = k % static_cast<size_t>(slots);
        {
          std::unique_lock<std::mutex> lock(mutex);
          changed.wait(lock, [&] {
            return error.failed() ||
                   issued[slot] + static_cast<int64_t>(slots) >= static_cast<int64_t>(k);
          });
          if (error.failed()) return;
        }
        if (on_device && k >= static_cast<size_t>(slots)) ring.events[slot]->synchronize();
        const Chunk& c = chunks[k];
        pread_fully(*c.item->file, base + slot * chunk, c.item->file_offset + c.offset, c.nbytes);
        bytes_read_.fetch_add(c.nbytes, std::memory_order_relaxed);
        {
          std::lock_guard<std::mutex> lock(mutex);
          read_done[k] = 1;
        }
        changed.notify_all();
      }
    } catch (...) {
      error.set(std::current_exception());
      changed.notify_all();
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(readers));
  for (int i = 0; i < readers; ++i) threads.emplace_back(reader);

  try {
    for (size_t k = 0; k < chunks.size(); ++k) {
      {
        std::unique_lock<std::mutex> lock(mutex);
        changed.wait(lock, [&] { return error.failed() || read_done[k] != 0; });
        if (error.failed()) break;
      }
      const size_t slot = k % static_cast<size_t>(slots);
      const Chunk& c = chunks[k];
      if (on_device) {
        c10::StreamGuard guard(*copy_stream);
        at::Tensor dst = c.item->dst.reshape({-1}).view(at::kByte).narrow(
            0, c.item->dst_offset + c.offset, c.nbytes);
        dst.copy_(ring.buffer.narrow(0, static_cast<int64_t>(slot) * chunk, c.nbytes),
                  /*non_blocking=*/true);
        ring.events[slot]->record(*copy_stream);
      } else {
        std::memcpy(host_bytes(*c.item) + c.offset, base + slot * chunk,
                    static_cast<size_t>(c.nbytes));
      }
      staged_copies_.fetch_add(1, std::memory_order_relaxed);
      {
        std::lock_guard<std::mutex> lock(mutex);
        issued[slot] = static_cast<int64_t>(k);
      }
      changed.notify_all();
    }
  } catch (...) {
    error.set(std::current_exception());
    changed.notify_all();
  }
  for (std::thread& t : threads) t.join();
  // The ring is reused by the next load: no copy out of it may still run.
  if (on_device) copy_stream->synchronize();
  error.rethrow();
}

void FileLoader::load_mapped_(const Plan& plan) {
  for (const auto& file : plan.files) {
    std::optional<FileMapping> map;
    for (const LoadItem& item : plan.device) {
      if (item.file != file.get() || item.nbytes == 0) continue;
      if (!map) map.emplace(*file);
      at::Tensor src = at::from_blob(const_cast<uint8_t*>(map->bytes()) + item.file_offset,
                                     {item.nbytes}, at::TensorOptions().dtype(at::kByte));
      at::Tensor dst =
          item.dst.reshape({-1}).view(at::kByte).narrow(0, item.dst_offset, item.nbytes);
      copy_weight_(dst, src);  // the page touch, then the copy
      bytes_read_.fetch_add(item.nbytes, std::memory_order_relaxed);
      mapped_copies_.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

int64_t load_safetensors_(const std::vector<std::string>& paths, const LoadTargets& targets) {
  FileLoader loader;
  return loader.load_(paths, targets);
}

}  // namespace reloadsafe
