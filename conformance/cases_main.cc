// cases_main.cc: the `cases` command. Evaluates a case file (golden/FORMAT.md)
// and prints one result line per case, in input order.
//
//   bazel run //conformance:cases -- /abs/path/cases.jsonl
//   bazel run //conformance:cases -- - < cases.jsonl
//
// Exit status: 0 when the file could be read, whatever its cases said;
// 1 when it cannot be opened or read; 2 on a usage error.
#include "conformance/case_runner.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>

int main(int argc, char** argv) {
  if (argc != 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::cerr << "usage: cases <cases.jsonl | ->\n"
                 "Evaluates each case line and prints one result line per case.\n";
    return 2;
  }
  std::ios::sync_with_stdio(false);
  std::string path = argv[1];
  if (path == "-") {
    reloadsafe::conformance::run_cases(std::cin, std::cout);
    if (std::cin.bad()) {
      std::cerr << "cases: error reading standard input\n";
      return 1;
    }
    return 0;
  }
  // `bazel run` starts in the runfiles tree: resolve relative paths against
  // the directory the command was typed in.
  const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (!path.empty() && path[0] != '/' && cwd != nullptr) path = std::string(cwd) + "/" + path;
  std::ifstream in(path);
  if (!in) {
    std::cerr << "cases: cannot open " << path << ": " << std::strerror(errno) << "\n";
    return 1;
  }
  reloadsafe::conformance::run_cases(in, std::cout);
  if (in.bad()) {
    std::cerr << "cases: error reading " << path << "\n";
    return 1;
  }
  return 0;
}
