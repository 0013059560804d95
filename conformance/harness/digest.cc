#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/digest.h"

#include "conformance/harness/internal/parallel_items.h"
#include "conformance/harness/values.h"

#include <ATen/Parallel.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#include <c10/core/DispatchKey.h>
#include <c10/util/intrusive_ptr.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace reloadsafe::harness {
namespace {

// One pass over the n bytes at p (Note [A digest instead of a copy]): 32
// lanes of four bytes, each lane's step x -> (x ^ w) * odd (a bijection of
// the lane and of the word), over blocks of 128 bytes; the bytes after the
// last whole block one by one in an eight-byte lane; the lanes folded into
// the seed in order with bijective 64-bit steps. So a single changed
// four-byte word always changes the result. Two implementations of the same
// arithmetic: AVX2's (16 GB/s from memory on one core of the Xeon hosts,
// where the scalar 64-bit lanes this replaced ran at 6.8) and a portable
// one (digest_test holds them equal).
constexpr uint32_t kLanePrime = 0x9E3779B1u;
constexpr uint64_t kFoldPrime = 0x100000001B3ull;
constexpr size_t kDigestBlock = 128;
constexpr int kDigestLanes = kDigestBlock / 4;

// The lanes' starting values, from the seed.
void seed_lanes(uint64_t h, uint32_t* lanes) {
  for (int i = 0; i < kDigestLanes; ++i) {
    lanes[i] = static_cast<uint32_t>(h ^ (h >> 32)) ^ (static_cast<uint32_t>(i) * 0x85EBCA6Bu);
  }
}

// The lanes and the tail folded into the seed.
uint64_t fold(uint64_t h, const uint32_t* lanes, const unsigned char* tail, size_t rest, size_t n) {
  uint64_t out = h;
  for (int i = 0; i < kDigestLanes; ++i) out = (out ^ lanes[i]) * kFoldPrime;
  for (size_t i = 0; i < rest; ++i) out = (out ^ tail[i]) * kFoldPrime;
  return (out ^ static_cast<uint64_t>(n)) * kFoldPrime;
}

uint64_t mix_run_portable(uint64_t h, const unsigned char* p, size_t n) {
  uint32_t lanes[kDigestLanes];
  seed_lanes(h, lanes);
  const size_t blocks = n / kDigestBlock;
  for (size_t b = 0; b < blocks; ++b) {
    for (int i = 0; i < kDigestLanes; ++i) {
      uint32_t w;
      std::memcpy(&w, p + b * kDigestBlock + static_cast<size_t>(i) * 4, 4);
      lanes[i] = (lanes[i] ^ w) * kLanePrime;
    }
  }
  return fold(h, lanes, p + blocks * kDigestBlock, n - blocks * kDigestBlock, n);
}

#if defined(__x86_64__) || defined(__i386__)
#define RELOADSAFE_HAVE_AVX2_DIGEST 1
__attribute__((target("avx2"))) uint64_t mix_run_avx2(uint64_t h, const unsigned char* p,
                                                      size_t n) {
  uint32_t lanes[kDigestLanes];
  seed_lanes(h, lanes);
  __m256i a[4];
  for (int k = 0; k < 4; ++k) {
    a[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lanes + 8 * k));
  }
  const __m256i prime = _mm256_set1_epi32(static_cast<int>(kLanePrime));
  const size_t blocks = n / kDigestBlock;
  for (size_t b = 0; b < blocks; ++b) {
    const unsigned char* q = p + b * kDigestBlock;
    for (int k = 0; k < 4; ++k) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * k));
      a[k] = _mm256_mullo_epi32(_mm256_xor_si256(a[k], w), prime);
    }
  }
  for (int k = 0; k < 4; ++k) _mm256_storeu_si256(reinterpret_cast<__m256i*>(lanes + 8 * k), a[k]);
  return fold(h, lanes, p + blocks * kDigestBlock, n - blocks * kDigestBlock, n);
}
#endif

uint64_t mix_run(uint64_t h, const unsigned char* p, size_t n) {
  return digest_bytes(h, p, n);
}

// `t`'s bytes mixed into h (TensorDigest, run by run).
uint64_t mix_bytes(uint64_t h, const at::Tensor& t) {
  const at::Tensor c = t.is_contiguous() ? t : t.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.const_data_ptr());
  const size_t n = static_cast<size_t>(c.numel()) * c.element_size();
  TensorDigest digest(h, n);
  if (digest.runs() == 1) {
    digest.run(0, p);
  } else {
    at::parallel_for(0, digest.runs(), 1, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) digest.run(k, p + static_cast<size_t>(k) * kDigestRun);
    });
  }
  return digest.value();
}

// The seed a checkpoint entry's digest starts from (CheckpointDigest).
constexpr uint64_t kEntrySeed = 0xCBF29CE484222325ull;

// Mixes `dtype` and `sizes` into h: what a tensor's bytes are mixed after.
uint64_t mix_layout(uint64_t h, at::ScalarType dtype, at::IntArrayRef sizes) {
  h = mix(h, static_cast<uint64_t>(dtype));
  for (int64_t d : sizes) h = mix(h, static_cast<uint64_t>(d));
  return h;
}

// Digests noted by the code that made a tensor (note_digest), by tensor.
struct Noted {
  c10::weak_intrusive_ptr<c10::TensorImpl> tensor;
  uint32_t version;
  uint64_t digest;
};
std::mutex noted_mutex;
std::unordered_map<const c10::TensorImpl*, Noted>& noted() {
  static auto* table = new std::unordered_map<const c10::TensorImpl*, Noted>();  // never destroyed
  return *table;
}

}  // namespace

uint64_t digest_bytes(uint64_t seed, const void* bytes, size_t n, bool portable) {
  const auto* p = static_cast<const unsigned char*>(bytes);
#ifdef RELOADSAFE_HAVE_AVX2_DIGEST
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2 && !portable) return mix_run_avx2(seed, p, n);
#endif
  return mix_run_portable(seed, p, n);
}

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  return h * 0xFF51AFD7ED558CCDull;
}

uint64_t mix_string(uint64_t h, std::string_view s) {
  h = mix(h, s.size());
  for (char c : s) h = mix(h, static_cast<unsigned char>(c));
  return h;
}

bool mix_tensor(uint64_t* h, const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() || t.layout() != at::kStrided || !t.has_storage() ||
      t.is_conj() || t.is_neg() ||
      t.unsafeGetTensorImpl()->key_set().has(c10::DispatchKey::Python)) {
    return false;
  }
  *h = mix_bytes(mix_layout(*h, t.scalar_type(), t.sizes()), t);
  return true;
}

TensorDigest::TensorDigest(uint64_t seed, size_t nbytes)
    : seed_(seed),
      nbytes_(nbytes),
      runs_(std::max<size_t>(1, (nbytes + kDigestRun - 1) / kDigestRun), 0) {}

TensorDigest::TensorDigest(at::ScalarType dtype, at::IntArrayRef sizes, size_t nbytes)
    : TensorDigest(mix_layout(kEntrySeed, dtype, sizes), nbytes) {}

void TensorDigest::run(int64_t k, const void* bytes) {
  const size_t at = static_cast<size_t>(k) * kDigestRun;
  const auto* p = static_cast<const unsigned char*>(bytes);
  // One run: the bytes mixed into the seed itself, as before there were runs.
  runs_[static_cast<size_t>(k)] = runs_.size() == 1 ? mix_run(seed_, p, nbytes_)
                                                    : mix_run(seed_ ^ static_cast<uint64_t>(k), p,
                                                              std::min(kDigestRun, nbytes_ - at));
}

uint64_t TensorDigest::value() const {
  if (runs_.size() == 1) return runs_[0];
  uint64_t h = seed_;
  for (const uint64_t d : runs_) h = mix(h, d);
  return mix(h, nbytes_);
}

void note_digest(const at::Tensor& t, uint64_t digest) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (!impl->version_counter().enabled()) return;  // an inference tensor: nothing to tell by
  std::lock_guard<std::mutex> lock(noted_mutex);
  auto& table = noted();
  if (table.size() >= 4096) {  // the entries of tensors gone since
    for (auto it = table.begin(); it != table.end();) {
      it = it->second.tensor.expired() ? table.erase(it) : std::next(it);
    }
  }
  table.insert_or_assign(impl, Noted{c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr()),
                                     impl->version_counter().current_version(), digest});
}

std::optional<uint64_t> noted_digest(const at::Tensor& t) {
  if (!t.defined()) return std::nullopt;
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  std::lock_guard<std::mutex> lock(noted_mutex);
  auto& table = noted();
  const auto it = table.find(impl);
  if (it == table.end()) return std::nullopt;
  const Noted& n = it->second;
  // The very tensor noted (not another at a freed one's address), and no
  // in-place op on it since.
  if (n.tensor.lock().get() != impl || !impl->version_counter().enabled() ||
      impl->version_counter().current_version() != n.version) {
    table.erase(it);
    return std::nullopt;
  }
  return n.digest;
}

namespace {

// Each tensor's bytes, for parallel_items.
std::vector<int64_t> tensor_bytes(const std::vector<const at::Tensor*>& tensors) {
  std::vector<int64_t> out;
  out.reserve(tensors.size());
  for (const at::Tensor* t : tensors) {
    out.push_back(t->defined() ? t->numel() * static_cast<int64_t>(t->element_size()) : 0);
  }
  return out;
}

// `t`'s digest as an entry of a checkpoint's, or nothing.
std::optional<uint64_t> entry_digest(const at::Tensor& t) {
  uint64_t h = kEntrySeed;
  if (!mix_tensor(&h, t)) return std::nullopt;
  return h;
}

}  // namespace

CheckpointDigest::CheckpointDigest(const Checkpoint& ckpt) {
  entries_.reserve(ckpt.size());
  std::vector<const at::Tensor*> tensors;
  for (const auto& [name, t] : ckpt) {
    entries_.push_back(Entry{name, std::nullopt, {}});
    tensors.push_back(&t);
  }
  // A digest noted when the tensor was made, and nothing wrote into it
  // since, is its digest: its bytes are not read again.
  std::vector<int64_t> bytes = tensor_bytes(tensors);
  for (size_t i = 0; i < tensors.size(); ++i) {
    entries_[i].digest = noted_digest(*tensors[i]);
    if (entries_[i].digest) bytes[i] = 0;  // nothing to do: last
  }
  parallel_items(bytes, [&](size_t i) {
    if (!entries_[i].digest) entries_[i].digest = entry_digest(*tensors[i]);
  });
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (!entries_[i].digest) entries_[i].copy = tensors[i]->clone();
  }
}

std::vector<std::string> CheckpointDigest::changed(const Checkpoint& ckpt) {
  std::vector<const at::Tensor*> tensors(entries_.size(), nullptr);
  for (size_t i = 0; i < entries_.size(); ++i) {
    const auto it = ckpt.find(entries_[i].name);
    if (it != ckpt.end()) tensors[i] = &it->second;
  }
  std::vector<char> same(entries_.size(), 0);
  std::vector<const at::Tensor*> digested;  // the tensors an entry's digest stands for
  std::vector<size_t> which;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (tensors[i] == nullptr) continue;
    if (entries_[i].digest) {
      digested.push_back(tensors[i]);
      which.push_back(i);
    } else {
      same[i] = same_bytes(*tensors[i], entries_[i].copy);
    }
  }
  parallel_items(tensor_bytes(digested), [&](size_t k) {
    const size_t i = which[k];
    same[i] = entry_digest(*digested[k]) == entries_[i].digest;
  });
  std::vector<std::string> out;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (!same[i]) out.push_back(entries_[i].name);
  }
  if (!out.empty()) changed_ = true;
  return out;
}

std::optional<uint64_t> CheckpointDigest::whole() const {
  if (changed_) return std::nullopt;
  uint64_t h = 0x84222325CBF29CE4ull;
  for (const Entry& e : entries_) {
    if (!e.digest) return std::nullopt;
    h = mix(mix_string(h, e.name), *e.digest);
  }
  return mix(h, entries_.size());
}

bool CheckpointDigest::same_as(const CheckpointDigest& other) const {
  if (entries_.size() != other.entries_.size()) return false;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& a = entries_[i];
    const Entry& b = other.entries_[i];
    if (a.name != b.name || a.digest.has_value() != b.digest.has_value()) return false;
    if (a.digest ? *a.digest != *b.digest : !same_bytes(a.copy, b.copy)) return false;
  }
  return true;
}

}  // namespace reloadsafe::harness
