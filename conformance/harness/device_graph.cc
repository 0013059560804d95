#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/device_graph.h"

#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <array>
#include <atomic>

namespace reloadsafe::harness {
namespace {

// One slot per device type; written by static initialisers before main.
std::array<std::atomic<DeviceGraphCapture>,
           static_cast<size_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES)>&
captures() {
  static std::array<std::atomic<DeviceGraphCapture>,
                    static_cast<size_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES)>
      slots{};
  return slots;
}

// Whether the dispatcher has a CUDA kernel for aten::mm: true exactly when
// libtorch_cuda is loaded into this process (it registers the kernels).
bool cuda_kernels_registered() {
  auto op = c10::Dispatcher::singleton().findSchema({"aten::mm", ""});
  return op.has_value() && op->hasKernelForDispatchKey(c10::DispatchKey::CUDA);
}

}  // namespace

DeviceGraphCapture device_graph_capture(c10::DeviceType type) {
  return captures()[static_cast<size_t>(type)].load();
}

bool register_device_graph_capture(c10::DeviceType type, DeviceGraphCapture capture) {
  captures()[static_cast<size_t>(type)].store(capture);
  return true;
}

std::string cuda_unavailable_reason() {
  if (!cuda_kernels_registered()) {
    return "this binary was built without CUDA: LibTorch's CUDA library (libtorch_cuda.so) is not "
           "linked, so no CUDA kernel is registered; rebuild it on a machine with the CUDA Toolkit "
           "(CUDA_HOME, nvcc on PATH or /usr/local/cuda)";
  }
  if (device_graph_capture(c10::kCUDA) == nullptr) {
    return "this binary was built without the CUDA graph step "
           "(conformance/harness:device_graph_cuda "
           "is not linked); rebuild it on a machine with the CUDA Toolkit";
  }
  if (!at::globalContext().hasCUDA()) {
    return "no CUDA device is visible (CUDA is linked into this binary, but the driver reports no "
           "device: check nvidia-smi and CUDA_VISIBLE_DEVICES)";
  }
  return "";
}

std::string cuda_build_info() {
  std::string info = cuda_kernels_registered() ? "CUDA linked (aten::mm has a CUDA kernel"
                                               : "CUDA not linked (aten::mm has no CUDA kernel";
  info += device_graph_capture(c10::kCUDA) != nullptr ? ", graph step linked)" : ", no graph step)";
  const bool visible = cuda_kernels_registered() && at::globalContext().hasCUDA();
  info += visible ? "; a CUDA device is visible" : "; no CUDA device visible";
  return info;
}

}  // namespace reloadsafe::harness
