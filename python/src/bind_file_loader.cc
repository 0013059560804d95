// bind_file_loader.cc: the safetensors file loader (utils/file_loader.h), for
// reloadsafe/file_loader.py.

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "python/src/bindings.h"

#include "utils/file_loader.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace reloadsafe::python {

void bind_file_loader(py::module_& m) {
  py::class_<FileLoader>(m, "FileLoader")
      .def(py::init([](int threads, int64_t chunk_bytes, int ring_slots) {
             FileLoaderOptions options;
             options.threads = threads;
             options.chunk_bytes = chunk_bytes;
             options.ring_slots = ring_slots;
             return std::make_unique<FileLoader>(options);
           }),
           py::arg("threads"), py::arg("chunk_bytes"), py::arg("ring_slots"))
      // The targets' tensors are held by the map for the whole call, and the
      // loader touches no Python object: the GIL is released while it reads.
      .def(
          "load_",
          [](FileLoader& self, const std::vector<std::string>& paths,
             const std::vector<
                 std::pair<std::string, std::pair<at::Tensor, std::optional<int64_t>>>>& targets) {
            LoadTargets map;
            for (const auto& [name, target] : targets) {
              TORCH_CHECK(map.count(name) == 0, "load_: '", name, "' is given twice");
              map[name] = {target.first, target.second};
            }
            py::gil_scoped_release release;
            return self.load_(paths, map);
          },
          py::arg("paths"), py::arg("targets"))
      .def("counters",
           [](const FileLoader& self) {
             const FileLoaderCounters c = self.counters();
             py::dict d;
             d["calls"] = c.calls;
             d["tensors_loaded"] = c.tensors_loaded;
             d["bytes_read"] = c.bytes_read;
             d["staging_allocations"] = c.staging_allocations;
             d["staging_bytes"] = c.staging_bytes;
             d["staged_copies"] = c.staged_copies;
             d["mapped_copies"] = c.mapped_copies;
             return d;
           })
      .def_property_readonly("threads",
                             [](const FileLoader& self) { return self.options().threads; })
      .def_property_readonly("chunk_bytes",
                             [](const FileLoader& self) { return self.options().chunk_bytes; })
      .def_property_readonly("ring_slots",
                             [](const FileLoader& self) { return self.options().ring_slots; });
}

}  // namespace reloadsafe::python
