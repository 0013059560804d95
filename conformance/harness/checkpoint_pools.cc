#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/checkpoint_pools.h"

#include "conformance/harness/digest.h"
#include "conformance/harness/internal/parallel_items.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Dispatch_v2.h>
#include <ATen/EmptyTensor.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <vector>

namespace reloadsafe::harness {
namespace {

uint64_t mix_seed(uint64_t z) {  // SplitMix64's finaliser
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The floating dtypes a CPU at::mul scales directly (float8 has no CPU
// multiplication: it goes through float).
bool scaled_by_mul(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf ||
         dtype == at::kBFloat16;
}

// The float8 dtypes the loop scales as the ops do: widened to float (exact),
// multiplied in float, narrowed by c10's conversion (ATen's copy_ uses the
// same).
bool float8_through_float(at::ScalarType dtype) {
  return dtype == at::kFloat8_e4m3fn || dtype == at::kFloat8_e5m2 ||
         dtype == at::kFloat8_e4m3fnuz || dtype == at::kFloat8_e5m2fnuz;
}

// kScaleBlock elements from `in`, times `s`, into `out`: a loop of a fixed length
// over pointers that do not alias, which the compiler vectorizes at -O2.
constexpr int64_t kScaleBlock = 16;
template <typename T, typename Math>
void scale_block(const T* __restrict in, T* __restrict out, Math s) {
  for (int64_t j = 0; j < kScaleBlock; ++j) out[j] = static_cast<T>(static_cast<Math>(in[j]) * s);
}

// n elements from src, times `scale` in T's op-math type, into dst (a new
// tensor's bytes: the two never overlap): the arithmetic of
// at::mul(tensor, double) on the CPU.
template <typename T>
void scale_into(const void* src, void* dst, int64_t n, double scale) {
  using Math = at::opmath_type<T>;
  const auto s = static_cast<Math>(scale);
  const T* in = static_cast<const T*>(src);
  T* out = static_cast<T*>(dst);
  int64_t i = 0;
  for (; i + kScaleBlock <= n; i += kScaleBlock) scale_block<T, Math>(in + i, out + i, s);
  for (; i < n; ++i) out[i] = static_cast<T>(static_cast<Math>(in[i]) * s);
}

// `values` times `scale` as a new contiguous tensor, through ATen ops
// (integers and booleans unscaled).
at::Tensor scaled_with_ops(const at::Tensor& values, double scale) {
  const at::ScalarType dtype = values.scalar_type();
  if (scaled_by_mul(dtype) || at::isComplexType(dtype)) return values.mul(scale).contiguous();
  if (at::isFloatingType(dtype)) {
    return values.to(at::kFloat).mul_(scale).to(dtype).contiguous();  // float8: no CPU mul
  }
  return values.clone(at::MemoryFormat::Contiguous);
}

// A given pool's window, through ATen ops (whatever the pool's strides).
at::Tensor draw_with_ops(const at::Tensor& pool, const PoolWindow& w) {
  return scaled_with_ops(pool.as_strided(pool.sizes(), pool.strides(), w.offset), w.scale);
}

}  // namespace

IntegerRange integer_range(at::ScalarType dtype) {
  TORCH_CHECK(at::isIntegralType(dtype, /*includeBool=*/false), "integer_range: ", dtype,
              " is not an integer dtype");
  int64_t low = -128, high = 127;
  switch (dtype) {
    case at::kByte:
    case at::kUInt16:
    case at::kUInt32:
    case at::kUInt64:
      low = 0;
      break;
    default:
      break;
  }
  return {low, high};
}

PoolWindow pool_window(uint64_t seed) {
  const uint64_t h = mix_seed(seed);
  PoolWindow w;
  w.offset = static_cast<int64_t>(h % static_cast<uint64_t>(kPoolWindows));
  w.scale = 0.5 + 1.5 * static_cast<double>(h >> 11) / 9007199254740992.0;  // 2^53
  return w;
}

namespace {

// `size` values of `dtype` from `gen`: floating and complex from a normal
// distribution, booleans from {0, 1}, integers from integer_range().
at::Tensor random_values(int64_t size, at::ScalarType dtype, at::Generator& gen) {
  if (at::isFloatingType(dtype)) return at::randn({size}, gen, at::kFloat).to(dtype);
  if (at::isComplexType(dtype)) return at::randn({size}, gen, at::TensorOptions().dtype(dtype));
  if (dtype == at::kBool) {
    return at::randint(0, 2, {size}, gen, at::TensorOptions().dtype(at::kLong)).to(dtype);
  }
  const IntegerRange range = integer_range(dtype);
  return at::randint(range.low, range.high + 1, {size}, gen, at::TensorOptions().dtype(at::kLong))
      .to(dtype);
}

// Where `name` starts in its dtype's pool: a fixed function of the name
// (FNV-1a, then mixed), so a tensor's values do not depend on what else the
// checkpoint holds.
int64_t base_of(const std::string& name) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001B3ull;
  return static_cast<int64_t>(mix_seed(h) % static_cast<uint64_t>(kSharedPoolElements));
}

// The window of `w` of a dtype's pool from `base` on, as a new tensor of
// `layout`'s sizes and dtype (Note [Checkpoints from a pool]): element j is
// the window's element (base + j) mod kSharedPoolElements, scaled; its
// digest noted (note_digest) as its runs are written. A tensor of more than
// one run is drawn run by run in parallel.
at::Tensor draw_from_pool(const at::Tensor& pool, const at::Tensor& layout, int64_t base,
                          const PoolWindow& w) {
  const at::ScalarType dtype = pool.scalar_type();
  at::Tensor out(at::detail::empty_cpu(layout.sizes(), dtype));
  const int64_t n = out.numel();
  if (n == 0) return out;
  const size_t item = pool.element_size();
  const char* window = static_cast<const char*>(pool.const_data_ptr()) + w.offset * item;
  char* dst = static_cast<char*>(out.mutable_data_ptr());
  const bool by_loop = !at::isFloatingType(dtype)
                           ? !at::isComplexType(dtype)
                           : scaled_by_mul(dtype) || float8_through_float(dtype);
  // `len` elements of the output from `start` on, read from the window's
  // element `from` on.
  const auto copy_stretch = [&](int64_t start, int64_t from, int64_t len) {
    const char* src = window + from * item;
    char* to = dst + start * item;
    if (!by_loop) {  // complex, or a floating dtype the loop does not handle
      out.view(-1)
          .narrow(0, start, len)
          .copy_(scaled_with_ops(pool.narrow(0, w.offset + from, len), w.scale));
    } else if (!at::isFloatingType(dtype)) {  // integers and bool: unscaled
      std::memcpy(to, src, static_cast<size_t>(len) * item);
    } else {
      AT_DISPATCH_V2(dtype, "draw_from_pool",
                     AT_WRAP([&] { scale_into<scalar_t>(src, to, len, w.scale); }), at::kFloat,
                     at::kDouble, at::kHalf, at::kBFloat16, at::kFloat8_e4m3fn, at::kFloat8_e5m2,
                     at::kFloat8_e4m3fnuz, at::kFloat8_e5m2fnuz);
    }
  };
  // The output in the runs its digest is taken in (Note [A digest instead
  // of a copy]): each run's elements copied, in stretches where the pool
  // wraps, then digested while they are in the cache.
  TensorDigest digest(dtype, out.sizes(), static_cast<size_t>(n) * item);
  const int64_t per_run = static_cast<int64_t>(kDigestRun / item);
  const auto draw_runs = [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const int64_t first = k * per_run;
      const int64_t last = std::min(n, first + per_run);
      for (int64_t j = first; j < last;) {
        const int64_t from = (base + j) % kSharedPoolElements;
        const int64_t len = std::min(last - j, kSharedPoolElements - from);
        copy_stretch(j, from, len);
        j += len;
      }
      digest.run(k, dst + first * static_cast<int64_t>(item));
    }
  };
  if (digest.runs() == 1) {
    draw_runs(0, 1);  // most tensors: no thread handed work
  } else {
    at::parallel_for(0, digest.runs(), 1, draw_runs);
  }
  note_digest(out, digest.value());
  return out;
}

}  // namespace

CheckpointPools::CheckpointPools(const Checkpoint& layouts) {
  std::map<at::ScalarType, at::Tensor> pools;
  for (const auto& [name, layout] : layouts) {
    if (!layout.is_meta()) {
      entries_.emplace(name, Entry{layout, {}, std::nullopt});
      continue;
    }
    const at::ScalarType dtype = layout.scalar_type();
    at::Tensor& pool = pools[dtype];
    if (!pool.defined()) {
      // Each dtype's pool from a generator of its own: the same whatever
      // else the layouts hold.
      at::Generator gen = at::detail::createCPUGenerator(0x5EED0000u + static_cast<int>(dtype));
      pool = random_values(kSharedPoolElements + kPoolWindows, dtype, gen);
    }
    entries_.emplace(name, Entry{pool, layout, base_of(name)});
  }
}

Checkpoint CheckpointPools::draw(uint64_t seed) const {
  const PoolWindow w = pool_window(seed);
  std::vector<const Entry*> entries;
  std::vector<int64_t> bytes;
  for (const auto& [name, e] : entries_) {
    entries.push_back(&e);
    const at::Tensor& shape = e.base ? e.layout : e.pool;
    bytes.push_back(shape.numel() * static_cast<int64_t>(shape.element_size()));
  }
  // The tensors in parallel, the largest first (a model's tensors are of
  // very uneven sizes); a tensor longer than the pool draws its stretches
  // on the thread that took it.
  std::vector<at::Tensor> drawn(entries.size());
  parallel_items(bytes, [&](size_t i) {
    const Entry& e = *entries[i];
    drawn[i] = e.base ? draw_from_pool(e.pool, e.layout, *e.base, w) : draw_with_ops(e.pool, w);
  });
  Checkpoint ckpt;
  size_t i = 0;
  for (const auto& [name, e] : entries_) ckpt.emplace(name, std::move(drawn[i++]));
  return ckpt;
}

const at::Tensor& CheckpointPools::pool(const std::string& name) const {
  const auto it = entries_.find(name);
  TORCH_CHECK(it != entries_.end(), "CheckpointPools: no pool for '", name, "'");
  return it->second.pool;
}

std::optional<int64_t> CheckpointPools::base(const std::string& name) const {
  const auto it = entries_.find(name);
  TORCH_CHECK(it != entries_.end(), "CheckpointPools: no pool for '", name, "'");
  return it->second.base;
}

int64_t CheckpointPools::nbytes() const {
  std::set<const void*> seen;
  int64_t bytes = 0;
  for (const auto& [name, e] : entries_) {
    if (e.pool.has_storage() && seen.insert(e.pool.storage().data()).second) {
      bytes += static_cast<int64_t>(e.pool.storage().nbytes());
    }
  }
  return bytes;
}

}  // namespace reloadsafe::harness
