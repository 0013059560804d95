// case_runner.cc: the operations of the case format (golden/FORMAT.md):
// reading cases, building the tensors, storages and layers they describe,
// calling the utilities, and reporting the outcome as JSON.
#include "conformance/case_runner.h"

#include "utils/copy_weight.h"
#include "utils/layer.h"
#include "utils/parameter_names.h"
#include "utils/reload_context.h"
#include "utils/replace_parameter.h"
#include "utils/storage_fit.h"
#include "utils/tensor_attrs.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/safe_numerics.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace reloadsafe::conformance {
namespace {

using Json = nlohmann::json;           // cases as read
using OJson = nlohmann::ordered_json;  // results, keys in the documented order

// The name every single-weight operation uses for the layer attribute.
constexpr const char* kWeight = "weight";
// The attribute name refill_derived cases use.
constexpr const char* kDerived = "derived";
// Bounds that keep hostile cases from exhausting the stack.
constexpr int64_t kMaxModulePathDepth = 64;
constexpr int64_t kMaxScopeDepth = 64;

// ---------------------------------------------------------------------------
// Reading JSON

// A short rendering of a JSON value for error messages.
std::string brief(const Json& v) {
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  return s.size() <= 40 ? s : s.substr(0, 37) + "...";
}

const Json* field(const Json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

const Json& required(const Json& obj, const char* key, const std::string& what) {
  const Json* v = field(obj, key);
  TORCH_CHECK(v != nullptr, what, " has no field '", key, "'");
  return *v;
}

int64_t as_int(const Json& v, const std::string& what) {
  TORCH_CHECK(v.is_number_integer(), what, " must be an integer, not ", v.type_name(), " ",
              brief(v));
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    TORCH_CHECK(u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), what, " = ", u,
                " does not fit in int64");
    return static_cast<int64_t>(u);
  }
  return v.get<int64_t>();
}

bool as_bool(const Json& v, const std::string& what) {
  TORCH_CHECK(v.is_boolean(), what, " must be true or false, not ", v.type_name(), " ", brief(v));
  return v.get<bool>();
}

std::string as_string(const Json& v, const std::string& what) {
  TORCH_CHECK(v.is_string(), what, " must be a string, not ", v.type_name(), " ", brief(v));
  return v.get<std::string>();
}

std::vector<int64_t> as_int_list(const Json& v, const std::string& what) {
  TORCH_CHECK(v.is_array(), what, " must be an array of integers, not ", v.type_name(), " ",
              brief(v));
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    out.push_back(as_int(v[i], what + "[" + std::to_string(i) + "]"));
  }
  return out;
}

bool opt_bool(const Json& obj, const char* key, bool fallback) {
  const Json* v = field(obj, key);
  return v == nullptr ? fallback : as_bool(*v, key);
}

// A field that may be absent or null (both read as nullptr).
const Json* nullable(const Json& obj, const char* key) {
  const Json* v = field(obj, key);
  return v == nullptr || v->is_null() ? nullptr : v;
}

// Rejects nesting deeper than kMaxJsonDepth before the parser sees the line.
void check_depth(const std::string& line) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char ch : line) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (ch == '\\') {
        escaped = true;
      } else if (ch == '"') {
        in_string = false;
      }
      continue;
    }
    if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      TORCH_CHECK(++depth <= kMaxJsonDepth, "the case nests arrays and objects deeper than ",
                  kMaxJsonDepth, " levels");
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
}

// ---------------------------------------------------------------------------
// Dtypes

const std::vector<std::pair<std::string, at::ScalarType>>& dtype_table() {
  static const auto* table = new std::vector<std::pair<std::string, at::ScalarType>>{
      {"bool", at::ScalarType::Bool},
      {"uint8", at::ScalarType::Byte},
      {"int8", at::ScalarType::Char},
      {"int16", at::ScalarType::Short},
      {"int32", at::ScalarType::Int},
      {"int64", at::ScalarType::Long},
      {"float16", at::ScalarType::Half},
      {"bfloat16", at::ScalarType::BFloat16},
      {"float32", at::ScalarType::Float},
      {"float64", at::ScalarType::Double},
      {"float8_e4m3fn", at::ScalarType::Float8_e4m3fn},
      {"float8_e5m2", at::ScalarType::Float8_e5m2},
  };
  return *table;
}

at::ScalarType parse_dtype(const Json& v, const std::string& what) {
  const std::string name = as_string(v, what);
  const auto& table = dtype_table();
  auto it =
      std::find_if(table.begin(), table.end(), [&](const auto& e) { return e.first == name; });
  TORCH_CHECK(it != table.end(), what, ": unknown dtype '", name, "'");
  return it->second;
}

std::string dtype_name(at::ScalarType t) {
  for (const auto& [n, s] : dtype_table()) {
    if (s == t) return n;
  }
  return c10::toString(t);
}

// ---------------------------------------------------------------------------
// Attributes

AttrMap parse_attrs(const Json& v, const std::string& what) {
  TORCH_CHECK(v.is_object(), what, " must be an object, not ", v.type_name());
  // Properties every tensor has; Python cannot set them as attributes.
  static const std::set<std::string> kProperties = {"data",   "shape",         "dtype",   "device",
                                                    "grad",   "requires_grad", "is_meta", "is_cuda",
                                                    "layout", "ndim",          "T",       "names"};
  AttrMap out;
  for (const auto& [key, value] : v.items()) {
    const std::string where = what + "." + key;
    TORCH_CHECK(kProperties.count(key) == 0, where, ": '", key,
                "' is a property of every tensor, not an attribute a case can set");
    if (value.is_string()) {
      out[key] = AttrValue(value.get<std::string>());
    } else if (value.is_boolean()) {
      out[key] = AttrValue(value.get<bool>());
    } else if (value.is_number_integer()) {
      out[key] = AttrValue(as_int(value, where));
    } else {
      TORCH_CHECK(false, where, ": attribute values are strings, booleans or integers, not ",
                  value.type_name());
    }
  }
  return out;
}

OJson attr_json(const AttrValue& value) {
  return std::visit(
      [](const auto& v) -> OJson {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, WeightLoader>) {
          return v.name;
        } else if constexpr (std::is_same_v<T, at::Tensor>) {
          return "<tensor>";
        } else {
          return v;
        }
      },
      value);
}

// All attributes of `t`, keys sorted.
OJson attrs_json(const at::Tensor& t) {
  OJson out = OJson::object();
  for (const auto& [key, value] : attrs(t)) out[key] = attr_json(value);
  return out;
}

// ---------------------------------------------------------------------------
// Layouts

struct Layout {
  at::ScalarType dtype = at::ScalarType::Float;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  int64_t offset = 0;
  int64_t needed_nbytes = 0;   // (offset + extent) * itemsize
  int64_t storage_nbytes = 0;  // of its own storage (unused for views)
  c10::Device device = c10::Device(c10::kCPU);
  bool device_given = false;
  std::string on;    // empty: a storage of its own; else whose storage it views
  std::string kind;  // empty (the operation's default), "parameter" or "tensor"
  std::string name;  // layer_script tensors only
  AttrMap attrs;
};

struct LayoutRules {
  bool strict_keys = true;      // reject fields that are not layout fields
  bool allow_name = false;      // layer_script: a "name" field
  bool check_fit = true;        // false: the utility itself must judge the fit
  bool require_nbytes = false;  // storage_nbytes has no default
};

// PyTorch's contiguous strides (a size 0 counts as 1), overflow-checked.
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

Layout parse_layout(const Json& j, const std::string& what, const LayoutRules& rules) {
  TORCH_CHECK(j.is_object(), what, " must be a layout object, not ", j.type_name(), " ", brief(j));
  if (rules.strict_keys) {
    static const std::set<std::string> known = {
        "dtype", "shape", "stride", "offset", "storage_nbytes", "device", "on", "attrs", "kind"};
    for (const auto& item : j.items()) {
      TORCH_CHECK(known.count(item.key()) != 0 || (rules.allow_name && item.key() == "name"), what,
                  " has an unknown field '", item.key(), "'");
    }
  }
  Layout l;
  l.dtype = parse_dtype(required(j, "dtype", what), what + ".dtype");
  l.shape = as_int_list(required(j, "shape", what), what + ".shape");
  for (size_t d = 0; d < l.shape.size(); ++d) {
    TORCH_CHECK(l.shape[d] >= 0, what, ".shape[", d, "] = ", l.shape[d],
                " is negative; sizes are >= 0");
  }
  if (const Json* s = field(j, "stride")) {
    l.stride = as_int_list(*s, what + ".stride");
    TORCH_CHECK(l.stride.size() == l.shape.size(), what, " has ", l.shape.size(), " sizes but ",
                l.stride.size(), " strides");
    for (size_t d = 0; d < l.stride.size(); ++d) {
      TORCH_CHECK(l.stride[d] >= 0, what, ".stride[", d, "] = ", l.stride[d],
                  " is negative; strides are >= 0");
    }
  } else {
    l.stride = contiguous_strides(l.shape, what);
  }
  if (const Json* o = field(j, "offset")) {
    l.offset = as_int(*o, what + ".offset");
    TORCH_CHECK(l.offset >= 0, what, ".offset = ", l.offset, " is negative");
  }
  if (const Json* d = field(j, "device")) {
    const std::string dev = as_string(*d, what + ".device");
    TORCH_CHECK(dev == "cpu" || dev == "meta", what, ".device: '", dev,
                "' is not a device cases can use (cpu, meta)");
    l.device = c10::Device(dev == "cpu" ? c10::kCPU : c10::kMeta);
    l.device_given = true;
  }
  if (const Json* on = field(j, "on")) {
    l.on = as_string(*on, what + ".on");
    TORCH_CHECK(!l.on.empty(), what, ".on is empty");
  }
  if (const Json* k = field(j, "kind")) {
    l.kind = as_string(*k, what + ".kind");
    TORCH_CHECK(l.kind == "parameter" || l.kind == "tensor", what, ".kind: '", l.kind,
                "' is neither \"parameter\" nor \"tensor\"");
  }
  if (rules.allow_name) l.name = as_string(required(j, "name", what), what + ".name");
  if (const Json* a = field(j, "attrs")) l.attrs = parse_attrs(*a, what + ".attrs");

  // Elements, extent and bytes, all checked: layouts from outside need not
  // describe any tensor that could exist.
  int64_t numel = 1;
  bool empty = false;
  for (int64_t size : l.shape) empty = empty || size == 0;
  for (int64_t size : l.shape) {
    TORCH_CHECK(empty || !c10::mul_overflows(numel, size, &numel), what,
                ": the number of elements of shape ", c10::IntArrayRef(l.shape),
                " overflows int64");
  }
  const std::optional<int64_t> span = checked_extent(l.shape, l.stride);
  TORCH_CHECK(span.has_value(), what, ": the extent of shape ", c10::IntArrayRef(l.shape),
              " with strides ", c10::IntArrayRef(l.stride), " overflows int64");
  const auto itemsize = static_cast<int64_t>(c10::elementSize(l.dtype));
  int64_t end = 0;
  TORCH_CHECK(!c10::add_overflows(l.offset, *span, &end) &&
                  !c10::mul_overflows(end, itemsize, &l.needed_nbytes),
              what, ": the bytes up to the end of this layout overflow int64");
  const Json* nbytes = field(j, "storage_nbytes");
  TORCH_CHECK(nbytes != nullptr || !rules.require_nbytes, what, " has no field 'storage_nbytes'");
  if (nbytes != nullptr && l.on.empty()) {
    l.storage_nbytes = as_int(*nbytes, what + ".storage_nbytes");
    TORCH_CHECK(l.storage_nbytes >= 0, what, ".storage_nbytes = ", l.storage_nbytes,
                " is negative");
    TORCH_CHECK(!rules.check_fit || l.needed_nbytes <= l.storage_nbytes, what,
                ": the layout does not fit its storage: it needs ", l.needed_nbytes,
                " bytes but storage_nbytes is ", l.storage_nbytes);
  } else {
    l.storage_nbytes = l.needed_nbytes;
  }
  return l;
}

// ---------------------------------------------------------------------------
// Building tensors

// Byte i of storage k: ((7 + 4k) * i + 13 + 158k) mod 256, so storage 0 is
// (7i + 13) and storage 1 is (11i + 171); modulo 2 again for bool owners.
void fill_pattern(uint8_t* bytes, int64_t nbytes, int64_t k, bool boolean) {
  const auto step = static_cast<uint8_t>((7 + 4 * static_cast<uint64_t>(k)) & 0xff);
  auto value = static_cast<uint8_t>((13 + 158 * static_cast<uint64_t>(k)) & 0xff);
  for (int64_t i = 0; i < nbytes; ++i, value = static_cast<uint8_t>(value + step)) {
    bytes[i] = boolean ? (value & 1) : value;
  }
}

// The tensors, storages and budget of one case.
class CaseTensors {
 public:
  // Checks, before anything is allocated, that the CPU storages of `layouts`
  // (those with a storage of their own) stay within kMaxCaseStorageBytes.
  static void plan(const std::vector<const Layout*>& layouts) {
    int64_t total = 0;
    for (const Layout* l : layouts) {
      if (l == nullptr || !l->on.empty() || !l->device.is_cpu()) continue;
      TORCH_CHECK(
          !c10::add_overflows(total, l->storage_nbytes, &total) && total <= kMaxCaseStorageBytes,
          "the case asks for more than ", kMaxCaseStorageBytes,
          " bytes of CPU storage, the runner's limit per case");
    }
  }

  // A new storage of `nbytes` filled with pattern `k`.
  c10::Storage storage(int64_t nbytes, c10::Device device, int64_t k, bool boolean) {
    if (device.is_cpu()) {
      int64_t total = 0;
      TORCH_CHECK(!c10::add_overflows(cpu_bytes_, nbytes, &total) && total <= kMaxCaseStorageBytes,
                  "the case asks for more than ", kMaxCaseStorageBytes,
                  " bytes of CPU storage, the runner's limit per case");
      cpu_bytes_ = total;
    }
    at::Tensor bytes = at::empty({nbytes}, at::TensorOptions().dtype(at::kByte).device(device));
    if (device.is_cpu()) fill_pattern(bytes.data_ptr<uint8_t>(), nbytes, k, boolean);
    return bytes.storage();
  }

  // The tensor of layout `l` on a storage of its own (pattern `k`).
  at::Tensor own(const Layout& l, int64_t k, const std::string& what) {
    TORCH_CHECK(l.on.empty(), what, ".on: this tensor cannot be a view on another one");
    c10::Storage s = storage(l.storage_nbytes, l.device, k, l.dtype == at::ScalarType::Bool);
    return storage_view(s, l.offset, l.shape, l.stride, l.dtype);
  }

  // The tensor of layout `l` as a view on `base`; offset counts from its start.
  static at::Tensor view_on(const Layout& l, const c10::Storage& base, const std::string& what) {
    TORCH_CHECK(!l.device_given || l.device == base.device(), what, ".device is ", l.device,
                " but the storage it is on is on ", base.device());
    TORCH_CHECK(l.needed_nbytes <= static_cast<int64_t>(base.nbytes()), what, ": the view needs ",
                l.needed_nbytes, " bytes but the storage it is on has ", base.nbytes());
    return storage_view(base, l.offset, l.shape, l.stride, l.dtype);
  }

 private:
  int64_t cpu_bytes_ = 0;
};

// The object a layout describes: a parameter or a plain tensor, with its
// attributes set.
at::Tensor make_object(const at::Tensor& data, const Layout& l, const char* default_kind) {
  const std::string kind = l.kind.empty() ? default_kind : l.kind;
  at::Tensor obj = kind == "parameter" ? make_parameter(data) : data;
  for (const auto& [key, value] : l.attrs) set_attr(obj, key, value);
  return obj;
}

// ---------------------------------------------------------------------------
// Reporting

bool same_storage(const at::Tensor& t, const c10::Storage& s) {
  return t.defined() && t.storage().unsafeGetStorageImpl() == s.unsafeGetStorageImpl();
}

void put_layout(OJson& out, const at::Tensor& t) {
  out["dtype"] = dtype_name(t.scalar_type());
  out["shape"] = t.sizes().vec();
  out["stride"] = t.strides().vec();
  out["byte_offset"] = t.storage_offset() * static_cast<int64_t>(t.element_size());
}

std::string hex(const c10::Storage& s) {
  static constexpr char kDigits[] = "0123456789abcdef";
  const auto* bytes = static_cast<const uint8_t*>(s.data());
  std::string out(2 * s.nbytes(), '0');
  for (size_t i = 0; i < s.nbytes(); ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 0xf];
  }
  return out;
}

// A storage and its data pointer when the case had built it.
struct Watched {
  c10::Storage storage;
  const void* data;
  explicit Watched(c10::Storage s) : storage(std::move(s)), data(storage.data()) {}
};

OJson storage_json(const Watched& w) {
  OJson out;
  out["nbytes"] = static_cast<int64_t>(w.storage.nbytes());
  out["moved"] = w.storage.data() != w.data;
  if (w.storage.device().is_cpu()) out["hex"] = hex(w.storage);
  return out;
}

// Names for the objects and storages a layer_script reports: the case's own
// under their names, others "#1", "#2", ... in order of first report. Holds
// every object it has named, so no identity is reused while the case runs.
class Registry {
 public:
  void add_object(const at::Tensor& t, const std::string& name) {
    objects_.emplace(t.unsafeGetTensorImpl(), std::make_pair(t, name));
  }
  void add_storage(const c10::Storage& s, const std::string& name) {
    storages_.emplace(s.unsafeGetStorageImpl(), std::make_pair(s, name));
  }
  OJson object(const at::Tensor& t) {
    if (!t.defined()) return nullptr;
    auto it = objects_.find(t.unsafeGetTensorImpl());
    if (it != objects_.end()) return it->second.second;
    const std::string name = "#" + std::to_string(next_++);
    add_object(t, name);
    return name;
  }
  OJson storage(const at::Tensor& t) const {
    auto it = storages_.find(t.storage().unsafeGetStorageImpl());
    return it == storages_.end() ? OJson("other") : OJson(it->second.second);
  }

 private:
  std::unordered_map<const c10::TensorImpl*, std::pair<at::Tensor, std::string>> objects_;
  std::unordered_map<const c10::StorageImpl*, std::pair<c10::Storage, std::string>> storages_;
  int64_t next_ = 1;
};

// ---------------------------------------------------------------------------
// Operations of case-format.md

void op_extent(const Json& c, OJson& out) {
  const std::vector<int64_t> shape = as_int_list(required(c, "shape", "the case"), "shape");
  for (size_t d = 0; d < shape.size(); ++d) {
    TORCH_CHECK(shape[d] >= 0, "shape[", d, "] = ", shape[d], " is negative; sizes are >= 0");
  }
  const Json* s = field(c, "stride");
  const std::vector<int64_t> stride =
      s != nullptr ? as_int_list(*s, "stride") : contiguous_strides(shape, "shape");
  const std::optional<int64_t> span = checked_extent(shape, stride);
  TORCH_CHECK(span.has_value(), "the extent of shape ", c10::IntArrayRef(shape), " with strides ",
              c10::IntArrayRef(stride), " overflows int64");
  out["extent"] = *span;
}

// The new tensor of an operation: on a storage of its own (pattern 1) or, with
// "on": `base_name`, a view on `base`.
at::Tensor build_second(CaseTensors& tensors, const Layout& l, const c10::Storage* base,
                        const char* base_name, const std::string& what) {
  if (l.on.empty()) return tensors.own(l, 1, what);
  TORCH_CHECK(l.on == base_name, what, ".on must be \"", base_name, "\", not \"", l.on, "\"");
  TORCH_CHECK(base != nullptr, what, " is on \"", base_name, "\" but there is no ", base_name,
              " tensor");
  return CaseTensors::view_on(l, *base, what);
}

void op_in_own_storage(const Json& c, OJson& out) {
  const bool whole_storage = opt_bool(c, "whole_storage", false);
  const Layout old_layout = parse_layout(required(c, "old", "the case"), "old", {});
  const Layout new_layout = parse_layout(required(c, "new", "the case"), "new", {});
  CaseTensors::plan({&old_layout, &new_layout});
  CaseTensors tensors;
  const at::Tensor old = tensors.own(old_layout, 0, "old");
  const Watched old_storage(old.storage());
  const at::Tensor fresh = build_second(tensors, new_layout, &old_storage.storage, "old", "new");

  const at::Tensor result = in_own_storage(old, fresh, whole_storage);

  out["placed"] = !result.is_same(fresh);
  OJson r;
  put_layout(r, result);
  r["storage"] = same_storage(result, old_storage.storage) ? "old"
                 : same_storage(result, fresh.storage())   ? "new"
                                                           : "other";
  out["result"] = r;
  out["old_storage"] = storage_json(old_storage);
}

// The nullable `old` and `new` layouts of a case, with their storages
// checked against the per-case limit before anything is allocated.
std::pair<std::optional<Layout>, std::optional<Layout>> parse_old_and_new(const Json& c) {
  const Json* old_json = nullable(c, "old");
  const Json* new_json = nullable(c, "new");
  std::optional<Layout> old_layout =
      old_json ? std::optional<Layout>(parse_layout(*old_json, "old", {})) : std::nullopt;
  std::optional<Layout> new_layout =
      new_json ? std::optional<Layout>(parse_layout(*new_json, "new", {})) : std::nullopt;
  CaseTensors::plan({old_layout ? &*old_layout : nullptr, new_layout ? &*new_layout : nullptr});
  return {std::move(old_layout), std::move(new_layout)};
}

void op_replace_parameter(const Json& c, OJson& out) {
  const bool direct = opt_bool(c, "direct_reload", false);
  Layer layer;
  if (const Json* u = field(c, "uses_meta_device")) {
    layer.quant_method = QuantMethod{as_bool(*u, "uses_meta_device")};
  }
  const auto [old_layout, new_layout] = parse_old_and_new(c);

  CaseTensors tensors;
  at::Tensor old;
  std::optional<Watched> old_storage;
  if (old_layout) {
    old = make_object(tensors.own(*old_layout, 0, "old"), *old_layout, "parameter");
    old_storage.emplace(old.storage());
    if (is_parameter(old)) {
      layer.register_param(kWeight, old);
    } else {
      layer.set_attribute(kWeight, old);
    }
  }
  at::Tensor fresh;
  std::optional<c10::Storage> fresh_storage;
  if (new_layout) {
    fresh = make_object(build_second(tensors, *new_layout,
                                     old_storage ? &old_storage->storage : nullptr, "old", "new"),
                        *new_layout, "tensor");
    fresh_storage = fresh.storage();
  }

  {
    DirectReloadScope scope(direct);
    replace_parameter(layer, kWeight, fresh);
  }

  const at::Tensor held = layer.get(kWeight);
  if (!held.defined()) {
    out["param"] = nullptr;
  } else {
    OJson p;
    p["kind"] = is_parameter(held) ? "parameter" : "tensor";
    p["same_object"] = old.defined() && held.is_same(old);
    put_layout(p, held);
    p["storage"] = old_storage && same_storage(held, old_storage->storage) ? "old"
                   : fresh_storage && same_storage(held, *fresh_storage)   ? "new"
                                                                           : "other";
    p["attrs"] = attrs_json(held);
    out["param"] = p;
  }
  if (old_storage) out["old_storage"] = storage_json(*old_storage);
}

// ---------------------------------------------------------------------------
// Operations added by this project (golden/FORMAT.md)

// `old`/`new` of the case, or "other", for an object.
OJson which_object(const at::Tensor& t, const at::Tensor& old, const at::Tensor& fresh) {
  if (!t.defined()) return nullptr;
  if (old.defined() && t.is_same(old)) return "old";
  if (fresh.defined() && t.is_same(fresh)) return "new";
  return "other";
}

void op_refill_derived(const Json& c, OJson& out) {
  const auto [old_layout, new_layout] = parse_old_and_new(c);
  Layer layer;
  CaseTensors tensors;
  at::Tensor old;
  std::optional<Watched> old_storage;
  if (old_layout) {
    old = make_object(tensors.own(*old_layout, 0, "old"), *old_layout, "tensor");
    old_storage.emplace(old.storage());
    layer.set(kDerived, old);
  }
  at::Tensor fresh;
  if (new_layout) {
    fresh = make_object(build_second(tensors, *new_layout,
                                     old_storage ? &old_storage->storage : nullptr, "old", "new"),
                        *new_layout, "tensor");
  }

  const at::Tensor returned = refill_derived(layer, kDerived, fresh);

  out["returned"] = which_object(returned, old, fresh);
  const at::Tensor held = layer.get(kDerived);
  if (!held.defined()) {
    out["derived"] = nullptr;
  } else {
    OJson d;
    d["object"] = which_object(held, old, fresh);
    d["kind"] = is_parameter(held) ? "parameter" : "tensor";
    put_layout(d, held);
    d["storage"] = old_storage && same_storage(held, old_storage->storage)  ? "old"
                   : fresh.defined() && same_storage(held, fresh.storage()) ? "new"
                                                                            : "other";
    out["derived"] = d;
  }
  if (old_storage) out["old_storage"] = storage_json(*old_storage);
}

void op_set_weight_attrs(const Json& c, OJson& out) {
  Layout l;
  l.dtype = at::ScalarType::Float;
  l.needed_nbytes = l.storage_nbytes = 4;
  if (const Json* t = field(c, "tensor")) l = parse_layout(*t, "tensor", {});
  const Json& given = required(c, "weight_attrs", "the case");
  const std::optional<AttrMap> weight_attrs =
      given.is_null() ? std::nullopt : std::optional<AttrMap>(parse_attrs(given, "weight_attrs"));
  CaseTensors tensors;
  const at::Tensor weight = make_object(tensors.own(l, 0, "tensor"), l, "tensor");
  set_weight_attrs(weight, weight_attrs);
  out["attrs"] = attrs_json(weight);
}

void op_storage_view(const Json& c, OJson& out) {
  LayoutRules rules;
  rules.strict_keys = false;
  rules.check_fit = false;
  rules.require_nbytes = true;
  const Layout l = parse_layout(c, "the case", rules);
  TORCH_CHECK(l.on.empty(), "storage_view cases have no field 'on'");
  CaseTensors tensors;
  const Watched storage(
      tensors.storage(l.storage_nbytes, l.device, 0, l.dtype == at::ScalarType::Bool));

  const at::Tensor view = storage_view(storage.storage, l.offset, l.shape, l.stride, l.dtype);

  OJson v;
  put_layout(v, view);
  v["storage"] = same_storage(view, storage.storage) ? "same" : "other";
  out["view"] = v;
  out["storage"] = storage_json(storage);
}

void op_copy_weight(const Json& c, OJson& out) {
  const bool integrated = opt_bool(c, "integrated", false);
  const Layout dst_layout = parse_layout(required(c, "dst", "the case"), "dst", {});
  const Layout src_layout = parse_layout(required(c, "src", "the case"), "src", {});
  CaseTensors::plan({&dst_layout, &src_layout});
  CaseTensors tensors;
  at::Tensor dst = tensors.own(dst_layout, 0, "dst");
  const Watched dst_storage(dst.storage());
  const at::Tensor src = build_second(tensors, src_layout, &dst_storage.storage, "dst", "src");
  {
    ScopedIntegratedGpuOverride force(integrated);
    const at::Tensor& returned = copy_weight_(dst, src);
    out["same_object"] = returned.is_same(dst);
  }
  out["dst_storage"] = storage_json(dst_storage);
}

void op_get_moe_expert_mapping(const Json& c, OJson& out) {
  const Json& modules = required(c, "modules", "the case");
  TORCH_CHECK(modules.is_array(), "modules must be an array, not ", modules.type_name());
  auto root = std::make_shared<Layer>("Model");
  std::set<Layer*> with_mapping;
  for (size_t i = 0; i < modules.size(); ++i) {
    const std::string what = "modules[" + std::to_string(i) + "]";
    const Json& m = modules[i];
    TORCH_CHECK(m.is_object(), what, " must be an object, not ", m.type_name());
    const std::string path = as_string(required(m, "path", what), what + ".path");
    Layer* node = root.get();
    if (!path.empty()) {
      int64_t depth = 0;
      size_t start = 0;
      while (true) {
        TORCH_CHECK(++depth <= kMaxModulePathDepth, what, ".path is deeper than ",
                    kMaxModulePathDepth, " modules");
        const size_t dot = path.find('.', start);
        const std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
        TORCH_CHECK(!part.empty(), what, ".path '", path, "' has an empty module name");
        std::shared_ptr<torch::nn::Module> child;
        for (const auto& item : node->named_children()) {
          if (item.key() == part) child = item.value();
        }
        if (!child) child = node->register_module(part, std::make_shared<Layer>(part));
        node = dynamic_cast<Layer*>(child.get());
        TORCH_INTERNAL_ASSERT(node != nullptr, "every module of a case is a Layer");
        if (dot == std::string::npos) break;
        start = dot + 1;
      }
    }
    const Json* mapping = nullable(m, "mapping");
    if (mapping == nullptr) continue;
    TORCH_CHECK(with_mapping.insert(node).second, what, ": module '", path,
                "' already has a mapping");
    TORCH_CHECK(mapping->is_array(), what, ".mapping must be an array, not ", mapping->type_name());
    ExpertMapping entries;
    for (size_t e = 0; e < mapping->size(); ++e) {
      const std::string ew = what + ".mapping[" + std::to_string(e) + "]";
      const Json& entry = (*mapping)[e];
      TORCH_CHECK(entry.is_array() && entry.size() == 4, ew,
                  " must be [param_name, weight_name, expert_id, shard_id]");
      entries.emplace_back(as_string(entry[0], ew + "[0]"), as_string(entry[1], ew + "[1]"),
                           as_int(entry[2], ew + "[2]"), as_string(entry[3], ew + "[3]"));
    }
    node->get_expert_mapping = [entries]() { return entries; };
  }

  const ExpertMapping mapping = get_moe_expert_mapping(*root);

  OJson list = OJson::array();
  for (const auto& [param, weight, expert, shard] : mapping) {
    list.push_back(OJson::array({param, weight, expert, shard}));
  }
  out["mapping"] = list;
}

void op_weights_already_processed(const Json& c, OJson& out) {
  const int64_t depth = as_int(required(c, "depth", "the case"), "depth");
  TORCH_CHECK(depth >= 0 && depth <= kMaxScopeDepth, "depth must be in [0, ", kMaxScopeDepth,
              "], not ", depth);
  const bool raise = opt_bool(c, "throw", false);
  std::vector<bool> seen{weights_pre_processed()};
  bool new_thread = true;
  std::function<void(int64_t)> enter = [&](int64_t level) {
    if (level == depth) {
      std::thread([&new_thread] { new_thread = weights_pre_processed(); }).join();
      if (raise) throw std::runtime_error("thrown inside the innermost scope");
      return;
    }
    {
      WeightsAlreadyProcessed scope;
      seen.push_back(weights_pre_processed());
      enter(level + 1);
    }
    seen.push_back(weights_pre_processed());
  };
  try {
    enter(0);
  } catch (const std::runtime_error&) {
    seen.push_back(weights_pre_processed());
  }
  out["observed"] = seen;
  out["new_thread"] = new_thread;
}

// ---------------------------------------------------------------------------
// layer_script

struct Step {
  std::string action;
  std::string name;
  std::string src;
  std::string dst;
  std::optional<std::string> tensor;  // nullopt: None
  std::optional<AttrMap> attrs;       // set_weight_attrs; nullopt: None
  bool direct_reload = false;
};

Step parse_step(const Json& j, const std::string& what,
                const std::map<std::string, at::Tensor>& declared) {
  TORCH_CHECK(j.is_object(), what, " must be an object, not ", j.type_name());
  Step s;
  s.action = as_string(required(j, "do", what), what + ".do");
  // The fields each action takes, besides "do" and "direct_reload".
  static const std::map<std::string, std::vector<std::string>> kFields = {
      {"set", {"name", "tensor"}},
      {"move_parameter", {"src", "dst"}},
      {"retire_parameter", {"name"}},
      {"replace_parameter", {"name", "tensor"}},
      {"set_kernel_parameter", {"name", "tensor"}},
      {"get_live_param", {"name"}},
      {"kernel_parameters", {}},
      {"refill_derived", {"name", "tensor"}},
      {"set_weight_attrs", {"name", "attrs"}},
      {"load", {"name", "tensor"}},
  };
  auto spec = kFields.find(s.action);
  TORCH_CHECK(spec != kFields.end(), what, ": unknown action '", s.action, "'");
  for (const auto& item : j.items()) {
    const std::string& key = item.key();
    const auto& allowed = spec->second;
    TORCH_CHECK(key == "do" || key == "direct_reload" ||
                    std::find(allowed.begin(), allowed.end(), key) != allowed.end(),
                what, ": action '", s.action, "' has no field '", key, "'");
  }
  for (const std::string& key : spec->second) {
    const Json& v = required(j, key.c_str(), what);
    const std::string where = what + "." + key;
    if (key == "tensor") {
      if (v.is_null()) {
        TORCH_CHECK(s.action != "load", where, ": load needs a tensor");
        continue;
      }
      s.tensor = as_string(v, where);
      TORCH_CHECK(declared.count(*s.tensor) != 0, where, ": no tensor is named '", *s.tensor, "'");
    } else if (key == "attrs") {
      if (!v.is_null()) s.attrs = parse_attrs(v, where);
    } else {
      const std::string value = as_string(v, where);
      (key == "name" ? s.name : key == "src" ? s.src : s.dst) = value;
    }
  }
  s.direct_reload = opt_bool(j, "direct_reload", false);
  return s;
}

std::string error_message(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

void op_layer_script(const Json& c, OJson& out) {
  Layer layer;
  if (const Json* u = field(c, "uses_meta_device")) {
    layer.quant_method = QuantMethod{as_bool(*u, "uses_meta_device")};
  }
  const Json& tensor_list = required(c, "tensors", "the case");
  TORCH_CHECK(tensor_list.is_array(), "tensors must be an array, not ", tensor_list.type_name());
  const Json& step_list = required(c, "steps", "the case");
  TORCH_CHECK(step_list.is_array(), "steps must be an array, not ", step_list.type_name());

  // The case's tensors, in order; tensor k owns storage k (pattern k).
  CaseTensors tensors;
  Registry registry;
  std::map<std::string, at::Tensor> declared;
  std::vector<std::pair<std::string, Watched>> storages;
  LayoutRules rules;
  rules.allow_name = true;
  std::vector<Layout> layouts;
  for (size_t k = 0; k < tensor_list.size(); ++k) {
    layouts.push_back(parse_layout(tensor_list[k], "tensors[" + std::to_string(k) + "]", rules));
  }
  std::vector<const Layout*> planned;
  for (const Layout& l : layouts) planned.push_back(&l);
  CaseTensors::plan(planned);
  for (size_t k = 0; k < layouts.size(); ++k) {
    const std::string what = "tensors[" + std::to_string(k) + "]";
    const Layout& l = layouts[k];
    TORCH_CHECK(!l.name.empty() && l.name[0] != '#', what,
                ".name must be non-empty and not "
                "start with '#'");
    TORCH_CHECK(declared.count(l.name) == 0, what, ": the name '", l.name, "' is taken");
    at::Tensor data;
    if (l.on.empty()) {
      data = tensors.own(l, static_cast<int64_t>(k), what);
      storages.emplace_back(l.name, Watched(data.storage()));
      registry.add_storage(data.storage(), l.name);
    } else {
      auto base = declared.find(l.on);
      TORCH_CHECK(base != declared.end(), what, ".on: no earlier tensor is named '", l.on, "'");
      data = CaseTensors::view_on(l, base->second.storage(), what);
    }
    const at::Tensor obj = make_object(data, l, "tensor");
    declared[l.name] = obj;
    registry.add_object(obj, l.name);
  }
  std::vector<Step> steps;
  for (size_t i = 0; i < step_list.size(); ++i) {
    steps.push_back(parse_step(step_list[i], "steps[" + std::to_string(i) + "]", declared));
  }

  auto tensor_of = [&](const Step& s) { return s.tensor ? declared.at(*s.tensor) : at::Tensor(); };
  OJson results = OJson::array();
  for (const Step& s : steps) {
    OJson result = nullptr;
    try {
      DirectReloadScope scope(s.direct_reload);
      if (s.action == "set") {
        layer.set(s.name, tensor_of(s));
      } else if (s.action == "move_parameter") {
        move_parameter(layer, s.src, s.dst);
      } else if (s.action == "retire_parameter") {
        retire_parameter(layer, s.name);
      } else if (s.action == "replace_parameter") {
        replace_parameter(layer, s.name, tensor_of(s));
      } else if (s.action == "set_kernel_parameter") {
        set_kernel_parameter(layer, s.name, tensor_of(s));
      } else if (s.action == "get_live_param") {
        result = registry.object(get_live_param(layer, s.name));
      } else if (s.action == "kernel_parameters") {
        result = OJson::array();
        for (const auto& [name, param] : kernel_parameters(layer)) {
          result.push_back(OJson::array({name, registry.object(param)}));
        }
      } else if (s.action == "refill_derived") {
        result = registry.object(refill_derived(layer, s.name, tensor_of(s)));
      } else if (s.action == "set_weight_attrs") {
        const at::Tensor held = layer.get(s.name);
        TORCH_CHECK(held.defined(), "set_weight_attrs: '", s.name, "' holds no tensor");
        set_weight_attrs(held, s.attrs);
      } else if (s.action == "load") {
        at::Tensor held = layer.get(s.name);
        TORCH_CHECK(held.defined(), "load: '", s.name, "' holds no tensor");
        copy_weight_(held, tensor_of(s));
      }
    } catch (const std::exception& e) {
      result = OJson::object();
      result["error"] = error_message(e);
    }
    results.push_back(result);
  }

  OJson report = OJson::object();
  auto describe = [&](const std::string& name) -> OJson {
    const at::Tensor t = layer.get(name);
    if (!t.defined()) return nullptr;
    OJson d;
    d["object"] = registry.object(t);
    d["kind"] = is_parameter(t) ? "parameter" : "tensor";
    d["live"] = get_live_param(layer, name).defined();
    put_layout(d, t);
    d["storage"] = registry.storage(t);
    d["attrs"] = attrs_json(t);
    return d;
  };
  for (const auto& slot : layer.parameter_slots()) report[slot.first] = describe(slot.first);
  for (const std::string& name : layer.attribute_names()) report[name] = describe(name);
  OJson storage_report = OJson::object();
  for (const auto& [name, watched] : storages) storage_report[name] = storage_json(watched);

  out["results"] = results;
  out["layer"] = report;
  out["storages"] = storage_report;
}

// ---------------------------------------------------------------------------

using Operation = void (*)(const Json&, OJson&);

const std::map<std::string, Operation>& operations() {
  static const auto* ops = new std::map<std::string, Operation>{
      {"extent", op_extent},
      {"in_own_storage", op_in_own_storage},
      {"replace_parameter", op_replace_parameter},
      {"refill_derived", op_refill_derived},
      {"set_weight_attrs", op_set_weight_attrs},
      {"storage_view", op_storage_view},
      {"copy_weight", op_copy_weight},
      {"get_moe_expert_mapping", op_get_moe_expert_mapping},
      {"weights_already_processed", op_weights_already_processed},
      {"layer_script", op_layer_script},
  };
  return *ops;
}

std::string dump(const OJson& j) {
  return j.dump(-1, ' ', false, OJson::error_handler_t::replace);
}

}  // namespace

std::string evaluate_case(const std::string& line) {
  OJson id = nullptr;
  std::string error;
  try {
    check_depth(line);
    const Json c = Json::parse(line);
    TORCH_CHECK(c.is_object(), "a case is a JSON object, not ", c.type_name());
    if (const Json* i = field(c, "id")) id = OJson::parse(i->dump());
    const std::string op = as_string(required(c, "op", "the case"), "op");
    auto it = operations().find(op);
    TORCH_CHECK(it != operations().end(), "unknown op '", op, "'");
    OJson out = OJson::object();
    out["id"] = id;
    it->second(c, out);
    return dump(out);
  } catch (const nlohmann::json::exception& e) {
    error = std::string("invalid JSON: ") + e.what();
  } catch (const std::exception& e) {
    error = error_message(e);
  } catch (...) {
    error = "unknown exception";
  }
  try {
    OJson out = OJson::object();
    out["id"] = id;
    out["error"] = error;
    return dump(out);
  } catch (...) {
    return R"({"id":null,"error":"the error could not be reported"})";
  }
}

bool is_case_line(const std::string& line) {
  return line.find_first_not_of(" \t\r\n\f\v") != std::string::npos;
}

int64_t run_cases(std::istream& in, std::ostream& out) {
  int64_t count = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (!is_case_line(line)) continue;
    out << evaluate_case(line) << '\n';
    ++count;
  }
  out.flush();
  return count;
}

}  // namespace reloadsafe::conformance
