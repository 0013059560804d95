#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "utils/safetensors_writer.h"

#include "utils/file_loader.h"
#include "utils/safetensors_header.h"
#include "utils/safetensors_test_writer.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace reloadsafe {
namespace {

using testing::message_of;
using testing::temp_path;

SafetensorsHeader header_of(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << path;
  SafetensorsHeader h = read_safetensors_header(fd, path);
  close(fd);
  return h;
}

// What is written reads back, through the header parser and the loader, as
// given: names that JSON must escape, a view, a dtype of two bytes, an
// empty tensor, all in the order given.
TEST(SafetensorsWriter, WhatIsWrittenReadsBackByteForByte) {
  const at::Tensor w = at::randn({6, 5});
  const std::vector<SafetensorsEntry> tensors = {
      {"z.weight", at::randn({3, 4}).to(at::kBFloat16)},
      {"quote\"back\\slash\nnewline", at::arange(7, at::kLong)},
      {"caf\xc3\xa9", w.t()},  // not contiguous: written as its values
      {"empty", at::empty({0, 3})},
  };
  const std::string path = temp_path("written.safetensors");
  write_safetensors_file(path, tensors);

  const SafetensorsHeader h = header_of(path);
  ASSERT_EQ(h.tensors.size(), tensors.size());
  EXPECT_EQ(h.data_start % 8, 0);
  int64_t offset = 0;
  LoadTargets targets;
  std::vector<at::Tensor> read;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SafetensorsTensor& t = h.tensors[i];
    EXPECT_EQ(t.name, tensors[i].name);
    EXPECT_EQ(t.dtype, tensors[i].value.scalar_type());
    EXPECT_EQ(t.shape, tensors[i].value.sizes().vec());
    EXPECT_EQ(t.begin, offset);
    offset = t.end;
    read.push_back(at::zeros(tensors[i].value.sizes(), tensors[i].value.options()));
    targets[t.name] = {read.back(), std::nullopt};
  }
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, h.data_start + offset);

  FileLoader loader;
  loader.load_({path}, targets);
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_TRUE(at::equal(read[i], tensors[i].value)) << tensors[i].name;
  }
}

TEST(SafetensorsWriter, AFileIsReplacedWhole) {
  const std::string path = temp_path("replaced.safetensors");
  write_safetensors_file(path, {{"a", at::randn({100})}});
  const at::Tensor b = at::randn({2});
  write_safetensors_file(path, {{"b", b}});
  const SafetensorsHeader h = header_of(path);
  ASSERT_EQ(h.tensors.size(), 1u);
  EXPECT_EQ(h.tensors[0].name, "b");
  EXPECT_EQ(h.file_size, h.data_start + 8);
}

TEST(SafetensorsWriter, WhatWouldMakeTheFileWrongIsRefusedBeforeItIsOpened) {
  struct Case {
    const char* name;
    std::vector<SafetensorsEntry> tensors;
    std::string says;
  };
  const at::Tensor t = at::randn({2});
  const Case cases[] = {
      {"twice", {{"w", t}, {"w", t}}, "'w' is given twice"},
      {"metadata", {{"__metadata__", t}}, "'__metadata__' is the safetensors header's metadata"},
      {"dtype", {{"c", at::randn({2}, at::kComplexDouble)}}, "safetensors has no name for"},
      {"undefined", {{"u", at::Tensor()}}, "'u' must be a defined dense (strided) tensor"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = temp_path(std::string("refused-") + c.name + ".safetensors");
    const std::string message = message_of([&] { write_safetensors_file(path, c.tensors); });
    EXPECT_NE(message.find(c.says), std::string::npos) << message;
    EXPECT_NE(access(path.c_str(), F_OK), 0) << "created anyway";
  }
  const std::string message =
      message_of([] { write_safetensors_file(temp_path("no/such/dir/x.safetensors"), {}); });
  EXPECT_NE(message.find("cannot create"), std::string::npos) << message;
}

}  // namespace
}  // namespace reloadsafe
