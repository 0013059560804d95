// replace_bench: replace_parameter's address-keeping paths against the copy
// limit of the same bytes, and the cost of deciding that a tensor does not fit.
//
//   bazel run -c opt //bench:replace_bench -- --benchmark_out=$PWD/replace.json
//   bazel run -c opt //bench:replace_bench -- --reloadsafe_large   # adds 128 and 512 MiB
//
// Names (sizes 4 KiB to 256 MiB, the bytes the new tensor holds):
//   BM_Replace/in_place/bytes:<N>/real_time       same layout: copied into the
//       parameter (float32 into float32)
//   BM_Replace/placed/bytes:<N>/real_time         equal-size repack to another
//       dtype, placed into the parameter's storage by in_own_storage
//       (float32 <-> int32 views of one buffer, alternating so that every
//       call repacks)
//   BM_Replace/direct_reload/bytes:<N>/manual_time  a weight grown to the
//       whole storage under DirectReloadScope; the parameter is reset to its
//       loaded half-size view outside the timed region before each call
//   BM_Replace/memcpy/bytes:<N>/real_time         memcpy of the same bytes
//       between resident buffers
//   BM_Replace/stream_copy/bytes:<N>/real_time    the same with AVX2 streaming
//       (non-temporal) stores; the limit of a size is the faster of the two
//   BM_Replace/all_cores/<series>/...             the same series with
//       LibTorch's threads = the CPUs this process may use; the limits split
//       the bytes over those threads (at::parallel_for, memcpy or streaming
//       stores per chunk). The series above run on one thread.
//   BM_InOwnStorage/decision_unplaced/real_time   in_own_storage for a small
//       tensor that does not fit (so it returns it unplaced): the decision
//       alone, nothing copied
//
// Each benchmark checks after its loop that the parameter kept its address
// and holds the new values, and fails otherwise: a path that silently
// reallocated would measure the wrong thing.
#include "bench/bench_main.h"
#include "bench/limit_copy.h"
#include "utils/dense_copy.h"
#include "utils/layer.h"
#include "utils/reload_context.h"
#include "utils/replace_parameter.h"
#include "utils/storage_fit.h"
#include "utils/tensor_attrs.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace reloadsafe::bench {
namespace {

using Clock = std::chrono::steady_clock;

// A layer whose "weight" parameter is `data` (made a parameter object).
struct OneWeight : Layer {
  explicit OneWeight(const at::Tensor& data) { register_param("weight", make_parameter(data)); }
  at::Tensor weight() const { return get("weight"); }
};

// Fails the benchmark unless the weight still starts at `address` and holds
// `expected`.
void check_kept(benchmark::State& state, const OneWeight& layer, const void* address,
                const at::Tensor& expected) {
  const at::Tensor w = layer.weight();
  if (w.data_ptr() != address) {
    state.SkipWithError("the parameter moved: the address-keeping path was not taken");
  } else if (!at::equal(w, expected)) {
    state.SkipWithError("the parameter does not hold the new tensor's values");
  }
}

int64_t floats(int64_t nbytes) {
  return nbytes / static_cast<int64_t>(sizeof(float));
}

void replace_in_place(benchmark::State& state, int threads) {
  guarded(state, [&] {
    ScopedThreads scoped(threads);
    const int64_t n = state.range(0);
    OneWeight layer(at::zeros({floats(n)}));
    const at::Tensor src = at::full({floats(n)}, 1.5f);
    const void* address = layer.weight().data_ptr();
    for (auto _ : state) replace_parameter(layer, "weight", src);
    state.SetBytesProcessed(state.iterations() * n);
    check_kept(state, layer, address, src);
  });
}

void replace_placed(benchmark::State& state, int threads) {
  guarded(state, [&] {
    ScopedThreads scoped(threads);
    const int64_t n = state.range(0);
    OneWeight layer(at::zeros({floats(n)}));
    // The parameter alternates between the two dtypes, so each call is a
    // repack. Both sources are views of one buffer (0x3FC00000 is 1.5f), so
    // the bytes touched are those of the memcpy it is compared with.
    const at::Tensor bits = at::full({floats(n)}, 0x3FC00000, at::kInt);
    const at::Tensor srcs[2] = {bits, bits.view(at::kFloat)};
    const void* address = layer.weight().data_ptr();
    int64_t i = 0;
    for (auto _ : state) replace_parameter(layer, "weight", srcs[i++ & 1]);
    state.SetBytesProcessed(state.iterations() * n);
    check_kept(state, layer, address, srcs[(i - 1) & 1]);
  });
}

void replace_direct_reload(benchmark::State& state, int threads) {
  guarded(state, [&] {
    ScopedThreads scoped(threads);
    const int64_t n = state.range(0);
    const at::Tensor room = at::zeros({floats(n)});
    const at::Tensor loaded = room.narrow(0, 0, floats(n) / 2);  // the weight as loaded
    OneWeight layer(loaded);
    const at::Tensor grown = at::full({floats(n)}, 2.5f);  // fills the whole storage
    const void* address = layer.weight().data_ptr();
    DirectReloadScope direct;
    for (auto _ : state) {
      layer.weight().set_data(loaded);  // untimed: back to the loaded view
      const Clock::time_point t0 = Clock::now();
      replace_parameter(layer, "weight", grown);
      const Clock::time_point t1 = Clock::now();
      state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
    }
    state.SetBytesProcessed(state.iterations() * n);
    check_kept(state, layer, address, grown);
  });
}

// The limits: memcpy or streaming stores, on one thread or split over
// `threads` (each thread copies one contiguous chunk).
void copy_limit(benchmark::State& state, int threads, bool stream) {
  ScopedThreads scoped(threads);
  const int64_t n = state.range(0);
  const at::Tensor src = at::full({n}, 1, at::kByte);  // both resident: filled
  at::Tensor dst = at::zeros({n}, at::kByte);
  auto* d = static_cast<uint8_t*>(dst.data_ptr());
  const auto* s = static_cast<const uint8_t*>(src.const_data_ptr());
  for (auto _ : state) {
    limit_copy_bytes(d, s, n, threads, stream);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n);
}

void in_own_storage_decision(benchmark::State& state) {
  guarded(state, [&] {
    const at::Tensor old = at::zeros({4, 4});
    const at::Tensor bigger = at::zeros({4, 8});  // more bytes than `old`: does not fit
    if (!in_own_storage(old, bigger).is_same(bigger)) {
      state.SkipWithError("the tensor was placed: this benchmark must measure the decision only");
      return;
    }
    for (auto _ : state) {
      at::Tensor result = in_own_storage(old, bigger);
      benchmark::DoNotOptimize(result.unsafeGetTensorImpl());
    }
  });
}

BenchMainOptions register_benchmarks(bool large) {
  // With --reloadsafe_large, also the sizes around and above dense_copy_'s
  // sweep (128 and 512 MiB; about 2 GiB of memory at 512 MiB).
  const std::vector<int64_t> extra =
      large ? std::vector<int64_t>{int64_t{128} << 20, int64_t{512} << 20} : std::vector<int64_t>{};
  const auto sized = [extra](benchmark::internal::Benchmark* b) {
    b->ArgName("bytes")->RangeMultiplier(4)->Range(4 << 10, 256 << 20);
    for (int64_t n : extra) b->Arg(n);
    return b->Unit(benchmark::kMicrosecond);
  };
  BenchMainOptions options;
  options.help = "  --reloadsafe_large  also measure 128 and 512 MiB (about 2 GiB of memory)\n";
  options.copy_sizes = {int64_t{256} << 20};
  options.copy_sizes.insert(options.copy_sizes.end(), extra.begin(), extra.end());
  struct Series {
    std::string prefix;  // "BM_Replace/" or "BM_Replace/all_cores/"
    int threads;
    std::string what;  // in the targets' descriptions
  };
  const int cores = all_cores();
  for (const Series& series :
       {Series{"BM_Replace/", 1, "one thread"},
        Series{"BM_Replace/all_cores/", cores, std::to_string(cores) + " threads"}}) {
    const int t = series.threads;
    const auto reg = [&](const char* name, auto fn) {
      return sized(benchmark::RegisterBenchmark((series.prefix + name).c_str(),
                                                [t, fn](benchmark::State& st) { fn(st, t); }));
    };
    reg("in_place", replace_in_place)->UseRealTime();
    reg("placed", replace_placed)->UseRealTime();
    reg("direct_reload", replace_direct_reload)->UseManualTime();
    reg("memcpy", [](benchmark::State& st, int n) { copy_limit(st, n, false); })->UseRealTime();
    reg("stream_copy", [](benchmark::State& st, int n) { copy_limit(st, n, true); })->UseRealTime();
    const std::string limit = series.prefix + "memcpy/|" + series.prefix + "stream_copy/";
    for (const char* path : {"in_place", "placed", "direct_reload"}) {
      options.targets.push_back(
          {Target::Kind::kEachAtLeast,
           std::string("replace_parameter ") + path + " / copy limit (" + series.what + ")",
           series.prefix + path + "/", limit, 16 << 20, 0.9});
    }
  }
  benchmark::RegisterBenchmark("BM_InOwnStorage/decision_unplaced", in_own_storage_decision)
      ->UseRealTime()
      ->Unit(benchmark::kNanosecond);
  options.targets.push_back({Target::Kind::kTimeAtMost, "in_own_storage decision, small tensor",
                             "BM_InOwnStorage/decision_unplaced", "", 0, 1000});
  options.targets.push_back({Target::Kind::kTimeAtMost,
                             "replace_parameter in_place, 4 KiB, one thread (per call)",
                             "BM_Replace/in_place/bytes:4096/", "", 0, 500});
  options.context = {{"replace_bench_all_cores_threads", std::to_string(cores)}};
  return options;
}

}  // namespace
}  // namespace reloadsafe::bench

int main(int argc, char** argv) {
  const bool large = reloadsafe::bench::take_flag(&argc, argv, "reloadsafe_large").has_value();
  return reloadsafe::bench::run_benchmarks(argc, argv,
                                           reloadsafe::bench::register_benchmarks(large));
}
