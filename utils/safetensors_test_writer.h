// safetensors_test_writer.h: safetensors files written by tests, so that the
// loader's tests know every byte the file holds.
//
// Invariant: a file written by write_safetensors() holds the tensors' bytes
// exactly, in the order given, after a header that lists them with
// consecutive data offsets (padded with spaces to 8 bytes, as safetensors'
// own writer does). Test-only (testonly in BUILD).
//
// Usage:
//   std::string path = write_safetensors("ckpt.safetensors", {{"w", w}, {"b", b}});
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace reloadsafe::testing {

/// A tensor of a file: its name and its value (contiguous, on the CPU).
struct NamedTensor {
  std::string name;
  at::Tensor value;
};

/// `name` in the test's temporary folder ($TEST_TMPDIR, else the working
/// folder).
std::string temp_path(const std::string& name);

/// Writes `bytes` to `path`, replacing what was there.
void write_bytes(const std::string& path, const std::string& bytes);

/// The 8-byte little-endian header length field for `n`.
std::string length_field(uint64_t n);

/// Writes `tensors` as a safetensors file named `file` in temp_path() and
/// returns its path.
std::string write_safetensors(const std::string& file, const std::vector<NamedTensor>& tensors);

}  // namespace reloadsafe::testing
