// safetensors_header.h: the header of a safetensors file, parsed and checked
// against the file's size before any of its data is read.
//
// Invariant: a SafetensorsHeader that parse_safetensors_header() returned
// describes only byte ranges inside its file: every tensor's range lies in
// the data section, no two ranges overlap, each range's length is exactly
// its shape's element count times its dtype's size (computed with overflow
// checks), and every dtype is one LibTorch has. Anything else (a truncated
// file, a header length larger than the file, malformed JSON, an unknown
// dtype, offsets out of order, past the end, or overlapping) is refused with
// a TORCH_CHECK that names the file and, where there is one, the tensor. So a
// reader may trust the offsets: a malformed file cannot make it read past
// the file's end or write past a destination sized from the header.
//
// The format: 8 bytes, a little-endian unsigned header length N; N bytes of
// UTF-8 JSON, an object mapping each tensor name to
// {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]} (offsets
// relative to the data section, which starts at byte 8 + N), and an optional
// "__metadata__" object of strings; then the data section.
//
// Note [A parser of its own]
// The JSON is read by a small strict parser here rather than a JSON library:
// utils/ is the one library backend authors and the Python extension link,
// and it depends on LibTorch alone. The parser accepts the JSON grammar
// (RFC 8259) for the values a header holds, nests at most 64 deep, and
// refuses duplicate tensor names and trailing bytes other than spaces
// (safetensors' writers pad the header with spaces to an 8-byte boundary).
//
// Decisions: data ranges may leave gaps between them (they are not read);
// keys of a tensor's entry other than the three are refused, as is a
// tensor entry that lacks one of them; a header longer than 100 MB
// (safetensors' own limit) is refused before it is read.
//
// Usage:
//   SafetensorsHeader h = read_safetensors_header(fd, "model.safetensors");
//   for (const SafetensorsTensor& t : h.tensors) ...  // t.file_offset(h)
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace reloadsafe {

/// One tensor of a safetensors file.
struct SafetensorsTensor {
  std::string name;
  c10::ScalarType dtype = c10::ScalarType::Byte;
  std::string dtype_name;  // as the file spells it: "F32", "BF16", ...
  std::vector<int64_t> shape;
  int64_t begin = 0;  // data_offsets[0]: from the start of the data section
  int64_t end = 0;    // data_offsets[1]

  int64_t nbytes() const { return end - begin; }
};

/// A checked header: the tensors in file order, and where the data starts.
struct SafetensorsHeader {
  std::vector<SafetensorsTensor> tensors;
  int64_t data_start = 0;  // 8 + the header length: file offset of data_offsets 0
  int64_t file_size = 0;

  /// The tensor called `name`, or null.
  const SafetensorsTensor* find(std::string_view name) const;
};

/// The largest header length accepted (safetensors' own limit).
constexpr int64_t kMaxSafetensorsHeaderBytes = 100'000'000;

/// Parses and checks the header text `json` of a file of `file_size` bytes
/// whose header length field said `json.size()`. `what` names the file in
/// errors. Throws (TORCH_CHECK) on anything the invariant above refuses.
SafetensorsHeader parse_safetensors_header(std::string_view json, int64_t file_size,
                                           const std::string& what);

/// Reads the length field and the header of the open file `fd` with pread,
/// and parses it with parse_safetensors_header. Reads only the header.
SafetensorsHeader read_safetensors_header(int fd, const std::string& what);

/// The LibTorch dtype of a safetensors dtype name ("F32" -> Float), or
/// nullopt for a name it does not know.
std::optional<c10::ScalarType> safetensors_dtype(std::string_view name);

/// The safetensors name of a LibTorch dtype (Float -> "F32"), or nullopt.
std::optional<std::string_view> safetensors_dtype_name(c10::ScalarType dtype);

}  // namespace reloadsafe
