// report_format.h: reports (report.h) as JSON for machines and as a table
// for people.
//
// Invariant: the JSON schema is the same for C++ and Python subjects, and a
// field is never renamed or removed without a new schema version; the table
// has one line per subject with its verdict, then at most three violations
// and three warnings per mode.
#pragma once

#include "conformance/harness/report.h"
#include "conformance/harness/run_options.h"

#include <string>
#include <vector>

namespace reloadsafe::harness {

/// The reports as JSON, with the options they were made with.
std::string to_json(const std::vector<BackendReport>& reports, const RunOptions& options);

/// The reports as a table with a verdict per backend.
std::string to_table(const std::vector<BackendReport>& reports);

}  // namespace reloadsafe::harness
