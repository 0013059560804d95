// harness_test_main.cc: the reload harness as a GoogleTest binary, the main
// of every reload_harness_test (conformance/harness/defs.bzl).
//
// Each backend linked into the binary (RELOADSAFE_REGISTER_BACKEND, in a
// library linked whole) becomes one test: ReloadHarness.<name> for a sample,
// ReloadHarnessControl.<name> for a negative control. A test runs the reload
// protocol in both modes (harness.h) and fails when a sample loses an address,
// a read, its values or its memory bound in a mode it claims, or when a
// negative control goes unflagged; its failure message is the backend's table
// with every violation listed. After the tests, the table of every backend is
// printed (so it is in Bazel's test log), and the JSON report goes to
// $TEST_UNDECLARED_OUTPUTS_DIR/harness.json. GoogleTest writes the XML where
// Bazel asks for it (GTEST_OUTPUT).
//
//   harness_test [--reloads N] [--device cpu|cuda[:I]] [--seed S] [--no-trace]
//       [the steps' flags: step_table.h] [gtest flags]
//
// Exit status: 0 when every test passed, 1 when one failed or no backend was
// linked, 2 on bad arguments.
#include "conformance/harness/harness.h"
#include "conformance/harness/report_format.h"
#include "conformance/harness/run_flags.h"

#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

namespace reloadsafe::harness {
namespace {

std::string usage() {
  return "usage: harness_test [--reloads N] [--device cpu|cuda[:I]] [--seed S] [--no-trace]\n" +
         steps_usage("                    ") + "                    [gtest flags]\n";
}

[[noreturn]] void bad_argument(const std::string& message) {
  std::cerr << "harness_test: " << message << "\n" << usage();
  std::exit(2);
}

/// The options of the run, from the arguments GoogleTest left.
RunOptions parse_options(int argc, char** argv) {
  RunOptions options;
  try {
    for (int i = 1; i < argc; ++i) {
      if (!parse_run_flag(argc, argv, i, options))
        throw BadFlag(std::string("unknown argument ") + argv[i]);
    }
  } catch (const BadFlag& e) {
    bad_argument(e.what());
  }
  return options;
}

/// A test name GoogleTest accepts: letters, digits and underscores.
std::string test_name(const std::string& backend) {
  std::string out;
  for (char c : backend) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return out.empty() ? "unnamed" : out;
}

/// One backend through the protocol; its report is kept for the final table.
class BackendTest : public testing::Test {
 public:
  BackendTest(std::shared_ptr<const Backend> backend, const RunOptions& options,
              std::vector<BackendReport>& reports)
      : backend_(std::move(backend)), options_(options), reports_(reports) {}

  void TestBody() override {
    if (options_.device.is_cuda() && !at::hasCUDA()) {
      GTEST_SKIP() << "--device " << options_.device << " but no CUDA device is visible";
    }
    BackendReport report = run_backend(*backend_, options_);
    reports_.push_back(report);
    RecordProperty("verdict", report.ok() ? "ok" : "FAIL");
    if (report.negative_control) {
      RecordProperty("expected_violation", report.expected_violation);
      EXPECT_TRUE(report.ok()) << "negative control " << report.name << " was not flagged with '"
                               << report.expected_violation << "':\n"
                               << to_table({report});
    } else {
      EXPECT_TRUE(report.ok()) << report.name << " did not keep its addresses:\n"
                               << to_table({report});
    }
  }

 private:
  std::shared_ptr<const Backend> backend_;
  RunOptions options_;
  std::vector<BackendReport>& reports_;
};

// Registered when no backend is linked: a harness test over nothing must fail.
class NoBackendTest : public testing::Test {
 public:
  void TestBody() override {
    ADD_FAILURE() << "no backend is registered in this binary: end each backend's source with "
                     "RELOADSAFE_REGISTER_BACKEND(Type); and build it with reload_backend "
                     "(or a cc_library with alwayslink = True) so its registration is linked";
  }
};

void write_json(const std::vector<BackendReport>& reports, const RunOptions& options) {
  const char* dir = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  if (dir == nullptr || reports.empty()) return;
  const std::string path = std::string(dir) + "/harness.json";
  std::ofstream out(path);
  out << to_json(reports, options) << "\n";
  if (!out) std::cerr << "harness_test: cannot write " << path << "\n";
}

}  // namespace
}  // namespace reloadsafe::harness

int main(int argc, char** argv) {
  using namespace reloadsafe::harness;
  testing::InitGoogleTest(&argc, argv);  // removes the gtest flags it knows
  const RunOptions options = parse_options(argc, argv);
  std::vector<BackendReport> reports;
  auto backends = BackendRegistry::instance().create_all();
  for (auto& owned : backends) {
    std::shared_ptr<const Backend> backend = std::move(owned);
    const char* suite = backend->negative_control() ? "ReloadHarnessControl" : "ReloadHarness";
    testing::RegisterTest(suite, test_name(backend->name()).c_str(), nullptr, nullptr, __FILE__,
                          __LINE__, [backend, &options, &reports]() -> testing::Test* {
                            return new BackendTest(backend, options, reports);
                          });
  }
  if (backends.empty()) {
    testing::RegisterTest("ReloadHarness", "HasBackends", nullptr, nullptr, __FILE__, __LINE__,
                          []() -> testing::Test* { return new NoBackendTest(); });
  }
  const int status = RUN_ALL_TESTS();
  if (!reports.empty()) {
    std::cout << "\n" << to_table(reports);
    write_json(reports, options);
  }
  return status;
}
