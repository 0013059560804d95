// zoo_doc: writes docs/bug-zoo-cpp.md from the bug zoo's C++ rows and a run
// of each pair (zoo_doc.h).
//
//   bazel run //conformance/harness:zoo_doc -- $PWD/docs/bug-zoo-cpp.md
//   tools/gen_bug_zoo_cpp.sh          # the same
//
// Without a path it prints the Markdown.

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/backends/zoo_doc.h"

#include <fstream>
#include <iostream>

int main(int argc, char** argv) {
  if (argc > 2) {
    std::cerr << "usage: zoo_doc [OUT.md]\n";
    return 2;
  }
  const std::string doc = reloadsafe::harness::zoo_doc();
  if (argc == 1) {
    std::cout << doc;
    return 0;
  }
  std::ofstream out(argv[1], std::ios::binary);
  out << doc;
  out.close();
  if (!out) {
    std::cerr << "zoo_doc: could not write " << argv[1] << "\n";
    return 1;
  }
  std::cerr << "zoo_doc: wrote " << argv[1] << " (" << reloadsafe::harness::zoo_rows().size()
            << " rows)\n";
  return 0;
}
