// case_tensors.h: the tensors, storages and objects a case describes
// (golden/FORMAT.md, "Layouts" and "Storage contents").
//
// A case's layout is one of three kinds, each its own type:
//  - OwnedTensor: a tensor on a storage of its own, which the case creates
//    (filled with a known byte pattern) and whose bytes it reports;
//  - ViewTensor: a view on the storage of another tensor of the case ("on");
//  - NamedObject: a layer_script tensor, an ObjectSpec under a name.
// An ObjectSpec adds what makes a tensor an object: parameter or plain
// tensor, and its attributes.
//
// Invariant: a case never asks for more than kMaxCaseStorageBytes of CPU
// storage in all (CaseTensors checks before allocating), and every tensor
// built here ends within its storage: layouts are overflow-checked when they
// are read, and views go through storage_view, which checks the fit.
//
// Usage:
//   const ObjectSpec old = read_object(required(c, "old", "the case"), "old");
//   CaseTensors::plan({&old.tensor});
//   CaseTensors tensors;
//   at::Tensor t = make_object(tensors.own(old.tensor, 0, "old"), old, ObjectKind::kParameter);
#pragma once

#include "conformance/case_json.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Storage.h>

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace reloadsafe::conformance {

/// The most bytes of CPU storage one case may ask for, all its storages
/// together (1 GiB). A case above it gets an error line instead of an
/// allocation. Meta storages allocate nothing and do not count.
inline constexpr int64_t kMaxCaseStorageBytes = int64_t{1} << 30;

/// Dtype, sizes, strides (elements) and offset (elements) of one tensor,
/// with the bytes it needs from the start of its storage,
/// `(offset + extent) * itemsize`, all checked against int64 overflow.
struct Geometry {
  at::ScalarType dtype = at::ScalarType::Float;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  int64_t offset = 0;
  int64_t needed_nbytes = 0;
};

/// A tensor on a storage of its own of `storage_nbytes` bytes.
struct OwnedTensor {
  Geometry geometry;
  int64_t storage_nbytes = 0;
  c10::Device device = c10::Device(c10::kCPU);
};

/// A view on the storage of the case tensor named `on`; `offset` counts from
/// that storage's start. `device`, when given, must be that storage's.
struct ViewTensor {
  Geometry geometry;
  std::string on;
  std::optional<c10::Device> device;
};

/// Where a layout's tensor lives.
using TensorSpec = std::variant<OwnedTensor, ViewTensor>;

/// Parameter or plain tensor.
enum class ObjectKind { kParameter, kTensor };

/// A layout as an object: its tensor, its kind (nullopt: the operation's
/// default) and its attributes.
struct ObjectSpec {
  TensorSpec tensor;
  std::optional<ObjectKind> kind;
  AttrMap attrs;
};

/// A layer_script tensor: an object with a name.
struct NamedObject {
  std::string name;
  ObjectSpec object;
};

/// The geometry of any layout.
const Geometry& geometry(const TensorSpec& spec);

/// PyTorch's contiguous strides of `shape` (a size 0 counts as 1); throws if
/// they overflow int64.
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape, const std::string& what);

/// A layout object of an operation (`old`, `new`, `dst`, `src`, `tensor`).
/// Unknown fields are errors; an owned storage must hold the layout.
ObjectSpec read_object(const Json& j, const std::string& what);

/// A layer_script tensor: a layout object with a `name`.
NamedObject read_named_object(const Json& j, const std::string& what);

/// The layout of a storage_view case, given by the case's own fields (other
/// fields are the case's): `storage_nbytes` is required and may be too small,
/// since judging the fit is the utility's job; `on` is refused.
OwnedTensor read_storage_view_layout(const Json& c);

/// The `old` and `new` layouts of a case, each null or absent for None.
struct OldAndNew {
  std::optional<ObjectSpec> old_spec;
  std::optional<ObjectSpec> new_spec;
};

/// Reads `old` and `new` (either may be null or absent) and checks their
/// storages against the per-case limit before anything is allocated.
OldAndNew read_old_and_new(const Json& c);

/// The tensors, storages and storage budget of one case.
class CaseTensors {
 public:
  /// Checks, before anything is allocated, that the owned CPU storages of
  /// `specs` (nullptr entries are skipped) fit kMaxCaseStorageBytes together.
  static void plan(const std::vector<const TensorSpec*>& specs);

  /// A new storage of `nbytes` bytes on `device`, filled with pattern `k`
  /// (bytes reduced modulo 2 when `boolean`) if it is on the CPU.
  c10::Storage storage(int64_t nbytes, c10::Device device, int64_t k, bool boolean);

  /// The tensor of `spec` on a new storage of its own (pattern `k`). A view
  /// spec is an error here: this tensor must own its storage.
  at::Tensor own(const TensorSpec& spec, int64_t k, const std::string& what);

  /// The tensor of `spec` as a view on `base`.
  static at::Tensor view_on(const ViewTensor& spec, const c10::Storage& base,
                            const std::string& what);

  /// The second tensor of an operation: on a storage of its own (pattern 1),
  /// or a view on `base`, which the case calls `base_name` ("old", "dst";
  /// `base` is nullptr when the case has no such tensor).
  at::Tensor second(const TensorSpec& spec, const c10::Storage* base, const char* base_name,
                    const std::string& what);

 private:
  int64_t cpu_bytes_ = 0;
};

/// The object `spec` describes, on `data`: `data` itself or a new parameter
/// on it (by `spec.kind`, else `default_kind`), with `spec.attrs` set.
at::Tensor make_object(const at::Tensor& data, const ObjectSpec& spec, ObjectKind default_kind);

/// The kind of an object as results name it ("parameter" or "tensor").
const char* kind_name(const at::Tensor& t);

}  // namespace reloadsafe::conformance
