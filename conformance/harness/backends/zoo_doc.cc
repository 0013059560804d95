#include "conformance/harness/backends/zoo_doc.h"

#include "conformance/harness/harness.h"
#include "conformance/harness/step_table.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <sstream>

namespace reloadsafe::harness {
namespace {

// Violations and warnings listed per row: the first of reload 1 in the
// normal mode.
constexpr size_t kListed = 3;
// The width prose is filled to.
constexpr size_t kWidth = 100;

std::string code(const std::string& text) {
  return "`" + text + "`";
}

// "a", "a and b", "a, b and c".
std::string joined(const std::vector<std::string>& items, const std::string& last = " and ") {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += i + 1 == items.size() ? last : ", ";
    out += items[i];
  }
  return out;
}

std::vector<std::string> codes(const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (const auto& name : names) out.push_back(code(name));
  return out;
}

// Whether the buggy backend's steps are ones plain reloads never take (a
// sleep, re-created parameters, a memory bound): cuda_graph_test, which
// reloads without them, expects no stale replay from it.
bool needs_a_step(const ReloadSteps& steps) {
  return takes_kind(steps, StepKind::kEngine) || takes_kind(steps, StepKind::kBound);
}

// `say(mode)` for every mode: "X in each mode" where all modes say the
// same, else "X in the normal mode and Y in the direct mode".
std::string per_mode(const BackendReport& report,
                     const std::function<std::string(const ModeReport&)>& say,
                     const std::string& each = " in each mode") {
  if (report.modes.empty()) return "no mode ran";
  bool same = true;
  for (const auto& mode : report.modes) same = same && say(mode) == say(report.modes[0]);
  if (same) return say(report.modes[0]) + each;
  std::vector<std::string> parts;
  for (const auto& mode : report.modes) {
    parts.push_back(say(mode) + " in the " + to_string(mode.mode) + " mode");
  }
  return joined(parts);
}

std::string plural(int64_t n, const std::string& one, const std::string& many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

// A mode in the words of reload_harness's table.
std::string mode_words(const ModeReport& mode) {
  if (!mode.error.empty()) return "`error`";
  if (mode.violation_count == 0) return "`kept`";
  return plural(mode.violation_count, "violation", "violations");
}

// The table's cells: whether the buggy backend is flagged, the fixed one
// clean, in every mode.
std::string buggy_cell(const BackendReport& report) {
  if (!report.ok()) return "NOT FLAGGED";
  return per_mode(
      report, [](const ModeReport& m) { return m.violation_count > 0 ? "flagged" : "clean"; },
      ", both modes");
}

std::string fixed_cell(const BackendReport& report) {
  return per_mode(
      report, [](const ModeReport& m) { return m.clean() ? "passes" : "fails"; }, ", both modes");
}

// What a violation or warning is, without its before and after.
std::string violation_line(const BackendReport& report, const ModeReport& mode,
                           const Violation& v) {
  std::string line =
      report.name + " [" + to_string(mode.mode) + "] reload " + std::to_string(v.reload) + ": ";
  line += v.read.empty() ? v.tensor : v.read + " (" + v.tensor + ")";
  return line + " " + v.what;
}

std::string warning_line(const BackendReport& report, const ModeReport& mode, const Warning& w) {
  return report.name + " [" + to_string(mode.mode) +
         "] warning: " + (w.read.empty() ? "" : w.read + " ") + "(" + w.tensor + ") " + w.message;
}

// "Flagged in each mode: `a`, `b`." where the modes flag the same names,
// else a sentence per mode.
std::string flagged_sentences(const BackendReport& report) {
  const auto names = [](const ModeReport& m) {
    return m.flagged.empty() ? std::string("nothing") : joined(codes(m.flagged), ", ");
  };
  bool same = true;
  for (const auto& mode : report.modes) same = same && mode.flagged == report.modes[0].flagged;
  if (same && !report.modes.empty()) return "Flagged in each mode: " + names(report.modes[0]) + ".";
  std::string sentences;
  for (const auto& mode : report.modes) {
    if (!sentences.empty()) sentences += " ";
    sentences +=
        "Flagged in the " + std::string(to_string(mode.mode)) + " mode: " + names(mode) + ".";
  }
  return sentences;
}

// `text` as a Markdown paragraph: its words filled into lines of at most
// kWidth characters (a longer word has a line of its own; a code span is
// one word), then a blank line.
std::string paragraph(const std::string& text) {
  std::vector<std::string> words;
  bool in_code = false;  // the last word opened a code span it did not close
  std::istringstream in(text);
  for (std::string word; in >> word;) {
    if (in_code) {
      words.back() += " " + word;
    } else {
      words.push_back(word);
    }
    if (std::count(word.begin(), word.end(), '`') % 2 == 1) in_code = !in_code;
  }
  std::string out, line;
  for (const std::string& word : words) {
    if (!line.empty() && line.size() + 1 + word.size() > kWidth) {
      out += line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  return out + line + "\n\n";
}

void write_intro(std::ostream& os, const std::vector<ZooPairRun>& runs, const RunOptions& options) {
  std::vector<std::string> with_steps;
  for (const auto& run : runs) {
    if (run.steps.any()) with_steps.push_back(run.row->id);
  }
  os << "# The bug zoo's C++ rows\n\n"
     << "<!-- Generated by `bazel run //conformance/harness:zoo_doc` (tools/gen_bug_zoo_cpp.sh) "
        "from the rows in conformance/harness/backends/zoo_backends.cc; do not edit. -->\n\n"
     << paragraph(
            "`docs/bug-zoo.md` (generated from `python/tests/zoo/`) re-creates each catalogue bug "
            "as a pair of plain-torch Python layers. Where the mechanism is a C++ one (a TorchBind "
            "object handed to a custom op, a struct a kernel reaches through a pointer, a C++ "
            "kernel object), the row is also a pair of C++ backends in "
            "`conformance/harness/backends/zoo_backends.cc`: `zoo_Zxx_<short>_buggy`, a negative "
            "control whose `expected_violation` is the name the upstream fix used, and "
            "`zoo_Zxx_<short>_fixed`, a sample that must keep every address in both reload modes. "
            "Beside each pair its row is registered (`ZooRow`, `zoo_rows.h`): the upstream "
            "thread, the mechanism, what the buggy backend must be flagged with, and the prose "
            "below.")
     << paragraph(
            "C++ has no walker to find what a kernel object holds, as the Python check's walker "
            "does, so each backend names its kernel objects' tensors and TorchBind objects itself "
            "(`Backend::held_tensors`, `Backend::held_objects`), and the host numbers its kernels "
            "take (`Backend::host_numbers`). A TorchBind object handed to its op from C++ is "
            "wrapped in a new script object on every call; it is named, and compared, by its C++ "
            "instance.")
     << paragraph("The pairs of " + joined(with_steps) +
                  " keep every address: their bug shows only under a harness step "
                  "(`step_table.h`; sleep and wake, re-created parameters, host numbers, state "
                  "against a cold load, memory against the cold load and over a reload). Both "
                  "backends of such a pair ask for the step through `Backend::steps()`, which "
                  "`BackendSubject` hands the protocol as `SubjectInfo::steps`, so every run takes "
                  "it, `reload_harness` and `harness_test` included; the fixed backend passes with "
                  "the same steps.")
     << paragraph(
            "Run one with `bazel run //conformance/harness:reload_harness -- --backend NAME`; "
            "`bazel test //conformance/harness:harness_test` checks every pair against its row "
            "(`BugZoo.*`, and the buggy backends' flags in `expected_flags()`); "
            "`BugZoo.EachBackendThatAsksForAStepIsNotNamedWithoutIt` runs each buggy backend that "
            "asks for steps with its steps taken away and checks that it is then flagged with what "
            "its row says, and never under the upstream name. This file is generated from the rows "
            "and a run of each pair (`tools/gen_bug_zoo_cpp.sh`); "
            "`//conformance/harness:zoo_doc_test` fails when it is stale.")
     << paragraph("Each pair ran the default run (" + std::to_string(options.reloads) +
                  " reloads per mode, seed " + std::to_string(options.seed) + ") on the " +
                  (options.device.is_cpu() ? std::string("CPU") : options.device.str()) +
                  ". The lines below are the first listed for reload 1 in the normal mode: the "
                  "tensor, or the read with the tensor in parentheses, and what changed. What it "
                  "was before and after (addresses, byte counts, values) varies from run to run "
                  "and is left out here; `reload_harness` prints it.");
}

void write_table(std::ostream& os, const std::vector<ZooPairRun>& runs) {
  os << "| id | upstream thread | mechanism | buggy backend | fixed backend |\n"
     << "|----|-----------------|-----------|---------------|---------------|\n";
  for (const auto& run : runs) {
    const ZooRow& row = *run.row;
    const std::vector<std::string> steps = step_words(run.steps);
    os << "| " << row.id << " | " << row.thread << " | " << row.mechanism_class << ": "
       << row.mechanism;
    if (!steps.empty()) os << (steps.size() == 1 ? "; step: " : "; steps: ") << joined(steps, ", ");
    os << " | " << buggy_cell(run.buggy) << " | " << fixed_cell(run.fixed) << " |\n";
  }
  os << "\n";
}

// How many violations and warnings each mode of `report` has, and how many
// tensors its forward reads.
std::string counts(const BackendReport& report) {
  const std::string found = per_mode(report, [](const ModeReport& m) {
    std::string s = plural(m.violation_count, "violation", "violations");
    if (!m.warnings.empty()) {
      s += " and " + plural(static_cast<int64_t>(m.warnings.size()), "warning", "warnings");
    }
    return s;
  });
  const std::string reads = per_mode(
      report,
      [](const ModeReport& m) {
        std::string s = plural(m.declared_reads, "declared tensor", "declared tensors");
        if (m.undeclared_reads > 0)
          s += " and " + std::to_string(m.undeclared_reads) + " undeclared";
        return s;
      },
      "");
  return found + "; the forward reads " + reads;
}

// The first violations of reload 1 in the normal mode, and its warnings, as
// reload_harness lists them less their before and after.
void write_listed(std::ostream& os, const BackendReport& report) {
  if (report.modes.empty()) return;
  const ModeReport& normal = report.modes[0];
  std::vector<std::string> lines;
  for (const Violation& v : normal.violations) {
    if (v.reload == 1 && lines.size() < kListed) lines.push_back(violation_line(report, normal, v));
  }
  for (size_t i = 0; i < normal.warnings.size() && i < kListed; ++i) {
    lines.push_back(warning_line(report, normal, normal.warnings[i]));
  }
  if (lines.empty()) return;
  os << "```\n";
  for (const auto& line : lines) os << line << "\n";
  os << "```\n\n";
}

void write_row(std::ostream& os, const ZooPairRun& run) {
  const ZooRow& row = *run.row;
  const std::vector<std::string> steps = step_words(run.steps);
  os << "## " << row.id << " · " << code(row.buggy) << " / " << code(row.fixed) << "\n\n";
  if (!row.construction.empty()) os << paragraph(row.construction);

  std::string buggy = "Buggy (`expected_violation`: " + code(run.buggy.expected_violation);
  if (!steps.empty()) buggy += (steps.size() == 1 ? "; step " : "; steps ") + joined(steps);
  os << paragraph(buggy + "): " + counts(run.buggy) + ".");
  write_listed(os, run.buggy);
  os << paragraph(flagged_sentences(run.buggy));
  if (!row.reading.empty()) os << paragraph(row.reading);
  if (row.flagged_without_steps) {
    os << paragraph(row.flagged_without_steps->empty()
                        ? "Without its steps: clean in each mode."
                        : "Without its steps: flagged with " +
                              joined(codes(*row.flagged_without_steps)) + " only, in each mode.");
  }

  os << paragraph(
      "Fixed: " + row.fix + " " +
      per_mode(
          run.fixed, [](const ModeReport& m) { return mode_words(m); }, " in both modes") +
      (steps.empty() ? "" : " with the same steps") + ", " +
      (run.fixed.ok() ? "`pass`" : "`FAIL`") + ".");
}

void write_outro(std::ostream& os, const std::vector<ZooPairRun>& runs) {
  std::vector<std::string> quiet, stale;
  for (const auto& run : runs) {
    (needs_a_step(run.steps) ? quiet : stale).push_back(run.row->id);
  }
  std::string text =
      "Every zoo backend passes the device-clean probe (`DeviceClean.*` in `harness_test`) "
      "unless its row says otherwise: their gathers and permutations use `aten::gather` and "
      "`aten::index`, which have meta kernels in LibTorch. `cuda_graph_test` reloads without the "
      "protocol's steps: it expects no stale replay from the buggy backends whose steps ask for a "
      "sleep, re-created parameters or a memory bound (" +
      joined(quiet) + "), and a stale one at every reload from the others (" + joined(stale) +
      "), whose graphs read a tensor that moved or keep a number that changed.";
  const std::string p = paragraph(text);
  os << p.substr(0, p.size() - 1);  // the file ends with one newline
}

}  // namespace

RunOptions zoo_doc_options() {
  RunOptions options;
  options.device = c10::Device(c10::kCPU);
  return options;
}

std::vector<ZooPairRun> run_zoo_pairs(const RunOptions& options) {
  const std::vector<std::unique_ptr<Backend>> backends = BackendRegistry::instance().create_all();
  const auto named = [&](const std::string& name) -> const Backend& {
    for (const auto& backend : backends) {
      if (backend->name() == name) return *backend;
    }
    TORCH_CHECK(false, "zoo row names ", name, ", which is not a registered backend");
  };
  std::vector<ZooPairRun> runs;
  for (const ZooRow& row : zoo_rows()) {
    ZooPairRun run;
    run.row = &row;
    const Backend& buggy = named(row.buggy);
    run.steps = buggy.steps();
    run.buggy = run_backend(buggy, options);
    RunOptions with_buggy_steps = options;
    with_buggy_steps.steps = run.steps;
    run.fixed = run_backend(named(row.fixed), with_buggy_steps);
    runs.push_back(std::move(run));
  }
  return runs;
}

std::string zoo_doc_markdown(const std::vector<ZooPairRun>& runs, const RunOptions& options) {
  std::ostringstream os;
  write_intro(os, runs, options);
  write_table(os, runs);
  for (const auto& run : runs) write_row(os, run);
  write_outro(os, runs);
  return os.str();
}

std::string zoo_doc() {
  const RunOptions options = zoo_doc_options();
  return zoo_doc_markdown(run_zoo_pairs(options), options);
}

}  // namespace reloadsafe::harness
