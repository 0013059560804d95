// What the reload harness costs, against the work it cannot avoid.
//
// A backend author's suite runs the protocol (conformance/harness/protocol.h)
// over many layers, so a harness run must cost little more than the loads,
// post-processings and forwards the protocol makes anyway. For each sample
// backend (negative controls excepted), on the CPU:
//
//   BM_HarnessRun/<backend>/traced/process_time    run_backend, 10 reloads per mode, both
//                                                  modes
//   BM_HarnessRun/<backend>/untraced/process_time  the same with RunOptions::trace off
//   BM_OwnWork/<backend>/process_time              20 x (new layer + load + post-processing
//                                                  + forward): the layer's own work for as
//                                                  many reloads (ReloadSession::cold_forward)
//   BM_Forward/<backend>/{untraced,traced,captured}/process_time
//                                                  one forward, bare, under a ReadTrace, and
//                                                  captured (trace + held arguments)
//
// All on one thread, timed in process CPU time, which other processes on a
// shared machine do not inflate (bench/compare.py judges /process_time
// benchmarks by it).
//
// Targets (ratios within the run): a traced harness run <= 3 x its own work,
// and <= 1.3 x the untraced run (the tracing overhead), for each sample and
// as the median over the samples.
//
//   bazel run -c opt //bench:harness_bench -- --benchmark_repetitions=5
//   bench/compare.py harness_bench
#include "bench/bench_main.h"

#include "conformance/harness/harness.h"
#include "conformance/trace/capture.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

namespace reloadsafe::bench {
namespace {

using harness::Backend;
using harness::BackendRegistry;
using harness::BackendSubject;
using harness::ReloadSession;
using harness::RunOptions;
using trace::CapturedForward;

constexpr int kReloads = 10;                 // per mode, as check_reload's default
constexpr int kOwnWorkUnits = 2 * kReloads;  // one per reload of both modes

void harness_run(benchmark::State& state, const Backend& backend, bool trace) {
  ScopedThreads threads(1);
  RunOptions options;
  options.reloads = kReloads;
  options.trace = trace;
  guarded(state, [&] {
    for (auto _ : state) {
      const harness::BackendReport report = harness::run_backend(backend, options);
      if (!report.ok()) {
        state.SkipWithError(("the backend did not pass: " + harness::to_table({report})).c_str());
        break;
      }
    }
  });
}

void own_work(benchmark::State& state, const Backend& backend) {
  ScopedThreads threads(1);
  guarded(state, [&] {
    ReloadSession session(backend, c10::kCPU, /*seed=*/1);
    const harness::Checkpoint ckpt = session.draw_checkpoint(2);
    at::Generator gen = at::detail::createCPUGenerator(3);
    const at::Tensor x = at::randn(backend.input_shape(), gen, at::kFloat);
    for (auto _ : state) {
      for (int i = 0; i < kOwnWorkUnits; ++i) {
        benchmark::DoNotOptimize(session.cold_forward(ckpt, x).const_data_ptr());
      }
    }
  });
}

enum class How { kUntraced, kTraced, kCaptured };

void forward(benchmark::State& state, const Backend& backend, How how) {
  ScopedThreads threads(1);
  guarded(state, [&] {
    BackendSubject subject(backend, c10::kCPU);
    subject.cold_load(subject.draw_checkpoint(1));
    const at::Tensor x = subject.draw_input(2);
    for (auto _ : state) {
      if (how == How::kUntraced) {
        benchmark::DoNotOptimize(subject.forward(x).const_data_ptr());
      } else if (how == How::kTraced) {
        trace::ReadTrace trace;
        benchmark::DoNotOptimize(subject.forward(x).const_data_ptr());
        trace.stop();
      } else {
        CapturedForward capture([&] { return subject.forward(x); });
        benchmark::DoNotOptimize(capture.output().const_data_ptr());
      }
    }
  });
}

BenchMainOptions register_benchmarks() {
  BenchMainOptions options;
  // Held for the life of the process: the benchmarks refer to them.
  static std::vector<std::shared_ptr<Backend>> backends;
  for (auto& owned : BackendRegistry::instance().create_all()) {
    if (!owned->negative_control()) backends.emplace_back(std::move(owned));
  }
  for (const auto& b : backends) {
    const Backend* backend = b.get();
    const std::string name = backend->name();
    const std::string run = "BM_HarnessRun/" + name + "/";
    const std::string own = "BM_OwnWork/" + name + "/";
    benchmark::RegisterBenchmark((run + "traced").c_str(),
                                 [backend](benchmark::State& s) { harness_run(s, *backend, true); })
        ->MeasureProcessCPUTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(
        (run + "untraced").c_str(),
        [backend](benchmark::State& s) { harness_run(s, *backend, false); })
        ->MeasureProcessCPUTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("BM_OwnWork/" + name).c_str(),
                                 [backend](benchmark::State& s) { own_work(s, *backend); })
        ->MeasureProcessCPUTime()
        ->Unit(benchmark::kMillisecond);
    for (const auto& [how, label] :
         {std::pair{How::kUntraced, "untraced"}, std::pair{How::kTraced, "traced"},
          std::pair{How::kCaptured, "captured"}}) {
      benchmark::RegisterBenchmark(
          ("BM_Forward/" + name + "/" + label).c_str(),
          [backend, how = how](benchmark::State& s) { forward(s, *backend, how); })
          ->MeasureProcessCPUTime()
          ->Unit(benchmark::kMicrosecond);
    }
    // The own-work target first: compare.py measures a harness run's
    // slowdown against its own work (the first pair named for a prefix).
    options.targets.push_back({Target::Kind::kTimeRatioAtMost,
                               "harness run, traced / 20 x own work (" + name + ")",
                               run + "traced/", own, 0, 3.0});
    options.targets.push_back({Target::Kind::kTimeRatioAtMost,
                               "tracing overhead: harness run traced / untraced (" + name + ")",
                               run + "traced/", run + "untraced/", 0, 1.3});
    options.references.emplace_back(run + "untraced/", own);
    options.references.emplace_back("BM_Forward/" + name + "/traced/",
                                    "BM_Forward/" + name + "/untraced/");
    options.references.emplace_back("BM_Forward/" + name + "/captured/",
                                    "BM_Forward/" + name + "/untraced/");
  }
  // The same two ratios as medians over the samples, each sample's own
  // ratio still judged above: on a sample whose forward is many ops of a few
  // hundred nanoseconds each, the trace's fixed work per op (boxing the
  // arguments for the fallback, recording each read) is most of its cost.
  options.targets.push_back({Target::Kind::kMedianTimeRatioAtMost,
                             "harness run, traced / 20 x own work (median over the samples)",
                             "BM_HarnessRun/*/traced/", "BM_OwnWork/*/", 0, 3.0});
  options.targets.push_back({Target::Kind::kMedianTimeRatioAtMost,
                             "tracing overhead: harness run traced / untraced (median over the "
                             "samples)",
                             "BM_HarnessRun/*/traced/", "BM_HarnessRun/*/untraced/", 0, 1.3});
  options.context = {{"harness_bench_reloads_per_mode", std::to_string(kReloads)},
                     {"harness_bench_threads", "1"}};
  return options;
}

}  // namespace
}  // namespace reloadsafe::bench

int main(int argc, char** argv) {
  return reloadsafe::bench::run_benchmarks(argc, argv, reloadsafe::bench::register_benchmarks());
}
