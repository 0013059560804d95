#include "utils/safetensors_header.h"

#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>
#include <c10/util/safe_numerics.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unordered_set>

namespace reloadsafe {
namespace {

struct DtypeName {
  const char* name;
  c10::ScalarType dtype;
};

// safetensors' dtype names that LibTorch has.
constexpr DtypeName kDtypes[] = {
    {"F64", c10::ScalarType::Double},
    {"F32", c10::ScalarType::Float},
    {"F16", c10::ScalarType::Half},
    {"BF16", c10::ScalarType::BFloat16},
    {"I64", c10::ScalarType::Long},
    {"I32", c10::ScalarType::Int},
    {"I16", c10::ScalarType::Short},
    {"I8", c10::ScalarType::Char},
    {"U8", c10::ScalarType::Byte},
    {"U16", c10::ScalarType::UInt16},
    {"U32", c10::ScalarType::UInt32},
    {"U64", c10::ScalarType::UInt64},
    {"BOOL", c10::ScalarType::Bool},
    {"F8_E4M3", c10::ScalarType::Float8_e4m3fn},
    {"F8_E5M2", c10::ScalarType::Float8_e5m2},
    {"C64", c10::ScalarType::ComplexFloat},
};

constexpr int kMaxDepth = 64;

// A strict reader of the JSON a header holds (Note [A parser of its own]).
// Every error throws, naming the file and the byte offset in the header.
class JsonReader {
 public:
  JsonReader(std::string_view text, const std::string& what) : s_(text), what_(what) {}

  [[noreturn]] void fail(const std::string& why) const {
    TORCH_CHECK(false, "safetensors header of ", what_, " is malformed at header byte ", pos_, ": ",
                why, ". The file is damaged or not a safetensors file: write it again.");
  }

  void skip_space() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool at_end() {
    skip_space();
    return pos_ == s_.size();
  }

  char peek() {
    skip_space();
    if (pos_ == s_.size()) fail("unexpected end of the header");
    return s_[pos_];
  }

  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }

  // `c` next (consumed, true) or not (false).
  bool accept(char c) {
    if (peek() != c) return false;
    ++pos_;
    return true;
  }

  std::string string() {
    expect('"');
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail("unterminated string");
      const char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) fail("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u':
          append_utf8(out, code_point());
          break;
        default:
          fail("unknown escape in a string");
      }
    }
  }

  // A non-negative integer that fits int64 (shapes, offsets).
  int64_t unsigned_integer(const char* what) {
    skip_space();
    const size_t start = pos_;
    uint64_t v = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      const uint64_t digit = static_cast<uint64_t>(s_[pos_] - '0');
      if (v > (static_cast<uint64_t>(INT64_MAX) - digit) / 10) {
        fail(std::string(what) + " does not fit in 64 bits");
      }
      v = v * 10 + digit;
      ++pos_;
    }
    if (pos_ == start) fail(std::string(what) + " must be a non-negative integer");
    if (pos_ - start > 1 && s_[start] == '0') fail("a number with a leading zero");
    if (pos_ < s_.size() && (s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E')) {
      fail(std::string(what) + " must be an integer");
    }
    return static_cast<int64_t>(v);
  }

  std::vector<int64_t> integer_array(const char* what) {
    std::vector<int64_t> out;
    expect('[');
    if (accept(']')) return out;
    do {
      out.push_back(unsigned_integer(what));
    } while (accept(','));
    expect(']');
    return out;
  }

  // Any JSON value, checked and discarded.
  void skip_value(int depth = 0) {
    if (depth > kMaxDepth) fail("values nested more than 64 deep");
    const char c = peek();
    if (c == '"') {
      string();
    } else if (c == '{') {
      ++pos_;
      if (accept('}')) return;
      do {
        string();
        expect(':');
        skip_value(depth + 1);
      } while (accept(','));
      expect('}');
    } else if (c == '[') {
      ++pos_;
      if (accept(']')) return;
      do {
        skip_value(depth + 1);
      } while (accept(','));
      expect(']');
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      number();
    } else if (!literal("true") && !literal("false") && !literal("null")) {
      fail("not a JSON value");
    }
  }

 private:
  bool literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  void number() {
    if (s_[pos_] == '-') ++pos_;
    const auto digits = [&] {
      const size_t start = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      if (pos_ == start) fail("a number without digits");
    };
    digits();
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      digits();
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      digits();
    }
  }

  uint32_t hex4() {
    if (s_.size() - pos_ < 4) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = s_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9') {
        v |= static_cast<uint32_t>(h - '0');
      } else if (h >= 'a' && h <= 'f') {
        v |= static_cast<uint32_t>(h - 'a' + 10);
      } else if (h >= 'A' && h <= 'F') {
        v |= static_cast<uint32_t>(h - 'A' + 10);
      } else {
        fail("bad hex digit in a \\u escape");
      }
    }
    return v;
  }

  uint32_t code_point() {
    const uint32_t hi = hex4();
    if (hi < 0xD800 || hi > 0xDFFF) return hi;
    if (hi > 0xDBFF || s_.substr(pos_, 2) != "\\u") fail("unpaired UTF-16 surrogate");
    pos_ += 2;
    const uint32_t lo = hex4();
    if (lo < 0xDC00 || lo > 0xDFFF) fail("unpaired UTF-16 surrogate");
    return 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string_view s_;
  const std::string& what_;
  size_t pos_ = 0;
};

// One tensor's entry: {"dtype": ..., "shape": [...], "data_offsets": [b, e]}.
SafetensorsTensor read_entry(JsonReader& r, std::string name, const std::string& what) {
  SafetensorsTensor t;
  t.name = std::move(name);
  bool has_dtype = false;
  bool has_shape = false;
  bool has_offsets = false;
  r.expect('{');
  if (!r.accept('}')) {
    do {
      const std::string key = r.string();
      r.expect(':');
      if (key == "dtype" && !has_dtype) {
        t.dtype_name = r.string();
        const std::optional<c10::ScalarType> dtype = safetensors_dtype(t.dtype_name);
        TORCH_CHECK(dtype.has_value(), "safetensors file ", what, ": tensor '", t.name,
                    "' has dtype '", t.dtype_name,
                    "', which LibTorch has no dtype for; convert the checkpoint to a supported "
                    "dtype (F64, F32, F16, BF16, I64, I32, I16, I8, U8, U16, U32, U64, BOOL, "
                    "F8_E4M3, F8_E5M2, C64)");
        t.dtype = *dtype;
        has_dtype = true;
      } else if (key == "shape" && !has_shape) {
        t.shape = r.integer_array("a dimension");
        has_shape = true;
      } else if (key == "data_offsets" && !has_offsets) {
        const std::vector<int64_t> offsets = r.integer_array("a data offset");
        if (offsets.size() != 2) r.fail("data_offsets of '" + t.name + "' must be two numbers");
        t.begin = offsets[0];
        t.end = offsets[1];
        has_offsets = true;
      } else {
        r.fail("tensor '" + t.name + "' has an unexpected or repeated key '" + key + "'");
      }
    } while (r.accept(','));
    r.expect('}');
  }
  if (!has_dtype || !has_shape || !has_offsets) {
    r.fail("tensor '" + t.name + "' lacks one of dtype, shape and data_offsets");
  }
  return t;
}

}  // namespace

std::optional<c10::ScalarType> safetensors_dtype(std::string_view name) {
  for (const DtypeName& d : kDtypes) {
    if (name == d.name) return d.dtype;
  }
  return std::nullopt;
}

std::optional<std::string_view> safetensors_dtype_name(c10::ScalarType dtype) {
  for (const DtypeName& d : kDtypes) {
    if (dtype == d.dtype) return std::string_view(d.name);
  }
  return std::nullopt;
}

const SafetensorsTensor* SafetensorsHeader::find(std::string_view name) const {
  for (const SafetensorsTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

SafetensorsHeader parse_safetensors_header(std::string_view json, int64_t file_size,
                                           const std::string& what) {
  const auto header_len = static_cast<int64_t>(json.size());
  TORCH_CHECK(file_size >= 8 && header_len <= file_size - 8, "safetensors file ", what, " of ",
              file_size, " bytes cannot hold its header of ", header_len,
              " bytes: the file is truncated or not a safetensors file");
  SafetensorsHeader h;
  h.data_start = 8 + header_len;
  h.file_size = file_size;
  const int64_t data_size = file_size - h.data_start;

  JsonReader r(json, what);
  std::unordered_set<std::string> names;
  r.expect('{');
  if (!r.accept('}')) {
    bool seen_metadata = false;
    do {
      std::string name = r.string();
      r.expect(':');
      if (name == "__metadata__" && !seen_metadata) {
        seen_metadata = true;
        r.skip_value();
        continue;
      }
      if (!names.insert(name).second) r.fail("tensor '" + name + "' appears twice");
      h.tensors.push_back(read_entry(r, std::move(name), what));
    } while (r.accept(','));
    r.expect('}');
  }
  if (!r.at_end()) r.fail("bytes after the header's object");

  for (const SafetensorsTensor& t : h.tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) {
      TORCH_CHECK(!c10::mul_overflows(numel, d, &numel), "safetensors file ", what, ": tensor '",
                  t.name, "' has a shape whose element count overflows 64 bits");
    }
    int64_t expected = 0;
    TORCH_CHECK(
        !c10::mul_overflows(numel, static_cast<int64_t>(c10::elementSize(t.dtype)), &expected),
        "safetensors file ", what, ": tensor '", t.name,
        "' has a byte size that overflows 64 bits");
    TORCH_CHECK(t.begin <= t.end && t.end <= data_size, "safetensors file ", what, ": tensor '",
                t.name, "' has data_offsets [", t.begin, ", ", t.end,
                "] outside the data section of ", data_size,
                " bytes: the file is truncated or its header is damaged");
    TORCH_CHECK(t.end - t.begin == expected, "safetensors file ", what, ": tensor '", t.name, "' (",
                t.dtype_name, ", shape ", c10::ArrayRef<int64_t>(t.shape), ") needs ", expected,
                " bytes but its data_offsets [", t.begin, ", ", t.end, "] span ", t.end - t.begin);
  }
  std::vector<const SafetensorsTensor*> by_begin;
  by_begin.reserve(h.tensors.size());
  for (const SafetensorsTensor& t : h.tensors) by_begin.push_back(&t);
  std::sort(by_begin.begin(), by_begin.end(),
            [](const SafetensorsTensor* a, const SafetensorsTensor* b) {
              return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
            });
  for (size_t i = 1; i < by_begin.size(); ++i) {
    const SafetensorsTensor& prev = *by_begin[i - 1];
    const SafetensorsTensor& cur = *by_begin[i];
    // Empty tensors occupy no bytes and overlap nothing.
    if (prev.nbytes() == 0 || cur.nbytes() == 0) continue;
    TORCH_CHECK(cur.begin >= prev.end, "safetensors file ", what, ": the data of tensors '",
                prev.name, "' [", prev.begin, ", ", prev.end, ") and '", cur.name, "' [", cur.begin,
                ", ", cur.end, ") overlap: the header is damaged");
  }
  return h;
}

SafetensorsHeader read_safetensors_header(int fd, const std::string& what) {
  struct stat st {};
  TORCH_CHECK(fstat(fd, &st) == 0, "cannot stat ", what, ": ", std::strerror(errno));
  const auto file_size = static_cast<int64_t>(st.st_size);
  uint8_t len_bytes[8] = {};
  TORCH_CHECK(file_size >= 8, "safetensors file ", what, " has ", file_size,
              " bytes, fewer than the 8 of its header length: it is truncated or empty");
  TORCH_CHECK(pread(fd, len_bytes, 8, 0) == 8, "cannot read the header length of ", what, ": ",
              std::strerror(errno));
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | len_bytes[i];
  TORCH_CHECK(len <= static_cast<uint64_t>(kMaxSafetensorsHeaderBytes), "safetensors file ", what,
              " declares a header of ", len, " bytes, more than the ", kMaxSafetensorsHeaderBytes,
              " accepted: the file is damaged or not a safetensors file");
  TORCH_CHECK(static_cast<int64_t>(len) <= file_size - 8, "safetensors file ", what, " of ",
              file_size, " bytes cannot hold its declared header of ", len,
              " bytes: the file is truncated or not a safetensors file");
  std::string json(len, '\0');
  size_t got = 0;
  while (got < len) {
    const ssize_t n = pread(fd, json.data() + got, len - got, static_cast<off_t>(8 + got));
    if (n < 0 && errno == EINTR) continue;
    TORCH_CHECK(n > 0, "cannot read the header of ", what, ": ",
                n == 0 ? "unexpected end of file" : std::strerror(errno));
    got += static_cast<size_t>(n);
  }
  return parse_safetensors_header(json, file_size, what);
}

}  // namespace reloadsafe
