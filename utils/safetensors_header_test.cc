#include "utils/safetensors_header.h"

#include "utils/safetensors_test_writer.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

namespace reloadsafe {
namespace {

using testing::length_field;
using testing::message_of;
using testing::temp_path;

TEST(SafetensorsHeader, ParsesTensorsInFileOrder) {
  const std::string json =
      R"({"__metadata__": {"format": "pt", "note": "a \"quoted\" \u00e9"},)"
      R"( "b.weight": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},)"
      R"( "a\u0041": {"shape": [], "data_offsets": [12, 20], "dtype": "I64"},)"
      R"( "empty": {"dtype": "F32", "shape": [0, 4], "data_offsets": [20, 20]}}   )";
  const SafetensorsHeader h = parse_safetensors_header(json, 8 + json.size() + 20, "t");
  ASSERT_EQ(h.tensors.size(), 3u);
  EXPECT_EQ(h.data_start, static_cast<int64_t>(8 + json.size()));
  EXPECT_EQ(h.tensors[0].name, "b.weight");
  EXPECT_EQ(h.tensors[0].dtype, c10::ScalarType::BFloat16);
  EXPECT_EQ(h.tensors[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(h.tensors[0].nbytes(), 12);
  EXPECT_EQ(h.tensors[1].name, "aA");
  EXPECT_EQ(h.tensors[1].dtype, c10::ScalarType::Long);
  EXPECT_TRUE(h.tensors[1].shape.empty());
  EXPECT_EQ(h.tensors[1].begin, 12);
  EXPECT_EQ(h.tensors[2].nbytes(), 0);
  EXPECT_NE(h.find("empty"), nullptr);
  EXPECT_EQ(h.find("missing"), nullptr);
}

TEST(SafetensorsHeader, DtypeNamesRoundTrip) {
  for (const char* name : {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "U16",
                           "U32", "U64", "BOOL", "F8_E4M3", "F8_E5M2", "C64"}) {
    SCOPED_TRACE(name);
    const std::optional<c10::ScalarType> dtype = safetensors_dtype(name);
    ASSERT_TRUE(dtype.has_value());
    EXPECT_EQ(safetensors_dtype_name(*dtype), std::string_view(name));
  }
  EXPECT_FALSE(safetensors_dtype("F4").has_value());
  EXPECT_FALSE(safetensors_dtype_name(c10::ScalarType::QInt8).has_value());
}

struct MalformedCase {
  const char* what;
  std::string json;
  int64_t data_bytes;    // the data section's size
  const char* expected;  // in the message
};

TEST(SafetensorsHeader, RefusesMalformedHeaders) {
  const std::string deep = std::string(100, '[') + std::string(100, ']');
  const MalformedCase cases[] = {
      {"empty text", "", 0, "unexpected end"},
      {"not an object", "[1, 2]", 0, "expected '{'"},
      {"truncated", R"({"a": {"dtype": "F32", "shape": [1], "data_offs)", 4, "unterminated"},
      {"no closing brace", R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]})", 4,
       "unexpected end"},
      {"trailing bytes", R"({} x)", 0, "bytes after"},
      {"offsets past the end", R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
       4, "outside the data section"},
      {"end before begin", R"({"a": {"dtype": "U8", "shape": [0], "data_offsets": [4, 0]}})", 4,
       "outside the data section"},
      {"overlapping",
       R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
       R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
       16, "overlap"},
      {"size disagrees with shape",
       R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 16, "needs 12 bytes"},
      {"unknown dtype", R"({"a": {"dtype": "F4", "shape": [1], "data_offsets": [0, 1]}})", 1,
       "'F4'"},
      {"missing key", R"({"a": {"dtype": "F32", "shape": [1]}})", 4, "lacks one of"},
      {"unknown key", R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": 1}})", 4,
       "unexpected or repeated key 'x'"},
      {"repeated key",
       R"({"a": {"dtype": "F32", "dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 4,
       "repeated key 'dtype'"},
      {"duplicate name",
       R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},)"
       R"( "a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
       2, "appears twice"},
      {"negative dimension", R"({"a": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}})", 1,
       "non-negative integer"},
      {"fractional offset", R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1.5]}})", 2,
       "must be an integer"},
      {"three offsets", R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]}})", 2,
       "two numbers"},
      {"offset over 64 bits",
       R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 99999999999999999999]}})", 2,
       "64 bits"},
      {"element count overflows",
       R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}})", 4,
       "overflows"},
      {"byte size overflows",
       R"({"a": {"dtype": "F64", "shape": [2305843009213693952], "data_offsets": [0, 4]}})", 4,
       "overflows"},
      {"metadata nested too deep", R"({"__metadata__": )" + deep + "}", 0, "64 deep"},
      {"control character", "{\"a\n\": {}}", 0, "control character"},
      {"lone surrogate", R"({"\ud800": {}})", 0, "surrogate"},
  };
  for (const MalformedCase& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string msg = message_of([&] {
      parse_safetensors_header(c.json, 8 + static_cast<int64_t>(c.json.size()) + c.data_bytes,
                               "file.safetensors");
    });
    EXPECT_NE(msg.find(c.expected), std::string::npos) << msg;
    EXPECT_NE(msg.find("file.safetensors"), std::string::npos) << msg;
  }
}

// A file of `bytes` in the test's temporary folder, open for reading.
class TempFile {
 public:
  explicit TempFile(const std::string& bytes) {
    path_ = temp_path("header_XXXXXX");
    fd_ = mkstemp(path_.data());
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(write(fd_, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }
  ~TempFile() {
    close(fd_);
    unlink(path_.c_str());
  }
  int fd() const { return fd_; }

 private:
  std::string path_;
  int fd_;
};

struct FileCase {
  const char* what;
  std::string bytes;
  const char* expected;
};

TEST(SafetensorsHeader, RefusesMalformedFiles) {
  const std::string ok = R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}})";
  const FileCase cases[] = {
      {"empty file", "", "fewer than the 8"},
      {"shorter than the length field", "abc", "fewer than the 8"},
      {"header length huge", length_field(uint64_t{1} << 62) + ok, "more than the"},
      {"header length past the end", length_field(ok.size() + 1) + ok, "cannot hold"},
      {"data cut short", length_field(ok.size()) + ok + "ab", "outside the data section"},
  };
  for (const FileCase& c : cases) {
    SCOPED_TRACE(c.what);
    TempFile f(c.bytes);
    const std::string msg = message_of([&] { read_safetensors_header(f.fd(), "f.safetensors"); });
    EXPECT_NE(msg.find(c.expected), std::string::npos) << msg;
  }
  TempFile good(length_field(ok.size()) + ok + "abcd");
  const SafetensorsHeader h = read_safetensors_header(good.fd(), "good");
  ASSERT_EQ(h.tensors.size(), 1u);
  EXPECT_EQ(h.data_start, static_cast<int64_t>(8 + ok.size()));
}

}  // namespace
}  // namespace reloadsafe
