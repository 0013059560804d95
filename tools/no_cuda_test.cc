// Stand-in for a GPU test on a machine without the CUDA Toolkit: the real
// test needs CUDA headers to compile. It skips and says why.
#include <gtest/gtest.h>

TEST(NoCudaToolkit, GpuTestNotBuilt) {
  GTEST_SKIP() << "no CUDA Toolkit was found when this workspace was configured "
                  "(set CUDA_HOME), so this GPU test was not compiled";
}
