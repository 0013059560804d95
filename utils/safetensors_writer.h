// safetensors_writer.h: tensors written as a safetensors file, the format
// utils/safetensors_header.h parses and utils/file_loader.h loads.
//
// Invariant: a file written by write_safetensors_file() holds each tensor's
// bytes exactly (its values as a contiguous tensor, copied to the host
// first where it lives on a device), in the order given, after a header that
// lists them with consecutive data offsets and is padded with spaces to 8
// bytes, as safetensors' own writer does. Names are written as JSON strings
// (quotes, backslashes and control characters escaped), so every name reads
// back as given. Everything that would make the file wrong (a duplicate
// name, "__metadata__" as a name, a dtype safetensors has no name for, a
// tensor that is not strided) is refused before the file is opened; an I/O
// error throws, naming the file, and leaves it removed.
//
// One tensor at a time is copied to the host (where one is needed), so a
// write holds at most one tensor's bytes besides the tensors themselves.
//
// Usage:
//   write_safetensors_file("ckpt.safetensors", {{"w", w}, {"b", b}});
//   FileLoader().load_({"ckpt.safetensors"}, {{"w", {w_live}}, {"b", {b_live}}});
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace reloadsafe {

/// A tensor of a file: its name and its value.
struct SafetensorsEntry {
  std::string name;
  at::Tensor value;
};

/// Writes `tensors` to `path` as a safetensors file (see the invariant
/// above), replacing what was there. Throws (TORCH_CHECK) naming the tensor
/// or the file when it cannot.
void write_safetensors_file(const std::string& path, const std::vector<SafetensorsEntry>& tensors);

}  // namespace reloadsafe
