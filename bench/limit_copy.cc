#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "bench/limit_copy.h"

#include "utils/dense_copy.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>

namespace reloadsafe::bench {

void limit_copy_bytes(uint8_t* dst, const uint8_t* src, int64_t n, int threads, bool stream) {
  const auto copy = [&](int64_t begin, int64_t end) {
    if (stream) {
      stream_copy_bytes(dst + begin, src + begin, static_cast<size_t>(end - begin));
    } else {
      std::memcpy(dst + begin, src + begin, static_cast<size_t>(end - begin));
    }
  };
  if (threads <= 1) {
    copy(0, n);
  } else {
    at::parallel_for(0, n, std::max<int64_t>(n / threads, 1), copy);
  }
}

}  // namespace reloadsafe::bench
