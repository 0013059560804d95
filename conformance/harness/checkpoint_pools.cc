#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/checkpoint_pools.h"

#include "conformance/harness/values.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Dispatch_v2.h>
#include <ATen/EmptyTensor.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>

#include <cstring>

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

// Whether `pool`'s window at `offset` is drawn by the loop below: a dense
// CPU pool (plain_cpu_bytes) at the start of a storage that holds the window,
// of a dtype the loop handles (integers, bool, and the real dtypes at::mul
// scales), smaller than ATen's grain size (where at::mul would use one
// thread too); any other goes through the op, threaded and vectorized.
bool drawn_by_loop(const at::Tensor& pool, int64_t offset) {
  const at::ScalarType dtype = pool.scalar_type();
  if (pool.numel() >= at::internal::GRAIN_SIZE || !plain_cpu_bytes(pool) ||
      pool.storage_offset() != 0 || pool.is_conj() || pool.is_neg() || at::isComplexType(dtype) ||
      (at::isFloatingType(dtype) && !scaled_by_mul(dtype) && !float8_through_float(dtype))) {
    return false;
  }
  const auto needed = static_cast<size_t>(offset + pool.numel()) * pool.element_size();
  return pool.storage().nbytes() >= needed && pool.storage().data() != nullptr;
}

// kBlock elements from `in`, times `s`, into `out`: a loop of a fixed length
// over pointers that do not alias, which the compiler vectorizes at -O2.
constexpr int64_t kBlock = 16;
template <typename T, typename Math>
void scale_block(const T* __restrict in, T* __restrict out, Math s) {
  for (int64_t j = 0; j < kBlock; ++j) out[j] = static_cast<T>(static_cast<Math>(in[j]) * s);
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
  for (; i + kBlock <= n; i += kBlock) scale_block<T, Math>(in + i, out + i, s);
  for (; i < n; ++i) out[i] = static_cast<T>(static_cast<Math>(in[i]) * s);
}

// The window as a new tensor, for a pool drawn_by_loop() accepts.
at::Tensor draw_by_loop(const at::Tensor& pool, const PoolWindow& w) {
  const at::ScalarType dtype = pool.scalar_type();
  const int64_t n = pool.numel();
  const size_t item = pool.element_size();
  const char* src = static_cast<const char*>(pool.storage().data()) + w.offset * item;
  at::Tensor out(at::detail::empty_cpu(pool.sizes(), dtype));
  void* dst = out.mutable_data_ptr();
  if (n == 0) return out;
  if (!at::isFloatingType(dtype)) {  // integers and bool: the window unscaled
    std::memcpy(dst, src, static_cast<size_t>(n) * item);
    return out;
  }
  // The floating dtypes drawn_by_loop() accepts.
  AT_DISPATCH_V2(dtype, "draw_by_loop",
                 AT_WRAP([&] { scale_into<scalar_t>(src, dst, n, w.scale); }), at::kFloat,
                 at::kDouble, at::kHalf, at::kBFloat16, at::kFloat8_e4m3fn, at::kFloat8_e5m2,
                 at::kFloat8_e4m3fnuz, at::kFloat8_e5m2fnuz);
  return out;
}

// The same through ATen ops, for any pool (contiguous, whatever the pool's
// strides: elementwise ops keep them).
at::Tensor draw_with_ops(const at::Tensor& pool, const PoolWindow& w) {
  const at::Tensor window = pool.as_strided(pool.sizes(), pool.strides(), w.offset);
  const at::ScalarType dtype = pool.scalar_type();
  if (scaled_by_mul(dtype) || at::isComplexType(dtype)) {
    return window.mul(w.scale).contiguous();
  }
  if (at::isFloatingType(dtype)) {
    return window.to(at::kFloat).mul_(w.scale).to(dtype).contiguous();  // float8: no CPU mul
  }
  return window.clone(at::MemoryFormat::Contiguous);
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

Checkpoint checkpoint_pools(const Checkpoint& layouts) {
  at::Generator gen = at::detail::createCPUGenerator(0x5EED);
  Checkpoint pools;
  for (const auto& [name, layout] : layouts) {
    if (!layout.is_meta()) {
      pools.emplace(name, layout);
      continue;
    }
    const int64_t size = layout.numel() + kPoolWindows;
    const at::ScalarType dtype = layout.scalar_type();
    at::Tensor pool;
    if (at::isFloatingType(dtype)) {
      pool = at::randn({size}, gen, at::kFloat).to(dtype);
    } else if (at::isComplexType(dtype)) {
      pool = at::randn({size}, gen, at::TensorOptions().dtype(dtype));
    } else if (dtype == at::kBool) {
      pool = at::randint(0, 2, {size}, gen, at::TensorOptions().dtype(at::kLong)).to(dtype);
    } else {
      const IntegerRange range = integer_range(dtype);
      pool =
          at::randint(range.low, range.high + 1, {size}, gen, at::TensorOptions().dtype(at::kLong))
              .to(dtype);
    }
    pools.emplace(name,
                  pool.as_strided(layout.sizes(), c10::contiguous_strides(layout.sizes()), 0));
  }
  return pools;
}

Checkpoint draw_from_pools(const Checkpoint& pools, uint64_t seed) {
  const PoolWindow w = pool_window(seed);
  Checkpoint ckpt;
  for (const auto& [name, pool] : pools) {
    ckpt.emplace(name,
                 drawn_by_loop(pool, w.offset) ? draw_by_loop(pool, w) : draw_with_ops(pool, w));
  }
  return ckpt;
}

}  // namespace reloadsafe::harness
