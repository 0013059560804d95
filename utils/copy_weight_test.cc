#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "utils/copy_weight.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace reloadsafe {
namespace {

// An anonymous private mapping: its pages are not resident until something
// reads or writes them, so mincore tells which pages a call touched.
class FreshMapping {
 public:
  explicit FreshMapping(size_t pages) : bytes_(pages * page_size()) {
    ptr_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(ptr_, MAP_FAILED);
  }
  ~FreshMapping() { munmap(ptr_, bytes_); }
  uint8_t* data() const { return static_cast<uint8_t*>(ptr_); }
  std::vector<bool> resident() const {
    std::vector<unsigned char> v(bytes_ / page_size());
    EXPECT_EQ(mincore(ptr_, bytes_, v.data()), 0);
    std::vector<bool> out;
    for (unsigned char c : v) out.push_back(c & 1);
    return out;
  }

 private:
  size_t bytes_;
  void* ptr_;
};

TEST(PageSize, IsWhatTheOsReports) {
  EXPECT_EQ(page_size(), sysconf(_SC_PAGESIZE));
}

TEST(IsIntegratedGpu, FalseOffCudaAndForceable) {
  EXPECT_FALSE(is_integrated_gpu(c10::Device(c10::kCPU)));
  EXPECT_FALSE(is_integrated_gpu(c10::Device(c10::kMeta)));
  {
    ScopedIntegratedGpuOverride force(true);
    EXPECT_TRUE(is_integrated_gpu(c10::Device(c10::kCPU)));
    {
      ScopedIntegratedGpuOverride off(false);
      EXPECT_FALSE(is_integrated_gpu(c10::Device(c10::kCPU)));
    }
    EXPECT_TRUE(is_integrated_gpu(c10::Device(c10::kCPU)));
  }
  EXPECT_FALSE(is_integrated_gpu(c10::Device(c10::kCPU)));
}

// Where the CUDA runtime cannot be loaded, or cannot answer (no device with
// that index), the question answers false and copy_weight_ is a plain copy;
// it never throws. On a machine with a discrete GPU the answer is false too.
TEST(IsIntegratedGpu, NoRuntimeOrNoDeviceAnswersFalseWithoutThrowing) {
  for (const char* device : {"cuda", "cuda:0", "cuda:7"}) {
    SCOPED_TRACE(device);
    bool integrated = true;
    EXPECT_NO_THROW(integrated = is_integrated_gpu(c10::Device(device)));
    if (std::string(device) == "cuda:7") {
      EXPECT_FALSE(integrated);
    }
  }
}

TEST(CopyWeight, ForcedIntegratedTouchesEveryPageTheSourceSpansAndNoOther) {
  // Source: from the middle of page 1 to the middle of page 4 of 6 pages.
  FreshMapping map(6);
  const int64_t p = page_size();
  const int64_t begin = p + p / 2, end = 4 * p + p / 2;
  at::Tensor src = at::from_blob(map.data() + begin, {end - begin}, at::kByte);
  // A meta destination: copy_ reads nothing, so only the touch shows.
  at::Tensor dst = at::empty({end - begin}, at::TensorOptions().dtype(at::kByte).device(at::kMeta));
  ASSERT_EQ(map.resident(), std::vector<bool>(6, false));
  {
    ScopedIntegratedGpuOverride force(true);
    copy_weight_(dst, src);
  }
  EXPECT_EQ(map.resident(), (std::vector<bool>{false, true, true, true, true, false}));
}

TEST(CopyWeight, NotIntegratedTouchesNothing) {
  FreshMapping map(4);
  at::Tensor src = at::from_blob(map.data(), {4 * page_size()}, at::kByte);
  at::Tensor dst = at::empty_like(src, at::TensorOptions().device(at::kMeta));
  ScopedIntegratedGpuOverride force(false);
  copy_weight_(dst, src);
  EXPECT_EQ(map.resident(), std::vector<bool>(4, false));
}

TEST(CopyWeight, SkipsWhatTheReferenceSkips) {
  ScopedIntegratedGpuOverride force(true);
  struct Case {
    const char* name;
    at::ScalarType src_dtype, dst_dtype;
    int64_t numel;
    bool transposed;
  } cases[] = {
      {"other dtype", at::kByte, at::kInt, 2 * 4096, false},
      {"one element", at::kByte, at::kByte, 1, false},
      {"not contiguous", at::kByte, at::kByte, 2 * 4096, true},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    FreshMapping map(4);
    at::Tensor src = at::from_blob(map.data(), {c.numel}, c.src_dtype);
    if (c.transposed) src = src.view({2, c.numel / 2}).t();
    at::Tensor dst =
        at::empty(src.sizes(), at::TensorOptions().dtype(c.dst_dtype).device(at::kMeta));
    copy_weight_(dst, src);
    EXPECT_EQ(map.resident(), std::vector<bool>(4, false));
  }
}

TEST(CopyWeight, CopyIsExactAndKeepsTheDestination) {
  for (bool integrated : {false, true}) {
    SCOPED_TRACE(integrated);
    ScopedIntegratedGpuOverride force(integrated);
    at::Tensor src = at::randn({1000, 33});
    at::Tensor dst = at::zeros({1000, 33});
    const void* ptr = dst.data_ptr();
    at::Tensor& out = copy_weight_(dst, src);
    EXPECT_TRUE(out.is_same(dst));
    EXPECT_EQ(dst.data_ptr(), ptr);
    EXPECT_TRUE(at::equal(dst, src));
    // Converting and strided copies are plain copy_ too.
    at::Tensor half = at::zeros({33, 1000}, at::kHalf);
    copy_weight_(half, src.t());
    EXPECT_TRUE(at::equal(half, src.t().to(at::kHalf)));
  }
}

TEST(TouchPages, ReadsOnePerPagePlusTheLastByte) {
  const int64_t p = page_size();
  at::Tensor t = at::zeros({3 * p + 1}, at::kByte);
  EXPECT_EQ(touch_pages(t), 4 + 1);
  EXPECT_EQ(touch_pages(at::zeros({0}, at::kByte)), 0);
  EXPECT_THROW(touch_pages(t.view({1, -1}).expand({2, -1})), c10::Error);
}

}  // namespace
}  // namespace reloadsafe
