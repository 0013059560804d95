// What tracing costs: each sample backend's forward untraced, under a
// ReadTrace, and captured (trace plus held arguments); and a whole harness
// run (5 reloads, both modes) with and without the trace.
//
//   bazel run -c opt //conformance/harness:trace_bench -- --benchmark_repetitions=5
#include "conformance/harness/harness.h"
#include "conformance/trace/capture.h"

#include <benchmark/benchmark.h>

#include <memory>
#include <string>

namespace reloadsafe::harness {
namespace {

enum class How { kUntraced, kTraced, kCaptured };

void register_forward(const std::shared_ptr<Backend>& backend, How how, const char* label) {
  benchmark::RegisterBenchmark(
      ("BM_Forward/" + backend->name() + "/" + label).c_str(),
      [backend, how](benchmark::State& state) {
        BackendSubject subject(*backend, c10::kCPU);
        subject.cold_load(subject.draw_checkpoint(1));
        const at::Tensor x = subject.draw_input(2);
        for (auto _ : state) {
          if (how == How::kUntraced) {
            benchmark::DoNotOptimize(subject.forward(x));
          } else if (how == How::kTraced) {
            trace::ReadTrace trace;
            benchmark::DoNotOptimize(subject.forward(x));
            trace.stop();
          } else {
            trace::CapturedForward capture([&] { return subject.forward(x); });
            benchmark::DoNotOptimize(capture.output());
          }
        }
      });
}

void register_harness(const std::shared_ptr<Backend>& backend, bool trace) {
  benchmark::RegisterBenchmark(
      ("BM_HarnessRun/" + backend->name() + (trace ? "/trace" : "/no_trace")).c_str(),
      [backend, trace](benchmark::State& state) {
        RunOptions options;
        options.reloads = 5;
        options.trace = trace;
        for (auto _ : state) {
          BackendReport report = run_backend(*backend, options);
          if (!report.ok()) state.SkipWithError("the backend did not pass");
        }
      })
      ->Unit(benchmark::kMillisecond);
}

}  // namespace
}  // namespace reloadsafe::harness

int main(int argc, char** argv) {
  using namespace reloadsafe::harness;
  for (auto& owned : BackendRegistry::instance().create_all()) {
    if (owned->negative_control()) continue;
    std::shared_ptr<Backend> backend(std::move(owned));
    register_forward(backend, How::kUntraced, "untraced");
    register_forward(backend, How::kTraced, "traced");
    register_forward(backend, How::kCaptured, "captured");
    register_harness(backend, false);
    register_harness(backend, true);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
