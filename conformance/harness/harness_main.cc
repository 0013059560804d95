// The reload harness over every registered backend.
//
//   bazel run //conformance/harness:reload_harness -- [--reloads N] [--device cpu|cuda[:I]]
//       [--backend NAME] [--seed S] [--json PATH] [--no-trace] [--trace] [--build-info]
//       [the steps' flags: step_table.h; --help lists them]
//
// Prints a table for people and, with --json, writes the report for machines.
// --trace prints what the forward of each selected backend reads (its
// captured read set) and runs no reloads. --build-info prints what the binary
// has of CUDA (kernels linked, graph step, a device visible). Exits 1 when a sample backend loses
// an address or a negative control is not flagged, 2 on bad arguments.
#include "conformance/harness/device_graph.h"
#include "conformance/harness/forward_capture.h"
#include "conformance/harness/harness.h"
#include "conformance/harness/report_format.h"
#include "conformance/harness/run_flags.h"

#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <string>

namespace {

std::string usage() {
  return "usage: reload_harness [--reloads N] [--device cpu|cuda[:I]] [--backend NAME] [--seed S]\n"
         "                      [--json PATH] [--no-trace] [--trace] [--build-info]\n"
         "  steps around each reload (docs/harness-steps.md):\n" +
         reloadsafe::harness::steps_usage("                      ");
}

[[noreturn]] void bad_argument(const std::string& message) {
  std::cerr << "reload_harness: " << message << "\n" << usage();
  std::exit(2);
}

void print_trace(const reloadsafe::harness::Backend& backend, const c10::Device& device,
                 uint64_t seed) {
  using namespace reloadsafe::harness;
  BackendSubject subject(backend, device);
  RunOptions options;
  options.device = device;
  options.seed = seed;
  const auto reads = captured_reads(subject, options);
  std::cout << backend.name() << ": what the forward reads (captured at cold load; nested ops "
            << "indented)\n";
  std::cout << "  " << std::left << std::setw(44) << "op, argument" << std::setw(30) << "tensor"
            << "layout\n";
  for (const auto& r : reads) {
    const std::string op = std::string(2 * static_cast<size_t>(r.depth), ' ') + r.op;
    std::cout << "  " << std::setw(44) << op << std::setw(30) << r.name << r.layout << "\n";
  }
  const DistinctReads distinct = distinct_reads(reads);
  std::cout << "  tensors read: " << distinct.declared.size() << " declared, "
            << distinct.undeclared.size() << " undeclared";
  if (!distinct.constants.empty()) {
    std::cout << ", " << distinct.constants.size() << " constants of compiled code";
  }
  std::cout << "\n\n";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace reloadsafe::harness;
  RunOptions options;
  std::string only, json_path;
  bool trace_only = false;
  try {
    for (int i = 1; i < argc; ++i) {
      if (parse_run_flag(argc, argv, i, options)) continue;
      const std::string arg = argv[i];
      if (arg == "--backend") {
        only = flag_value(argc, argv, i);
      } else if (arg == "--json") {
        json_path = flag_value(argc, argv, i);
      } else if (arg == "--trace") {
        trace_only = true;
      } else if (arg == "--build-info") {
        std::cout << "reload_harness: " << cuda_build_info() << "\n";
        return 0;
      } else if (arg == "--help" || arg == "-h") {
        std::cout << usage();
        return 0;
      } else {
        throw BadFlag("unknown argument " + arg);
      }
    }
  } catch (const BadFlag& e) {
    bad_argument(e.what());
  }
  if (options.device.is_cuda()) {
    const std::string why = cuda_unavailable_reason();
    if (!why.empty()) {
      std::cerr << "reload_harness: --device " << options.device << " given, but " << why << "\n";
      return 2;
    }
  }
  std::vector<BackendReport> reports;
  bool found = false;
  for (const auto& backend : BackendRegistry::instance().create_all()) {
    if (!only.empty() && backend->name() != only) continue;
    found = true;
    if (backend->cpu_only() && !options.device.is_cpu()) {
      std::cerr << "[harness] " << backend->name() << ": skipped on " << options.device
                << " (its kernel runs on the CPU only)\n";
      continue;
    }
    if (trace_only) {
      try {
        print_trace(*backend, options.device, options.seed);
      } catch (const std::exception& e) {
        const std::string what = e.what();
        std::cout << backend->name() << ": error: " << what.substr(0, what.find('\n')) << "\n\n";
      }
      continue;
    }
    std::cerr << "[harness] " << backend->name() << ": " << options.reloads
              << " reloads x 2 modes on " << options.device << "\n";
    reports.push_back(run_backend(*backend, options));
  }
  if (!found) {
    std::cerr << "reload_harness: no backend named '" << only << "'\n";
    return 2;
  }
  if (trace_only) return 0;
  std::cout << to_table(reports);
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << to_json(reports, options) << "\n";
    if (!out) {
      std::cerr << "reload_harness: cannot write " << json_path << "\n";
      return 2;
    }
    std::cerr << "[harness] JSON report: " << json_path << "\n";
  }
  for (const auto& r : reports) {
    if (!r.ok()) return 1;
  }
  return 0;
}
