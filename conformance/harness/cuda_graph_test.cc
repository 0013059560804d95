// Every backend of the reload harness on CUDA, through a captured CUDA graph:
// capture the forward once, then reload new checkpoints many times and replay
// the graph after each. A sample backend's replay must equal the forward of a
// cold load of the new checkpoint, and every address the graph captured must
// still be the live address of its tensor. A negative control that breaks a
// value must be caught by its replay output on every reload: the graph keeps
// reading the tensor it captured, freed and zeroed by the graph step's
// quarantine (a leak and a scratch workspace break no value; the trace
// flags them). The protocol's graph step itself and the quarantine have
// tests of their own at the end.
//
// Seeds, reload count and tolerance are the protocol's: the seed of a run
// with default options, its input from input_seed() and reload r's
// checkpoint from reload_seed() (run_options.h), kDefaultReloads reloads per
// backend and mode (RELOADSAFE_GRAPH_RELOADS sets another count), and a
// replay compared with a cold load's forward by close() (values.h).
#include "conformance/harness/device_graph.h"
#include "conformance/harness/harness.h"
#include "conformance/harness/run_options.h"
#include "conformance/harness/step_table.h"
#include "conformance/harness/values.h"
#include "conformance/trace/read_trace.h"

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros_like.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <string>

namespace reloadsafe::harness {
namespace {

int reloads_per_mode() {
  const char* env = std::getenv("RELOADSAFE_GRAPH_RELOADS");
  return env != nullptr ? std::max(1, std::atoi(env)) : kDefaultReloads;
}

// The seed of a protocol run with default options: the cold load's
// checkpoint; input_seed() and reload_seed() derive the others from it.
uint64_t run_seed() {
  return RunOptions().seed;
}

// The input a protocol run of `seed` hands `backend`'s forward, on `device`.
at::Tensor run_input(const Backend& backend, uint64_t seed, const c10::Device& device) {
  return BackendSubject(backend, device).draw_input(input_seed(seed));
}

struct GraphRun {
  int replays = 0;
  int stale_replays = 0;    // replay output differs from the cold forward
  int moved_addresses = 0;  // a captured tensor is no longer at its address
};

// Captures the backend's forward with the protocol's graph step (its
// quarantine included, Note [Device quarantine]), then reloads and replays
// `reloads` times.
GraphRun capture_and_reload(const Backend& backend, ReloadMode mode, int reloads) {
  const c10::Device cuda(c10::kCUDA, 0);
  const uint64_t seed = run_seed();
  ReloadSession session(backend, cuda, seed);
  const at::Tensor x = run_input(backend, seed, cuda);
  backend.forward(session.layer(), x);  // engines warm up before they capture

  // Where the graph's tensors are, after the warm-up (state the first
  // forward makes, a workspace, is part of the capture).
  std::map<std::string, const void*> captured_address;
  for (const auto& [name, t] : session.kernel_visible()) captured_address[name] = t.data_ptr();

  const DeviceGraphCapture capture = device_graph_capture(c10::kCUDA);
  TORCH_CHECK(capture != nullptr, cuda_unavailable_reason());
  std::unique_ptr<CapturedDeviceGraph> graph =
      capture(cuda, [&] { return backend.forward(session.layer(), x); });

  GraphRun run;
  for (int r = 1; r <= reloads; ++r) {
    const Checkpoint ckpt = session.draw_checkpoint(reload_seed(seed, r));
    session.reload(mode, ckpt);
    for (const auto& [name, t] : session.kernel_visible()) {
      auto it = captured_address.find(name);
      if (it == captured_address.end() || it->second != t.data_ptr()) ++run.moved_addresses;
    }
    const at::Tensor out = graph->replay();  // the output is poisoned first
    ++run.replays;
    const at::Tensor expected = session.cold_forward(ckpt, x);
    if (!close(out, expected)) ++run.stale_replays;
  }
  return run;
}

// Note [Kernel arguments against the trace]
// The read trace sees what the dispatcher sees; the hardware reads what the
// captured kernels were given. Every kernel node of a captured graph carries
// its argument buffer; cuFuncGetParamInfo gives each argument's offset and
// size. A pointer-sized argument that points into a live device allocation is
// a read (or write) the graph bakes in: it must lie in a storage the trace
// recorded, or in the graph's own pool (memory made during capture). Library
// workspaces (cuBLAS) are neither; they are listed, not failed. What must
// never happen is a kernel reading one of the layer's own tensors through a
// pointer the trace did not record: the trace would then have missed a read.

// Driver entry points, found through the runtime so the binary does not link
// libcuda (it must start, and skip, on machines without a driver).
struct Driver {
  PFN_cuGraphKernelNodeGetParams_v12000 kernel_node_params = nullptr;
  PFN_cuFuncGetParamInfo_v12040 param_info = nullptr;
  PFN_cuKernelGetFunction_v12000 kernel_function = nullptr;
  PFN_cuPointerGetAttribute_v4000 pointer_attribute = nullptr;

  std::string load() {
    auto get = [](const char* name, void** fn, unsigned version) -> bool {
      cudaDriverEntryPointQueryResult found{};
      return cudaGetDriverEntryPointByVersion(name, fn, version, cudaEnableDefault, &found) ==
                 cudaSuccess &&
             found == cudaDriverEntryPointSuccess && *fn != nullptr;
    };
    if (!get("cuGraphKernelNodeGetParams", reinterpret_cast<void**>(&kernel_node_params), 12000))
      return "cuGraphKernelNodeGetParams";
    if (!get("cuFuncGetParamInfo", reinterpret_cast<void**>(&param_info), 12040))
      return "cuFuncGetParamInfo (driver older than CUDA 12.4)";
    if (!get("cuKernelGetFunction", reinterpret_cast<void**>(&kernel_function), 12000))
      return "cuKernelGetFunction";
    if (!get("cuPointerGetAttribute", reinterpret_cast<void**>(&pointer_attribute), 4000))
      return "cuPointerGetAttribute";
    return "";
  }
};

struct Range {
  uintptr_t begin, end;
  bool contains(uintptr_t p) const { return begin <= p && p < end; }
};

// What a scan of a graph's kernel nodes found, to say why it found no
// pointer argument when it finds none.
struct KernelScan {
  std::vector<uintptr_t> pointers;  // pointer-sized arguments into live device memory
  int nodes = 0, kernel_nodes = 0, params_failed = 0, no_function = 0, no_param_info = 0;
  int words = 0;  // aligned words of arguments looked at
  CUresult last_error = CUDA_SUCCESS;

  std::string summary() const {
    return std::to_string(nodes) + " nodes, " + std::to_string(kernel_nodes) + " kernel nodes, " +
           std::to_string(params_failed) + " whose parameters could not be read, " +
           std::to_string(no_function) + " without a function, " + std::to_string(no_param_info) +
           " without parameter info, " + std::to_string(words) +
           " argument words; last driver error " + std::to_string(last_error);
  }
};

// Every aligned word of `graph`'s kernel arguments that points into a live
// device allocation.
KernelScan kernel_pointer_arguments(const Driver& driver, cudaGraph_t graph) {
  KernelScan scan;
  size_t n = 0;
  EXPECT_EQ(cudaGraphGetNodes(graph, nullptr, &n), cudaSuccess);
  std::vector<cudaGraphNode_t> nodes(n);
  EXPECT_EQ(cudaGraphGetNodes(graph, nodes.data(), &n), cudaSuccess);
  scan.nodes = static_cast<int>(n);
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    if (cudaGraphNodeGetType(node, &type) != cudaSuccess || type != cudaGraphNodeTypeKernel)
      continue;
    ++scan.kernel_nodes;
    CUDA_KERNEL_NODE_PARAMS_v2 params{};
    if (CUresult r = driver.kernel_node_params(reinterpret_cast<CUgraphNode>(node), &params);
        r != CUDA_SUCCESS) {
      ++scan.params_failed;
      scan.last_error = r;
      continue;
    }
    CUfunction func = params.func;
    if (func == nullptr && params.kern != nullptr) {
      if (CUresult r = driver.kernel_function(&func, params.kern); r != CUDA_SUCCESS) {
        scan.last_error = r;
      }
    }
    if (func == nullptr || params.kernelParams == nullptr) {
      ++scan.no_function;
      continue;
    }
    for (size_t i = 0;; ++i) {
      size_t offset = 0, size = 0;
      if (CUresult r = driver.param_info(func, i, &offset, &size); r != CUDA_SUCCESS) {
        if (i == 0) {
          ++scan.no_param_info;
          scan.last_error = r;
        }
        break;
      }
      // PyTorch's kernels mostly take structs by value (a TensorIterator's
      // data pointers, a GEMM's parameter block): every aligned word of every
      // argument is a candidate pointer, not only pointer-sized arguments.
      const auto* bytes = static_cast<const unsigned char*>(params.kernelParams[i]);
      for (size_t at = 0; at + sizeof(void*) <= size; at += sizeof(void*)) {
        ++scan.words;
        uintptr_t value = 0;
        std::memcpy(&value, bytes + at, sizeof(value));
        CUdeviceptr start = 0;
        if (value != 0 &&
            driver.pointer_attribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                     static_cast<CUdeviceptr>(value)) == CUDA_SUCCESS) {
          scan.pointers.push_back(value);
        }
      }
    }
  }
  return scan;
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
    if (backend->negative_control() || backend->cpu_only()) continue;
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
  const int reloads = std::min(reloads_per_mode(), kDefaultReloads);
  int total_replays = 0;
  for (const auto& backend : BackendRegistry::instance().create_all()) {
    if (!backend->negative_control() || backend->cpu_only()) continue;
    for (ReloadMode mode : {ReloadMode::kNormal, ReloadMode::kDirect}) {
      SCOPED_TRACE(backend->name() + std::string(" ") + to_string(mode));
      GraphRun run = capture_and_reload(*backend, mode, reloads);
      total_replays += run.replays;
      // Two controls break no value a replay computes: a leak, and a scratch
      // workspace the graph writes before it reads it (the trace flags both).
      // Nor do the controls whose bug only a step of the protocol brings out
      // (Backend::steps(): a sleep, re-created parameters, a memory bound),
      // which plain reloads never take. Every other one reads a stale tensor
      // (or a host number baked into a launch) on every replay, with the
      // quarantine, not only when the allocator hands out another block.
      const ReloadSteps steps = backend->steps();
      const bool needs_a_step =
          takes_kind(steps, StepKind::kEngine) || takes_kind(steps, StepKind::kBound);
      const bool value_visible = backend->name() != "neg_leak" &&
                                 backend->name() != "neg_workspace_per_reload" && !needs_a_step;
      EXPECT_EQ(run.stale_replays, value_visible ? run.replays : 0);
    }
  }
  RecordProperty("replays", total_replays);
}

// See Note [Kernel arguments against the trace].
TEST_F(CudaGraphReload, KernelArgumentsPointIntoTheTracedReadSetOrTheGraphPool) {
  Driver driver;
  const std::string missing = driver.load();
  if (!missing.empty()) GTEST_SKIP() << "the CUDA driver lacks " << missing;
  int kernels_checked = 0;
  std::string scans;  // what each backend's scan found, for the failure message
  for (const auto& backend : BackendRegistry::instance().create_all()) {
    if (backend->negative_control() || backend->cpu_only()) continue;
    SCOPED_TRACE(backend->name());
    const c10::Device cuda(c10::kCUDA, 0);
    const uint64_t seed = run_seed();
    ReloadSession session(*backend, cuda, seed);
    const at::Tensor x = run_input(*backend, seed, cuda);
    at::cuda::CUDAGraph graph(/*keep_graph=*/true);
    std::vector<Range> traced;
    {
      c10::cuda::CUDAStreamGuard side(c10::cuda::getStreamFromPool());
      at::Tensor out = backend->forward(session.layer(), x);  // warm-up
      trace::ReadTrace trace;
      graph.capture_begin();
      out = backend->forward(session.layer(), x);
      graph.capture_end();
      trace.stop();
      for (const auto& op : trace.ops()) {
        for (const auto& r : op.reads) {
          if (r.storage_data == nullptr) continue;
          const auto begin = reinterpret_cast<uintptr_t>(r.storage_data);
          traced.push_back({begin, begin + r.storage_nbytes});
        }
      }
    }
    std::vector<Range> pool, layer_tensors;
    for (const auto& segment :
         c10::cuda::CUDACachingAllocator::snapshot(graph.pool(), false).segments) {
      if (segment.owner_private_pool_id == graph.pool())
        pool.push_back({segment.address, segment.address + segment.total_size});
    }
    for (const auto& named : session.named_tensors()) {
      if (!named.tensor.is_cuda() || named.tensor.storage().data() == nullptr) continue;
      const auto begin = reinterpret_cast<uintptr_t>(named.tensor.storage().data());
      layer_tensors.push_back({begin, begin + named.tensor.storage().nbytes()});
    }
    auto in = [](const std::vector<Range>& ranges, uintptr_t p) {
      return std::any_of(ranges.begin(), ranges.end(),
                         [&](const Range& r) { return r.contains(p); });
    };
    std::set<uintptr_t> unexplained;
    const KernelScan scan = kernel_pointer_arguments(driver, graph.raw_cuda_graph());
    scans += backend->name() + ": " + scan.summary() + "\n";
    for (uintptr_t p : scan.pointers) {
      ++kernels_checked;
      if (in(traced, p) || in(pool, p)) continue;
      EXPECT_FALSE(in(layer_tensors, p))
          << "a captured kernel reads the layer's tensor at 0x" << std::hex << p
          << " through a pointer the read trace did not record";
      unexplained.insert(p);
    }
    RecordProperty(backend->name() + "_unexplained_pointers", static_cast<int>(unexplained.size()));
  }
  RecordProperty("pointer_arguments_checked", kernels_checked);
  EXPECT_GT(kernels_checked, 0) << "no kernel node with a pointer argument was found:\n" << scans;
}

TEST_F(CudaGraphReload, HarnessPassesOnCudaAndReplaysTheGraphAfterEveryReload) {
  RunOptions options;
  options.device = c10::Device(c10::kCUDA, 0);
  for (const auto& backend : BackendRegistry::instance().create_all()) {
    if (backend->cpu_only()) continue;
    SCOPED_TRACE(backend->name());
    const BackendReport report = run_backend(*backend, options);
    EXPECT_TRUE(report.ok());
    if (backend->negative_control()) continue;
    for (const ModeReport& mode : report.modes) {
      EXPECT_EQ(mode.graph_replays, options.reloads) << to_string(mode.mode) << ": " << mode.error;
    }
  }
}

// Note [Device quarantine]: a block freed after the capture is never handed
// back, so a graph that reads it reads the zeroed block on every replay,
// whatever the caching allocator would have done.
TEST_F(CudaGraphReload, AGraphReadingAFreedTensorReadsPoisonOnEveryReplay) {
  const c10::Device cuda(c10::kCUDA, 0);
  const DeviceGraphCapture capture = device_graph_capture(c10::kCUDA);
  ASSERT_NE(capture, nullptr) << cuda_unavailable_reason();
  const auto options = at::TensorOptions().device(cuda);
  at::Tensor weight = at::ones({1 << 16}, options);
  const void* captured = weight.data_ptr();
  std::unique_ptr<CapturedDeviceGraph> graph = capture(cuda, [&] { return weight * 2; });
  for (int reload = 1; reload <= 5; ++reload) {
    SCOPED_TRACE(reload);
    weight.reset();  // freed first, then rebuilt: the allocator's favourite reuse
    weight = at::ones({1 << 16}, options);
    EXPECT_NE(weight.data_ptr(), captured) << "the freed block was handed back";
    const at::Tensor out = graph->replay();
    EXPECT_TRUE(at::equal(out, at::zeros_like(out)))
        << "the replay read something other than poison";
  }
}

// The protocol's graph step on a rebuilt tensor (neg_undeclared_scale):
// every reload's replay is wrong, in both modes, not only the reloads where
// the allocator happened to hand out another block.
TEST_F(CudaGraphReload, TheProtocolFlagsAStaleGraphReplayOnEveryReload) {
  RunOptions options;
  options.device = c10::Device(c10::kCUDA, 0);
  options.max_listed = 1000;
  int controls = 0;
  for (const auto& backend : BackendRegistry::instance().create_all()) {
    if (backend->name() != "neg_undeclared_scale") continue;
    ++controls;
    const BackendReport report = run_backend(*backend, options);
    for (const ModeReport& mode : report.modes) {
      SCOPED_TRACE(to_string(mode.mode));
      EXPECT_EQ(mode.error, "");
      const auto stale =
          std::count_if(mode.violations.begin(), mode.violations.end(),
                        [](const Violation& v) { return v.tensor == "cuda graph replay"; });
      EXPECT_EQ(stale, options.reloads);
    }
  }
  EXPECT_EQ(controls, 1);
}

}  // namespace
}  // namespace reloadsafe::harness
