#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/case_tensors.h"

#include "utils/storage_fit.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <c10/util/safe_numerics.h>

#include <algorithm>
#include <set>

namespace reloadsafe::conformance {
namespace {

// The fields of a layout object (a layer_script tensor has `name` too).
const std::set<std::string>& layout_keys() {
  static const auto* keys = new std::set<std::string>{
      "dtype", "shape", "stride", "offset", "storage_nbytes", "device", "on", "attrs", "kind"};
  return *keys;
}

void check_keys(const Json& j, const std::string& what, bool named) {
  for (const auto& item : j.items()) {
    TORCH_CHECK(layout_keys().count(item.key()) != 0 || (named && item.key() == "name"), what,
                " has an unknown field '", item.key(), "'");
  }
}

// dtype, shape, stride and offset; the bytes come later (size_geometry).
Geometry read_geometry(const Json& j, const std::string& what) {
  Geometry g;
  g.dtype = as_dtype(required(j, "dtype", what), what + ".dtype");
  g.shape = as_int_list(required(j, "shape", what), what + ".shape");
  for (size_t d = 0; d < g.shape.size(); ++d) {
    TORCH_CHECK(g.shape[d] >= 0, what, ".shape[", d, "] = ", g.shape[d],
                " is negative; sizes are >= 0");
  }
  if (const Json* s = field(j, "stride")) {
    g.stride = as_int_list(*s, what + ".stride");
    TORCH_CHECK(g.stride.size() == g.shape.size(), what, " has ", g.shape.size(), " sizes but ",
                g.stride.size(), " strides");
    for (size_t d = 0; d < g.stride.size(); ++d) {
      TORCH_CHECK(g.stride[d] >= 0, what, ".stride[", d, "] = ", g.stride[d],
                  " is negative; strides are >= 0");
    }
  } else {
    g.stride = contiguous_strides(g.shape, what);
  }
  if (const Json* o = field(j, "offset")) {
    g.offset = as_int(*o, what + ".offset");
    TORCH_CHECK(g.offset >= 0, what, ".offset = ", g.offset, " is negative");
  }
  return g;
}

std::optional<c10::Device> read_device(const Json& j, const std::string& what) {
  const Json* d = field(j, "device");
  if (d == nullptr) return std::nullopt;
  const std::string dev = as_string(*d, what + ".device");
  TORCH_CHECK(dev == "cpu" || dev == "meta", what, ".device: '", dev,
              "' is not a device cases can use (cpu, meta)");
  return c10::Device(dev == "cpu" ? c10::kCPU : c10::kMeta);
}

std::optional<std::string> read_on(const Json& j, const std::string& what) {
  const Json* on = field(j, "on");
  if (on == nullptr) return std::nullopt;
  std::string name = as_string(*on, what + ".on");
  TORCH_CHECK(!name.empty(), what, ".on is empty");
  return name;
}

std::optional<ObjectKind> read_kind(const Json& j, const std::string& what) {
  const Json* k = field(j, "kind");
  if (k == nullptr) return std::nullopt;
  const std::string kind = as_string(*k, what + ".kind");
  TORCH_CHECK(kind == "parameter" || kind == "tensor", what, ".kind: '", kind,
              "' is neither \"parameter\" nor \"tensor\"");
  return kind == "parameter" ? ObjectKind::kParameter : ObjectKind::kTensor;
}

AttrMap read_attrs(const Json& j, const std::string& what) {
  const Json* a = field(j, "attrs");
  return a == nullptr ? AttrMap{} : as_attrs(*a, what + ".attrs");
}

// Elements, extent and bytes, all checked: layouts from outside need not
// describe any tensor that could exist.
void size_geometry(Geometry& g, const std::string& what) {
  int64_t numel = 1;
  bool empty = false;
  for (int64_t size : g.shape) empty = empty || size == 0;
  for (int64_t size : g.shape) {
    TORCH_CHECK(empty || !c10::mul_overflows(numel, size, &numel), what,
                ": the number of elements of shape ", c10::IntArrayRef(g.shape),
                " overflows int64");
  }
  const std::optional<int64_t> span = checked_extent(g.shape, g.stride);
  TORCH_CHECK(span.has_value(), what, ": the extent of shape ", c10::IntArrayRef(g.shape),
              " with strides ", c10::IntArrayRef(g.stride), " overflows int64");
  const auto itemsize = static_cast<int64_t>(c10::elementSize(g.dtype));
  int64_t end = 0;
  TORCH_CHECK(!c10::add_overflows(g.offset, *span, &end) &&
                  !c10::mul_overflows(end, itemsize, &g.needed_nbytes),
              what, ": the bytes up to the end of this layout overflow int64");
}

int64_t read_storage_nbytes(const Json& nbytes, const std::string& what) {
  const int64_t n = as_int(nbytes, what + ".storage_nbytes");
  TORCH_CHECK(n >= 0, what, ".storage_nbytes = ", n, " is negative");
  return n;
}

// A layout object, and its name when `name` is given (layer_script).
ObjectSpec read_object_fields(const Json& j, const std::string& what, std::string* name) {
  TORCH_CHECK(j.is_object(), what, " must be a layout object, not ", j.type_name(), " ", brief(j));
  check_keys(j, what, name != nullptr);
  Geometry g = read_geometry(j, what);
  const std::optional<c10::Device> device = read_device(j, what);
  std::optional<std::string> on = read_on(j, what);
  ObjectSpec spec;
  spec.kind = read_kind(j, what);
  if (name != nullptr) *name = as_string(required(j, "name", what), what + ".name");
  spec.attrs = read_attrs(j, what);
  size_geometry(g, what);
  if (on) {
    spec.tensor = ViewTensor{std::move(g), std::move(*on), device};
    return spec;
  }
  OwnedTensor owned{std::move(g), 0, device.value_or(c10::Device(c10::kCPU))};
  owned.storage_nbytes = owned.geometry.needed_nbytes;
  if (const Json* nbytes = field(j, "storage_nbytes")) {
    owned.storage_nbytes = read_storage_nbytes(*nbytes, what);
    TORCH_CHECK(owned.geometry.needed_nbytes <= owned.storage_nbytes, what,
                ": the layout does not fit its storage: it needs ", owned.geometry.needed_nbytes,
                " bytes but storage_nbytes is ", owned.storage_nbytes);
  }
  spec.tensor = std::move(owned);
  return spec;
}

// Byte i of storage k: ((7 + 4k) * i + 13 + 158k) mod 256, so storage 0 is
// (7i + 13) and storage 1 is (11i + 171); modulo 2 again for bool owners.
void fill_pattern(uint8_t* bytes, int64_t nbytes, int64_t k, bool boolean) {
  const auto step = static_cast<uint8_t>((7 + 4 * static_cast<uint64_t>(k)) & 0xff);
  auto value = static_cast<uint8_t>((13 + 158 * static_cast<uint64_t>(k)) & 0xff);
  for (int64_t i = 0; i < nbytes; ++i, value = static_cast<uint8_t>(value + step)) {
    bytes[i] = boolean ? (value & 1) : value;
  }
}

void check_budget(int64_t used, int64_t more, int64_t* total) {
  TORCH_CHECK(!c10::add_overflows(used, more, total) && *total <= kMaxCaseStorageBytes,
              "the case asks for more than ", kMaxCaseStorageBytes,
              " bytes of CPU storage, the runner's limit per case");
}

}  // namespace

const Geometry& geometry(const TensorSpec& spec) {
  return std::visit([](const auto& s) -> const Geometry& { return s.geometry; }, spec);
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape,
                                        const std::string& what) {
  std::vector<int64_t> stride(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    stride[i] = acc;
    if (i > 0) {
      TORCH_CHECK(!c10::mul_overflows(acc, std::max<int64_t>(shape[i], 1), &acc), what,
                  ": the contiguous strides of this shape overflow int64");
    }
  }
  return stride;
}

ObjectSpec read_object(const Json& j, const std::string& what) {
  return read_object_fields(j, what, nullptr);
}

NamedObject read_named_object(const Json& j, const std::string& what) {
  NamedObject named;
  named.object = read_object_fields(j, what, &named.name);
  return named;
}

OwnedTensor read_storage_view_layout(const Json& c) {
  const std::string what = "the case";
  Geometry g = read_geometry(c, what);
  const std::optional<c10::Device> device = read_device(c, what);
  const std::optional<std::string> on = read_on(c, what);
  read_kind(c, what);   // checked, as in every layout
  read_attrs(c, what);  // checked, as in every layout
  size_geometry(g, what);
  const Json* nbytes = field(c, "storage_nbytes");
  TORCH_CHECK(nbytes != nullptr, what, " has no field 'storage_nbytes'");
  TORCH_CHECK(!on.has_value(), "storage_view cases have no field 'on'");
  OwnedTensor owned{std::move(g), read_storage_nbytes(*nbytes, what),
                    device.value_or(c10::Device(c10::kCPU))};
  return owned;
}

OldAndNew read_old_and_new(const Json& c) {
  OldAndNew specs;
  if (const Json* j = nullable(c, "old")) specs.old_spec = read_object(*j, "old");
  if (const Json* j = nullable(c, "new")) specs.new_spec = read_object(*j, "new");
  CaseTensors::plan({specs.old_spec ? &specs.old_spec->tensor : nullptr,
                     specs.new_spec ? &specs.new_spec->tensor : nullptr});
  return specs;
}

void CaseTensors::plan(const std::vector<const TensorSpec*>& specs) {
  int64_t total = 0;
  for (const TensorSpec* spec : specs) {
    const auto* owned = spec != nullptr ? std::get_if<OwnedTensor>(spec) : nullptr;
    if (owned == nullptr || !owned->device.is_cpu()) continue;
    check_budget(total, owned->storage_nbytes, &total);
  }
}

c10::Storage CaseTensors::storage(int64_t nbytes, c10::Device device, int64_t k, bool boolean) {
  if (device.is_cpu()) check_budget(cpu_bytes_, nbytes, &cpu_bytes_);
  at::Tensor bytes = at::empty({nbytes}, at::TensorOptions().dtype(at::kByte).device(device));
  if (device.is_cpu()) fill_pattern(bytes.data_ptr<uint8_t>(), nbytes, k, boolean);
  return bytes.storage();
}

at::Tensor CaseTensors::own(const TensorSpec& spec, int64_t k, const std::string& what) {
  const auto* owned = std::get_if<OwnedTensor>(&spec);
  TORCH_CHECK(owned != nullptr, what, ".on: this tensor cannot be a view on another one");
  const Geometry& g = owned->geometry;
  c10::Storage s =
      storage(owned->storage_nbytes, owned->device, k, g.dtype == at::ScalarType::Bool);
  return storage_view(s, g.offset, g.shape, g.stride, g.dtype);
}

at::Tensor CaseTensors::view_on(const ViewTensor& spec, const c10::Storage& base,
                                const std::string& what) {
  TORCH_CHECK(!spec.device || *spec.device == base.device(), what, ".device is ",
              spec.device.value_or(c10::Device(c10::kCPU)), " but the storage it is on is on ",
              base.device());
  const Geometry& g = spec.geometry;
  TORCH_CHECK(g.needed_nbytes <= static_cast<int64_t>(base.nbytes()), what, ": the view needs ",
              g.needed_nbytes, " bytes but the storage it is on has ", base.nbytes());
  return storage_view(base, g.offset, g.shape, g.stride, g.dtype);
}

at::Tensor CaseTensors::second(const TensorSpec& spec, const c10::Storage* base,
                               const char* base_name, const std::string& what) {
  const auto* view = std::get_if<ViewTensor>(&spec);
  if (view == nullptr) return own(spec, 1, what);
  TORCH_CHECK(view->on == base_name, what, ".on must be \"", base_name, "\", not \"", view->on,
              "\"");
  TORCH_CHECK(base != nullptr, what, " is on \"", base_name, "\" but there is no ", base_name,
              " tensor");
  return view_on(*view, *base, what);
}

at::Tensor make_object(const at::Tensor& data, const ObjectSpec& spec, ObjectKind default_kind) {
  const ObjectKind kind = spec.kind.value_or(default_kind);
  at::Tensor obj = kind == ObjectKind::kParameter ? make_parameter(data) : data;
  for (const auto& [key, value] : spec.attrs) set_attr(obj, key, value);
  return obj;
}

const char* kind_name(const at::Tensor& t) {
  return is_parameter(t) ? "parameter" : "tensor";
}

}  // namespace reloadsafe::conformance
