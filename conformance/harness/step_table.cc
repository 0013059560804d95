#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/step_table.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace reloadsafe::harness {

// Each step's spec, defined beside its Step class in steps/ (one file per
// step). The table below is the one place they are listed.
StepSpec sleep_step();
StepSpec recreate_parameters_step();
StepSpec load_per_tensor_step();
StepSpec load_from_file_step();
StepSpec host_numbers_step();
StepSpec compare_state_step();
StepSpec compare_forward_state_step();
StepSpec cold_footprint_step();
StepSpec reload_peak_step();

const std::vector<StepSpec>& step_table() {
  // Within a phase hooks run in this order: the engine's steps first (a
  // sleep, then parameters re-created), then the checks, then the bounds.
  static const std::vector<StepSpec> table = {
      sleep_step(),
      recreate_parameters_step(),
      load_per_tensor_step(),
      load_from_file_step(),
      host_numbers_step(),
      compare_state_step(),
      compare_forward_state_step(),
      cold_footprint_step(),
      reload_peak_step(),
  };
  return table;
}

const StepSpec* find_step(const std::string& name) {
  for (const StepSpec& spec : step_table()) {
    if (name == spec.name) return &spec;
  }
  return nullptr;
}

std::string value_text(const StepSpec& spec) {
  switch (spec.takes) {
    case StepTakes::kSwitch:
      return "";
    case StepTakes::kLevel: {
      std::string out;
      for (int level = 1; level <= spec.max_level; ++level) {
        out += (level > 1 ? "|" : "") + std::to_string(level);
      }
      return out;
    }
    case StepTakes::kBytes:
      return "BYTES";
  }
  return "";
}

namespace {

std::string step_names() {
  std::string out;
  for (const StepSpec& spec : step_table())
    out += (out.empty() ? "" : ", ") + std::string(spec.name);
  return out;
}

}  // namespace

void check_steps(const ReloadSteps& steps) {
  for (const auto& [name, value] : steps.values()) {
    const StepSpec* spec = find_step(name);
    TORCH_CHECK(spec != nullptr, "no harness step is named '", name, "'; the steps are ",
                step_names());
    switch (spec->takes) {
      case StepTakes::kSwitch:
        TORCH_CHECK(value == 1, name, " is a switch: take it with 1, or leave it out, not ", value);
        break;
      case StepTakes::kLevel:
        TORCH_CHECK(value >= 1 && value <= spec->max_level, name, " takes a level from 1 to ",
                    spec->max_level, " (leave it out for none), not ", value);
        break;
      case StepTakes::kBytes:
        TORCH_CHECK(value >= 0, name, " is a number of bytes >= 0, not ", value);
        break;
    }
  }
}

ReloadSteps merge_steps(const ReloadSteps& a, const ReloadSteps& b) {
  ReloadSteps out = a;
  for (const auto& [name, value] : b.values()) {
    const std::optional<int64_t> mine = a.get(name);
    const StepSpec* spec = find_step(name);
    const bool bound = spec != nullptr && spec->takes == StepTakes::kBytes;
    if (!mine) {
      out.set(name, value);
    } else {
      out.set(name, bound ? std::min(*mine, value) : std::max(*mine, value));
    }
  }
  return out;
}

std::vector<std::unique_ptr<Step>> make_steps(const ReloadSteps& steps) {
  check_steps(steps);
  std::vector<std::unique_ptr<Step>> out;
  for (const StepSpec& spec : step_table()) {
    if (const std::optional<int64_t> value = steps.get(spec.name)) out.push_back(spec.make(*value));
  }
  return out;
}

bool takes_kind(const ReloadSteps& steps, StepKind kind) {
  return std::any_of(step_table().begin(), step_table().end(), [&](const StepSpec& spec) {
    return spec.kind == kind && steps.has(spec.name);
  });
}

std::vector<std::string> step_words(const ReloadSteps& steps) {
  std::vector<std::string> out;
  for (const StepSpec& spec : step_table()) {
    const std::optional<int64_t> value = steps.get(spec.name);
    if (!value) continue;
    out.push_back("`" + std::string(spec.name) + "`");
    if (spec.takes != StepTakes::kSwitch) out.back() += " " + std::to_string(*value);
  }
  return out;
}

std::string steps_markdown_table() {
  auto kind_text = [](StepKind kind) {
    switch (kind) {
      case StepKind::kEngine:
        return "engine action";
      case StepKind::kCheck:
        return "check";
      case StepKind::kBound:
        return "memory bound";
    }
    return "";
  };
  // One code span per value a cell shows: "`sleep=1`, `sleep=2`".
  auto spans = [](const StepSpec& spec, const std::string& prefix, const std::string& between) {
    switch (spec.takes) {
      case StepTakes::kSwitch:
        return "`" + prefix + (between == "=" ? "=True" : "") + "`";
      case StepTakes::kLevel: {
        std::string out;
        for (int level = 1; level <= spec.max_level; ++level) {
          out += (level > 1 ? ", `" : "`") + prefix + between + std::to_string(level) + "`";
        }
        return out;
      }
      case StepTakes::kBytes:
        return "`" + prefix + between + "N`";
    }
    return std::string();
  };
  std::string out =
      "| Python `check_reload(...)` | `reload_harness` flag | kind | what it does | what a bug "
      "looks like |\n| --- | --- | --- | --- | --- |\n";
  for (const StepSpec& spec : step_table()) {
    out += "| " + spans(spec, spec.name, "=") + " | " + spans(spec, spec.flag, " ") + " | " +
           kind_text(spec.kind) + " | " + spec.help + " | " + spec.example + " |\n";
  }
  return out;
}

}  // namespace reloadsafe::harness
