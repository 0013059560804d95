#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "utils/copy_weight.h"

#include "utils/dense_copy.h"

#include <c10/util/Exception.h>

#include <dlfcn.h>
#include <unistd.h>

namespace reloadsafe {
namespace {

thread_local std::optional<bool> integrated_override;

// cudaDeviceGetAttribute, found at run time: the CPU build of reloadsafe
// needs no CUDA headers, and a CUDA build of LibTorch has already loaded the
// CUDA runtime when a CUDA device exists.
using GetAttributeFn = int (*)(int* value, int attr, int device);
constexpr int kCudaDevAttrIntegrated = 18;

GetAttributeFn cuda_get_attribute() {
  static GetAttributeFn fn = []() -> GetAttributeFn {
    for (const char* lib : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
      if (void* handle = dlopen(lib, RTLD_NOW | RTLD_LOCAL)) {
        if (void* sym = dlsym(handle, "cudaDeviceGetAttribute")) {
          return reinterpret_cast<GetAttributeFn>(sym);
        }
      }
    }
    return nullptr;
  }();
  return fn;
}

}  // namespace

int64_t page_size() {
  static const int64_t size = sysconf(_SC_PAGESIZE);
  return size;
}

bool is_integrated_gpu(const c10::Device& device) {
  if (integrated_override.has_value()) return *integrated_override;
  if (!device.is_cuda()) return false;
  // Decision: when the answer cannot be had (no loadable CUDA runtime, or the
  // runtime reports an error, e.g. no such device), the device counts as not
  // integrated. The page touch only speeds up copies on integrated GPUs; a
  // plain copy_ is always correct, and copy_ itself reports a missing device.
  GetAttributeFn get = cuda_get_attribute();
  if (get == nullptr) return false;
  int integrated = 0;
  const int err = get(&integrated, kCudaDevAttrIntegrated, device.has_index() ? device.index() : 0);
  return err == 0 && integrated != 0;
}

ScopedIntegratedGpuOverride::ScopedIntegratedGpuOverride(bool integrated)
    : previous_(integrated_override) {
  integrated_override = integrated;
}

ScopedIntegratedGpuOverride::~ScopedIntegratedGpuOverride() {
  integrated_override = previous_;
}

int64_t touch_pages(const at::Tensor& src) {
  TORCH_CHECK(src.device().is_cpu() && src.is_contiguous(),
              "touch_pages: the source must be a contiguous CPU tensor");
  const int64_t nbytes = src.numel() * static_cast<int64_t>(src.element_size());
  if (nbytes == 0) return 0;
  const volatile uint8_t* bytes = static_cast<const uint8_t*>(src.const_data_ptr());
  const int64_t step = page_size();
  uint8_t sink = 0;
  int64_t reads = 0;
  for (int64_t i = 0; i < nbytes; i += step, ++reads) sink ^= bytes[i];
  sink ^= bytes[nbytes - 1];
  ++reads;
  (void)sink;
  return reads;
}

at::Tensor& copy_weight_(at::Tensor& dst, const at::Tensor& src) {
  TORCH_CHECK(dst.defined() && src.defined(), "copy_weight_: dst and src must be tensors");
  if (src.device().is_cpu() && src.dtype() == dst.dtype() && src.numel() > 1 &&
      src.is_contiguous() && is_integrated_gpu(dst.device())) {
    touch_pages(src);
  }
  // A CPU destination: dense same-dtype bytes at the copy limit, else copy_.
  dense_copy_(dst, src);
  return dst;
}

}  // namespace reloadsafe
