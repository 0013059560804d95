#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/case_json.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <set>
#include <utility>

namespace reloadsafe::conformance {
namespace {

// The dtypes cases can name, in the order FORMAT.md lists them.
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

// `{"tensor": v}`: an int64 tensor (a bool tensor when every value is a
// boolean), 0-dim for a single value, 1-D for an array.
at::Tensor as_attr_tensor(const Json& v, const std::string& what) {
  TORCH_CHECK(v.size() == 1, what, " must be {\"tensor\": values}, not ", brief(v));
  const Json& values = v.at("tensor");
  const bool scalar = !values.is_array();
  const Json list = scalar ? Json::array({values}) : values;
  const bool boolean = !list.empty() && std::all_of(list.begin(), list.end(),
                                                    [](const Json& x) { return x.is_boolean(); });
  at::Tensor t = at::empty(
      scalar ? std::vector<int64_t>{} : std::vector<int64_t>{static_cast<int64_t>(list.size())},
      at::TensorOptions().dtype(boolean ? at::kBool : at::kLong));
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = what + ".tensor" + (scalar ? "" : "[" + std::to_string(i) + "]");
    if (boolean) {
      t.data_ptr<bool>()[i] = list[i].get<bool>();
    } else {
      t.data_ptr<int64_t>()[i] = as_int(list[i], where);
    }
  }
  return t;
}

}  // namespace

Json parse_case(const std::string& line) {
  // The callback sees each array or object as it opens, with the number of
  // containers already open around it.
  const Json::parser_callback_t limit_depth = [](int depth, Json::parse_event_t event, Json&) {
    if (event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) {
      TORCH_CHECK(depth < kMaxJsonDepth, "the case nests arrays and objects deeper than ",
                  kMaxJsonDepth, " levels");
    }
    return true;
  };
  return Json::parse(line, limit_depth);
}

std::string brief(const Json& v) {
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  return s.size() <= 40 ? s : s.substr(0, 37) + "...";
}

const Json* field(const Json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

const Json* nullable(const Json& obj, const char* key) {
  const Json* v = field(obj, key);
  return v == nullptr || v->is_null() ? nullptr : v;
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

at::ScalarType as_dtype(const Json& v, const std::string& what) {
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

AttrMap as_attrs(const Json& v, const std::string& what) {
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
    } else if (value.is_object() && value.contains("tensor")) {
      out[key] = AttrValue(as_attr_tensor(value, where));
    } else {
      TORCH_CHECK(false, where,
                  ": attribute values are strings, booleans, integers or {\"tensor\": values}, "
                  "not ",
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

}  // namespace reloadsafe::conformance
