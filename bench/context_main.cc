// Prints machine_context() (machine_context.h) as one JSON object: the
// context of a benchmark that is not a Google Benchmark binary
// (check_bench.py), so that its results are keyed and compared exactly as
// the C++ binaries' are.
#include "bench/machine_context.h"

#include <nlohmann/json.hpp>

#include <iostream>

int main() {
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  for (const auto& [key, value] : reloadsafe::bench::machine_context()) context[key] = value;
  std::cout << context.dump(1) << "\n";
  return 0;
}
