#include "bench/targets.h"

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <sstream>

namespace reloadsafe::bench {
namespace {

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// The series of a benchmark name: the component before `bytes:`, or the last
// component before the time suffix for names without a size.
std::string series_of(const std::string& name) {
  std::vector<std::string> parts;
  std::stringstream in(name);
  for (std::string part; std::getline(in, part, '/');) parts.push_back(part);
  while (!parts.empty() &&
         (parts.back() == "real_time" || parts.back() == "manual_time" ||
          parts.back() == "process_time" || starts_with(parts.back(), "bytes:"))) {
    parts.pop_back();
  }
  return parts.empty() ? name : parts.back();
}

std::string human_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024 && u < 4 && static_cast<int64_t>(v) % 1024 == 0) {
    v /= 1024;
    ++u;
  }
  std::ostringstream out;
  out << v << " " << units[u];
  return out.str();
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

std::vector<std::string> limit_prefixes(const std::string& limit) {
  std::vector<std::string> out;
  std::stringstream in(limit);
  for (std::string part; std::getline(in, part, '|');) {
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

std::optional<int64_t> bytes_of(const std::string& name) {
  const auto at = name.find("/bytes:");
  if (at == std::string::npos) return std::nullopt;
  try {
    return std::stoll(name.substr(at + 7));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<std::string> subject_of(const std::string& pattern, const std::string& name) {
  const size_t star = pattern.find('*');
  if (star == std::string::npos) return std::nullopt;
  const std::string head = pattern.substr(0, star);
  const std::string tail = pattern.substr(star + 1);
  if (!starts_with(name, head)) return std::nullopt;
  const size_t end = name.find('/', head.size());
  const size_t length = (end == std::string::npos ? name.size() : end) - head.size();
  if (length == 0) return std::nullopt;
  if (name.compare(head.size() + length, tail.size(), tail) != 0) return std::nullopt;
  return name.substr(head.size(), length);
}

namespace {

// One row judging the median of `values` against t's upper bound, named
// after t's candidate pattern and how many values it is the median of; no
// row for no values.
void append_median_row(const Target& t, std::vector<double> values,
                       std::vector<TargetResult>* results) {
  if (values.empty()) return;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  const double median = n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
  std::string pattern = t.candidates;
  if (!pattern.empty() && pattern.back() == '/') pattern.pop_back();
  results->push_back({t.description, 0, median, t.bound, true, median <= t.bound,
                      pattern + " (median of " + std::to_string(n) + ")"});
}

// kMedianTimeRatioAtMost: one row, the median over subjects of the
// candidate's time over its subject's fastest limit.
void append_median_time_ratio(const Target& t, const std::map<std::string, Measurement>& measured,
                              std::vector<TargetResult>* results) {
  std::map<std::string, double> limit;
  for (const auto& [name, m] : measured) {
    if (m.time_ns <= 0) continue;
    if (auto subject = subject_of(t.limit, name)) {
      auto it = limit.find(*subject);
      if (it == limit.end() || m.time_ns < it->second) limit[*subject] = m.time_ns;
    }
  }
  std::vector<double> ratios;
  for (const auto& [name, m] : measured) {
    auto subject = subject_of(t.candidates, name);
    if (!subject) continue;
    auto it = limit.find(*subject);
    if (it != limit.end()) ratios.push_back(m.time_ns / it->second);
  }
  append_median_row(t, std::move(ratios), results);
}

// kCounterAtMost: each candidate's counter.
void append_counters(const Target& t, const std::map<std::string, Measurement>& measured,
                     std::vector<TargetResult>* results) {
  for (const auto& [name, m] : measured) {
    if (!starts_with(name, t.candidates)) continue;
    auto it = m.counters.find(t.counter);
    if (it == m.counters.end()) continue;
    results->push_back({t.description, 0, it->second, t.bound, true, it->second <= t.bound, name});
  }
}

// kMedianCounterAtMost: one row, the median over subjects of their counter.
void append_median_counter(const Target& t, const std::map<std::string, Measurement>& measured,
                           std::vector<TargetResult>* results) {
  std::vector<double> values;
  for (const auto& [name, m] : measured) {
    if (!subject_of(t.candidates, name)) continue;
    auto it = m.counters.find(t.counter);
    if (it != m.counters.end()) values.push_back(it->second);
  }
  append_median_row(t, std::move(values), results);
}

// kTimeRatioAtMost: each candidate's time over the fastest limit of its size
// (names without a size pair with limits without one).
void append_time_ratios(const Target& t, const std::map<std::string, Measurement>& measured,
                        std::vector<TargetResult>* results) {
  constexpr int64_t kNoSize = -1;
  const std::vector<std::string> limits = limit_prefixes(t.limit);
  std::map<int64_t, double> fastest;
  for (const auto& [name, m] : measured) {
    if (m.time_ns <= 0) continue;
    for (const std::string& prefix : limits) {
      if (!starts_with(name, prefix)) continue;
      const int64_t size = bytes_of(name).value_or(kNoSize);
      auto it = fastest.find(size);
      if (it == fastest.end() || m.time_ns < it->second) fastest[size] = m.time_ns;
    }
  }
  for (const auto& [name, m] : measured) {
    if (!starts_with(name, t.candidates)) continue;
    const int64_t size = bytes_of(name).value_or(kNoSize);
    if (size != kNoSize && size < t.min_bytes) continue;
    auto it = fastest.find(size);
    if (it == fastest.end()) continue;
    const double ratio = m.time_ns / it->second;
    results->push_back(
        {t.description, size == kNoSize ? 0 : size, ratio, t.bound, true, ratio <= t.bound, name});
  }
}

// kTimeAtMost: each candidate's time.
void append_times(const Target& t, const std::map<std::string, Measurement>& measured,
                  std::vector<TargetResult>* results) {
  for (const auto& [name, m] : measured) {
    if (!starts_with(name, t.candidates)) continue;
    results->push_back(
        {t.description, 0, m.time_ns, t.bound, true, m.time_ns <= t.bound, name, true});
  }
}

// kBestAtLeast and kEachAtLeast: the limit of each size (the fastest of the
// alternatives), then the candidates of each size against it.
void append_throughput_ratios(const Target& t, const std::map<std::string, Measurement>& measured,
                              std::vector<TargetResult>* results) {
  const std::vector<std::string> limits = limit_prefixes(t.limit);
  std::map<int64_t, double> limit;
  for (const auto& [name, m] : measured) {
    auto bytes = bytes_of(name);
    if (!bytes || m.bytes_per_second <= 0) continue;
    for (const std::string& prefix : limits) {
      if (starts_with(name, prefix)) limit[*bytes] = std::max(limit[*bytes], m.bytes_per_second);
    }
  }
  std::map<int64_t, std::vector<std::pair<std::string, double>>> by_size;
  for (const auto& [name, m] : measured) {
    auto bytes = bytes_of(name);
    if (!bytes || *bytes < t.min_bytes || !starts_with(name, t.candidates)) continue;
    if (limit.count(*bytes) == 0) continue;
    by_size[*bytes].emplace_back(name, m.bytes_per_second);
  }
  for (const auto& [bytes, candidates] : by_size) {
    if (t.kind == Target::Kind::kBestAtLeast) {
      auto best = candidates.front();
      for (const auto& c : candidates) {
        if (c.second > best.second) best = c;
      }
      const double ratio = best.second / limit[bytes];
      results->push_back(
          {t.description, bytes, ratio, t.bound, false, ratio >= t.bound, best.first});
    } else {
      for (const auto& [name, bps] : candidates) {
        const double ratio = bps / limit[bytes];
        results->push_back({t.description, bytes, ratio, t.bound, false, ratio >= t.bound, name});
      }
    }
  }
}

}  // namespace

std::vector<TargetResult> evaluate_targets(const std::vector<Target>& targets,
                                           const std::map<std::string, Measurement>& measured) {
  std::vector<TargetResult> results;
  for (const Target& t : targets) {
    switch (t.kind) {
      case Target::Kind::kBestAtLeast:
      case Target::Kind::kEachAtLeast:
        append_throughput_ratios(t, measured, &results);
        break;
      case Target::Kind::kTimeAtMost:
        append_times(t, measured, &results);
        break;
      case Target::Kind::kTimeRatioAtMost:
        append_time_ratios(t, measured, &results);
        break;
      case Target::Kind::kMedianTimeRatioAtMost:
        append_median_time_ratio(t, measured, &results);
        break;
      case Target::Kind::kCounterAtMost:
        append_counters(t, measured, &results);
        break;
      case Target::Kind::kMedianCounterAtMost:
        append_median_counter(t, measured, &results);
        break;
    }
  }
  return results;
}

void print_target_results(std::ostream& out, const std::vector<TargetResult>& results,
                          const std::string& basis) {
  out << "\nTargets (" << basis << "):\n";
  if (results.empty()) {
    out << "  none applies to the benchmarks that ran (sizes below the targets' minimum, "
           "filtered out, or failed)\n";
    return;
  }
  int met = 0;
  for (const TargetResult& r : results) {
    std::ostringstream value, bound;
    if (r.is_time) {
      value << std::fixed << std::setprecision(1) << r.value << " ns";
      bound << "<= " << std::fixed << std::setprecision(0) << r.bound << " ns";
    } else if (r.at_most) {
      value << std::fixed << std::setprecision(2) << r.value;
      bound << "<= " << std::fixed << std::setprecision(2) << r.bound;
    } else {
      value << std::fixed << std::setprecision(2) << r.value;
      bound << ">= " << std::fixed << std::setprecision(2) << r.bound;
    }
    out << "  " << std::left << std::setw(7) << (r.met ? "met" : "MISSED") << std::right
        << std::setw(11) << value.str() << "  " << std::left << std::setw(12) << bound.str()
        << std::setw(10) << (r.bytes ? human_bytes(r.bytes) : std::string("-")) << r.description;
    if (!r.is_time) out << " [" << series_of(r.candidate) << "]";
    out << "\n";
    met += r.met ? 1 : 0;
  }
  out << "  " << met << " of " << results.size() << " met\n";
}

void write_target_results_json(std::ostream& out, const std::vector<TargetResult>& results,
                               const std::string& basis) {
  out << "{\n  \"basis\": " << json_string(basis) << ",\n  \"targets\": [";
  for (size_t i = 0; i < results.size(); ++i) {
    const TargetResult& r = results[i];
    out << (i ? "," : "") << "\n    {\"description\": " << json_string(r.description)
        << ", \"bytes\": " << r.bytes << ", \"value\": " << std::setprecision(6) << r.value
        << ", \"bound\": " << r.bound << ", \"comparison\": \"" << (r.at_most ? "<=" : ">=")
        << "\", \"unit\": \"" << (r.is_time ? "ns" : "ratio")
        << "\", \"met\": " << (r.met ? "true" : "false")
        << ", \"benchmark\": " << json_string(r.candidate) << "}";
  }
  out << "\n  ]\n}\n";
}

}  // namespace reloadsafe::bench
