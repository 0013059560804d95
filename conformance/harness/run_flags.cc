#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

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

// The value of step `step`'s flag at argv[i], as ReloadSteps takes it.
int64_t step_value(const StepSpec& step, const std::string& flag, int argc, char** argv, int& i) {
  switch (step.takes) {
    case StepTakes::kSwitch:
      return 1;
    case StepTakes::kLevel: {
      const int level = parse_number<int>(flag, flag_value(argc, argv, i), 1);
      if (level > step.max_level) {
        throw BadFlag(flag + " takes 1 to " + std::to_string(step.max_level) + ", not " +
                      std::to_string(level));
      }
      return level;
    }
    case StepTakes::kBytes:
      return parse_number<int64_t>(flag, flag_value(argc, argv, i), 0);
  }
  return 1;
}

}  // namespace

std::string flag_value(int argc, char** argv, int& i) {
  if (i + 1 >= argc) throw BadFlag(std::string(argv[i]) + " needs a value");
  return argv[++i];
}

std::string steps_usage(const std::string& indent, size_t width) {
  std::string out, line = indent;
  for (const StepSpec& step : step_table()) {
    const std::string value = value_text(step);
    const std::string item =
        std::string("[") + step.flag + (value.empty() ? "" : " " + value) + "]";
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
    for (const StepSpec& step : step_table()) {
      if (arg != step.flag) continue;
      options.steps.set(step.name, step_value(step, arg, argc, argv, i));
      return true;
    }
    return false;
  }
  return true;
}

}  // namespace reloadsafe::harness
