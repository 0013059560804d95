// case_runner_fuzzer.cc: a coverage-guided (libFuzzer) target over the
// conformance case runner (conformance/case_runner.h) on arbitrary input.
//
// For every input line, evaluate_case must:
//  - return (never throw, abort, hang or trip a sanitizer);
//  - return one line of JSON: an object whose first key is "id";
//  - echo the case's id when it evaluated the case (no "error");
//  - return the same line when asked again (cases share no state).
//
// The runner lets a case allocate up to 1 GiB (kMaxCaseStorageBytes, case_tensors.h), which
// is legal but would make single inputs take seconds and gigabytes under
// AddressSanitizer. The harness therefore installs a CPU allocator that
// refuses allocations above kMaxAllocation with c10::OutOfMemoryError, as a
// machine without that memory would: the runner must report that as an
// error line like any other.
//
//   bazel build //fuzz:case_runner_fuzzer
//   bazel-bin/fuzz/case_runner_fuzzer -dict=fuzz/corpus/case_runner.dict \
//       -max_total_time=600 /tmp/case_corpus fuzz/corpus/case_runner_fuzzer

#define TORCH_ASSERT_NO_OPERATORS

#include "conformance/case_runner.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

namespace {

constexpr size_t kMaxAllocation = size_t{16} << 20;  // 16 MiB per tensor allocation

#define FUZZ_CHECK(cond, line)                                                             \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "property violated: %s (%s:%d)\noutput: %s\n", #cond, __FILE__, \
                   __LINE__, (line).c_str());                                              \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)

class CappedCpuAllocator final : public c10::Allocator {
 public:
  explicit CappedCpuAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    TORCH_CHECK_WITH(OutOfMemoryError, n <= kMaxAllocation, "case_runner_fuzzer: refusing a ", n,
                     "-byte CPU allocation (the harness allows ", kMaxAllocation, ")");
    return base_->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return base_->raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    base_->copy_data(dest, src, count);
  }

 private:
  c10::Allocator* base_;
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  static CappedCpuAllocator capped(c10::GetDefaultCPUAllocator());
  c10::SetAllocator(c10::DeviceType::CPU, &capped, /*priority=*/1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string line(reinterpret_cast<const char*>(data), size);
  std::string out;
  try {
    out = reloadsafe::conformance::evaluate_case(line);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "evaluate_case threw: %s\n", e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "evaluate_case threw a non-standard exception\n");
    std::abort();
  }
  FUZZ_CHECK(out.find('\n') == std::string::npos, out);
  const nlohmann::ordered_json result = nlohmann::ordered_json::parse(out, nullptr, false);
  FUZZ_CHECK(!result.is_discarded() && result.is_object() && !result.empty(), out);
  FUZZ_CHECK(result.begin().key() == "id", out);
  if (!result.contains("error")) {
    const nlohmann::json input = nlohmann::json::parse(line, nullptr, false);
    FUZZ_CHECK(input.is_object(), out);
    const nlohmann::json id = input.contains("id") ? input["id"] : nlohmann::json();
    FUZZ_CHECK(result["id"].dump() == id.dump(), out);
  }
  FUZZ_CHECK(reloadsafe::conformance::evaluate_case(line) == out, out);
  return 0;
}
