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

const std::vector<StepFlag>& step_flags() {
  // Each step's flag, what it takes and how it is set: the one place a step
  // meets the command line (run_options.h says what each step does).
  static const std::vector<StepFlag> table = {
      {"--sleep", "1|2",
       [](ReloadSteps& steps, const std::string& flag, const std::string& value) {
         const int level = parse_number<int>(flag, value, 1);
         if (level > kMaxSleepLevel) {
           throw BadFlag(flag + " takes 1 to " + std::to_string(kMaxSleepLevel) + ", not " +
                         std::to_string(level));
         }
         steps.sleep_level = level;
       }},
      {"--recreate-parameters", "",
       [](ReloadSteps& steps, const std::string&, const std::string&) {
         steps.recreate_parameters = true;
       }},
      {"--host-numbers", "",
       [](ReloadSteps& steps, const std::string&, const std::string&) {
         steps.host_numbers = true;
       }},
      {"--compare-state", "",
       [](ReloadSteps& steps, const std::string&, const std::string&) {
         steps.compare_state = true;
       }},
      {"--compare-forward-state", "",
       [](ReloadSteps& steps, const std::string&, const std::string&) {
         steps.compare_forward_state = true;
       }},
      {"--cold-footprint-tolerance", "BYTES",
       [](ReloadSteps& steps, const std::string& flag, const std::string& value) {
         steps.cold_footprint_tolerance_bytes = parse_number<int64_t>(flag, value, 0);
       }},
      {"--reload-peak-budget", "BYTES",
       [](ReloadSteps& steps, const std::string& flag, const std::string& value) {
         steps.reload_peak_budget_bytes = parse_number<int64_t>(flag, value, 0);
       }},
  };
  return table;
}

std::string steps_usage(const std::string& indent, size_t width) {
  std::string out, line = indent;
  for (const StepFlag& step : step_flags()) {
    std::string item = std::string("[") + step.flag;
    if (*step.value != '\0') item += std::string(" ") + step.value;
    item += "]";
    if (line.size() > indent.size() && line.size() + 1 + item.size() > width) {
      out += line + "\n";
      line = indent;
    }
    if (line.size() > indent.size()) line += " ";
    line += item;
  }
  return out + line + "\n";
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
  } else {
    for (const StepFlag& step : step_flags()) {
      if (arg != step.flag) continue;
      const std::string value = *step.value != '\0' ? flag_value(argc, argv, i) : "";
      step.set(options.steps, arg, value);
      return true;
    }
    return false;
  }
  return true;
}

}  // namespace reloadsafe::harness
