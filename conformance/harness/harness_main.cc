// The reload harness over every registered backend.
//
//   bazel run //conformance/harness:reload_harness -- [--reloads N] [--device cpu|cuda]
//       [--backend NAME] [--seed S] [--json PATH]
//
// Prints a table for people and, with --json, writes the report for machines.
// Exits 1 when a sample backend loses an address or a negative control is not
// flagged, 2 on bad arguments.
#include "conformance/harness/harness.h"

#include <ATen/Context.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

int main(int argc, char** argv) {
  using namespace reloadsafe::harness;
  RunOptions options;
  std::string only, json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "reload_harness: " << arg << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--reloads") {
      options.reloads = std::atoi(value().c_str());
    } else if (arg == "--device") {
      options.device = c10::Device(value());
    } else if (arg == "--backend") {
      only = value();
    } else if (arg == "--seed") {
      options.seed = std::strtoull(value().c_str(), nullptr, 10);
    } else if (arg == "--json") {
      json_path = value();
    } else {
      std::cerr << "reload_harness: unknown argument " << arg
                << "\nusage: reload_harness [--reloads N] [--device cpu|cuda] [--backend NAME] "
                   "[--seed S] [--json PATH]\n";
      return 2;
    }
  }
  if (options.device.is_cuda() && !at::hasCUDA()) {
    std::cerr << "reload_harness: --device cuda given but no CUDA device is available\n";
    return 2;
  }
  std::vector<BackendReport> reports;
  for (const auto& backend : BackendRegistry::instance().create_all()) {
    if (!only.empty() && backend->name() != only) continue;
    std::cerr << "[harness] " << backend->name() << ": " << options.reloads
              << " reloads x 2 modes on " << options.device << "\n";
    reports.push_back(run_backend(*backend, options));
  }
  if (reports.empty()) {
    std::cerr << "reload_harness: no backend named '" << only << "'\n";
    return 2;
  }
  std::cout << to_table(reports);
  if (!json_path.empty()) {
    std::ofstream(json_path) << to_json(reports, options) << "\n";
    std::cerr << "[harness] JSON report: " << json_path << "\n";
  }
  for (const auto& r : reports) {
    if (!r.ok()) return 1;
  }
  return 0;
}
