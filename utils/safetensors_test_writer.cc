#include "utils/safetensors_test_writer.h"

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
  const std::string path = temp_path(file);
  write_safetensors_file(path, tensors);
  return path;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

}  // namespace reloadsafe::testing
