#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "utils/dense_copy.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/complex.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace reloadsafe {
namespace {

// A byte tensor of `n` bytes holding a pattern that differs for each seed.
at::Tensor pattern(int64_t n, int seed) {
  at::Tensor t = at::empty({n}, at::kByte);
  auto* p = t.data_ptr<uint8_t>();
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(i * 31 + seed * 7 + (i >> 11));
  return t;
}

std::vector<uint8_t> bytes_of(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.const_data_ptr());
  return std::vector<uint8_t>(p, p + c.numel() * c.element_size());
}

// The raw copy kernels: every length around the 32- and 128-byte steps, at
// every misalignment of source and destination within a cache line, in both
// modes; bytes outside the destination range stay as they were.
TEST(DenseCopyKernels, ByteExactAtEveryLengthAndAlignment) {
  const std::vector<size_t> lengths = {0,   1,   31,  32,  33,   127,  128,   129,
                                       255, 256, 257, 999, 4096, 4097, 65537, (1 << 20) + 3};
  const size_t guard = 64;
  for (bool parallel : {false, true}) {
    for (bool stream : {false, true}) {
      for (size_t n : lengths) {
        for (size_t dmis : {0, 1, 7, 31, 33}) {
          for (size_t smis : {0, 3, 32}) {
            SCOPED_TRACE("parallel=" + std::to_string(parallel) +
                         " stream=" + std::to_string(stream) + " n=" + std::to_string(n) + " dst+" +
                         std::to_string(dmis) + " src+" + std::to_string(smis));
            const int64_t total = static_cast<int64_t>(n + 2 * guard + 64);
            at::Tensor src = pattern(total, 1);
            at::Tensor dst = pattern(total, 2);
            const std::vector<uint8_t> before = bytes_of(dst);
            auto* d = dst.data_ptr<uint8_t>() + guard + dmis;
            const auto* s = src.data_ptr<uint8_t>() + guard + smis;
            if (parallel) {
              parallel_copy_bytes(d, s, n, stream);
            } else if (stream) {
              stream_copy_bytes(d, s, n);
            } else {
              std::memcpy(d, s, n);
            }
            const std::vector<uint8_t> after = bytes_of(dst);
            const size_t first = guard + dmis;
            for (size_t i = 0; i < after.size(); ++i) {
              const uint8_t want = i >= first && i < first + n ? s[i - first] : before[i];
              ASSERT_EQ(after[i], want) << "byte " << i;
            }
          }
        }
      }
    }
  }
}

// dense_copy_ on pairs of tensors: which path it takes, and that the result
// is copy_'s, byte for byte.
TEST(DenseCopy, TakesTheBytePathOnlyWhereItIsCopyExactly) {
  struct Case {
    std::string name;
    std::function<std::pair<at::Tensor, at::Tensor>()> make;  // (dst, src)
    bool byte_path;
  };
  const auto f32 = [](std::vector<int64_t> shape, int seed) {
    return at::arange(at::IntArrayRef(shape).size() ? c10::multiply_integers(shape) : 1, at::kFloat)
        .add_(seed * 1000)
        .view(shape);
  };
  const std::vector<Case> cases = {
      {"contiguous 4 KiB", [&] { return std::make_pair(f32({1024}, 0), f32({1024}, 1)); }, true},
      {"contiguous 3 MiB (parallel split)",
       [&] { return std::make_pair(f32({3 << 18}, 0), f32({3 << 18}, 1)); }, true},
      {"odd byte count", [&] { return std::make_pair(pattern(1001, 1), pattern(1001, 2)); }, true},
      {"zero-dim", [&] { return std::make_pair(at::scalar_tensor(1.0), at::scalar_tensor(2.0)); },
       true},
      {"empty",
       [&] {
         return std::make_pair(f32({0, 4}, 0), f32({0, 4}, 1));
       },
       true},
      {"both transposed (dense, same strides)",
       [&] {
         return std::make_pair(f32({8, 16}, 0).t(), f32({8, 16}, 1).t());
       },
       true},
      {"misaligned views at an odd offset",
       [&] {
         return std::make_pair(pattern(5000, 1).narrow(0, 3, 4096),
                               pattern(5000, 2).narrow(0, 1, 4096));
       },
       true},
      {"dtype mismatch", [&] { return std::make_pair(f32({64}, 0), f32({64}, 1).to(at::kDouble)); },
       false},
      {"shape mismatch (broadcast)",
       [&] {
         return std::make_pair(f32({4, 16}, 0), f32({16}, 1));
       },
       false},
      {"strides differ (transposed source)",
       [&] {
         return std::make_pair(f32({16, 16}, 0), f32({16, 16}, 1).t());
       },
       false},
      {"non-dense destination (every other column)",
       [&] {
         return std::make_pair(f32({8, 32}, 0).slice(1, 0, 32, 2),
                               f32({8, 32}, 1).slice(1, 0, 32, 2));
       },
       false},
      {"expanded source",
       [&] {
         return std::make_pair(f32({4, 4}, 0), f32({4}, 1).expand({4, 4}));
       },
       false},
      {"overlapping ranges in one storage",
       [&] {
         at::Tensor base = f32({200}, 0);
         return std::make_pair(base.narrow(0, 0, 100), base.narrow(0, 50, 100));
       },
       false},
      {"conjugate source",
       [&] {
         at::Tensor c = at::complex(f32({8}, 1), f32({8}, 2));
         return std::make_pair(at::zeros({8}, at::kComplexFloat), c.conj());
       },
       false},
      {"destination requires grad",
       [&] { return std::make_pair(f32({8}, 0).requires_grad_(), f32({8}, 1)); }, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto [dst, src] = c.make();
    EXPECT_EQ(dense_copy_applies(dst, src), c.byte_path);
    // copy_'s answer: the same copy onto a scratch copy of the destination's
    // storage (a source in that storage is read from the scratch copy too).
    const auto storage_copy = [](const at::Tensor& t) {
      at::Tensor bytes = at::empty({static_cast<int64_t>(t.storage().nbytes())}, at::kByte);
      // An empty storage has no data pointer, and memcpy takes none, even for 0 bytes.
      if (t.storage().nbytes() > 0) {
        std::memcpy(bytes.data_ptr(), t.storage().data(), t.storage().nbytes());
      }
      return bytes;
    };
    const at::Tensor scratch = storage_copy(dst);
    const std::vector<uint8_t> before = bytes_of(scratch);
    const auto on_scratch = [&](const at::Tensor& t) {
      at::Tensor v = at::empty({0}, t.options().requires_grad(false));
      v.set_(scratch.storage(), t.storage_offset(), t.sizes(), t.strides());
      return t.is_conj() ? v.conj() : v;
    };
    at::Tensor want = on_scratch(dst);
    const at::Tensor read =
        src.storage().data() == dst.storage().data() ? on_scratch(src) : src.detach();
    bool copy_refuses = false;
    try {
      want.copy_(read);
    } catch (const c10::Error&) {
      copy_refuses = true;
    }
    if (copy_refuses) {  // e.g. partial overlap: dense_copy_ refuses the same way
      EXPECT_THROW(dense_copy_(dst, src), c10::Error);
      EXPECT_EQ(bytes_of(storage_copy(dst)), before) << "a refused copy changed the destination";
      continue;
    }
    const void* address = dst.const_data_ptr();
    const size_t storage_bytes = dst.storage().nbytes();
    if (dst.requires_grad()) {
      c10::AutoGradMode no_grad(false);
      dense_copy_(dst, src);
    } else {
      dense_copy_(dst, src);
    }
    EXPECT_EQ(dst.const_data_ptr(), address);
    EXPECT_EQ(dst.storage().nbytes(), storage_bytes);
    EXPECT_EQ(bytes_of(dst.detach()), bytes_of(want));
  }
}

TEST(DenseCopy, TryLeavesTheDestinationAloneWhenItDoesNotApply) {
  at::Tensor dst = at::zeros({16});
  const at::Tensor src = at::ones({16}, at::kDouble);
  EXPECT_FALSE(try_dense_copy(dst, src));
  EXPECT_EQ(dst.sum().item<float>(), 0.0f);
}

TEST(DenseCopy, BumpsTheVersionLikeCopy) {
  at::Tensor dst = at::zeros({1024});
  const at::Tensor src = at::ones({1024});
  const auto v0 = dst._version();
  ASSERT_TRUE(try_dense_copy(dst, src));
  EXPECT_EQ(dst._version(), v0 + 1);
  at::Tensor ref = at::zeros({1024});
  const auto r0 = ref._version();
  ref.copy_(src);
  EXPECT_EQ(ref._version() - r0, dst._version() - v0);
}

// Around the measured crossover, and with one and two threads: a 32 MiB copy
// (above the crossover of any machine where streaming wins at all within the
// measured range, or below it) is byte-exact either way.
TEST(DenseCopy, LargeCopiesAreExactWithEitherThreadCount) {
  const int threads = at::get_num_threads();
  for (int t : {1, 2}) {
    SCOPED_TRACE("threads=" + std::to_string(t));
    at::set_num_threads(t);
    const int64_t crossover = stream_crossover_bytes();
    EXPECT_GE(crossover, int64_t{256} << 10);
    EXPECT_EQ(stream_crossover_bytes(), crossover);  // measured once
    for (int64_t n : {int64_t{1} << 20, (int64_t{32} << 20) + 5}) {
      at::Tensor src = pattern(n, 3);
      at::Tensor dst = pattern(n, 4);
      dense_copy_(dst, src);
      EXPECT_TRUE(at::equal(dst, src)) << n << " bytes";
    }
  }
  at::set_num_threads(threads);
}

// Above the sweep's range (128 MiB and more): the first copy made in a band
// measures both ways on its own buffers, leaves the source's bytes, and
// records the band's choice; later copies in the band use it.
TEST(DenseCopy, TheFirstCopyOfALargeBandMeasuresItAndIsExact) {
  if (std::getenv("RELOADSAFE_STREAM_CROSSOVER") != nullptr) {
    GTEST_SKIP() << "RELOADSAFE_STREAM_CROSSOVER fixes every size: no band is measured";
  }
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const int64_t n = (int64_t{128} << 20) + 4099;  // band 27: [128 MiB, 256 MiB)
  EXPECT_FALSE(large_copy_streams(n).has_value()) << "no copy of this band was made yet";
  EXPECT_FALSE(large_copy_streams(64 << 20).has_value()) << "the sweep's range has no bands";
  const at::Tensor src = pattern(n, 5);
  at::Tensor dst = pattern(n, 6);
  dense_copy_(dst, src);
  EXPECT_TRUE(at::equal(dst, src));
  const std::optional<bool> choice = large_copy_streams(n);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(large_copy_streams((int64_t{256} << 20) - 1), choice) << "the same band";
  EXPECT_FALSE(large_copy_streams(int64_t{256} << 20).has_value()) << "the next band";
  at::Tensor again = pattern(n, 7);
  dense_copy_(again, src);
  EXPECT_TRUE(at::equal(again, src));
  at::set_num_threads(threads);
}

}  // namespace
}  // namespace reloadsafe
