// copy_weight.h: copying checkpoint tensors into weights, with the page
// faults of an mmap'd checkpoint taken on the CPU on integrated GPUs.
//
// On an integrated GPU (GB10, GH200, Jetson: the GPU shares the host's
// memory), a host-to-device copy straight from an mmap'd safetensors file
// takes each page fault inside the driver's copy, which is several times
// slower than faulting the pages in on the CPU first. copy_weight_ reads one
// byte of every page the source spans before the copy there; everywhere else
// it is a plain copy_.
//
// Invariant: copy_weight_ writes only `dst`'s elements, exactly as
// `dst.copy_(src)` does; the page touch only reads `src`. No storage is
// resized or moved.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>

namespace reloadsafe {

/// `copy_weight_(dst, src)`: `dst.copy_(src)` for weight loaders; returns
/// `dst`. When `src` is a contiguous CPU tensor of `dst`'s dtype with more
/// than one element and `dst` is on an integrated GPU, one byte of each page
/// `src` spans is read first (sources with at most one element are skipped,
/// as in the reference). `dst` keeps its address.
at::Tensor& copy_weight_(at::Tensor& dst, const at::Tensor& src);

/// `_is_integrated_gpu(device)`: true for a CUDA device whose properties say
/// it is integrated (cudaDevAttrIntegrated); false for every other device,
/// and false when the CUDA runtime cannot be loaded or cannot answer (so
/// copy_weight_ is a plain copy there). Never throws. A
/// ScopedIntegratedGpuOverride on this thread takes precedence.
bool is_integrated_gpu(const c10::Device& device);

/// Forces is_integrated_gpu() to `integrated` for every device on this thread
/// while the scope lives; restores the previous setting after. For tests and
/// benchmarks of the integrated path on machines without one.
class ScopedIntegratedGpuOverride {
 public:
  explicit ScopedIntegratedGpuOverride(bool integrated);
  ~ScopedIntegratedGpuOverride();
  ScopedIntegratedGpuOverride(const ScopedIntegratedGpuOverride&) = delete;
  ScopedIntegratedGpuOverride& operator=(const ScopedIntegratedGpuOverride&) = delete;

 private:
  std::optional<bool> previous_;
};

/// The page size the OS reports (`sysconf(_SC_PAGESIZE)`, Python's
/// `mmap.PAGESIZE`).
int64_t page_size();

/// Reads one byte at every page-size step from the first byte of `src`, and
/// its last byte, so that every page it spans is faulted in; returns the
/// number of bytes read. `src` must be a contiguous CPU tensor. Reads only.
int64_t touch_pages(const at::Tensor& src);

}  // namespace reloadsafe
