#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "utils/safetensors_writer.h"

#include "utils/safetensors_header.h"

#include <c10/util/Exception.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <set>

namespace reloadsafe {
namespace {

// `s` as a JSON string literal (RFC 8259): bytes other than the quote, the
// backslash and control characters are written as they are (UTF-8 stays
// UTF-8).
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (byte < 0x20) {
      char escaped[7];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", byte);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

int64_t nbytes(const at::Tensor& t) {
  return t.numel() * static_cast<int64_t>(t.element_size());
}

// An open file, closed (and removed unless kept) when it goes.
class OutFile {
 public:
  explicit OutFile(const std::string& path) : path_(path) {
    fd_ = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    TORCH_CHECK(fd_ >= 0, "write_safetensors_file: cannot create ", path, ": ",
                std::strerror(errno));
  }
  ~OutFile() {
    if (fd_ >= 0) close(fd_);
    if (!kept_) unlink(path_.c_str());
  }
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;

  void write_all(const void* data, int64_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t wrote = ::write(fd_, p, static_cast<size_t>(n));
      if (wrote < 0 && errno == EINTR) continue;
      TORCH_CHECK(wrote > 0, "write_safetensors_file: cannot write ", path_, ": ",
                  wrote < 0 ? std::strerror(errno) : "nothing written");
      p += wrote;
      n -= wrote;
    }
  }

  void keep() {
    const int fd = fd_;
    fd_ = -1;
    TORCH_CHECK(close(fd) == 0, "write_safetensors_file: cannot close ", path_, ": ",
                std::strerror(errno));
    kept_ = true;
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool kept_ = false;
};

}  // namespace

void write_safetensors_file(const std::string& path, const std::vector<SafetensorsEntry>& tensors) {
  std::string json = "{";
  int64_t offset = 0;
  std::set<std::string> names;
  for (const SafetensorsEntry& t : tensors) {
    TORCH_CHECK(t.name != "__metadata__",
                "write_safetensors_file: '__metadata__' is the safetensors header's metadata "
                "entry, not a tensor name; rename the tensor");
    TORCH_CHECK(names.insert(t.name).second, "write_safetensors_file: the tensor name '", t.name,
                "' is given twice; a file holds each name once");
    TORCH_CHECK(t.value.defined() && t.value.layout() == at::kStrided, "write_safetensors_file: '",
                t.name, "' must be a defined dense (strided) tensor");
    const auto dtype = safetensors_dtype_name(t.value.scalar_type());
    TORCH_CHECK(dtype.has_value(), "write_safetensors_file: '", t.name, "' has the dtype ",
                t.value.scalar_type(),
                ", which safetensors has no name for; convert it to one it has");
    std::string shape;
    for (const int64_t d : t.value.sizes()) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    const int64_t n = nbytes(t.value);
    json += (json.size() > 1 ? "," : "") + json_string(t.name) + ":{\"dtype\":\"" +
            std::string(*dtype) + "\",\"shape\":[" + shape + "],\"data_offsets\":[" +
            std::to_string(offset) + "," + std::to_string(offset + n) + "]}";
    offset += n;
  }
  json += "}";
  while (json.size() % 8 != 0) json += ' ';

  OutFile out(path);
  const uint64_t length = json.size();
  char field[8];
  for (int i = 0; i < 8; ++i) field[i] = static_cast<char>((length >> (8 * i)) & 0xFF);
  out.write_all(field, 8);
  out.write_all(json.data(), static_cast<int64_t>(json.size()));
  for (const SafetensorsEntry& t : tensors) {
    if (nbytes(t.value) == 0) continue;
    const at::Tensor host =
        t.value.device().is_cpu() ? t.value.contiguous() : t.value.to(at::kCPU).contiguous();
    out.write_all(host.const_data_ptr(), nbytes(host));
  }
  out.keep();
}

}  // namespace reloadsafe
