// Every backend of the reload harness on CUDA, through a captured CUDA graph:
// capture the forward once, then reload new checkpoints many times and replay
// the graph after each. A sample backend's replay must equal the forward of a
// cold load of the new checkpoint, and every address the graph captured must
// still be the live address of its tensor. A negative control must be caught
// by its replay output: the graph keeps reading the tensor it captured, so
// the output is stale.
//
// RELOADSAFE_GRAPH_RELOADS sets the reloads per backend and mode (default 100).
#include "conformance/harness/harness.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>

namespace reloadsafe::harness {
namespace {

int reloads_per_mode() {
  const char* env = std::getenv("RELOADSAFE_GRAPH_RELOADS");
  return env != nullptr ? std::max(1, std::atoi(env)) : 100;
}

struct GraphRun {
  int replays = 0;
  int stale_replays = 0;    // replay output differs from the cold forward
  int moved_addresses = 0;  // a captured tensor is no longer at its address
};

// Captures the backend's forward, then reloads and replays `reloads` times.
GraphRun capture_and_reload(const Backend& backend, ReloadMode mode, int reloads) {
  const c10::Device cuda(c10::kCUDA, 0);
  ReloadSession session(backend, cuda, /*seed=*/1);
  at::Generator gen = at::detail::createCPUGenerator(7919);
  const at::Tensor x = at::randn(backend.input_shape(), gen, at::kFloat).to(cuda);

  // What the graph reads, kept alive the way a running engine keeps them:
  // the handles the forward used at capture time.
  std::vector<std::pair<std::string, at::Tensor>> captured;
  std::map<std::string, const void*> captured_address;
  for (const auto& [name, t] : session.kernel_visible()) {
    captured.emplace_back(name, t.detach());
    captured_address[name] = t.data_ptr();
  }

  at::Tensor out;
  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStreamGuard side(c10::cuda::getStreamFromPool());
    out = backend.forward(session.layer(), x);  // warm-up and output buffer
    graph.capture_begin();
    out.copy_(backend.forward(session.layer(), x));
    graph.capture_end();
  }
  at::cuda::device_synchronize();

  GraphRun run;
  for (int r = 1; r <= reloads; ++r) {
    const Checkpoint ckpt = session.random_checkpoint(1000003ull * r + static_cast<int>(mode));
    session.reload(mode, ckpt);
    for (const auto& [name, t] : session.kernel_visible()) {
      auto it = captured_address.find(name);
      if (it == captured_address.end() || it->second != t.data_ptr()) ++run.moved_addresses;
    }
    out.zero_();  // a replay that writes nothing must not pass
    graph.replay();
    at::cuda::device_synchronize();
    ++run.replays;
    const at::Tensor expected = session.cold_forward(ckpt, x);
    if (!at::allclose(out, expected, 1e-4, 1e-4)) ++run.stale_replays;
  }
  return run;
}

class CudaGraphReload : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!at::cuda::is_available()) {
      GTEST_SKIP() << "no CUDA device is visible (at::cuda::is_available() is false); the "
                      "CUDA-graph reload tests need a GPU";
    }
  }
};

TEST_F(CudaGraphReload, SampleBackendsReplayTheNewWeightsAtTheCapturedAddresses) {
  const int reloads = reloads_per_mode();
  int total_replays = 0;
  for (const auto& backend : BackendRegistry::instance().create_all()) {
    if (backend->negative_control()) continue;
    for (ReloadMode mode : backend->modes()) {
      SCOPED_TRACE(backend->name() + std::string(" ") + to_string(mode));
      GraphRun run = capture_and_reload(*backend, mode, reloads);
      total_replays += run.replays;
      EXPECT_EQ(run.replays, reloads);
      EXPECT_EQ(run.moved_addresses, 0);
      EXPECT_EQ(run.stale_replays, 0);
    }
  }
  RecordProperty("replays", total_replays);
}

TEST_F(CudaGraphReload, NegativeControlsAreCaughtByStaleReplayOutput) {
  const int reloads = std::min(reloads_per_mode(), 10);
  int total_replays = 0;
  for (const auto& backend : BackendRegistry::instance().create_all()) {
    if (!backend->negative_control()) continue;
    for (ReloadMode mode : {ReloadMode::kNormal, ReloadMode::kDirect}) {
      SCOPED_TRACE(backend->name() + std::string(" ") + to_string(mode));
      GraphRun run = capture_and_reload(*backend, mode, reloads);
      total_replays += run.replays;
      EXPECT_EQ(run.stale_replays, run.replays) << "every replay must read the stale tensor";
      EXPECT_GT(run.moved_addresses, 0);
    }
  }
  RecordProperty("replays", total_replays);
}

TEST_F(CudaGraphReload, HarnessPassesOnCuda) {
  RunOptions options;
  options.device = c10::Device(c10::kCUDA, 0);
  options.reloads = 10;
  for (const auto& backend : BackendRegistry::instance().create_all()) {
    SCOPED_TRACE(backend->name());
    EXPECT_TRUE(run_backend(*backend, options).ok());
  }
}

}  // namespace
}  // namespace reloadsafe::harness
