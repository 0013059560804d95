#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/violation_sink.h"

#include <algorithm>
#include <utility>

namespace reloadsafe::harness {

void ViolationSink::add(Violation v) {
  for (std::string* text : {&v.tensor, &v.what, &v.before, &v.after, &v.read}) {
    *text = valid_utf8(std::move(*text));
  }
  ++report_.violation_count;
  flag(v.tensor);
  flag(v.read);
  if (listing()) report_.violations.push_back(std::move(v));
}

void ViolationSink::add(int reload, std::string tensor, std::string what, std::string before,
                        std::string after, std::string read) {
  add(Violation{reload, std::move(tensor), std::move(what), std::move(before), std::move(after),
                std::move(read)});
}

void ViolationSink::flag(const std::string& name) {
  if (name.empty()) return;
  if (std::find(report_.flagged.begin(), report_.flagged.end(), name) == report_.flagged.end()) {
    report_.flagged.push_back(name);
  }
}

}  // namespace reloadsafe::harness
