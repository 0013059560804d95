// named_tensor.h: the tensors and opaque objects a layer names, for the
// trace's reports and the harness's subjects alike.
//
// A leaf: it depends on ATen's Tensor and nothing of the trace, so the
// harness's lowest layer (the subject interface) names what a layer holds
// without pulling in the capture.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace reloadsafe::trace {

/// A tensor a layer can name. Declared tensors are the layer's promise: the
/// forward may read them, and they keep address, storage and layout across
/// reloads. Undeclared ones only give traced reads a name.
struct NamedTensor {
  std::string name;
  at::Tensor tensor;
  bool declared = true;
};

/// An opaque object (a TorchBind script object) a layer can name, by
/// identity (ObjectRead::identity), or by the C++ instance it holds
/// (ObjectRead::payload, as a torch::CustomClassHolder*): an object handed
/// to its op from C++ is wrapped in a new script object on every call, and
/// only its instance stays the same.
struct NamedObject {
  std::string name;
  const void* identity = nullptr;
};

}  // namespace reloadsafe::trace
