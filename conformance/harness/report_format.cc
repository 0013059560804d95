#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/report_format.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <iomanip>
#include <sstream>

namespace reloadsafe::harness {

std::string to_json(const std::vector<BackendReport>& reports, const RunOptions& options) {
  nlohmann::ordered_json j;
  j["device"] = options.device.str();
  j["reloads"] = options.reloads;
  j["seed"] = options.seed;
  j["trace"] = options.trace;
  j["backends"] = nlohmann::ordered_json::array();
  for (const auto& r : reports) {
    nlohmann::ordered_json b;
    b["name"] = r.name;
    b["description"] = r.description;
    b["negative_control"] = r.negative_control;
    if (r.negative_control) b["expected_violation"] = r.expected_violation;
    b["ok"] = r.ok();
    for (const auto& m : r.modes) {
      nlohmann::ordered_json mj;
      mj["expected_to_pass"] = m.expected_to_pass;
      mj["reloads_done"] = m.reloads_done;
      mj["violation_count"] = m.violation_count;
      mj["declared_reads"] = m.declared_reads;
      mj["undeclared_reads"] = m.undeclared_reads;
      if (!m.error.empty()) mj["error"] = m.error;
      mj["flagged"] = m.flagged;
      mj["violations"] = nlohmann::ordered_json::array();
      for (const auto& v : m.violations) {
        nlohmann::ordered_json vj{{"reload", v.reload},
                                  {"tensor", v.tensor},
                                  {"what", v.what},
                                  {"before", v.before},
                                  {"after", v.after}};
        if (!v.read.empty()) vj["read"] = v.read;
        mj["violations"].push_back(vj);
      }
      mj["warnings"] = nlohmann::ordered_json::array();
      for (const auto& w : m.warnings) {
        mj["warnings"].push_back({{"tensor", w.tensor}, {"read", w.read}, {"message", w.message}});
      }
      mj["memory_bytes"] = m.memory_bytes;
      mj["graph_replays"] = m.graph_replays;
      b["modes"][to_string(m.mode)] = mj;
    }
    j["backends"].push_back(b);
  }
  // A message that carries raw bytes (a library's error text) is written with
  // U+FFFD in their place rather than stopping the report.
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The violations and warnings of a mode the table lists; the rest are
// counted, with every name flagged.
constexpr size_t kTableLines = 3;

std::string to_table(const std::vector<BackendReport>& reports) {
  std::ostringstream os;
  auto cell = [](const ModeReport& m) {
    std::string s = !m.error.empty()         ? "error"
                    : m.violation_count == 0 ? "kept"
                                             : std::to_string(m.violation_count) + " violations";
    if (!m.warnings.empty()) s += ", " + std::to_string(m.warnings.size()) + " warn";
    if (!m.expected_to_pass) s += " (not claimed)";
    return s;
  };
  auto reads = [](const BackendReport& r) {
    if (r.modes.empty()) return std::string("-");
    return std::to_string(r.modes[0].declared_reads) + "/" +
           std::to_string(r.modes[0].undeclared_reads);
  };
  size_t name_width = 24;  // at least two spaces after the longest name
  for (const auto& r : reports) name_width = std::max(name_width, r.name.size() + 2);
  const int w = static_cast<int>(name_width);
  os << std::left << std::setw(w) << "backend" << std::setw(30) << "normal reload" << std::setw(30)
     << "direct reload" << std::setw(12) << "reads d/u"
     << "verdict\n";
  for (const auto& r : reports) {
    const std::string verdict = r.negative_control
                                    ? (r.ok() ? "flagged (negative control)" : "NOT FLAGGED")
                                    : (r.ok() ? "pass" : "FAIL");
    os << std::setw(w) << r.name << std::setw(30) << (r.modes.size() > 0 ? cell(r.modes[0]) : "")
       << std::setw(30) << (r.modes.size() > 1 ? cell(r.modes[1]) : "") << std::setw(12) << reads(r)
       << verdict << "\n";
  }
  for (const auto& r : reports) {
    for (const auto& m : r.modes) {
      const std::string tag = "  " + r.name + " [" + to_string(m.mode) + "] ";
      if (!m.error.empty()) {
        // The lines of a multi-line error line up under its first.
        const std::string head = tag + "error: ";
        std::string error = m.error;
        for (size_t at = error.find('\n'); at != std::string::npos; at = error.find('\n', at + 1)) {
          error.insert(at + 1, head.size(), ' ');
        }
        os << head << error << "\n";
      }
      size_t shown = 0;
      for (; shown < m.violations.size() && shown < kTableLines; ++shown) {
        const Violation& v = m.violations[shown];
        os << tag << "reload " << v.reload << ": ";
        if (!v.read.empty()) os << v.read << " ";
        os << (v.read.empty() ? v.tensor : "(" + v.tensor + ")") << " " << v.what << ": "
           << v.before << " -> " << v.after << "\n";
      }
      // Nothing hidden without saying so: how many more, and every name
      // flagged (a layer with five rebuilt tensors shows five).
      if (m.violation_count > static_cast<int>(shown)) {
        os << tag << "and " << (m.violation_count - static_cast<int>(shown))
           << " more violations; flagged: ";
        for (size_t i = 0; i < m.flagged.size(); ++i) os << (i ? ", " : "") << m.flagged[i];
        os << "\n";
      }
      for (size_t i = 0; i < m.warnings.size() && i < kTableLines; ++i) {
        const Warning& w = m.warnings[i];
        os << tag << "warning: " << (w.read.empty() ? "" : w.read + " ") << "(" << w.tensor << ") "
           << w.message << "\n";
      }
      if (m.warnings.size() > kTableLines) {
        os << tag << "and " << (m.warnings.size() - kTableLines) << " more warnings\n";
      }
    }
  }
  return os.str();
}

}  // namespace reloadsafe::harness
