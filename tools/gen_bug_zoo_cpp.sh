#!/usr/bin/env bash
# Regenerates docs/bug-zoo-cpp.md from the bug zoo's C++ rows
# (conformance/harness/backends/zoo_rows.h, registered beside each pair in
# zoo_backends.cc): builds //conformance/harness:zoo_doc and runs every pair
# through the reload harness on the CPU. //conformance/harness:zoo_doc_test
# fails when the committed file differs from what this writes.
#
#   tools/gen_bug_zoo_cpp.sh        # after tools/setup.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bazel run //conformance/harness:zoo_doc -- "$PWD/docs/bug-zoo-cpp.md"
