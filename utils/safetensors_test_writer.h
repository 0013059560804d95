// safetensors_test_writer.h: the files the loader's tests write: well-formed
// safetensors files (through utils/safetensors_writer.h, the one writer) in
// the test's temporary folder, raw bytes for malformed ones, and the message
// a refused call raises.
//
// Invariant: a file written by write_safetensors() is what
// write_safetensors_file() writes: the tensors' bytes exactly, in the order
// given, so the loader's tests know every byte the file holds. Test-only
// (testonly in BUILD).
//
// Usage:
//   std::string path = write_safetensors("ckpt.safetensors", {{"w", w}, {"b", b}});
#pragma once

#include "utils/safetensors_writer.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace reloadsafe::testing {

/// A tensor of a file: its name and its value.
using NamedTensor = SafetensorsEntry;

/// `name` in the test's temporary folder ($TEST_TMPDIR, else the working
/// folder).
std::string temp_path(const std::string& name);

/// Writes `bytes` to `path`, replacing what was there.
void write_bytes(const std::string& path, const std::string& bytes);

/// The 8-byte little-endian header length field for `n`.
std::string length_field(uint64_t n);

/// Writes `tensors` as a safetensors file named `file` in temp_path()
/// (write_safetensors_file) and returns its path.
std::string write_safetensors(const std::string& file, const std::vector<NamedTensor>& tensors);

/// What the c10::Error `f` throws says (without its backtrace); empty when
/// `f` throws nothing.
std::string message_of(const std::function<void()>& f);

}  // namespace reloadsafe::testing
