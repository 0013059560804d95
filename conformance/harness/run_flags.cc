#define TORCH_ASSERT_NO_OPERATORS

#include "conformance/harness/run_flags.h"

#include <c10/util/Exception.h>

#include <charconv>
#include <cstdint>

namespace reloadsafe::harness {
namespace {

template <typename T>
T parse_number(const std::string& flag, const std::string& text, T min) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < min) {
    throw BadFlag(flag + " takes an integer >= " + std::to_string(min) + ", not '" + text + "'");
  }
  return value;
}

c10::Device parse_device(const std::string& text) {
  try {
    c10::Device device(text);
    if (device.is_cpu() || device.is_cuda()) return device;
  } catch (const c10::Error&) {
  }
  throw BadFlag("--device takes cpu or cuda[:I], not '" + text + "'");
}

}  // namespace

std::string flag_value(int argc, char** argv, int& i) {
  if (i + 1 >= argc) throw BadFlag(std::string(argv[i]) + " needs a value");
  return argv[++i];
}

bool parse_run_flag(int argc, char** argv, int& i, RunOptions& options) {
  const std::string arg = argv[i];
  if (arg == "--reloads") {
    options.reloads = parse_number<int>(arg, flag_value(argc, argv, i), 1);
  } else if (arg == "--device") {
    options.device = parse_device(flag_value(argc, argv, i));
  } else if (arg == "--seed") {
    options.seed = parse_number<uint64_t>(arg, flag_value(argc, argv, i), 0);
  } else if (arg == "--no-trace") {
    options.trace = false;
  } else if (arg == "--sleep") {
    const int level = parse_number<int>(arg, flag_value(argc, argv, i), 1);
    if (level > kMaxSleepLevel) {
      throw BadFlag("--sleep takes 1 to " + std::to_string(kMaxSleepLevel) + ", not " +
                    std::to_string(level));
    }
    options.steps.sleep_level = level;
  } else if (arg == "--recreate-parameters") {
    options.steps.recreate_parameters = true;
  } else if (arg == "--host-numbers") {
    options.steps.host_numbers = true;
  } else if (arg == "--compare-state") {
    options.steps.compare_state = true;
  } else if (arg == "--compare-forward-state") {
    options.steps.compare_forward_state = true;
  } else if (arg == "--cold-footprint-tolerance") {
    options.steps.cold_footprint_tolerance_bytes =
        parse_number<int64_t>(arg, flag_value(argc, argv, i), 0);
  } else if (arg == "--reload-peak-budget") {
    options.steps.reload_peak_budget_bytes =
        parse_number<int64_t>(arg, flag_value(argc, argv, i), 0);
  } else {
    return false;
  }
  return true;
}

}  // namespace reloadsafe::harness
