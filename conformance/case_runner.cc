// case_runner.cc: the dispatcher. Reads a case line, looks its `op` up in the
// operation table (ops/operation.h) and turns whatever happens into one
// result line. The parts live beside it: case_json (typed readers),
// case_tensors (layouts, budget, byte patterns), case_report (the result
// writer) and ops/ (one file per operation).

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/case_runner.h"

#include "conformance/case_json.h"
#include "conformance/case_report.h"
#include "conformance/ops/operation.h"

#include <c10/util/Exception.h>

namespace reloadsafe::conformance {

std::string evaluate_case(const std::string& line) {
  OJson id = nullptr;
  std::string error;
  try {
    const Json c = parse_case(line);
    TORCH_CHECK(c.is_object(), "a case is a JSON object, not ", c.type_name());
    if (const Json* i = field(c, "id")) id = OJson::parse(i->dump());
    const std::string op = as_string(required(c, "op", "the case"), "op");
    const Operation run = find_operation(op);
    TORCH_CHECK(run != nullptr, "unknown op '", op, "'");
    OJson out = OJson::object();
    out["id"] = id;
    run(c, out);
    return dump(out);
  } catch (const nlohmann::json::exception& e) {
    error = std::string("invalid JSON: ") + e.what();
  } catch (const std::exception& e) {
    error = error_message(e);
  } catch (...) {
    error = "unknown exception";
  }
  try {
    OJson out = OJson::object();
    out["id"] = id;
    out["error"] = error;
    return dump(out);
  } catch (...) {
    return R"({"id":null,"error":"the error could not be reported"})";
  }
}

bool is_case_line(const std::string& line) {
  return line.find_first_not_of(" \t\r\n\f\v") != std::string::npos;
}

int64_t run_cases(std::istream& in, std::ostream& out) {
  int64_t count = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (!is_case_line(line)) continue;
    out << evaluate_case(line) << '\n';
    ++count;
  }
  out.flush();
  return count;
}

}  // namespace reloadsafe::conformance
