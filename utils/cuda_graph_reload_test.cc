// The utilities on CUDA: a forward captured in a CUDA graph keeps reading the
// weight after replace_parameter reloads it, because the weight keeps its
// address. Skips (with the reason) where no CUDA device is visible.
#include "utils/copy_weight.h"
#include "utils/reload_context.h"
#include "utils/replace_parameter.h"
#include "utils/tensor_attrs.h"

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>

namespace reloadsafe {
namespace {

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!at::cuda::is_available()) {
      GTEST_SKIP() << "no CUDA device is visible (at::cuda::is_available() is false); "
                      "this test needs a GPU";
    }
  }
  at::TensorOptions cuda(at::ScalarType dtype = at::kFloat) const {
    return at::TensorOptions().dtype(dtype).device(at::kCUDA);
  }
};

TEST_F(CudaTest, ReplayAfterReloadReadsTheNewWeights) {
  Layer layer;
  layer.register_param("weight", make_parameter(at::randn({64, 64}, cuda())));
  at::Tensor x = at::randn({8, 64}, cuda());
  at::Tensor out = at::empty({8, 64}, cuda());
  const void* weight_ptr = layer.get("weight").data_ptr();

  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromPool());
    at::mm_out(out, x, layer.get("weight").t());  // warm-up outside capture
    graph.capture_begin();
    at::mm_out(out, x, layer.get("weight").t());
    graph.capture_end();
  }
  for (int reload = 0; reload < 10; ++reload) {
    SCOPED_TRACE(reload);
    at::Tensor fresh = at::randn({64, 64}, cuda());
    replace_parameter(layer, "weight", fresh);
    ASSERT_EQ(layer.get("weight").data_ptr(), weight_ptr);
    out.zero_();  // a replay that writes nothing must fail
    graph.replay();
    at::cuda::getCurrentCUDAStream().synchronize();
    EXPECT_TRUE(at::allclose(out, at::mm(x, fresh.t()), 1e-4, 1e-4));
  }
}

TEST_F(CudaTest, DirectReloadGrownWeightKeepsTheCapturedAddress) {
  Layer layer;
  at::Tensor room = at::zeros({32, 16}, cuda());
  layer.register_param("weight", make_parameter(room.narrow(0, 0, 16)));
  const void* ptr = layer.get("weight").data_ptr();
  at::Tensor grown = at::randn({32, 16}, cuda());
  {
    DirectReloadScope direct;
    replace_parameter(layer, "weight", grown);
  }
  EXPECT_EQ(layer.get("weight").data_ptr(), ptr);
  EXPECT_TRUE(at::equal(layer.get("weight"), grown));
}

TEST_F(CudaTest, CopyWeightOnADiscreteDeviceIsAPlainExactCopy) {
  const c10::Device device(at::kCUDA, 0);
  const bool integrated = at::cuda::getDeviceProperties(0)->integrated != 0;
  EXPECT_EQ(is_integrated_gpu(device), integrated);
  at::Tensor src = at::randn({1 << 16});
  at::Tensor dst = at::empty({1 << 16}, cuda());
  copy_weight_(dst, src);
  EXPECT_TRUE(at::equal(dst.cpu(), src));
  ScopedIntegratedGpuOverride force(true);
  at::Tensor dst2 = at::empty({1 << 16}, cuda());
  copy_weight_(dst2, src);
  EXPECT_TRUE(at::equal(dst2.cpu(), src));
}

}  // namespace
}  // namespace reloadsafe
