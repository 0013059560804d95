#include "utils/safetensors_test_writer.h"

#include "utils/safetensors_header.h"

#include <c10/util/Exception.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace reloadsafe::testing {

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : ".") + "/" + name;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  TORCH_CHECK(fd >= 0, "cannot create ", path, ": ", std::strerror(errno));
  const ssize_t wrote = write(fd, bytes.data(), bytes.size());
  close(fd);
  TORCH_CHECK(wrote == static_cast<ssize_t>(bytes.size()), "cannot write ", path);
}

std::string length_field(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out;
}

std::string write_safetensors(const std::string& file, const std::vector<NamedTensor>& tensors) {
  std::string json = "{";
  std::string data;
  for (const NamedTensor& t : tensors) {
    TORCH_CHECK(t.value.is_contiguous() && t.value.device().is_cpu(), "write_safetensors: '",
                t.name, "' must be a contiguous CPU tensor");
    const auto dtype = safetensors_dtype_name(t.value.scalar_type());
    TORCH_CHECK(dtype.has_value(), "write_safetensors: no safetensors dtype for ",
                t.value.scalar_type());
    const int64_t n = t.value.numel() * static_cast<int64_t>(t.value.element_size());
    std::string shape;
    for (int64_t d : t.value.sizes()) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    json += (json.size() > 1 ? "," : "") + std::string("\"") + t.name + "\":{\"dtype\":\"" +
            std::string(*dtype) + "\",\"shape\":[" + shape + "],\"data_offsets\":[" +
            std::to_string(data.size()) + "," + std::to_string(data.size() + n) + "]}";
    if (n > 0)
      data.append(static_cast<const char*>(t.value.const_data_ptr()), static_cast<size_t>(n));
  }
  json += "}";
  while (json.size() % 8 != 0) json += ' ';
  const std::string path = temp_path(file);
  write_bytes(path, length_field(json.size()) + json + data);
  return path;
}

}  // namespace reloadsafe::testing
