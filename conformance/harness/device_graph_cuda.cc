// The CUDA graph step of the protocol (device_graph.h): capture with
// at::cuda::CUDAGraph, and the quarantine of Note [Device quarantine] on the
// CUDA caching allocator. Linked only where the CUDA Toolkit is found; it
// registers itself from a static initialiser, so its library is linked whole.

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/device_graph.h"

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>
#include <utility>

namespace reloadsafe::harness {
namespace {

namespace allocator = c10::cuda::CUDACachingAllocator;

// The graph's output before a replay: NaN for floating outputs, -1 for
// integers, the flipped value for booleans, so a replay that writes nothing
// cannot pass.
void poison_output(at::Tensor& out) {
  if (at::isFloatingType(out.scalar_type()) || at::isComplexType(out.scalar_type())) {
    out.fill_(std::numeric_limits<double>::quiet_NaN());
  } else if (out.scalar_type() == at::kBool) {
    out.logical_not_();
  } else {
    out.fill_(-1);
  }
}

// Note [Device quarantine]
// Every allocation on the device, from the end of the capture until the
// graph is destroyed, is routed to a pool of its own (the caching
// allocator's "allocate to pool", the mechanism graph capture itself uses,
// with a filter that accepts every stream). Blocks freed meanwhile go back
// to the default pool, which nothing allocates from any more, so they stay
// as the reload left them until poison_free_blocks() zeroes them. Without
// this the allocator hands a freed block straight back to the tensor a
// reload rebuilds, and a stale replay reads the right values by luck
// (measured on an H200: 2 of 5 reloads).
//
// The poison is zero bytes, not the CPU quarantine's 0xff: a stale read of
// an index tensor (a sort permutation, a gather's indices) must stay in
// bounds. On the CPU an index out of range is an exception; on a GPU it is a
// device-side assert that ends every later use of the device in the
// process (seen on the H200 with neg_lazy_sort's gather).
class CudaGraph final : public CapturedDeviceGraph {
 public:
  CudaGraph(const c10::Device& device, const std::function<at::Tensor()>& forward)
      : index_(device.has_index() ? device.index() : c10::cuda::current_device()),
        guard_(c10::Device(c10::kCUDA, index_)) {
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, index_);
    c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(index_);
    {
      c10::cuda::CUDAStreamGuard on_side(side);
      side.synchronize();
      caller.synchronize();
      forward();  // warm-up on the capture stream, as graph capture requires
      side.synchronize();
      graph_.capture_begin();
      try {
        at::Tensor out = forward();
        graph_.capture_end();
        out_ = out;
      } catch (...) {
        try {
          graph_.capture_end();  // leaves capture mode; its own error is the lesser one
        } catch (...) {
        }
        throw;
      }
      side.synchronize();
    }
    TORCH_CHECK(out_.defined() && out_.is_cuda(),
                "the forward captured as a CUDA graph returned no CUDA tensor (",
                out_.defined() ? out_.device().str() : std::string("undefined"),
                "): the graph step compares the forward's output, which must be on the device");
    pool_ = at::cuda::graph_pool_handle();
    allocator::beginAllocateToPool(index_, pool_, [](cudaStream_t) { return true; });
  }

  ~CudaGraph() override {
    try {
      at::cuda::device_synchronize();
      allocator::endAllocateToPool(index_, pool_);
      allocator::releasePool(index_, pool_);
    } catch (...) {
    }
  }

  at::Tensor replay() override {
    poison_output(out_);
    poison_free_blocks();
    graph_.replay();
    at::cuda::device_synchronize();
    return out_.clone();
  }

 private:
  // Zeroes every free block of the device's default pool.
  void poison_free_blocks() {
    at::cuda::device_synchronize();
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(index_).stream();
    for (const auto& segment : allocator::snapshot({0, 0}, /*include_traces=*/false).segments) {
      if (segment.device != index_) continue;
      if (segment.owner_private_pool_id != c10::MempoolId_t{0, 0}) continue;
      uintptr_t at = segment.address;
      for (const auto& block : segment.blocks) {
        if (!block.allocated && !block.active) {
          C10_CUDA_CHECK(cudaMemsetAsync(reinterpret_cast<void*>(at), 0, block.size, stream));
        }
        at += block.size;
      }
    }
  }

  c10::DeviceIndex index_;  // the device, "cuda" resolved to the current one
  c10::cuda::CUDAGuard guard_;
  at::cuda::CUDAGraph graph_;
  at::Tensor out_;
  c10::MempoolId_t pool_{0, 0};
};

std::unique_ptr<CapturedDeviceGraph> capture_cuda_graph(
    const c10::Device& device, const std::function<at::Tensor()>& forward) {
  return std::make_unique<CudaGraph>(device, forward);
}

[[maybe_unused]] const bool registered =
    register_device_graph_capture(c10::kCUDA, &capture_cuda_graph);

}  // namespace
}  // namespace reloadsafe::harness
