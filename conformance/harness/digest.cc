#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/digest.h"

#include "conformance/harness/values.h"

#include <ATen/Parallel.h>
#include <c10/core/DispatchKey.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace reloadsafe::harness {
namespace {

// One pass over n bytes at p in four lanes (Note [A digest instead of a
// copy]).
uint64_t mix_run(uint64_t h, const unsigned char* p, size_t n) {
  constexpr uint64_t kPrime = 0x100000001B3ull;
  // The lanes are four locals, not an array: gcc keeps an array indexed in
  // a loop in memory, and each step then waits for a store to be read back.
  uint64_t l0 = h, l1 = h ^ 1, l2 = h ^ 2, l3 = h ^ 3;
  const auto word = [&](size_t at) {
    uint64_t w;
    std::memcpy(&w, p + at, 8);
    return w;
  };
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    l0 = (l0 ^ word(i)) * kPrime;
    l1 = (l1 ^ word(i + 8)) * kPrime;
    l2 = (l2 ^ word(i + 16)) * kPrime;
    l3 = (l3 ^ word(i + 24)) * kPrime;
  }
  for (; i + 8 <= n; i += 8) l0 = (l0 ^ word(i)) * kPrime;
  for (; i < n; ++i) l0 = (l0 ^ p[i]) * kPrime;
  uint64_t out = l0;
  for (const uint64_t lane : {l1, l2, l3}) out = (out ^ lane) * kPrime;
  return (out ^ static_cast<uint64_t>(n)) * kPrime;
}

// The bytes of a run longer than this are digested in runs of this length,
// in parallel, and the runs' digests mixed in order: the same digest on any
// number of threads.
constexpr size_t kParallelRun = size_t{8} << 20;

// `t`'s bytes mixed into h.
uint64_t mix_bytes(uint64_t h, const at::Tensor& t) {
  const at::Tensor c = t.is_contiguous() ? t : t.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.const_data_ptr());
  const size_t n = static_cast<size_t>(c.numel()) * c.element_size();
  if (n <= kParallelRun) return mix_run(h, p, n);
  const int64_t runs = static_cast<int64_t>((n + kParallelRun - 1) / kParallelRun);
  std::vector<uint64_t> digests(static_cast<size_t>(runs));
  at::parallel_for(0, runs, 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const size_t at = static_cast<size_t>(k) * kParallelRun;
      digests[static_cast<size_t>(k)] =
          mix_run(h ^ static_cast<uint64_t>(k), p + at, std::min(kParallelRun, n - at));
    }
  });
  for (const uint64_t d : digests) h = mix(h, d);
  return mix(h, n);
}

}  // namespace

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
  uint64_t out = mix(*h, static_cast<uint64_t>(t.scalar_type()));
  for (int64_t d : t.sizes()) out = mix(out, static_cast<uint64_t>(d));
  *h = mix_bytes(out, t);
  return true;
}

CheckpointDigest::CheckpointDigest(const Checkpoint& ckpt) {
  entries_.reserve(ckpt.size());
  for (const auto& [name, t] : ckpt) {
    Entry e{name, std::nullopt, {}};
    uint64_t h = 0xCBF29CE484222325ull;
    if (mix_tensor(&h, t)) {
      e.digest = h;
    } else {
      e.copy = t.clone();
    }
    entries_.push_back(std::move(e));
  }
}

std::vector<std::string> CheckpointDigest::changed(const Checkpoint& ckpt) {
  std::vector<std::string> out;
  for (const Entry& e : entries_) {
    const auto it = ckpt.find(e.name);
    bool same = it != ckpt.end();
    if (same && e.digest) {
      uint64_t h = 0xCBF29CE484222325ull;
      same = mix_tensor(&h, it->second) && h == *e.digest;
    } else if (same) {
      same = same_bytes(it->second, e.copy);
    }
    if (!same) out.push_back(e.name);
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
